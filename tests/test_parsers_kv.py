"""The general metric reader (parsers/lines/kv.py).

Its grammar, one line and a block giving the same rows, the bulk path of parsers.textlog giving the rows
of the one-by-one path, ranks and script dumps.
"""

from __future__ import annotations

import math
from pathlib import Path

import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parsers import textlog
from parsers.lines import kv, kv_bulk


def one(line: str):
    """(step, {metric: value}) of one line, or None."""
    r = kv.parse_line(line, {})
    if r is not None and not r.metrics:  # a step header: read one by one only (it sets the step of the
        return None                      # lines below it; parsers.textlog never reads its shape in bulk)
    return None if r is None else (r.step, {m: v for m, _, v in r.metrics})


def block(lines: list[str]):
    """What read_block reads from the candidate lines (as parsers.textlog sends them), as one() says."""
    s = pl.Series(lines, dtype=pl.Utf8)
    cand = (s.str.contains(kv.CANDIDATE) & ~s.str.contains(kv.CODE)).arg_true().to_list()
    ld, md = kv_bulk.read_block(s.gather(cand), None, {})
    steps = dict(ld.select("line", "step").iter_rows())
    out: list = [None] * len(lines)
    for i in steps:
        out[cand[i]] = (steps[i], {})
    for i, m, _, v in md.iter_rows():
        out[cand[i]][1][m] = v
    return out


@pytest.mark.parametrize(("line", "step", "expect"), [
    ("step:12/6200 train_loss:3.2785 train_time:1234ms step_avg:102.8ms", 12,
     {"loss": 3.2785, "train_time": 1234.0, "step_avg": 102.8}),
    ("epoch: 0|step: 7|ppo_ep: 1|act_loss: 0.2099|cri_loss: 0.1204|unsuper_loss: 0.0", 7,
     {"epoch": 0.0, "ppo_ep": 1.0, "loss/act": 0.2099, "loss/cri": 0.1204, "loss/unsuper": 0.0}),
    ("iter 40: loss 3.5012, time 1431.27ms, mfu 0.01%", 40, {"loss": 3.5012, "time": 1431.27, "mfu": 0.01}),
    ("step=5, loss=NaN, lr=[5e-05, 5e-05], grad_norm=INF", 5, {"loss": math.nan, "lr": 5e-05, "grad_norm": math.inf}),
    ("[2024-05-01 10:00:00] step 9\tloss 1.25\tlr 1e-4", 9, {"loss": 1.25, "lr": 1e-4}),
    ("global_step 100  total_loss 2.50  tokens 1.5M  throughput 12,345", 100,
     {"loss": 2.5, "tokens": 1.5e6, "throughput": 12345.0}),
    ('INFO {"iteration": 3, "sft/loss/avg": 0.75, "val/loss": 0.8}', 3, {"loss": 0.75, "eval_loss": 0.8}),
    ("{'global_step': 4, 'loss_metrics/global_avg_loss': 1.5, 'train/box_loss': 0.2}", 4,
     {"loss": 1.5, "loss/box": 0.2}),
    ("Iter(train) [50/500]  lr: 1.0000e-04  loss: 2.3456  loss_cls: 1.2", 50,
     {"lr": 1e-4, "loss": 2.3456, "loss/cls": 1.2}),
    ("chosen: 0.0, rejected: 0.0, loss: 0.693359375", None, {"chosen": 0.0, "rejected": 0.0, "loss": 0.693359375}),
    ("ppl: 2.0179834365844727", None, {"ppl": 2.0179834365844727}),
    ("Epoch 3 | train loss 1.20 | val loss 1.31", 3, {"epoch": 3.0, "loss": 1.2, "eval_loss": 1.31}),
    ("acc (higher is better) : 0.49, step 3", 3, {"acc": 0.49}),
    ("[100/200000] Train loss: 0.00414, Valid loss: 0.00665", 100, {"loss": 0.00414, "eval_loss": 0.00665}),
    ("Epoch[002/100], Step[0100/0196], Avg Loss: 0.9829", 2 * 196 + 100, {"epoch": 2.0, "loss": 0.9829}),
    ("2023/06/05 20:10:13 - mmengine - INFO - Epoch(train)   [3][50/500]  lr: 4.0e-05  loss: 0.4219", 3 * 500 + 50,
     {"epoch": 3.0, "lr": 4e-05, "loss": 0.4219}),
    ("Epoch [2][ 7/10]  loss: 1.5", 2 * 10 + 7, {"epoch": 2.0, "loss": 1.5}),
    ("Epoch: [3]  [ 50/500]  loss: 0.4", 3 * 500 + 50, {"epoch": 3.0, "loss": 0.4}),
    ("[0/25][100/782]\tLoss_D: 1.8 Loss_G: 4.4", 100, {"epoch": 0.0, "loss/d": 1.8, "loss/g": 4.4}),
    ("[2024-09-24 09:36:48 ViT-B/16] (main.py 188): INFO Train: [3/50][2/6]\teta 0:08:30 lr 0.0001\ttot_loss 0.4772",
     3 * 6 + 2, {"epoch": 3.0, "lr": 1e-4, "loss/tot": 0.4772}),  # eta 0:08:30 is a duration, not eta = 0
    ("2023-05-01 10:00:01,123 epoch 2 - iter 14/149 - loss 0.58347536 - time (sec): 1.23 - samples/sec: 512.33 - "
     "lr: 0.100000", 2 * 149 + 14, {"epoch": 2.0, "loss": 0.58347536, "time": 1.23, "samples/sec": 512.33,
                                    "lr": 0.1}),  # flair: the iteration counter restarts every epoch
    ("Epoch: 3, Iter: 7/20, loss: 1.5", 3 * 20 + 7, {"epoch": 3.0, "loss": 1.5}),
    ("step: 40  eta: 4:59:11  loss: 2.9600  time: 0.31", 40, {"loss": 2.96, "time": 0.31}),
    ("step 41 | eta 1 day, 4:59:11 | loss 2.5", 41, {"loss": 2.5}),
    ("step=42, loss=2.4, elapsed=10 days, 0:00:01, lr=0.1", 42, {"loss": 2.4, "lr": 0.1}),
])
def test_grammar(line, step, expect):
    """Each grammar the issue names: separators, fractions, dicts, units, nan/inf, notes, step-less loss lines."""
    got = one(line)
    assert got is not None and got[0] == step
    assert got[1].keys() == expect.keys()
    for k, v in expect.items():
        assert (math.isnan(got[1][k]) and math.isnan(v)) or got[1][k] == pytest.approx(v), k
    assert block([line]) == [got] or all(  # NaN != NaN: compare the keys and the finite values
        b[0] == got[0] and b[1].keys() == got[1].keys() for b in block([line]))


@pytest.mark.parametrize("line", [
    "def zeropower_via_newtonschulz5(G, steps=10, eps=1e-7):",
    "        val_loss = 0.0",
    "    if step == 10:",
    "Loading 5 files",
    "Total optimization steps = 1000",
])
def test_not_metric_lines(line):
    """Script source and prose are not metric lines."""
    assert one(line) is None


_KEYS = st.sampled_from(["step", "iter", "loss", "train_loss", "lr", "grad_norm", "val loss", "tokens", "x/lr0",
                         "epoch", "loss_cls", "mfu", "ppl", "current_steps", "throughput"])
_VALS = st.one_of(st.integers(0, 10**6).map(str), st.floats(-1e6, 1e6, allow_nan=False).map(lambda f: f"{f:.4g}"),
                  st.sampled_from(["nan", "NaN", "inf", "-inf", "1,234", "1.5e-05", "3.2K", "12ms", "45%", "7/100",
                                   "4:59:11", "1 day, 0:02:03"]))
_SEPS = st.sampled_from([": ", "=", " ", ":", " = "])
_JOIN = st.sampled_from([" | ", ", ", "\t", "  ", " ", "|"])


@st.composite
def _lines(draw):
    n = draw(st.integers(1, 6))
    pairs = [f"{draw(_KEYS)}{draw(_SEPS)}{draw(_VALS)}" for _ in range(n)]
    pre = draw(st.sampled_from(["", "[rank0]: ", "2024-01-01 10:00:00,123 INFO ", "{", "[step] "]))
    return pre + draw(_JOIN).join(pairs)


@settings(max_examples=300, deadline=None)
@given(st.lists(_lines(), min_size=1, max_size=30))
def test_line_and_block_agree(lines):
    """parse_line and parse_block/frames_of read the same steps and values (the bulk path's contract)."""
    lines = [textlog.common.clean(x) for x in lines]
    got = block(lines)
    for line, b in zip(lines, got, strict=True):
        a = one(line)
        if a is None or b is None:
            assert a == b, line
            continue
        assert a[0] == b[0] and a[1].keys() == b[1].keys(), line
        for k in a[1]:
            assert (math.isnan(a[1][k]) and math.isnan(b[1][k])) or a[1][k] == b[1][k], (line, k)


def _read(tmp_path: Path, text: str, long_run: int) -> tuple[pl.DataFrame, dict]:
    p = tmp_path / "train.log"
    p.write_text(text)
    old, small = textlog._Reader.LONG_RUN, textlog._Reader.SMALL
    textlog._Reader.LONG_RUN = long_run
    textlog._Reader.SMALL = 0 if long_run < 10**9 else 10**9  # bulk path vs one by one for every line
    try:
        r = textlog.read(p, tmp_path)
    finally:
        textlog._Reader.LONG_RUN, textlog._Reader.SMALL = old, small
    df = pl.from_arrow(r.metrics).sort(["segment", "step", "metric"], maintain_order=True)
    return df, dict(r.meta)


def test_bulk_rows_equal_one_by_one(tmp_path):
    """The block path (runs read by arrays) gives the rows of the one-by-one path.

    Steps that go back, step-less lines, wall times; script source counted.
    """
    lines = ["import os", "def f(x):", "    return x"]
    for i in range(300):
        lines.append(f"2024-01-01 10:{i // 60:02d}:{i % 60:02d} step {i % 200} | loss {1 + i / 1000:.4f} | lr 1e-4")
        if i % 50 == 7:
            lines.append(f"eval loss: {2 + i / 1000:.3f}")
    text = "\n".join(lines) + "\n"
    bulk, meta = _read(tmp_path, text, 8)
    single, _ = _read(tmp_path, text, 10**9)
    assert bulk.equals(single)
    assert bulk.get_column("segment").max() == 1  # the step went back at i = 200
    assert meta["skipped_lines"]["script source"] == 3


def test_script_dump_then_metrics(tmp_path):
    """Metric lines after more than 64 KiB of printed source are found by sniff and read."""
    src = "".join(f"def f{i}(x):\n    step = x + {i}\n    return step\n" for i in range(3000))
    p = tmp_path / "run.txt"
    p.write_text(src + "".join(f"step:{i}/100 train_loss:{3 - i / 100:.4f} train_time:{i}ms\n" for i in range(100)))
    assert p.stat().st_size > 64 * 1024 and textlog.sniff(p)
    r = textlog.read(p, tmp_path)
    df = pl.from_arrow(r.metrics)
    assert df.filter(pl.col("metric") == "loss").height == 100
    assert r.meta["total_steps"] == 100 and r.meta["units"]["train_time"] == "ms"


def test_interleaved_ranks_no_restart(tmp_path):
    """Eight ranks printing the same steps: one row per (step, metric), no segment, ranks counted."""
    lines = []
    for step in range(20):
        for rank in (3, 0, 7, 1):
            lines.append(f"[rank{rank}]: step {step} | loss {2 - step / 100:.3f}")
    _, df, _ = (None, *_rows(tmp_path, "\n".join(lines) + "\n"))
    assert df.get_column("segment").max() == 0
    assert df.filter(pl.col("metric") == "loss").height == 20


def _rows(tmp_path: Path, text: str):
    p = tmp_path / "ranks.log"
    p.write_text(text)
    r = textlog.read(p, tmp_path)
    return pl.from_arrow(r.metrics), r.meta


@pytest.mark.parametrize("line", ['{"step": 1e30, "loss": 1.5}', "step 9223372036854775808 loss 2.0",
                                  "step: 9.3e18/10 loss: 2", "{'step': -9.3e18, 'loss': 2}"])
def test_step_outside_int64_is_skipped_not_a_crash(line: str, tmp_path: Path) -> None:
    """A step no int64 holds (found by the fuzz in test_robustness) leaves that line out, counted; the rest is read."""
    from parsers import textlog

    log = tmp_path / "train.log"
    log.write_text(f"{line}\nstep 1 loss 2\nstep 2 loss 1.9\n")
    got = textlog.read(log, tmp_path)
    assert got.metrics.column("step").to_pylist() == [1, 2]
    assert got.meta["skipped_lines"]["step outside int64 (not a step)"] == 1


_KINDS = st.sampled_from(["{i}", "{f:.4f}", "{e:.2e}", "nan", "{i}ms", "{i}/{j}", "{f:.1f}%", "{i}K", "-{f:.3f}",
                          "{i}:{j:02d}:{i:02d}"])


@st.composite
def _shaped(draw):
    """Lines of a few shapes, each repeated with other numbers (the bulk path's plans read them)."""
    out = []
    for _ in range(draw(st.integers(1, 3))):
        pairs = [(draw(_KEYS), draw(_SEPS), draw(_KINDS)) for _ in range(draw(st.integers(1, 5)))]
        pre = draw(st.sampled_from(["", "2024-01-01 10:00:00,123 INFO ", "{", "[step] ", "[3/10] "]))
        join = draw(_JOIN)
        for _ in range(draw(st.integers(8, 12))):
            vals = [kind.format(i=draw(st.integers(0, 5000)), j=draw(st.integers(1, 5000)),
                                f=draw(st.floats(0, 1e4)), e=draw(st.floats(1e-6, 1e3))) for _, _, kind in pairs]
            out.append(pre + join.join(f"{k}{s}{v}" for (k, s, _), v in zip(pairs, vals, strict=True)))
    return draw(st.permutations(out))


@settings(max_examples=200, deadline=None)
@given(_shaped())
def test_line_and_planned_block_agree(lines):
    """Shapes shared by many lines are read by plans (one number scan); they read what parse_line reads."""
    test_line_and_block_agree.hypothesis.inner_test(lines)


@pytest.mark.parametrize("long_run", [8, 10**9])
def test_step_back_of_another_counter_is_not_a_restart(tmp_path, long_run):
    """A restart is judged per counter: another counter's step going back is not one.

    DeepSpeed's ``step=10`` among PPO's ``step: 9`` is not a restart; PPO's own step going back is (on the
    bulk path and one line at a time).
    """
    lines = []
    for _launch in range(2):
        for i in range(120):
            lines.append(f"epoch: 0|step: {i}|ppo_ep: 1|act_loss: {0.2 + i / 1000:.4f}|cri_loss: 0.1")
            if i % 10 == 8:  # the engines count ahead of the script's own counter (as in the real log)
                lines.append(f"[2023-04-18 08:48:36,035] [INFO] [logging.py:96:log_dist] [Rank 0] step={i + 2}, "
                             f"skipped=4, lr=[5.79e-07, 5.79e-07], mom=[(0.9, 0.95), (0.9, 0.95)]")
                lines.append(f"step={i + 2} tokens_per_sec={1000 + i}")
    df, _ = _read(tmp_path, "\n".join(lines) + "\n", long_run)
    assert df.get_column("segment").max() == 1  # only PPO's step 119 -> 0
    loss = df.filter(pl.col("tag") == "act_loss")
    assert loss.height == 240 and loss.filter(pl.col("segment") == 1).get_column("step").min() == 0


@pytest.mark.parametrize("long_run", [8, 10**9])
def test_epoch_line_among_finer_steps_belongs_to_the_last_step(tmp_path, long_run):
    """An epoch-indexed line among finer steps belongs to the last step seen; alone, the epoch is the step.

    PaddleViT prints per-step lines and a per-epoch summary whose only counter is the epoch: one axis, no
    phantom restart per epoch.
    """
    lines = []
    for e in range(1, 31):
        for s in range(50, 201, 50):
            lines.append(f"Epoch[{e:03d}/100], Step[{s:04d}/0200], Avg Loss: {1 / e + s / 1e4:.4f}, Avg Acc: 0.5")
        lines.append(f"----- Epoch[{e:03d}/100], Train Loss: {1 / e:.4f}, Train Acc: 0.76, time: 173.49")
    df, _ = _read(tmp_path, "\n".join(lines) + "\n", long_run)
    assert df.get_column("segment").max() == 0
    summary = df.filter(pl.col("tag") == "Train Loss")
    assert summary.height == 30 and summary.get_column("step").to_list() == [e * 200 + 200 for e in range(1, 31)]
    only, _ = _read(tmp_path, "".join(f"Epoch {e} | train loss {1 / e:.3f}\n" for e in range(1, 60)), long_run)
    assert only.filter(pl.col("metric") == "loss").get_column("step").to_list() == list(range(1, 60))
