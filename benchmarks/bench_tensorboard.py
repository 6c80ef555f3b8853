"""Speed of our TensorBoard reader against the readers a user would otherwise use.

Writes (once, cached in the temp folder) a 1,000,000-point event file with torch's
``SummaryWriter`` (4 tags x 200,000 steps, ``simple_value`` encoding, plus one ``new_style=True``
tag, i.e. a rank-0 float tensor with ``scalars`` metadata), then times in the same run:

- ``parsers.tensorboard.read`` with and without CRC checks (warm: best of ``--repeat``), and its
  first call in a new process (numba import and cached compiled scan included);
- tensorboard's ``EventAccumulator`` with ``size_guidance={"scalars": 0, "tensors": 0}`` (keep all);
- ``tbparse.SummaryReader`` (``pip install tbparse``), whose rows are also checked against ours:
  same count, same tags and steps, same value bits.

Issue 3's goal: at least 20x faster than tbparse, lossless.
Usage: ``python benchmarks/bench_tensorboard.py [--points N] [--repeat R] [--skip-slow]``.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from parsers import tensorboard as tb  # noqa: E402


def make_file(points: int) -> Path:
    """Write (or reuse) an event file with ``points`` scalar events; returns its path."""
    folder = Path(tempfile.gettempdir()) / f"forensics_bench_tb_{points}"
    found = sorted(folder.glob("events.out.tfevents.*"))
    if found:
        return found[0]
    from torch.utils.tensorboard import SummaryWriter

    folder.mkdir(parents=True, exist_ok=True)
    w = SummaryWriter(str(folder), max_queue=1000, flush_secs=3600)
    tags = ["train/loss", "train/lr", "train/grad_norm", "train/loss_scale"]
    steps = points // (len(tags) + 1)
    for s in range(steps):
        for k, t in enumerate(tags):
            w.add_scalar(t, 1.0 / (s + 1) + k, s)
        w.add_scalar("train/tokens", float(s * 4096), s, new_style=True)
    w.close()
    return sorted(folder.glob("events.out.tfevents.*"))[0]


def timed(fn, repeat: int) -> tuple[float, int]:
    """Best wall time of ``repeat`` calls, and the row count the call returned."""
    best, rows = float("inf"), 0
    for _ in range(repeat):
        t0 = time.perf_counter()
        rows = fn()
        best = min(best, time.perf_counter() - t0)
    return best, rows


def first_call(path: Path) -> float:
    """Wall time of one read in a fresh interpreter (imports numba and loads the compiled scan from cache)."""
    code = ("import sys, time; sys.path.insert(0, sys.argv[2]); t = time.perf_counter(); "
            "from parsers import tensorboard as tb; from pathlib import Path; p = Path(sys.argv[1]); "
            "tb.read(p, p.parent); print(time.perf_counter() - t)")
    out = subprocess.run([sys.executable, "-c", code, str(path), str(ROOT)], capture_output=True, text=True, check=True)
    return float(out.stdout.split()[-1])


def check_lossless(ours: pa.Table, frame) -> str:  # noqa: ANN001 - a pandas DataFrame (tag, step, value)
    """Compare our rows with tbparse's (scalars + tensors): same count, same (tag, step) -> same value bits."""
    import polars as pl

    theirs = pl.from_pandas(frame[["tag", "step", "value"]]).with_columns(pl.col("value").cast(pl.Float64),
                                                                         pl.col("step").cast(pl.Int64))
    mine = pl.from_arrow(ours.select(["tag", "step", "value"]))
    if mine.height != theirs.height:
        return f"DIFFERENT: {mine.height} rows vs tbparse {theirs.height}"
    key = ["tag", "step"]
    j = mine.sort(key).with_row_index().join(theirs.sort(key).with_row_index(), on="index", suffix="_t")
    same = ((j["tag"] == j["tag_t"]).to_numpy() & (j["step"] == j["step_t"]).to_numpy()
            & (j["value"].to_numpy().view(np.int64) == j["value_t"].to_numpy().view(np.int64)))
    return "equal (count, tags, steps, value bits)" if bool(same.all()) else f"DIFFERENT: {int((~same).sum())} rows"


def main() -> None:
    """Run the benchmark and print one line per reader, with ratios against ours."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--points", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--skip-slow", action="store_true", help="skip EventAccumulator and tbparse")
    args = ap.parse_args()
    path = make_file(args.points)
    mb = path.stat().st_size / 1e6
    print(f"file: {path} ({mb:.1f} MB)")
    results: dict[str, tuple[float, int]] = {}
    results["ours (CRC checked)"] = timed(lambda: tb.read(path, path.parent).metrics.num_rows, args.repeat)
    results["ours (no CRC)"] = timed(
        lambda: tb.read(path, path.parent, check_crc=False).metrics.num_rows, args.repeat)
    results["ours, first call in a new process"] = (first_call(path), results["ours (CRC checked)"][1])
    ours = tb.read(path, path.parent).metrics
    if not args.skip_slow:
        try:
            from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

            def ea() -> int:
                acc = EventAccumulator(str(path), size_guidance={"scalars": 0, "tensors": 0})
                acc.Reload()
                tags = acc.Tags()
                return sum(len(acc.Scalars(t)) for t in tags["scalars"]) + sum(
                    len(acc.Tensors(t)) for t in tags["tensors"])

            results["tensorboard EventAccumulator (keep all)"] = timed(ea, 1)
        except ImportError:
            print("tensorboard: not installed")
        try:
            import pandas as pd
            from tbparse import SummaryReader

            frames: list = []

            def tbp() -> int:
                reader = SummaryReader(str(path))
                frames[:] = [pd.concat([reader.scalars, reader.tensors], ignore_index=True)]
                return len(frames[0])

            results["tbparse SummaryReader (scalars + tensors)"] = timed(tbp, 1)
            print(f"lossless check against tbparse: {check_lossless(ours, frames[0])}")
        except ImportError:
            print("tbparse: not installed (pip install tbparse)")
    base = results["ours (CRC checked)"][0]
    for name, (sec, rows) in results.items():
        print(f"{name:42s} {sec:7.3f} s  {rows:8d} rows  {rows / sec / 1e6:6.2f} M rows/s  {mb / sec:7.1f} MB/s"
              f"  {sec / base:6.1f}x ours")


if __name__ == "__main__":
    main()
