"""Speed and peak memory of our JSONL reading against ``polars.read_ndjson`` on the same file.

Writes (once, cached in the temp folder, never in the repository) a trainer-style JSONL log of
``--steps`` steps x ``--metrics`` metrics (default 100,000 and 1,000,000 steps x 50 metrics):
``step``, ``_timestamp``, ``loss``, ``lr``, ``grad_norm``, ``loss_scale`` and per-layer series
(``layers/<i>/grad_norm``, ``layers/<i>/update_ratio``) as floats on every line. Then, per size,
in one run:

- ``read_ndjson``: ``polars.read_ndjson`` of the file (the wide frame a user would otherwise get);
- ``jsonl.read``: our reader, the long metrics table (one row per step and metric);
- ``load_run``: the whole loading side of ``forensics analyze`` (discovery, reader, run/segment columns,
  the polars ``RunData.metrics`` frame);

best wall time of ``--repeat`` calls taken in turn (a shared machine's load weighs on all alike),
printed with the ratio to ``read_ndjson``. With ``--memory`` (default on) each is run once more in a
fresh subprocess and its peak RSS over the process before the read (``VmHWM`` reset with
``/proc/self/clear_refs``) is printed against the Arrow ``nbytes`` of our long table (for
``load_run``: the polars frame's ``estimated_size``) and of ``read_ndjson``'s frame.

Usage: ``python benchmarks/bench_jsonl.py [--steps 100000 1000000] [--metrics 50] [--repeat 2]
[--no-memory] [--analyze]`` (``--analyze`` also times the whole ``forensics analyze -f json`` process).

Two more workloads, each printing its figures against its reference in the same run:

- ``--issue13 [--lines 1000000]``: issue 13's 1M-line bench (:mod:`benchmarks._bench_jsonl_issues`): a
  trainer log with nested keys, an eval line every 1,000 steps and NaN/Infinity lines; ``jsonl.read``
  against ``read_ndjson`` of the NaN-free copy, wall and CPU, taken in turn (goal <= 2x).
- ``--issue17 [--quick]``: issue 17's table: whole ``api.load`` + ``api.analyze_run`` of the
  ``benchmarks/bench_analyze.py`` runs (1M x 50, 100k x 50, 100k x 500; ``--quick``: 200k, 20k, 20k) in
  fresh processes against ``read_ndjson`` in fresh processes: wall and CPU ratio, peak RSS against the
  long table's Arrow ``nbytes``, the growth of the x 50 runs against their size ratio, and the CPU of
  ``jsonl.read`` within the analyze apart from the rest (framing, objective, series, detectors, report).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def make_file(steps: int, metrics: int) -> Path:
    """Write (or reuse) ``<tmp>/forensics_bench_jsonl_<steps>x<metrics>/run/metrics.jsonl``."""
    import numpy as np
    import polars as pl

    folder = Path(tempfile.gettempdir()) / f"forensics_bench_jsonl_{steps}x{metrics}" / "run"
    path = folder / "metrics.jsonl"
    if path.exists():
        return path
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    tmp = path.with_suffix(".tmp")
    layers = max(0, (metrics - 4) // 2)
    with open(tmp, "wb") as out:
        for lo in range(0, steps, 100_000):
            s = np.arange(lo, min(steps, lo + 100_000))
            n = len(s)
            cols: dict[str, np.ndarray] = {
                "step": s, "_timestamp": 1.7e9 + s * 0.35,
                "loss": 10.0 * np.exp(-s / 2e5) + rng.random(n) * 0.1,
                "lr": 3e-4 * np.minimum(1.0, s / 2000), "grad_norm": rng.lognormal(0.0, 0.5, n),
                "loss_scale": np.where(s < steps // 2, 65536.0, 32768.0)}
            for i in range(layers):
                cols[f"layers/{i}/grad_norm"] = rng.lognormal(-2.0, 0.5, n)
                cols[f"layers/{i}/update_ratio"] = rng.lognormal(-7.0, 0.3, n)
            for i in range(metrics - 4 - 2 * layers):
                cols[f"extra_{i}"] = rng.random(n)
            pl.DataFrame(cols).write_ndjson(out)
    tmp.replace(path)
    return path


def _status_mb(field: str) -> float | None:
    """``VmHWM``/``VmRSS`` of this process from ``/proc/self/status`` in MiB (None off Linux)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return None


def _reset_peak() -> bool:
    """Reset this process's peak RSS to its current RSS (Linux ``clear_refs``); False if unsupported."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def _run(which: str, path: Path) -> tuple[int, int]:
    """Read ``path`` one way; returns (rows, result bytes)."""
    import polars as pl

    from parsers import discover, jsonl

    if which == "read_ndjson":
        df = pl.read_ndjson(path)
        return df.height, int(df.estimated_size())
    if which == "jsonl.read":
        table = jsonl.read(path, path.parent).metrics
        return table.num_rows, int(table.nbytes)
    run = discover.load_run(path.parent)
    return run.metrics.height, int(run.metrics.estimated_size())


def child(which: str, path: Path) -> None:
    """In a fresh process: read ``path`` once and print peak-memory figures as one JSON line."""
    import polars as pl  # noqa: F401 - imports done before the baseline

    from parsers import discover, jsonl  # noqa: F401

    exact = _reset_peak()
    before = _status_mb("VmRSS") if exact else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    rows, size = _run(which, path)
    peak = _status_mb("VmHWM") if exact else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    print(json.dumps({"before_mb": before, "peak_mb": peak, "result_mb": size / 2**20, "rows": rows}))


def memory(which: str, path: Path) -> dict:
    """Run :func:`child` in a subprocess and return its figures."""
    out = subprocess.run([sys.executable, __file__, "--child", which, str(path)], check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def bench(steps: int, metrics: int, repeat: int, mem: bool, analyze: bool) -> None:
    """Print the figures of one file size."""
    path = make_file(steps, metrics)
    mb = path.stat().st_size / 1e6
    print(f"\n== {steps} steps x {metrics} metrics: {path} ({mb:.0f} MB)")
    names = ("read_ndjson", "jsonl.read", "load_run")
    best = dict.fromkeys(names, float("inf"))
    cpu = dict.fromkeys(names, float("inf"))
    rows = dict.fromkeys(names, 0)
    for _ in range(repeat):
        for name in names:
            t0, c0 = time.perf_counter(), time.process_time()
            rows[name], _ = _run(name, path)
            best[name] = min(best[name], time.perf_counter() - t0)
            cpu[name] = min(cpu[name], time.process_time() - c0)
    floor, cfloor = best["read_ndjson"], cpu["read_ndjson"]
    for name in names:
        print(f"{name:12s} {best[name]:7.2f} s (CPU {cpu[name]:6.2f} s)  {rows[name]:>10d} rows  "
              f"{mb / best[name]:6.0f} MB/s  x{best[name] / floor:.2f} read_ndjson (CPU x{cpu[name] / cfloor:.2f})")
    if analyze:
        t0 = time.perf_counter()
        out = subprocess.run([sys.executable, "-c", "import sys; from forensics.cli import main; sys.exit(main())",
                              "analyze", str(path.parent), "-f", "json"], capture_output=True, check=False)
        t = time.perf_counter() - t0
        verdict = json.loads(out.stdout or b"{}").get("verdict")
        print(f"{'analyze':12s} {t:7.2f} s  (whole process, exit {out.returncode}, verdict {verdict})  "
              f"x{t / floor:.2f} read_ndjson (goal: <= 3)")
    if mem:
        ours = memory("jsonl.read", path)
        for name in names:
            f = ours if name == "jsonl.read" else memory(name, path)
            delta = f["peak_mb"] - f["before_mb"]
            print(f"peak RSS {name:12s} {delta:8.0f} MB; result {f['result_mb']:7.0f} MB; "
                  f"peak / result {delta / f['result_mb']:.2f}; peak / our Arrow table "
                  f"{delta / ours['result_mb']:.2f}")


def main() -> None:
    """Run the benchmark and print one block per size."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, nargs="+", default=[100_000, 1_000_000])
    ap.add_argument("--metrics", type=int, default=50)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--no-memory", action="store_true")
    ap.add_argument("--analyze", action="store_true")
    ap.add_argument("--child", nargs=2, metavar=("WHICH", "PATH"), help=argparse.SUPPRESS)
    ap.add_argument("--issue13", action="store_true", help="issue 13's 1M-line bench (jsonl.read vs read_ndjson)")
    ap.add_argument("--lines", type=int, default=1_000_000, help="lines of the --issue13 file")
    ap.add_argument("--issue17", action="store_true", help="issue 17's analyze table")
    ap.add_argument("--quick", action="store_true", help="--issue17 at small sizes (development)")
    ap.add_argument("--sizes", help="--issue17 steps: SMALL,LARGE (x 50 runs),LAYERS (x 500 run)")
    args = ap.parse_args()
    if args.child:
        child(args.child[0], Path(args.child[1]))
        return
    if args.issue13 or args.issue17:
        from benchmarks import _bench_jsonl_issues as issues

        if args.issue13:
            issues.issue13(args.lines, args.repeat)
        if args.issue17:
            sizes = tuple(int(x) for x in args.sizes.split(",")) if args.sizes else None
            issues.issue17(args.quick, args.repeat, sizes)  # type: ignore[arg-type]
        return
    for steps in args.steps:
        bench(steps, args.metrics, args.repeat, not args.no_memory, args.analyze)


if __name__ == "__main__":
    main()
