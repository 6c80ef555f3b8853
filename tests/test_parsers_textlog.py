"""Tests of parsers.textlog and parsers.lines: inline line shapes, then the real case logs."""

from __future__ import annotations

import math
from pathlib import Path

import polars as pl
import pytest

from forensics.schema import EVENT_KINDS, EVENTS_SCHEMA, METRICS_SCHEMA
from parsers import textlog
from parsers.lines.pyrepr import parse as parse_repr

MEG = (" iteration {it:8d}/  159576 | consumed samples:      1514464 |"
       " elapsed time per iteration (ms): 2066.5 |"
       " learning rate: 5.999E-05 | global batch size:   528 |{loss} loss scale: {scale} | grad norm: {gn} |"
       " num zeros: 0.0 | number of skipped iterations:   0 | number of nan iterations:   0 |\n")


def meg(it: int, loss: float | None = 2.5, scale: float = 65536.0, gn: str = "1.234") -> str:
    """One Megatron iteration line; ``loss=None`` omits the ``lm loss`` field (a NaN average)."""
    return MEG.format(it=it, loss="" if loss is None else f" lm loss: {loss:.6E} |", scale=scale, gn=gn)


def parse(tmp_path: Path, text: str | bytes, name: str = "train.log"):
    """Parse."""
    p = tmp_path / name
    p.write_bytes(text.encode() if isinstance(text, str) else text)
    r = textlog.read(p, tmp_path)
    assert r.metrics.schema.equals(METRICS_SCHEMA)
    assert r.events.schema.equals(EVENTS_SCHEMA)
    return r, pl.from_arrow(r.metrics), pl.from_arrow(r.events)


def vals(df: pl.DataFrame, metric: str, step: int | None = None, segment: int | None = None) -> list:
    """Vals."""
    q = df.filter(pl.col("metric") == metric)
    if step is not None:
        q = q.filter(pl.col("step") == step)
    if segment is not None:
        q = q.filter(pl.col("segment") == segment)
    return q.get_column("value").to_list()


def kinds(ev: pl.DataFrame, kind: str) -> list[tuple]:
    """Kinds."""
    return ev.filter(pl.col("kind") == kind).select("segment", "step", "message").rows()


# ---------------------------------------------------------------------------------------------
# Megatron
# ---------------------------------------------------------------------------------------------
def test_megatron_fields_and_units(tmp_path):
    """Megatron fields and units."""
    r, df, ev = parse(tmp_path, meg(10, 2.5) + meg(20, 2.4, scale=32768.0))
    assert r.format == "textlog" and r.meta["framework"] == "megatron" and r.precision == "%.6E"
    assert vals(df, "loss", 10) == [2.5]
    assert vals(df, "lr", 10) == [5.999e-05]
    assert vals(df, "step_time", 10) == [pytest.approx(2.0665)]  # ms -> seconds
    assert vals(df, "samples", 10) == [1514464.0]
    assert vals(df, "grad_norm", 20) == [1.234]
    assert vals(df, "skipped_step", 20) == [0.0] and vals(df, "nan_step", 20) == [0.0]
    assert set(df.filter(pl.col("metric") == "loss").get_column("tag")) == {"lm loss"}
    assert kinds(ev, "loss_scale_change") == [(0, 20, "loss scale 65536 -> 32768")]
    assert r.meta["train_iters"] == 159576


def test_megatron_missing_lm_loss_is_nan(tmp_path):
    """Megatron missing lm loss is nan."""
    r, df, ev = parse(tmp_path, meg(10, 2.5) + meg(20, None) + meg(30, 2.6))
    loss = vals(df, "loss", 20)
    assert len(loss) == 1 and math.isnan(loss[0])
    assert [s for _, s, _ in kinds(ev, "nan_detected")] == [20]
    assert r.meta["nan_loss_lines"] == 1


def test_megatron_no_loss_anywhere_is_not_nan(tmp_path):
    """Megatron no loss anywhere is not nan."""
    _, df, ev = parse(tmp_path, meg(10, None) + meg(20, None))
    assert vals(df, "loss") == [] and kinds(ev, "nan_detected") == []


def test_megatron_placeholder_grad_norm_dropped(tmp_path):
    """Megatron placeholder grad norm dropped."""
    r, df, _ = parse(tmp_path, "".join(meg(i, 2.5, gn="0.000") for i in (10, 20, 30)))
    assert vals(df, "grad_norm") == []
    assert "grad_norm" in r.meta["placeholder_metrics"]


def test_megatron_args_restart_resume_segments(tmp_path):
    """Megatron args restart resume segments."""
    dump = ("START TIME: Wed Dec 08 05:49:48 UTC 2021\nusing torch.float16 for parameters ...\n"
            "------------------------ arguments ------------------------\n"
            "  lr .............................................. 6e-05\n"
            "  fp16 ............................................ True\n"
            "  min_lr .......................................... {min_lr}\n"
            "  rampup_batch_size ............................... ['16', '16', '6_000_000']\n"
            "-------------------- end of arguments ---------------------\n")
    text = (dump.format(min_lr="1e-06") + meg(99) + meg(100)
            + "saving checkpoint at iteration     100 to /ckpt\n"
            + "  successfully saved checkpoint at iteration 100 to /ckpt\n"
            + dump.format(min_lr="6e-07")
            + " loading checkpoint from /ckpt at iteration 100\n"
            + " > overriding minimum learning rate value to 6e-07\n"
            + "  successfully loaded checkpoint from /ckpt at iteration 100\n" + meg(101) + meg(102))
    r, df, ev = parse(tmp_path, text, "main_log.txt")
    assert r.meta["args"] == {"lr": 6e-05, "fp16": True, "min_lr": 6e-07,
                              "rampup_batch_size": ["16", "16", "6_000_000"]}
    assert r.meta["precision"] == "fp16" and len(r.meta["args_history"]) == 2
    assert df.filter(pl.col("segment") == 0).get_column("step").unique().sort().to_list() == [99, 100]
    assert df.filter(pl.col("segment") == 1).get_column("step").unique().sort().to_list() == [101, 102]
    assert kinds(ev, "restart") == [(1, 100, kinds(ev, "restart")[0][2])]
    assert [(s, st) for s, st, _ in kinds(ev, "checkpoint_saved")] == [(0, 100)]
    assert [(s, st) for s, st, _ in kinds(ev, "checkpoint_loaded")] == [(1, 100)]
    configs = [m for _, _, m in kinds(ev, "config")]
    assert any("min_lr: 1e-06 -> 6e-07" in m for m in configs)
    assert any("overriding minimum learning rate" in m for m in configs)
    assert r.meta["segments"] == 2


def test_megatron_validation_and_nan_guard(tmp_path):
    """Megatron validation and nan guard."""
    text = (meg(1000) + " validation loss at iteration 1000 | lm loss value: 2.100000E+00 | "
            "lm loss PPL: 8.166170E+00 |\n"
            "Rank 3, node n1, device 0, iteration 1001: Unexpected result nan "
            "(message='found NaN in local grad norm')\n")
    _, df, ev = parse(tmp_path, text)
    assert vals(df, "eval_loss", 1000) == [2.1] and vals(df, "eval_ppl", 1000) == [8.16617]
    assert [s for _, s, _ in kinds(ev, "nan_detected")] == [1001]


def test_rank_prefix_ansi_and_carriage_returns(tmp_path):
    """Rank prefix ansi and carriage returns."""
    text = ("[rank0]: \x1b[32m" + meg(5).rstrip("\n") + "\x1b[0m\n"
            + "[default7]:" + meg(6)
            + "progress 10%\r" + meg(7).rstrip("\n") + "\rprogress 20%\n")
    _, df, _ = parse(tmp_path, text)
    assert sorted(df.filter(pl.col("metric") == "loss").get_column("step").to_list()) == [5, 6, 7]


def test_tracebacks_and_error_kinds(tmp_path):
    """Tracebacks and error kinds."""
    text = (meg(10) + "Traceback (most recent call last):\n  File \"x.py\", line 1, in <module>\n"
            "    iteration = train(forward_step_func,\n"
            "RuntimeError: transform: failed to synchronize: cudaErrorECCUncorrectable: "
            "uncorrectable ECC error\n"
            "terminate called after throwing an instance of 'c10::Error'\n"
            "> initializing torch distributed ...\n"
            "Traceback (most recent call last):\n  File \"y.py\", line 2, in f\n"
            "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n"
            "NCCL error in: ProcessGroupNCCL.cpp:1234, unhandled system error\n")
    _, df, ev = parse(tmp_path, text)
    assert kinds(ev, "hardware_error")[0][:2] == (0, 10)
    assert "cudaErrorECCUncorrectable" in kinds(ev, "hardware_error")[0][2]
    assert kinds(ev, "error")[0][2].startswith("terminate called")
    assert kinds(ev, "restart")[0][:2] == (1, 10)
    assert kinds(ev, "oom")[0][:2] == (1, 10)
    assert len(kinds(ev, "hardware_error")) == 2  # the NCCL line, in the second launch
    assert vals(df, "loss") == [2.5]  # the traceback's "iteration = train(" is not a metric line
    assert set(ev.get_column("kind")) <= EVENT_KINDS


def test_unterminated_last_line_is_skipped(tmp_path):
    """Unterminated last line is skipped."""
    r, df, _ = parse(tmp_path, meg(1) + meg(2).rstrip("\n")[:60])
    assert df.get_column("step").unique().to_list() == [1]
    assert r.skipped and r.skipped[0].what == "train.log:2"


def test_step_rewind_starts_segment(tmp_path):
    """Step rewind starts segment."""
    _, df, _ = parse(tmp_path, "step 1 | loss 3.0\nstep 2 | loss 2.0\nstep 1 | loss 3.1\n")
    assert df.select("segment", "step", "value").rows() == [(0, 1, 3.0), (0, 2, 2.0), (1, 1, 3.1)]


# ---------------------------------------------------------------------------------------------
# HF Trainer stdout
# ---------------------------------------------------------------------------------------------
HF_HEAD = ("[INFO|trainer.py:2369] 2025-01-14 10:02:05,000 >> ***** Running training *****\n"
           "[INFO|trainer.py:2371] 2025-01-14 10:02:05,000 >>   Num Epochs = 2\n"
           "[INFO|trainer.py:2377] 2025-01-14 10:02:05,000 >>   Total optimization steps = 40\n")


def test_hf_dicts_nan_and_epoch_steps(tmp_path):
    """Hf dicts nan and epoch steps."""
    text = (HF_HEAD + "{'loss': 2.3, 'grad_norm': nan, 'learning_rate': 4.9e-05, 'epoch': 0.25}\n"
            "{'loss': inf, 'grad_norm': -inf, 'learning_rate': 4.8e-05, 'epoch': 0.5}\n"
            "{'eval_loss': 1.6, 'eval_runtime': 3.9, 'epoch': 0.5}\n"
            "{'train_runtime': 241.8, 'train_loss': 6.29, 'epoch': 2.0}\n")
    r, df, _ = parse(tmp_path, text)
    assert r.meta["framework"] == "hf_trainer_stdout" and r.meta["step_source"] == "epoch"
    assert vals(df, "loss", 5) == [2.3] and math.isnan(vals(df, "grad_norm", 5)[0])
    assert vals(df, "loss", 10) == [math.inf] and vals(df, "grad_norm", 10) == [-math.inf]
    assert vals(df, "lr", 5) == [4.9e-05] and vals(df, "epoch", 5) == [0.25]
    assert vals(df, "eval_loss", 10) == [1.6] and vals(df, "eval_runtime", 10) == [3.9]
    assert r.meta["train_summary"]["train_loss"] == 6.29
    assert 6.29 not in vals(df, "loss")
    assert r.meta["hf_total_steps"] == 40 and r.meta["hf_num_epochs"] == 2


def test_hf_running_index_with_logging_steps_and_tqdm(tmp_path):
    """Hf running index with logging steps and tqdm."""
    text = ("TrainingArguments(output_dir='o', logging_steps=50, bf16=True, "
            "lr_scheduler_type=<SchedulerType.LINEAR: 'linear'>)\n"
            " 10%|█         | 10/100 [00:01<00:09]\r{'loss': 1.5, 'learning_rate': 1e-05}\n"
            "{'loss': 1.4, 'learning_rate': 2e-05}\n")
    r, df, _ = parse(tmp_path, text)
    assert vals(df, "loss", 50) == [1.5] and vals(df, "loss", 100) == [1.4]
    assert r.meta["step_source"] == "index*logging_steps" and r.meta["precision"] == "bf16"
    assert r.meta["args"]["logging_steps"] == 50


def test_hf_json_lines_and_resume(tmp_path):
    """Hf json lines and resume."""
    text = ('{"loss": 2.0, "learning_rate": 5e-05, "epoch": 0.1, "step": 250}\n'
            "05/14/2020 18:03:08 - INFO - transformers.trainer -     Continuing training from checkpoint, "
            "will skip to saved global_step\n"
            "05/14/2020 18:03:08 - INFO - transformers.trainer -     Continuing training from epoch 4\n"
            "05/14/2020 18:03:08 - INFO - transformers.trainer -     "
            "Continuing training from global step 200\n"
            '{"loss": 2.1, "learning_rate": 4e-05, "epoch": 0.2, "step": 250}\n')
    _, df, ev = parse(tmp_path, text)
    assert df.filter(pl.col("metric") == "loss").select("segment", "step", "value").rows() == [
        (0, 250, 2.0), (1, 250, 2.1)]
    assert [(s, st) for s, st, _ in kinds(ev, "checkpoint_loaded")] == [(1, 200)]


# ---------------------------------------------------------------------------------------------
# fairseq / metaseq / DeepSpeed
# ---------------------------------------------------------------------------------------------
FS = ("2020-03-24 14:03:41 | INFO | train_inner | epoch 002:    243 / 356 loss=9.912, nll_loss=8.982, "
      "num_updates={n}, lr=0.0001475, gnorm={g}, loss_scale=0, wall=5478\n")


def test_fairseq_zero_loss_scale_notes_and_fatal(tmp_path):
    """Fairseq zero loss scale notes and fatal."""
    text = (FS.format(n=590, g=53.883)
            + "2020-03-24 14:05:13 | INFO | fairseq.trainer | "
            + "NOTE: overflow detected, setting loss scale to: "
              "0.001953125\n"
            + FS.format(n=600, g=54.481)
            + "Traceback (most recent call last):\n  File \"t.py\", line 1\n"
              "FloatingPointError: Minimum loss scale reached (0.0001). Your loss is probably exploding.\n")
    r, df, ev = parse(tmp_path, text)
    assert r.meta["framework"] == "fairseq" and r.meta["loss_scale_zero_means_small"] is True
    assert vals(df, "grad_norm", 600) == [54.481] and vals(df, "loss", 590) == [9.912]
    assert vals(df, "nll_loss", 590) == [8.982]  # both alias "loss": the one named loss wins
    ls = df.filter(pl.col("metric") == "loss_scale").select("step", "value", "tag").rows()
    assert ls == [(590, 0.0, "loss_scale"), (590, 0.001953125, "setting loss scale to"),
                  (600, 0.0, "loss_scale")]
    assert [st for _, st, _ in kinds(ev, "overflow_skip")] == [590]
    assert [st for _, st, _ in kinds(ev, "loss_scale_change")] == [590]
    assert kinds(ev, "error")[0][1] == 600 and "Minimum loss scale" in kinds(ev, "error")[0][2]
    assert vals(df, "wall", 590) == [5478.0] and df.get_column("wall_time")[0] == 1585058621.0


def test_fairseq_old_pipe_format(tmp_path):
    """Old fairseq: ``| epoch 001:  100 / 5000 k=v`` inner lines, ``| epoch 001 | k v |`` epoch averages."""
    inner = ("| epoch 001:    100 / 5000 loss=9.1, nll_loss=8.9, num_updates=100, lr=0.0001, gnorm=1.5, "
             "loss_scale=128\n")
    summary = ("| epoch 001 | loss 9.0 | nll_loss 8.8 | num_updates 5000 | lr 0.0005 | gnorm 1.2 | "
               "loss_scale 64\n")
    valid = "| epoch 001 | valid on 'valid' subset | loss 8.5 | nll_loss 8.4 | num_updates 5000\n"
    _, df, _ = parse(tmp_path, inner + summary + valid)
    assert vals(df, "loss", 100) == [9.1] and vals(df, "epoch_avg/loss", 5000) == [9.0]
    assert vals(df, "eval_loss", 5000) == [8.5] and vals(df, "loss_scale", 100) == [128.0]
    _, df2, _ = parse(tmp_path, summary + valid, "only_summaries.log")
    assert vals(df2, "loss", 5000) == [9.0] and vals(df2, "grad_norm", 5000) == [1.2]


def test_hf_multiline_training_arguments(tmp_path):
    """Recent HF prints TrainingArguments over many lines; it is one configuration dump."""
    text = ("TrainingArguments(\n_n_gpu=1,\nbf16=False,\nfp16=True,\nlogging_steps=10,\n"
            "lr_scheduler_type=SchedulerType.COSINE,\n)\n{'loss': 1.0, 'learning_rate': 1e-05}\n")
    r, df, _ = parse(tmp_path, text)
    assert r.meta["args"] == {"_n_gpu": 1, "bf16": False, "fp16": True, "logging_steps": 10,
                              "lr_scheduler_type": "SchedulerType.COSINE"}
    assert r.meta["precision"] == "fp16" and vals(df, "loss", 10) == [1.0]


def test_metaseq_json_train_inner(tmp_path):
    """Metaseq json train inner."""
    text = ("2021-11-29 06:55:00 | INFO | metaseq.trainer | Loaded checkpoint /c/checkpoint_39250.pt "
            "(epoch 1 @ 39250 updates)\n"
            '2021-11-29 07:07:43 | INFO | train_inner | {"epoch": 1, "actv_norm": "981.47", "loss": "3.174", '
            '"num_updates": "39260", "lr": "9.14604e-05", "gnorm": "0.312", "loss_scale": "0.5"}\n')
    r, df, ev = parse(tmp_path, text)
    assert r.meta["framework"] == "metaseq"
    assert vals(df, "loss", 39260) == [3.174] and vals(df, "actv_norm", 39260) == [981.47]
    assert vals(df, "loss_scale", 39260) == [0.5] and vals(df, "grad_norm", 39260) == [0.312]
    assert [(s, st) for s, st, _ in kinds(ev, "checkpoint_loaded")] == [(0, 39250)]


def test_metaseq_json_valid_and_epoch_lines(tmp_path):
    """Metaseq JSON valid/train lines carry prefixed keys (valid_loss, valid_num_updates)."""
    text = ('2021-11-29 07:07:43 | INFO | valid | {"epoch": 1, "valid_loss": "3.2", "valid_ppl": "9.2", '
            '"valid_num_updates": "39300"}\n')
    _, df, _ = parse(tmp_path, text)
    assert df.select("step", "metric", "value", "tag").rows() == [
        (39300, "eval_loss", 3.2, "valid_loss"), (39300, "eval_ppl", 9.2, "valid_ppl")]


def test_megatron_bf16_constant_loss_scale_dropped(tmp_path):
    """A loss scale of 1.0 on every line of a bf16 run is a constant, not a measurement."""
    text = "using torch.bfloat16 for parameters ...\n" + "".join(meg(i, scale=1.0) for i in (1, 2, 3))
    r, df, _ = parse(tmp_path, text)
    assert r.meta["precision"] == "bf16" and vals(df, "loss_scale") == []
    assert "loss_scale" in r.meta["placeholder_metrics"]


def test_deepspeed_steps_and_overflows(tmp_path):
    """Deepspeed steps and overflows."""
    p = "[2025-02-21 12:05:41,123] [INFO] [logging.py:128:log_dist] [Rank 0] "
    text = (p + "step=100, skipped=3, lr=[0.0003], mom=[(0.9, 0.999)]\n"
            + p + "step=110, skipped=5, lr=[0.00029], mom=[(0.9, 0.999)]\n"
            + "[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 65536, reducing to 32768\n"
            + "Grad overflow on iteration: 115\n"
            + "[2025-02-21 12:05:42,000] [INFO] [loss_scaler.py:1:x] "
            + "Reducing dynamic loss scale from 32768.0 to 16384.0\n"
            + "Current loss scale already at minimum - cannot decrease scale anymore. Exiting run.\n")
    r, df, ev = parse(tmp_path, text)
    assert vals(df, "lr", 100) == [0.0003] and vals(df, "skipped_step", 110) == [2.0]
    assert vals(df, "loss_scale", 110) == [32768.0, 16384.0]
    assert [st for _, st, _ in kinds(ev, "overflow_skip")] == [110, 115]
    assert len(kinds(ev, "loss_scale_change")) == 2
    assert "already at minimum" in kinds(ev, "error")[0][2]


# ---------------------------------------------------------------------------------------------
# Custom scripts
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("line", "step", "expected"),
    [
        ("step 3 | lr 1.0 | loss 1.1219", 3, {"lr": 1.0, "loss": 1.1219}),
        ("[step 20000] loss 0.1549 grad_norm 1.441", 20000, {"loss": 0.1549, "grad_norm": 1.441}),
        ("iter 100: loss 2.3456, time 123.45ms, mfu 12.34%", 100,
         {"loss": 2.3456, "step_time": 0.12345, "mfu": 12.34}),
        ("[titan] 2026-08-21 21:30:21,123 - root - INFO - step:  1  loss: 12.34567  grad_norm:  3.1234  "
         "memory: 12.34GiB(15.56%)  tps: 1,234  mfu: 12.34%", 1,
         {"loss": 12.34567, "grad_norm": 3.1234, "memory_reserved_gib": 12.34, "memory_reserved_pct": 15.56,
          "throughput": 1234.0, "mfu": 12.34}),
        ("Iter 10: Train loss \x1b[92m2.43155818\x1b[0m, Learning Rate 1.000e-04, It/sec 0.297, "
         "Tokens/sec 282.216, Trained Tokens 9494, Peak mem 22.051 GB", 10,
         {"loss": 2.43155818, "lr": 1e-4, "It/sec": 0.297, "throughput": 282.216, "tokens": 9494.0,
          "Peak mem": 22.051}),
        ("\x1b[96mIter 200: Val loss 4.937, Val took 37.902s\x1b[0m", 200,
         {"eval_loss": 4.937, "Val took": 37.902}),
        ("step 2000: train loss 1.2345, val loss 1.3456", 2000,
         {"eval_train_loss": 1.2345, "eval_loss": 1.3456}),
    ],
)
def test_generic_shapes(tmp_path, line, step, expected):
    """Generic shapes."""
    _, df, _ = parse(tmp_path, line + "\n")
    got = {m: v for m, v in df.filter(pl.col("step") == step).select("metric", "value").rows()}
    assert got == pytest.approx(expected)


def test_generic_nonfinite_loss_resume_and_saves(tmp_path):
    """Generic nonfinite loss resume and saves."""
    text = ("resuming from ckpt/step_15000.pt (metrics logged from step 20000, every 500 steps)\n"
            "[step 20000] loss 0.1549 grad_norm 1.441\nsaved ckpt/step_20000.pt\n"
            "[step 55895] non-finite loss (nan), stopping. last checkpoint: ckpt/step_55000.pt\n")
    _, df, ev = parse(tmp_path, text)
    assert math.isnan(vals(df, "loss", 55895)[0])
    assert [st for _, st, _ in kinds(ev, "nan_detected")] == [55895]
    assert [st for _, st, _ in kinds(ev, "checkpoint_loaded")] == [15000]
    assert [st for _, st, _ in kinds(ev, "checkpoint_saved")] == [20000]
    assert vals(df, "every") == []


def test_imagenet_epochs(tmp_path):
    """Imagenet epochs."""
    text = ("[Epoch=083/150] [Need: 06:12:33:40] [learning_rate=0.001000] "
            "[Best : Accuracy(T1/T5)=65.93/86.76]\n"
            "Epoch: [83][0/10010]\tTime 6.512 (6.512)\tLoss 1.8135 (1.8135)\tPrec@1 58.594 (58.594)\n"
            "Epoch: [83][200/10010]\tTime 0.513 (0.553)\tLoss 1.9176 (1.6593)\tPrec@1 68.812 (61.979)\n"
            " * Prec@1 65.214 Prec@5 86.402\n")
    r, df, _ = parse(tmp_path, text)
    assert r.meta["step_unit"] == "epoch" and r.meta["framework"] == "imagenet"
    assert vals(df, "lr", 83) == [0.001] and vals(df, "loss", 83) == [1.6593]
    assert vals(df, "eval_Prec@1", 83) == [65.214]


def test_sniff(tmp_path):
    """Sniff."""
    (tmp_path / "a.log").write_text("hello\n")
    (tmp_path / "bin.log").write_bytes(b"\x00\x01\x02")
    (tmp_path / "stdout").write_text("whatever\nstep 1 | loss 2.0\n")
    (tmp_path / "notes").write_text("just some words\n")
    (tmp_path / "vocab.txt").write_text("the\nof\nand\n")
    (tmp_path / "main_log.txt").write_text("anything\n")
    (tmp_path / "x.md").write_text("step 1 | loss 2\n")
    assert textlog.sniff(tmp_path / "a.log") and textlog.sniff(tmp_path / "stdout")
    assert textlog.sniff(tmp_path / "main_log.txt")
    assert not textlog.sniff(tmp_path / "bin.log") and not textlog.sniff(tmp_path / "notes")
    assert not textlog.sniff(tmp_path / "vocab.txt") and not textlog.sniff(tmp_path / "x.md")
    assert not textlog.sniff(tmp_path / "missing.log") and not textlog.sniff(tmp_path)


def test_pyrepr():
    """Pyrepr."""
    assert parse_repr("{'a': nan, 'b': -inf, 'c': (1, 2), 'd': None}")["b"] == -math.inf
    ns = parse_repr("Namespace(lr=0.1, betas='(0.9, 0.98)', m=[5])")
    assert ns == {"lr": 0.1, "betas": "(0.9, 0.98)", "m": [5]}
    assert parse_repr("{'a': 1", default="bad") == "bad"


# ---------------------------------------------------------------------------------------------
# The real case logs
# ---------------------------------------------------------------------------------------------
def read_case(cases_dir: Path, case: str, rel: str):
    """Read case."""
    folder = next(cases_dir.glob(case + "_*"))
    path = folder / rel
    assert textlog.sniff(path)
    r = textlog.read(path, folder)
    return r, pl.from_arrow(r.metrics), pl.from_arrow(r.events)


@pytest.mark.cases
def test_case_br06_megatron_override(cases_dir):
    """Case br06 megatron override."""
    r, df, ev = read_case(cases_dir, "br06", "main_log.txt")
    assert vals(df, "loss", 11990, 0) == [2.990254]
    assert vals(df, "grad_norm", 11990, 0) == [89786.465]
    assert vals(df, "lr", 12001, 1) == [5.842e-05]
    assert vals(df, "grad_norm", 12026, 1) == [158630.975]
    assert vals(df, "loss_scale", 12029, 1) == [131072.0]
    assert r.meta["segments"] == 2 and r.meta["precision"] == "fp16"
    assert r.meta["args"]["min_lr"] == 6e-07 and r.meta["args"]["override_lr_scheduler"] is True
    assert len(kinds(ev, "restart")) == 2
    assert "AssertionError: AnnealingLR" in kinds(ev, "error")[0][2]
    assert any("override_lr_scheduler: False -> True" in m for _, _, m in kinds(ev, "config"))
    assert (1, 12000) in [(s, st) for s, st, _ in kinds(ev, "checkpoint_loaded")]


@pytest.mark.cases
def test_case_br14_placeholder_grad_norm(cases_dir):
    """Case br14 placeholder grad norm."""
    r, df, ev = read_case(cases_dir, "br14", "main_log.txt")
    assert vals(df, "grad_norm") == [] and "grad_norm" in r.meta["placeholder_metrics"]
    assert vals(df, "loss_scale", 29050) == [8192.0]
    assert kinds(ev, "nan_detected") == []


@pytest.mark.cases
def test_case_br18_resume_and_data_skip(cases_dir):
    """Case br18 resume and data skip."""
    r, df, ev = read_case(cases_dir, "br18", "main_log.txt")
    assert r.meta["segments"] == 2
    assert df.filter(pl.col("segment") == 1).get_column("step").min() == 16901
    assert [st for _, st, _ in kinds(ev, "checkpoint_loaded")] == [16800, 16900]
    assert kinds(ev, "data_skip")[0][1] == 16651
    assert r.meta["args"]["skip_train_iteration_range"] == ["13251-14000", "16651-19500"]


@pytest.mark.cases
def test_case_br20_nan_tail(cases_dir):
    """Case br20 nan tail."""
    _, df, ev = read_case(cases_dir, "br20", "main_log.txt")
    assert all(math.isnan(vals(df, "loss", s)[0]) for s in (6980, 6990, 7000))
    assert [st for _, st, _ in kinds(ev, "nan_detected")] == [6980, 6990, 7000]
    assert vals(df, "loss", 6970) == [7.554426]


@pytest.mark.cases
def test_case_br30_seconds_and_prefix(cases_dir):
    """Case br30 seconds and prefix."""
    _, df, _ = read_case(cases_dir, "br30", "main_log.txt")
    assert vals(df, "step_time", 42760) == [105.21]
    assert vals(df, "throughput", 42760) == [149.03]
    assert vals(df, "loss_scale") == []


@pytest.mark.cases
def test_case_br30b_ecc_then_second_launch(cases_dir):
    """Case br30b ecc then second launch."""
    _, df, ev = read_case(cases_dir, "br30b", "main_log.txt")
    assert df.get_column("step").max() == 43680
    assert kinds(ev, "hardware_error")[0][:2] == (0, 43680)
    assert kinds(ev, "restart")[0][:2] == (1, 43680)
    assert kinds(ev, "oom")[0][0] == 1


@pytest.mark.cases
def test_case_br10_fairseq(cases_dir):
    """Case br10 fairseq."""
    r, df, ev = read_case(cases_dir, "br10", "train.log")
    assert vals(df, "grad_norm", 700) == [156.036]
    assert r.meta["loss_scale_zero_means_small"] is True
    notes = df.filter((pl.col("metric") == "loss_scale") & (pl.col("tag") == "setting loss scale to"))
    assert notes.filter(pl.col("step") == 700).get_column("value").to_list() == [
        0.00048828125, 0.000244140625, 0.0001220703125]
    assert vals(df, "eval_loss", 695) == [9.393]
    assert [st for _, st, _ in kinds(ev, "checkpoint_loaded")] == [580]
    assert kinds(ev, "error")[0][1] == 700


@pytest.mark.cases
def test_case_br12_metaseq_restarts(cases_dir):
    """Case br12 metaseq restarts."""
    r, df, ev = read_case(cases_dir, "br12", "train.log")
    assert r.meta["segments"] == 4 and r.meta["framework"] == "metaseq"
    assert vals(df, "grad_norm", 39310, 0) == [0.463] and vals(df, "clip", 39310, 0) == [26.0]
    assert vals(df, "loss", 39310, 1) == [3.157]
    assert df.group_by("segment").agg(pl.col("step").min()).get_column("step").to_list() == [39260] * 4
    assert len(kinds(ev, "checkpoint_loaded")) == 4 and len(kinds(ev, "restart")) == 3
    assert len(kinds(ev, "error")) == 3
    assert any("adam_betas" in m for _, _, m in kinds(ev, "config"))


@pytest.mark.cases
def test_case_br02_hf_2x(cases_dir):
    """Case br02 hf 2x."""
    r1, df1, ev1 = read_case(cases_dir, "br02", "logs/train_20200512.log")
    assert vals(df1, "loss", 250) == [7.745917856181768] and vals(df1, "lr", 250) == [4.958915365653246e-05]
    assert r1.meta["hf_total_steps"] == 30425 and r1.meta["args"]["num_train_epochs"] == 5.0
    assert [st for _, st, _ in kinds(ev1, "checkpoint_saved")] == [10000, 20000, 30000]
    r2, df2, ev2 = read_case(cases_dir, "br02", "logs/train_20200514.log")
    assert r2.meta["hf_total_steps"] == 60850 and r2.meta["step_source"] == "logged"
    assert vals(df2, "lr", 30250) == [2.514379622021364e-05]
    assert [(s, st) for s, st, _ in kinds(ev2, "checkpoint_loaded")] == [(0, 30000)]
    assert kinds(ev2, "job_end") and not kinds(ev2, "error")


@pytest.mark.cases
def test_case_br03_custom_resume(cases_dir):
    """Case br03 custom resume."""
    _, df, ev = read_case(cases_dir, "br03", "train.log")
    assert vals(df, "lr", 9, 0) == [0.1] and vals(df, "lr", 10, 1) == [1.0]
    assert vals(df, "loss", 10, 1) == [1.0164]
    assert [(s, st) for s, st, _ in kinds(ev, "checkpoint_loaded")] == [(1, 10)]
    assert kinds(ev, "restart")[0][0] == 1


@pytest.mark.cases
def test_case_br05_imagenet_epochs(cases_dir):
    """Case br05 imagenet epochs."""
    r, df, ev = read_case(cases_dir, "br05", "train.log")
    assert r.meta["step_unit"] == "epoch"
    assert vals(df, "lr", 84, 0) == [0.001] and vals(df, "lr", 84, 1) == [0.1]
    assert vals(df, "loss", 83, 0) == [1.6303] and vals(df, "loss", 84, 0) == [1.6189]
    assert vals(df, "loss", 84, 1) == [2.9398]
    assert [(s, st) for s, st, _ in kinds(ev, "checkpoint_loaded")] == [(1, 84)]


@pytest.mark.cases
def test_case_br21_mlx_ansi(cases_dir):
    """Case br21 mlx ansi."""
    _, df, ev = read_case(cases_dir, "br21", "train.log")
    assert vals(df, "loss", 70) == [2.12239957] and vals(df, "lr", 70) == [1e-4]
    assert vals(df, "eval_loss", 250) == [6.048] and vals(df, "eval_loss", 1) == [2.512]
    assert [st for _, st, _ in kinds(ev, "checkpoint_saved")] == [100, 200, 250]


@pytest.mark.cases
def test_case_br23_custom_stdout(cases_dir):
    """Case br23 custom stdout."""
    _, df, ev = read_case(cases_dir, "br23", "logs/train.out")
    assert vals(df, "loss", 20000) == [0.1549] and vals(df, "grad_norm", 20000) == [1.441]
    assert math.isnan(vals(df, "loss", 55895)[0])
    assert [st for _, st, _ in kinds(ev, "checkpoint_loaded")] == [15000]


@pytest.mark.cases
def test_case_br27_hf_stdout(cases_dir):
    """Case br27 hf stdout."""
    r, df, _ = read_case(cases_dir, "br27", "out_tf4.47.0/train.log")
    assert r.meta["step_source"] == "epoch" and r.meta["versions"]["transformers"] == "4.47.0"
    assert vals(df, "loss", 5) == [10.5949] and vals(df, "grad_norm", 5) == [188.29049682617188]
    assert vals(df, "eval_loss", 20) == [1.6016] and vals(df, "lr", 60) == [0.0]


@pytest.mark.cases
def test_case_br29_hf_deepspeed_stdout(cases_dir):
    """Case br29 hf deepspeed stdout."""
    r, df, _ = read_case(cases_dir, "br29", "train.log")
    assert vals(df, "grad_norm", 115) == [1.4142135623730951] and vals(df, "loss", 115) == [0.0]
    assert vals(df, "grad_norm", 114) == [1.0031307797956182]
    assert r.meta["precision"] == "bf16" and r.meta["deepspeed_config"]["zero_optimization_stage"] == 2


@pytest.mark.cases
def test_every_case_text_file_reads(cases_dir):
    """Every case text file reads."""
    for folder in sorted(p for p in cases_dir.iterdir() if p.is_dir()):
        for path in sorted(folder.rglob("*")):
            if path.is_file() and textlog.sniff(path):
                r = textlog.read(path, folder)
                assert set(pl.from_arrow(r.events).get_column("kind").to_list()) <= EVENT_KINDS, path
