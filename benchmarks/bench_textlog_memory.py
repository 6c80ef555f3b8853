"""Peak memory and time of a 10M-line text log (issue 16): the reader, ``load``, ``analyze`` (JSON, HTML).

The file is the hostile-input suite's (``tests/hostile_gen.big_textlog``: ``step S loss X lr 0.001``, the steps
starting again every 10,000 lines: 1,000 segments, 20M rows, 329 MB). Each measurement runs in its own
subprocess under a wall-clock limit and a memory cap (``hostile_gen.run_bounded``: peak RSS of the process tree,
sampled every 50 ms; killed past the cap); CPU time is the child's user + system time. The same measurements
run on the code of git revision ``REV`` (``--before``; default ``a892ff4``, before the compact table) in the same
run, so the rows compare. Issue 16's bound is 60 s and 1.5 GiB for ``forensics analyze``.

    nice -n 10 python benchmarks/bench_textlog_memory.py [N_LINES] [--before REV|none] [--timeout S] [--cap GiB]
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import tarfile
import tempfile
from io import BytesIO
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

import hostile_gen  # noqa: E402

READ = ("import sys; from pathlib import Path; from parsers import textlog; p = Path(sys.argv[1]); "
        "t = textlog.read(p, p.parent).metrics; print(t.num_rows, t.nbytes)")
LOAD = ("import sys; from forensics.api import load; d = load(sys.argv[1]); print(d.metrics.height)")
ANALYZE = ("import sys; from forensics.cli import main; "
           "sys.argv = ['forensics', 'analyze', sys.argv[1], '-f', sys.argv[3], '-o', sys.argv[2]]; main()")
LIMIT_S, LIMIT_RSS = 60.0, 3 << 29  # issue 16: 60 s, 1.5 GiB


def _code(rev: str, tmp: Path) -> Path | None:
    """The ``forensics``/``parsers``/``reports`` packages of git revision ``rev``, extracted under ``tmp``."""
    try:
        blob = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "forensics", "parsers", "reports"],
                              check=True, capture_output=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    old = tmp / f"code-{rev}"
    with tarfile.open(fileobj=BytesIO(blob)) as tf:
        tf.extractall(old, filter="data")
    return old


def measure(code: Path, argv: list[str], timeout: float, cap: int) -> tuple[str, float, float, int]:
    """``(outcome, wall s, CPU s, peak RSS bytes)`` of ``python -c CODE ARGS`` with ``code`` first on the path."""
    env = {**os.environ, "PYTHONPATH": str(code), "MPLCONFIGDIR": str(Path(tempfile.gettempdir()) / "mpl-bench")}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    res = hostile_gen.run_bounded([sys.executable, "-c", *argv], timeout=timeout, max_rss=cap, env=env, cwd=code)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if res.killed:
        outcome = f"killed ({res.killed})"
    elif res.rc not in (0, 1):  # analyze exits 1 on an anomaly
        outcome = f"exit {res.rc}: {res.stderr.decode(errors='replace').strip().splitlines()[-1:]}"
    else:
        outcome = "ok"
    return outcome, res.seconds, cpu, res.peak_rss


def _args() -> tuple[int, str, float, int]:
    argv = sys.argv[1:]
    opts = {k: argv[argv.index(k) + 1] for k in ("--before", "--timeout", "--cap") if k in argv}
    rest = [a for a in argv if a not in opts and a not in opts.values()]
    n = int(rest[0]) if rest else 10_000_000
    cap = int(float(opts.get("--cap", 6)) * (1 << 30))
    return n, opts.get("--before", "a892ff4"), float(opts.get("--timeout", 300)), cap


def main() -> None:
    """Generate the log, measure the reader and ``analyze`` on this checkout and on ``--before``, print the table."""
    n, rev, timeout, cap = _args()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        run = hostile_gen.big_textlog(tmp / "runs", n).run
        codes = [("now", ROOT)]
        old = _code(rev, tmp) if rev != "none" else None
        if old is not None:
            codes.insert(0, (f"before ({rev})", old))
        rows = []
        for label, code in codes:  # one at a time: the machine is shared
            for what, argv in (("reader alone", [READ, str(run / "train.log")]),
                               ("load (read, frame, objective)", [LOAD, str(run)]),
                               ("forensics analyze -f json", [ANALYZE, str(run), str(tmp / "r.json"), "json"]),
                               ("forensics analyze -f html", [ANALYZE, str(run), str(tmp / "r.html"), "html"])):
                rows.append((what, label, *measure(code, argv, timeout, cap)))
    print(f"{n:,} lines ({(n // 10000):,} segments, {2 * n:,} rows); limit {timeout:.0f} s, cap {cap >> 20} MiB; "
          f"issue 16 asks analyze < {LIMIT_S:.0f} s and < {LIMIT_RSS >> 20} MiB")
    print(f"{'what':30s} {'code':18s} {'wall s':>8s} {'CPU s':>8s} {'peak MiB':>9s}  outcome")
    for what, label, outcome, wall, cpu, peak in rows:
        print(f"{what:30s} {label:18s} {wall:8.1f} {cpu:8.1f} {peak >> 20:9d}  {outcome}")


if __name__ == "__main__":
    main()
