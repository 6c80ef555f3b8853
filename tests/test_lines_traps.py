"""Traps of the text-log reader (parsers/lines): a per-epoch iteration counter, durations, NCCL start-up warnings.

- ``epoch 2 - iter 14/149`` (flair): the iteration counter restarts every epoch; it is iteration 14 of 149 within
  epoch 2 (step 2 x 149 + 14, as for the other nested counters ``[e][i/M]``), never a restart of the program.
- ``eta: 4:59:11``, ``eta 1 day, 4:59:11``: a duration is no number; ``eta`` = 4 must never be read.
- ``NCCL WARN Call to ibv_open_device failed`` at start-up (NCCL falls back from InfiniBand) is no hardware
  error; ``NCCL WARN ... Timeout`` or ``... error 12`` is.

Each file-level test reads the file both ways the text reader has: the bulk path (lines of one shape read by
arrays) and line by line.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from parsers import textlog

FLAIR = ("2023-05-01 10:{e:02d}:{s:02d},123 epoch {e} - iter {i}/149 - loss {loss:.8f} - time (sec): {t:.2f} - "
         "samples/sec: 512.33 - lr: 0.100000 - momentum: 0.000000")


@pytest.fixture(params=["bulk", "line_by_line"])
def read(request, monkeypatch):
    """``read(path) -> (metrics, events, meta)``, by the bulk path or line by line."""
    if request.param == "bulk":
        monkeypatch.setattr(textlog._Reader, "LONG_RUN", 8)
        monkeypatch.setattr(textlog._Reader, "SMALL", 0)
    else:
        monkeypatch.setattr(textlog._Reader, "LONG_RUN", 10**9)
        monkeypatch.setattr(textlog._Reader, "SMALL", 10**9)

    def _read(path: Path):
        r = textlog.read(path, path.parent)
        return pl.from_arrow(r.metrics), pl.from_arrow(r.events), dict(r.meta)

    return _read


def test_per_epoch_iteration_counter_is_no_restart(tmp_path, read):
    """Flair's ``epoch E - iter I/149``: one segment, steps E x 149 + I, increasing across epochs."""
    lines = [FLAIR.format(e=e, s=i % 60, i=i, loss=2.0 / e + 0.001 * i, t=0.1 * i)
             for e in (1, 2, 3) for i in range(1, 150, 14)]
    log = tmp_path / "training.log"
    log.write_text("\n".join(lines) + "\n")
    metrics, events, meta = read(log)
    loss = metrics.filter(pl.col("metric") == "loss")
    assert loss.height == len(lines)
    assert set(loss.get_column("segment")) == {0}, "a per-epoch counter read as a restart"
    assert "restart" not in set(events.get_column("kind"))
    steps = loss.get_column("step").to_list()
    assert steps == sorted(steps) and len(set(steps)) == len(steps)
    assert steps[:2] == [1 * 149 + 1, 1 * 149 + 15] and steps[-1] == 3 * 149 + 141
    assert loss.get_column("value")[0] == pytest.approx(2.001)
    assert meta.get("step_unit", "").startswith("batch within epoch")


def test_global_counter_after_epoch_is_untouched(tmp_path, read):
    """A ``step N/M`` that does not reset (no epoch before it as a counter of its own) keeps its value."""
    lines = [f"step {s}/400 | epoch {s // 100} | loss {3 - s / 1000:.3f}" for s in range(0, 400, 10)]
    log = tmp_path / "train.log"
    log.write_text("\n".join(lines) + "\n")
    metrics, _, _ = read(log)
    assert metrics.filter(pl.col("metric") == "loss").get_column("step").to_list() == list(range(0, 400, 10))


def test_durations_are_never_their_first_number(tmp_path, read):
    """``eta: 4:59:11`` and ``eta: 1 day, 4:59:11`` give no ``eta`` value; the other pairs of the line are read."""
    lines = [f"[12/01 10:00:{s:02d}] step: {s * 10}  eta: {4 - s // 20}:59:{s:02d}  loss: {3 - s * 0.01:.4f}  "
             f"time: 0.3{s % 10}" for s in range(40)]
    lines += [f"step: {400 + k}  eta: {k + 1} days, 4:59:11  loss: 2.5  time: 0.31" for k in range(9)]
    log = tmp_path / "train.log"
    log.write_text("\n".join(lines) + "\n")
    metrics, _, _ = read(log)
    assert "eta" not in set(metrics.get_column("metric")), "a duration was read as its first number"
    loss = metrics.filter(pl.col("metric") == "loss")
    assert loss.height == len(lines) and loss.get_column("value")[0] == pytest.approx(3.0)
    assert metrics.filter(pl.col("metric") == "time").height == len(lines)
    assert set(metrics.get_column("segment")) == {0}


STEP = "step:{s}/100 train_loss:{v:.4f} train_time:{t}ms step_avg:43.54ms"
BENIGN = ["NCCL version 2.27.5+cuda12.9",
          "[2026-03-18 14:38:12] pgut1-0:871784:871848 [5] ibvwrap.c:94 NCCL WARN Call to ibv_open_device failed",
          "[2026-03-18 14:38:12] pgut1-0:871784:871848 [5] p2p_plugin.c:565 NCCL WARN NET/IB : Unable to open device "
          "mlx5_an0"]
FAULTS = ["node1:123:456 [3] NCCL WARN Timeout waiting for connect from peer 2",
          "node1:123:456 [3] transport/net_ib.cc:1295 NCCL WARN NET/IB : Got completion from peer 10.0.0.2<45012> "
          "with error 12, opcode 0, len 0, vendor err 129",
          "node1:123:456 [3] NCCL WARN Cuda failure 'an illegal memory access was encountered'"]


def test_nccl_start_up_warnings_are_not_hardware_errors(tmp_path, read):
    """NCCL's start-up warnings about an InfiniBand device it cannot open give no hardware_error event."""
    lines = BENIGN * 4 + [STEP.format(s=s, v=3 - s / 100, t=s * 43) for s in range(0, 100, 5)]
    log = tmp_path / "train.log"
    log.write_text("\n".join(lines) + "\n")
    metrics, events, _ = read(log)
    assert metrics.filter(pl.col("metric") == "loss").height == 20
    assert "hardware_error" not in set(events.get_column("kind"))


@pytest.mark.parametrize("fault", FAULTS)
def test_nccl_warnings_that_name_a_fault_are_hardware_errors(tmp_path, read, fault):
    """An NCCL WARN naming a timeout, an error code or a CUDA failure, during training, is a hardware error."""
    lines = BENIGN + [STEP.format(s=s, v=3 - s / 100, t=s * 43) for s in range(0, 50, 5)] + [fault]
    log = tmp_path / "train.log"
    log.write_text("\n".join(lines) + "\n")
    _, events, _ = read(log)
    hw = events.filter(pl.col("kind") == "hardware_error")
    assert hw.height == 1 and "NCCL WARN" in hw.get_column("message")[0]


TITAN = "[titan] 2025-01-01 10:00:{s:02d},000 - root - INFO - step: {s:2}  loss: {v:7.4f}  memory: 10.00GiB(12.50%)  " \
        "tps: 1,234  mfu: 1.23%"


def test_script_step_lines_are_not_damaged_torchtitan_lines(tmp_path, read):
    """A script's ``step: 40  loss: 2.96`` is read; in a torchtitan file a cut line is still listed as damaged.

    The script's line has torchtitan's two spaces but not its fields, in a file without torchtitan lines.
    """
    lines = [f"step: {s}  loss: {3 - s / 100:.4f}  time: 0.3{s % 10}" for s in range(0, 100, 5)]
    log = tmp_path / "train.log"
    log.write_text("\n".join(lines) + "\n")
    metrics, _, _ = read(log)
    assert metrics.filter(pl.col("metric") == "loss").height == 20
    titan = [TITAN.format(s=s, v=3 - s / 100) for s in range(1, 30)]
    titan.insert(10, "step: 99  loss:  2.8900  memory: 10.0")  # an interleaved write cut it
    log.write_text("\n".join(titan) + "\n")
    r = textlog.read(log, tmp_path)
    loss = pl.from_arrow(r.metrics).filter(pl.col("metric") == "loss")
    assert loss.height == 29 and 99 not in loss.get_column("step").to_list()
    assert any("damaged" in s.reason or "cut" in s.reason for s in r.skipped), r.skipped
