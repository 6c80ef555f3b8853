"""Speed of ``forensics ingest`` / ``analyze`` on a TensorBoard file against tbparse, as whole processes.

Writes (once, cached in the temp folder; never committed) a 1,000,000-point event file with torch's
``SummaryWriter`` (4 tags x 200,000 steps, ``simple_value`` encoding, plus one ``new_style=True``
tag, i.e. a rank-0 float tensor with ``scalars`` metadata), then times in the same run, each as a
new process with its wall clock (imports and start-up included, as a user sees them):

- ``forensics ingest RUN -o OUT`` (best of ``--repeat``);
- ``forensics analyze RUN -f json`` (best of ``--repeat``; issue 17: at most 1.5x its own ingest); with
  ``--split``, the CPU of each of its stages and detectors in this process (``bench_analyze.analyze_split``);
- ``forensics analyze RUN -o report.html`` (the default format, with its charts; best of ``--repeat``);
- ``python -c "SummaryReader(path).scalars"`` with tbparse (``pip install tbparse``; once, it is slow);
- with ``--accumulator``: tensorboard's ``EventAccumulator`` keeping every scalar and tensor.

Issue 17's goal: ingest at least 20x faster than tbparse. ``--check`` also compares our rows with
tbparse's (scalars + tensors) in this process: same count, tags, steps and value bits.
With ``--before DIR`` (a source tree, e.g. ``git archive main | tar -x -C DIR``) the same three commands of
that tree are timed in the same run, taking turns with ours, and printed under ``before``.
Usage: ``python benchmarks/bench_tensorboard.py [--points N] [--repeat R] [--check] [--accumulator] [--split]
[--before DIR]``.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
CLI = "import sys; from forensics.cli import main; sys.argv[0] = 'forensics'; main()"  # the console script
TBPARSE = "import sys; from tbparse import SummaryReader; print(len(SummaryReader(sys.argv[1]).scalars))"
ACCUMULATOR = ("import sys; from tensorboard.backend.event_processing.event_accumulator import EventAccumulator as E; "
               "a = E(sys.argv[1], size_guidance={'scalars': 0, 'tensors': 0}); a.Reload(); t = a.Tags(); "
               "print(sum(len(a.Scalars(k)) for k in t['scalars']) + sum(len(a.Tensors(k)) for k in t['tensors']))")


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


def wall(argv: list[str], repeat: int = 1, root: Path = ROOT) -> tuple[float, float]:
    """Best (wall-clock s, CPU s) of ``repeat`` runs of ``argv`` as a new process (output discarded).

    CPU time (user + system of the child) is printed beside the wall clock: on a shared machine it
    moves much less with the load than the wall clock does. Python may cache bytecode (``__pycache__``,
    git-ignored), as for any installed package: with ``PYTHONDONTWRITEBYTECODE`` set, every run would
    recompile this project's modules (~0.1 s) but not tbparse's, installed with their bytecode.
    ``root`` is the source tree the child imports (``PYTHONPATH``; ``--before`` gives another one).
    """
    env = {**os.environ, "PYTHONPATH": str(root)}
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # bytecode cached as in an installed package (see the docstring)
    best, cpu = float("inf"), float("inf")
    for _ in range(repeat):
        r0, t0 = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
        subprocess.run(argv, check=True, env=env, cwd=root, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        t, r1 = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_CHILDREN)
        best, cpu = min(best, t), min(cpu, r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime)
    return best, cpu


def time_commands(folder: Path, roots: dict[str, Path], repeat: int) -> dict[tuple[str, str], tuple[float, float]]:
    """Best (wall, CPU) of ``ingest``, ``analyze -f json`` and ``analyze`` to HTML per source tree.

    The trees take turns within each repeat (one run of each command from each tree, then the next
    repeat), so that a change in the machine's load falls on all of them alike.
    """
    cli = [sys.executable, "-c", CLI]
    best: dict[tuple[str, str], tuple[float, float]] = {}
    with tempfile.TemporaryDirectory() as out:
        commands = {"ingest": ["ingest", str(folder), "-o", out],
                    "json": ["analyze", str(folder), "-f", "json", "--fail-on", "never"],
                    "html": ["analyze", str(folder), "-o", str(Path(out) / "r.html"), "--fail-on", "never"]}
        for _ in range(repeat):
            for name, args in commands.items():
                for tree, root in roots.items():
                    w, c = wall([*cli, *args], 1, root)
                    old = best.get((name, tree), (float("inf"), float("inf")))
                    best[(name, tree)] = (min(old[0], w), min(old[1], c))
    return best


def check_lossless(path: Path) -> str:
    """Compare our rows with tbparse's (scalars + tensors): same count, same (tag, step) -> same value bits."""
    import pandas as pd
    import polars as pl
    from tbparse import SummaryReader

    sys.path.insert(0, str(ROOT))
    from parsers import tensorboard as tb

    reader = SummaryReader(str(path))
    frame = pd.concat([reader.scalars, reader.tensors], ignore_index=True)
    theirs = pl.from_pandas(frame[["tag", "step", "value"]]).with_columns(pl.col("value").cast(pl.Float64),
                                                                         pl.col("step").cast(pl.Int64))
    mine = pl.from_arrow(tb.read(path, path.parent).metrics.select(["tag", "step", "value"]))
    if mine.height != theirs.height:
        return f"DIFFERENT: {mine.height} rows vs tbparse {theirs.height}"
    key = ["tag", "step"]
    j = mine.sort(key).with_row_index().join(theirs.sort(key).with_row_index(), on="index", suffix="_t")
    same = ((j["tag"] == j["tag_t"]).to_numpy() & (j["step"] == j["step_t"]).to_numpy()
            & (j["value"].to_numpy().view(np.int64) == j["value_t"].to_numpy().view(np.int64)))
    return "equal (count, tags, steps, value bits)" if bool(same.all()) else f"DIFFERENT: {int((~same).sum())} rows"


def main() -> None:
    """Run the benchmark and print one line per process with its ratio to the reference."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--points", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--check", action="store_true", help="compare our rows with tbparse's, bit for bit")
    ap.add_argument("--accumulator", action="store_true", help="also time tensorboard's EventAccumulator")
    ap.add_argument("--split", action="store_true", help="CPU of each analyze stage and detector (in-process)")
    ap.add_argument("--before", type=Path, default=None,
                    help="another source tree (e.g. `git archive main | tar -x -C DIR`) timed in the same run")
    args = ap.parse_args()
    path = make_file(args.points)
    print(f"file: {path} ({path.stat().st_size / 1e6:.1f} MB, {args.points} points); whole processes, wall clock")
    roots = {"": ROOT, **({"before ": args.before.resolve()} if args.before else {})}
    best = time_commands(path.parent, roots, args.repeat)
    line = "{:44s} {:7.2f} s wall {:7.2f} s CPU  {}"
    for tree in roots:
        ingest, analyze, html = (best[(name, tree)] for name in ("ingest", "json", "html"))
        print(line.format(f"{tree}forensics ingest", *ingest, ""))
        ratio = f"{analyze[0] / ingest[0]:5.2f}x its own ingest (CPU {analyze[1] / ingest[1]:.2f}x; goal <= 1.5x)"
        print(line.format(f"{tree}forensics analyze -f json", *analyze, ratio))
        print(line.format(f"{tree}forensics analyze (html, the default)", *html,
                          f"{html[0] / ingest[0]:5.2f}x its own ingest (CPU {html[1] / ingest[1]:.2f}x; goal <= 1.5x)"))
    ingest = best[("ingest", "")]
    if args.split:
        sys.path.insert(0, str(ROOT))
        from benchmarks.bench_analyze import print_split

        print_split(path.parent)
    try:
        import tbparse  # noqa: F401
    except ImportError:
        print("tbparse: not installed (pip install tbparse)")
    else:
        ref = wall([sys.executable, "-c", TBPARSE, str(path)])
        print(line.format("tbparse SummaryReader(...).scalars", *ref, f"ours is {ref[0] / ingest[0]:5.1f}x faster "
                          f"(CPU {ref[1] / ingest[1]:.1f}x; goal >= 20x)"))
        if args.before:
            old = best[("ingest", "before ")]
            print(f"{'':44s} before: {ref[0] / old[0]:5.1f}x faster (CPU {ref[1] / old[1]:.1f}x)")
        if args.check:
            print(f"lossless check against tbparse: {check_lossless(path)}")
    if args.accumulator:
        ref = wall([sys.executable, "-c", ACCUMULATOR, str(path)])
        print(line.format("tensorboard EventAccumulator (keep all)", *ref,
                          f"ours is {ref[0] / ingest[0]:5.1f}x faster"))


if __name__ == "__main__":
    main()
