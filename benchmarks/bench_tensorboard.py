"""Speed of our TensorBoard reader against the readers a user would otherwise use.

Writes (once, cached in the temp folder) a 200,000-point event file with torch's
``SummaryWriter`` (4 tags x 50,000 steps, ``simple_value`` encoding, plus one
``new_style=True`` tag), then times:

- ``parsers.tensorboard.read`` with and without CRC checks;
- tensorboard's ``EventAccumulator`` with ``size_guidance={"scalars": 0, "tensors": 0}`` (keep all);
- ``tbparse.SummaryReader`` if installed (usually not; reported as such).

Usage: ``python benchmarks/bench_tensorboard.py [--points N] [--repeat R]``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

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


def main() -> None:
    """Run the benchmark and print one line per reader."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--points", type=int, default=200_000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    path = make_file(args.points)
    print(f"file: {path} ({path.stat().st_size / 1e6:.1f} MB)")
    results: dict[str, tuple[float, int]] = {}
    results["ours (CRC checked)"] = timed(lambda: tb.read(path, path.parent).metrics.num_rows, args.repeat)
    results["ours (no CRC)"] = timed(
        lambda: tb.read(path, path.parent, check_crc=False).metrics.num_rows, args.repeat)
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
        from tbparse import SummaryReader

        results["tbparse SummaryReader"] = timed(lambda: len(SummaryReader(str(path)).scalars), 1)
    except ImportError:
        print("tbparse: not installed (skipped)")
    base = results["ours (CRC checked)"][0]
    for name, (sec, rows) in results.items():
        rate = rows / sec / 1e3
        print(f"{name:42s} {sec:7.3f} s  {rows:8d} rows  {rate:8.1f} k rows/s  x{sec / base:5.2f}")


if __name__ == "__main__":
    main()
