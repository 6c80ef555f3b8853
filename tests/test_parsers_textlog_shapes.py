"""Exact line shapes of torchtitan, NeMo, DeepSpeed (fp16 overflow/hysteresis) and nanoGPT stdout.

Each log below is built with the format strings of the tool's own source (cited in the
``parsers/lines/<tool>.py`` docstrings); ``tests/data/lightning_run/train.log`` is real output of
Lightning's ``TQDMProgressBar`` (the NeMo 1 bar), made by ``tests/data/make_lightning_fixture.py``.
Every test checks exact row counts and values.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path

import polars as pl
import pytest

from forensics.schema import EVENT_KINDS
from parsers import textlog

DATA = Path(__file__).parent / "data"


def parse(tmp_path: Path, text: str, name: str = "train.log"):
    """Write ``text`` and read it with the text-log parser."""
    p = tmp_path / name
    p.write_text(text, encoding="utf-8")
    r = textlog.read(p, tmp_path)
    ev = pl.from_arrow(r.events)
    assert set(ev.get_column("kind")) <= EVENT_KINDS
    return r, pl.from_arrow(r.metrics), ev


def series(df: pl.DataFrame, metric: str) -> list[tuple]:
    """(segment, step, value) of one metric, in file order."""
    return df.filter(pl.col("metric") == metric).select("segment", "step", "value").rows()


def kinds(ev: pl.DataFrame) -> list[tuple]:
    """(segment, step, kind) of every event, in file order."""
    return ev.select("segment", "step", "kind").rows()


# ---------------------------------------------------------------------------------------------
# torchtitan: torchtitan/components/metrics.py, tools/logging.py, tools/utils.py (Color)
# ---------------------------------------------------------------------------------------------
class Color:
    """torchtitan's ``Color`` escape codes (``torchtitan/tools/utils.py``)."""

    red, green, yellow, blue = "\033[31m", "\033[32m", "\033[33m", "\033[34m"
    magenta, cyan, reset = "\033[35m", "\033[36m", "\033[39m"
    orange, turquoise = "\033[38;2;180;60;0m", "\033[38;2;54;234;195m"


C = Color()


def titan(when: str, msg: str, rank: int | None = None) -> str:
    """One line of the ``[titan] %(asctime)s - %(name)s - %(levelname)s - %(message)s`` logger."""
    return (f"[rank{rank}]:" if rank is not None else "") + f"[titan] 2026-03-01 {when},123 - root - INFO - {msg}\n"


def titan_2026(step, loss, gn, gib, pct, tps, tflops, mfu) -> str:
    """The training line since 2026-02 (grad_norm, ``loss:8.5f``, ``mfu: N/A``)."""
    mfu_str = f"{mfu:.2f}%" if mfu is not None else "N/A"
    return (f"{C.red}step: {step:2}  {C.green}loss: {loss:8.5f}  {C.orange}grad_norm: {gn:7.4f}  "
            f"{C.turquoise}memory: {gib:5.2f}GiB({pct:.2f}%)  {C.blue}tps: {round(tps):,}  "
            f"{C.cyan}tflops: {tflops:,.2f}  {C.magenta}mfu: {mfu_str}{C.reset}")


def titan_2025(step, loss, gib, pct, tps, tflops, mfu) -> str:
    """The training line of 2025-03..06 (tps and tflops, no grad_norm, ``loss:7.4f``)."""
    return (f"{C.red}step: {step:2}  {C.green}loss: {loss:7.4f}  {C.turquoise}memory: {gib:5.2f}GiB"
            f"({pct:.2f}%)  {C.blue}tps: {round(tps):,}  {C.cyan}tflops: {tflops:,.2f}  "
            f"{C.magenta}mfu: {mfu:.2f}%{C.reset}")


def titan_2024(step, loss, gib, pct, wps, mfu) -> str:
    """The training line of train.py in 2024 (``wps``)."""
    return (f"{C.cyan}step: {step:2}  {C.green}loss: {loss:7.4f}  {C.yellow}memory: {gib:5.2f}GiB"
            f"({pct:.2f}%)  {C.blue}wps: {round(wps):,}  {C.magenta}mfu: {mfu:.2f}%{C.reset}")


def titan_validate(step, loss, gib, pct, tps) -> str:
    """``MetricsProcessor.log_validation``."""
    return (f"{C.yellow}validate step: {step:2}  {C.green}loss: {loss:7.4f}  {C.turquoise}memory: {gib:5.2f}GiB"
            f"({pct:.2f}%)  {C.blue}tps: {round(tps):,}{C.reset}")


def test_torchtitan_three_line_versions(tmp_path):
    """The 2024, 2025 and 2026 training lines, with ANSI colours and a torchrun rank prefix."""
    text = (titan("10:00:01", titan_2024(1, 10.8765, 21.5, 27.13, 1234.4, 12.345))
            + titan("10:00:02", titan_2025(10, 9.1234, 21.5, 27.13, 8521.7, 123.456, 31.2), rank=0)
            + titan("10:00:03", titan_2026(20, 8.123456, 1.2345, 21.5, 27.13, 12345.6, 1234.567, None), rank=0))
    assert "\033[38;2;180;60;0m" in text and "mfu: N/A" in text and "tps: 12,346" in text
    r, df, ev = parse(tmp_path, text)
    assert r.meta["framework"] == "torchtitan" and r.precision == "%.4f" and r.meta["segments"] == 1
    assert df.height == 5 + 6 + 6
    assert df.select("step", "metric", "value", "tag").rows() == [
        (1, "loss", 10.8765, "loss"), (1, "memory_reserved_gib", 21.5, "memory"),
        (1, "memory_reserved_pct", 27.13, "memory %"), (1, "throughput", 1234.0, "wps"), (1, "mfu", 12.35, "mfu"),
        (10, "loss", 9.1234, "loss"), (10, "memory_reserved_gib", 21.5, "memory"),
        (10, "memory_reserved_pct", 27.13, "memory %"), (10, "throughput", 8522.0, "tps"),
        (10, "tflops", 123.46, "tflops"), (10, "mfu", 31.2, "mfu"),
        (20, "loss", 8.12346, "loss"), (20, "grad_norm", 1.2345, "grad_norm"),
        (20, "memory_reserved_gib", 21.5, "memory"), (20, "memory_reserved_pct", 27.13, "memory %"),
        (20, "throughput", 12346.0, "tps"), (20, "tflops", 1234.57, "tflops"),
    ]
    t0 = 1772359201.123  # 2026-03-01 10:00:01,123 UTC
    assert df.filter(pl.col("step") == 1).get_column("wall_time").unique().to_list() == [pytest.approx(t0)]
    assert ev.height == 0


def test_torchtitan_run_with_nan_crash_and_resume(tmp_path):
    """A torchtitan job: checkpoints, validation, a NaN step, a traceback, then a relaunch from step-20."""
    text = (titan("10:00:00", "Starting job: Llama 3 debug training")
            + titan("10:00:01", "Training starts at step 1")
            + titan("10:00:02", titan_2026(1, 10.9, 3.5, 2.1, 10.0, 900, 1.5, 0.42))
            + titan("10:00:03", titan_2026(10, 9.5, 2.5, 2.1, 10.0, 1500, 2.5, 0.71))
            + titan("10:00:04", titan_2026(20, 8.5, 1.5, 2.1, 10.0, 1500, 2.5, 0.71))
            + titan("10:00:05", "Saving the checkpoint (or staging if async is enabled).")
            + titan("10:00:06", titan_validate(20, 8.75, 2.2, 10.5, 4000))
            + titan("10:00:07", titan_2026(30, math.nan, math.inf, 2.1, 10.0, 1500, 2.5, 0.71))
            + "Traceback (most recent call last):\n  File \"train.py\", line 1, in <module>\n"
              "RuntimeError: loss is NaN\n"
            + titan("11:00:00", "torchtitan version: 0.3.0 (0.0.0 means __version__ is not defined correctly).")
            + titan("11:00:01", "Loading the checkpoint from ./outputs/checkpoint/step-20.")
            + titan("11:00:02", "Finished loading the checkpoint in 1.23 seconds.")
            + titan("11:00:03", "Training starts at step 21")
            + titan("11:00:04", titan_2026(30, 8.25, 1.25, 2.1, 10.0, 1500, 2.5, 0.71))
            + titan("11:00:05", "Saving a full checkpoint at last step, step 30.")
            + titan("11:00:06", "Training completed"))
    r, df, ev = parse(tmp_path, text)
    assert r.meta["segments"] == 2 and not r.skipped
    loss = series(df, "loss")
    assert loss[:3] == [(0, 1, 10.9), (0, 10, 9.5), (0, 20, 8.5)] and loss[4] == (1, 30, 8.25)
    assert loss[3][:2] == (0, 30) and math.isnan(loss[3][2])
    assert series(df, "grad_norm")[3] == (0, 30, math.inf)
    assert series(df, "eval_loss") == [(0, 20, 8.75)] and series(df, "eval_throughput") == [(0, 20, 4000.0)]
    assert len(series(df, "mfu")) == 5 and df.height == 5 * 7 + 4
    assert kinds(ev) == [(0, 20, "checkpoint_saved"), (0, 30, "nan_detected"), (0, 30, "error"),
                         (1, 30, "restart"), (1, 20, "checkpoint_loaded"), (1, 30, "checkpoint_saved"),
                         (1, 30, "job_end")]


# ---------------------------------------------------------------------------------------------
# NeMo 2 ProgressPrinter (nemo/lightning/pytorch/callbacks/progress_printer.py)
# ---------------------------------------------------------------------------------------------
def printer(n: int, total: int, metrics: dict) -> str:
    """One ``ProgressPrinter`` line: whole floats as ints, other values ``{:.4}``."""
    s = f"Training epoch 0, iteration {n - 1}/{total - 1}"
    for k, v in metrics.items():
        s += f" | {k}: {int(v)}" if isinstance(v, float) and v.is_integer() else f" | {k}: {v:.4}"
    return s + "\n"


def nemo_metrics(step: int, loss: float, val: float | None = None) -> dict:
    """The progress-bar metrics a NeMo 2 GPT pretraining logs (``val_loss`` stays after a validation)."""
    d = {"lr": 1.5e-5 * (step + 1), "global_batch_size": 8.0, "global_step": float(step),
         "reduced_train_loss": loss, "train_step_timing in s": 0.31171, "consumed_samples": 8.0 * (step + 1)}
    if val is not None:
        d["val_loss"] = val
    return d


def test_nemo2_progress_printer_lines(tmp_path):
    """Rank prefixes, 4 significant digits, whole floats as ints, val_loss once per new value, NaN."""
    lines = [printer(1, 100, nemo_metrics(0, 11.0312)), printer(2, 100, nemo_metrics(1, 10.98765)),
             "Validation: iteration 1/2\n", "Validation: iteration 2/2\n",
             printer(3, 100, nemo_metrics(2, 10.5, val=10.954321)), printer(4, 100, nemo_metrics(3, 10.25, 10.954321)),
             "[NeMo I 2025-03-01 10:00:05 model_checkpoint:657] Async checkpoint save for step 4 "
             "(/results/default/checkpoints/default--reduced_train_loss=10.2500-epoch=0-step=3-last.ckpt) "
             "finalized successfully.\n",
             printer(5, 100, nemo_metrics(4, math.nan, 10.954321)),
             printer(6, 100, nemo_metrics(5, math.nan, 10.954321))]
    assert lines[0] == ("Training epoch 0, iteration 0/99 | lr: 1.5e-05 | global_batch_size: 8 | global_step: 0 | "
                        "reduced_train_loss: 11.03 | train_step_timing in s: 0.3117 | consumed_samples: 8\n")
    prefixed = [f"[default0]:{line}" if i % 2 else f"0: {line}" for i, line in enumerate(lines)]
    r, df, ev = parse(tmp_path, "".join(prefixed))
    assert r.meta["framework"] == "nemo" and r.precision == "%.4g" and r.meta["segments"] == 1
    assert [(s, v) for _, s, v in series(df, "loss")][:4] == [(0, 11.03), (1, 10.99), (2, 10.5), (3, 10.25)]
    assert all(math.isnan(v) for _, _, v in series(df, "loss")[4:]) and len(series(df, "loss")) == 6
    assert series(df, "lr")[:2] == [(0, 0, 1.5e-05), (0, 1, 3e-05)]
    assert series(df, "step_time")[0] == (0, 0, 0.3117) and series(df, "samples")[5] == (0, 5, 48.0)
    assert series(df, "eval_loss") == [(0, 2, 10.95)]
    assert df.height == 6 * 5 + 1 and "global_step" not in set(df.get_column("metric"))
    assert kinds(ev) == [(0, 4, "checkpoint_saved"), (0, 4, "nan_detected")]


def test_nemo_resume_lines_start_a_segment(tmp_path):
    """Lightning's ``Restoring states ...`` line: a resume at the ``step=N`` of the checkpoint path."""
    ckpt = "/results/default/checkpoints/default--reduced_train_loss=10.2500-epoch=0-step=3-last.ckpt"
    text = (printer(3, 100, nemo_metrics(2, 10.5)) + printer(4, 100, nemo_metrics(3, 10.25))
            + printer(5, 100, nemo_metrics(4, 10.0))
            + f"[NeMo I 2025-03-01 11:00:00 exp_manager:1051] Resuming training from checkpoint: {ckpt}\n"
            + f"Restoring states from the checkpoint path at {ckpt}\n"
            + printer(5, 100, nemo_metrics(4, 10.125)))
    r, df, ev = parse(tmp_path, text)
    assert r.meta["segments"] == 2
    assert series(df, "loss") == [(0, 2, 10.5), (0, 3, 10.25), (0, 4, 10.0), (1, 4, 10.12)]
    assert kinds(ev) == [(1, 3, "checkpoint_loaded")]


def test_lightning_bar_log_real_nemo1_shape():
    """Lightning's TQDMProgressBar (the NeMo 1 bar) from a real run: every 5th step, NaN from step 1050."""
    root = DATA / "lightning_run"
    r = textlog.read(root / "train.log", root)
    df, ev = pl.from_arrow(r.metrics), pl.from_arrow(r.events)
    assert r.meta["framework"] == "nemo" and r.meta["segments"] == 1 and not r.skipped
    loss = series(df, "loss")
    assert [s for _, s, _ in loss] == list(range(4, 1100, 5))  # global_step = bar position - 1
    assert sum(math.isnan(v) for _, _, v in loss) == 10 and all(math.isnan(v) for _, s, v in loss if s >= 1054)
    assert loss[0] == (0, 4, 3.07) and dict((s, v) for _, s, v in loss)[1004] == 0.127  # from global_step=1e+3
    assert series(df, "eval_loss") == [(0, 499, 0.471), (0, 999, 0.263)]
    assert dict((s, v) for _, s, v in series(df, "samples"))[999] == 4000.0  # printed as 4e+3
    assert df.height == 220 + 220 + 2
    assert kinds(ev) == [(0, 1054, "nan_detected")]
    # the bar shows the CSV logger's values rounded by tqdm ({:.3g}) where both logged the same step
    with open(root / "csv/version_0/metrics.csv", newline="") as fh:
        exact = {int(row["step"]): float(row["reduced_train_loss"]) for row in csv.DictReader(fh)
                 if row["reduced_train_loss"]}
    bar = dict((s, v) for _, s, v in loss)
    both = sorted(set(exact) & set(bar))
    assert len(both) == 110
    for s in both:
        assert (math.isnan(bar[s]) and math.isnan(exact[s])) or bar[s] == float(f"{exact[s]:.3g}"), s


# ---------------------------------------------------------------------------------------------
# DeepSpeed fp16 loss scaler (deepspeed/runtime/fp16/loss_scaler.py, fused_optimizer.py)
# ---------------------------------------------------------------------------------------------
def test_deepspeed_hysteresis_and_overflow_messages(tmp_path):
    """Hysteresis skips keep the scale; a scale cut changes it; bf16 overflows print no scale."""
    ts = "[2025-02-21 12:05:{:02d},123] [INFO] "
    text = (ts.format(1) + "[logging.py:128:log_dist] [Rank 0] step=10, skipped=0, lr=[0.0003], mom=[(0.9, 0.999)]\n"
            + ts.format(2) + "[loss_scaler.py:183:update_scale] [deepspeed] OVERFLOW! Rank 0 Skipping step. "
                             "Attempted loss scale: 65536, but hysteresis is 2. Reducing hysteresis to 1\n"
            + ts.format(3) + "[loss_scaler.py:183:update_scale] [deepspeed] OVERFLOW! Rank 0 Skipping step. "
                             "Attempted loss scale: 65536, reducing to 32768\n"
            + ts.format(4) + "[loss_scaler.py:190:update_scale] Consecutive hysteresis is enabled. "
                             "Restoring hysteresis to 2\n"
            + ts.format(5) + "[logging.py:128:log_dist] [Rank 0] step=20, skipped=2, lr=[0.00029], mom=[(0.9, 0.999)]\n"
            + ts.format(6) + "[loss_scaler.py:183:update_scale] [deepspeed] OVERFLOW! Rank 0 Skipping step.\n"
            + ts.format(7) + "[fused_optimizer.py:270:step] [Rank 0] Overflow detected. Skipping step. Attempted "
                             "loss scale: 32768.0, reducing to 16384.0\n"
            + ts.format(8) + "[logging.py:128:log_dist] [Rank 0] step=30, skipped=4, lr=[0.00028], mom=[(0.9, 0.999)]\n"
            + "No Grad overflow for 1000 iterations\n")
    r, df, ev = parse(tmp_path, text)
    assert r.meta["framework"] == "deepspeed"
    assert series(df, "skipped_step") == [(0, 10, 0.0), (0, 20, 2.0), (0, 30, 2.0)]
    assert series(df, "lr") == [(0, 10, 0.0003), (0, 20, 0.00029), (0, 30, 0.00028)]
    assert series(df, "loss_scale") == [(0, 10, 65536.0), (0, 10, 32768.0), (0, 20, 16384.0)]
    assert df.height == 9
    assert kinds(ev) == [(0, 10, "overflow_skip"), (0, 10, "overflow_skip"), (0, 10, "loss_scale_change"),
                         (0, 20, "overflow_skip"), (0, 20, "overflow_skip"), (0, 20, "loss_scale_change")]
    assert ev.get_column("message")[0].endswith("but hysteresis is 2. Reducing hysteresis to 1")


# ---------------------------------------------------------------------------------------------
# nanoGPT (karpathy/nanoGPT:train.py)
# ---------------------------------------------------------------------------------------------
def test_nanogpt_log(tmp_path):
    """The shakespeare_char run's stdout: eval lines, iter lines, the -100% MFU placeholder, a resume."""
    def it(n, loss, ms, mfu):
        return f"iter {n}: loss {loss:.4f}, time {ms:.2f}ms, mfu {mfu * 100:.2f}%\n"

    text = ("tokens per iteration will be: 16,384\n"
            "found vocab_size = 65 (inside data/shakespeare_char/meta.pkl)\n"
            "Initializing a new model from scratch\nnumber of parameters: 10.65M\n"
            "num decayed parameter tensors: 26, with 10,740,096 parameters\n"
            "num non-decayed parameter tensors: 13, with 4,992 parameters\nusing fused AdamW: True\n"
            "compiling the model... (takes a ~minute)\n"
            "step 0: train loss 4.2874, val loss 4.2823\n"
            + it(0, 4.2654, 29893.44, -1.0) + it(10, 3.1462, 94.45, -1.0) + it(50, 2.5021, 95.1, 0.0395)
            + "step 100: train loss 2.1022, val loss 2.1563\nsaving checkpoint to out-shakespeare-char\n"
            + it(100, 2.0417, 14029.63, 0.0356) + it(110, math.nan, 95.0, 0.0357)
            + "Resuming training from out-shakespeare-char\n"
            + "step 100: train loss 2.1020, val loss 2.1561\n" + it(100, 2.0411, 30012.5, -1.0))
    r, df, ev = parse(tmp_path, text)
    assert r.meta["framework"] == "nanogpt" and r.meta["segments"] == 2 and r.precision == "%.4f"
    loss = series(df, "loss")
    assert loss[:4] == [(0, 0, 4.2654), (0, 10, 3.1462), (0, 50, 2.5021), (0, 100, 2.0417)]
    assert loss[4][:2] == (0, 110) and math.isnan(loss[4][2]) and loss[5] == (1, 100, 2.0411)
    assert series(df, "mfu") == [(0, 50, 3.95), (0, 100, 3.56), (0, 110, 3.57)]
    assert series(df, "step_time")[0] == (0, 0, pytest.approx(29.89344))
    assert series(df, "eval_loss") == [(0, 0, 4.2823), (0, 100, 2.1563), (1, 100, 2.1561)]
    assert series(df, "eval_train_loss") == [(0, 0, 4.2874), (0, 100, 2.1022), (1, 100, 2.102)]
    assert df.height == 6 + 6 + 3 + 6
    assert kinds(ev) == [(0, 100, "checkpoint_saved"), (0, 110, "nan_detected"), (1, 110, "checkpoint_loaded")]


# ---------------------------------------------------------------------------------------------
# Damage: a log cut mid-line (killed job) keeps every complete line and lists the cut
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["hf_trainer_run/train.log", "lightning_run/train.log"])
@pytest.mark.parametrize("fraction", [0.25, 0.5, 0.9])
def test_real_logs_cut_short(tmp_path, name, fraction):
    """The real stdout logs cut inside a line: the rows before the cut are the full log's, one Skip names the line."""
    src = DATA / name
    data = src.read_bytes()
    cut = int(len(data) * fraction)
    while data[cut - 1:cut] in (b"\n", b"\r", b" "):
        cut += 1
    p = tmp_path / "train.log"
    p.write_bytes(data[:cut])
    full = pl.from_arrow(textlog.read(src, src.parent).metrics).select("segment", "step", "metric", "value")
    r = textlog.read(p, tmp_path)
    part = pl.from_arrow(r.metrics).select("segment", "step", "metric", "value")
    assert part.height > 0 and len(r.skipped) == 1
    line = data[:cut].count(b"\n") + 1
    assert r.skipped[0].what == f"train.log:{line}" and "unterminated last line" in r.skipped[0].reason
    # every row read from the cut log is a row of the full log (the last step may hold fewer metrics)
    full_rows = {tuple(map(repr, row)) for row in full.rows()}
    assert all(tuple(map(repr, row)) in full_rows for row in part.rows())


def test_torchtitan_and_nemo_cut_and_garbled_lines(tmp_path):
    """A line cut by an interleaved write is not read as a metric line; the lines around it are."""
    good = titan("10:00:02", titan_2026(10, 9.5, 2.5, 2.1, 10.0, 1500, 2.5, 0.71))
    warning = "[titan] 2026-03-01 10:00:02,500 - root - WARNING - 2 CUDA memory allocation retries.\n"
    nemo = printer(2, 100, nemo_metrics(1, 10.5))
    text = (titan("10:00:01", titan_2026(1, 10.9, 3.5, 2.1, 10.0, 900, 1.5, 0.42)) + good[: len(good) // 2] + warning
            + titan("10:00:03", titan_2026(20, 8.5, 1.5, 2.1, 10.0, 1500, 2.5, 0.71))
            + printer(1, 100, nemo_metrics(0, 11.0312)) + nemo[:60] + nemo + nemo[:40])
    r, df, _ = parse(tmp_path, text)
    # the cut NeMo line runs into the next one (no newline between them): the pair is one damaged line
    assert series(df, "loss") == [(0, 1, 10.9), (0, 20, 8.5), (1, 0, 11.03)]
    assert [(s.what, s.reason.split(" (")[0]) for s in r.skipped] == [
        ("train.log:2", "torchtitan metric line that does not parse"),
        ("train.log:5", "NeMo progress line that does not parse"), ("train.log:6", "unterminated last line")]
