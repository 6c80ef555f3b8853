"""Speed of ``forensics audit``: runs per second with 1 and 2 processes, and the cached second audit.

Builds a temporary ROOT of ``--runs`` run folders (copies of the sample runs in ``sample_logs/``, or of
the acceptance cases when no sample is finished), then times, each into a fresh output folder:

- ``audit(jobs=1)`` and ``audit(jobs=2)`` (goal: jobs=2 at least 1.7x the runs per second of jobs=1);
- a second ``audit(jobs=2)`` into the same output folder: every run served from the cache (goal: at
  least 20x faster than the first).

Twice: with JSON reports only (the analysis itself) over ``--runs`` runs, and with the default
HTML + JSON reports (charts drawn with matplotlib, about 10x the analysis) over ``--html-runs`` runs.

Usage: ``python benchmarks/bench_audit.py [--runs 200] [--html-runs 40]``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from forensics.audit import audit  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def sources() -> list[Path]:
    """Finished sample runs (``expected.json`` written), else the acceptance cases."""
    runs = sorted(d for d in (REPO / "sample_logs").glob("*/") if (d / "expected.json").is_file())
    if not runs:
        runs = sorted(d for d in (REPO.parent / "shared" / "cases").glob("br*/") if d.is_dir())
    if not runs:
        raise SystemExit("no sample runs or cases to copy")
    return runs


def make_root(n: int, where: Path) -> Path:
    """``n`` run folders under ``where/root``: the sample runs copied round-robin."""
    root = where / "root"
    src = sources()
    for i in range(n):
        shutil.copytree(src[i % len(src)], root / f"{i:04d}_{src[i % len(src)].name}")
    return root


def timed(root: Path, out: Path, jobs: int, formats: tuple[str, ...]) -> tuple[float, int, int]:
    """Wall seconds of one audit, with the number of runs analysed and served from the cache."""
    t0 = time.perf_counter()
    res = audit(root, out, jobs=jobs, formats=formats, progress=False)
    return time.perf_counter() - t0, res.analysed, res.cached


def bench(n: int, formats: tuple[str, ...], tmp: Path) -> dict[str, float]:
    """Time jobs=1, jobs=2 and the cached audit over ``n`` runs; print and return the numbers."""
    work = tmp / "+".join(formats)
    root = make_root(n, work)
    t1, a1, _ = timed(root, work / "out1", 1, formats)
    t2, a2, _ = timed(root, work / "out2", 2, formats)
    tc, ac, cc = timed(root, work / "out2", 2, formats)
    assert a1 == a2 == n and ac == 0 and cc == n, (a1, a2, ac, cc)
    res = {"runs": n, "jobs1_s": t1, "jobs2_s": t2, "cached_s": tc, "jobs1_rps": n / t1, "jobs2_rps": n / t2,
           "speedup_jobs2": t1 / t2, "cache_speedup": t2 / tc}
    print(f"[{'+'.join(formats)}] {n} runs: jobs=1 {t1:.1f} s ({n / t1:.2f} runs/s), jobs=2 {t2:.1f} s "
          f"({n / t2:.2f} runs/s), ratio {t1 / t2:.2f}x (goal 1.7x); cached {tc:.2f} s, "
          f"{t2 / tc:.0f}x faster than the first (goal 20x)", flush=True)
    return res


def main() -> None:
    """Parse the arguments, run both benchmarks, print the numbers (and JSON with ``--json``)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=200, help="runs for the JSON-only benchmark")
    ap.add_argument("--html-runs", type=int, default=40, help="runs for the HTML+JSON benchmark (0: skip)")
    ap.add_argument("--json", action="store_true", help="also print the numbers as one JSON object")
    args = ap.parse_args()
    print(f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}; samples: "
          f"{', '.join(d.name for d in sources())}", flush=True)
    out = {}
    with tempfile.TemporaryDirectory(prefix="forensics-bench-audit-") as tmp:
        out["json"] = bench(args.runs, ("json",), Path(tmp))
        if args.html_runs:
            out["html+json"] = bench(args.html_runs, ("html", "json"), Path(tmp))
    if args.json:
        print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
