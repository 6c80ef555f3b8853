"""The workloads of ``bench_jsonl.py --issue13`` and ``--issue17`` (see that module's docstring).

Every figure is printed beside its reference measured in the same run. The machine may be shared, so
both wall and CPU seconds (``time.process_time``: every thread of the process) are given; the CPU ratio
is the steadier one under load.
"""

from __future__ import annotations

import json
import math
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NAN_LINES = 20  # lines with NaN/Infinity tokens, among the last 200


def make_mixed(lines: int) -> tuple[Path, Path]:
    """Write (or reuse) issue 13's log and its copy without NaN/Infinity lines; returns both paths.

    Per line ``step``, ``loss``, ``lr``, ``grad_norm``, ``loss_scale``, ``tokens``, a nested
    ``{"train": {"loss", "ppl"}}``, ``_timestamp`` and ``_runtime``; an ``{"eval": {...}}`` line every
    1,000 steps (at the step of a train line); :data:`NAN_LINES` lines with bare NaN/Infinity near the end.
    """
    folder = Path(tempfile.gettempdir()) / f"forensics_bench_jsonl_{lines}"
    path, clean = folder / "metrics.jsonl", folder / "metrics_no_nan.jsonl"
    if path.exists() and clean.exists():
        return path, clean
    folder.mkdir(parents=True, exist_ok=True)
    rng = random.Random(0)
    nan_at = set(range(lines - 200, lines, 200 // NAN_LINES))
    tmp, tmp_clean = path.with_suffix(".tmp"), clean.with_suffix(".tmp")
    with open(tmp, "w") as out, open(tmp_clean, "w") as out_clean:
        for s in range(lines):
            loss = 10.0 * math.exp(-s / 2e5) + rng.random() * 0.1
            scale = 65536.0 if s < lines // 2 else 32768.0
            gn, ppl = rng.lognormvariate(0.0, 0.5), math.exp(min(loss, 50.0))
            bad = s in nan_at
            rec = (f'{{"step": {s}, "loss": {"NaN" if bad else repr(loss)}, "lr": {3e-4 * min(1.0, s / 2000)!r}, '
                   f'"grad_norm": {"Infinity" if bad else repr(gn)}, "loss_scale": {scale!r}, "tokens": {s * 524288}, '
                   f'"train": {{"loss": {"NaN" if bad else repr(loss)}, "ppl": {"Infinity" if bad else repr(ppl)}}}, '
                   f'"_timestamp": {1.7e9 + s * 0.35!r}, "_runtime": {s * 0.35!r}}}\n')
            out.write(rec)
            if not bad:
                out_clean.write(rec)
            if s % 1000 == 999:
                ev = json.dumps({"step": s, "eval": {"loss": loss + 0.1, "ppl": math.exp(min(loss + 0.1, 50.0))}})
                out.write(ev + "\n")
                out_clean.write(ev + "\n")
    tmp.replace(path)
    tmp_clean.replace(clean)
    return path, clean


def issue13(lines: int, repeat: int) -> None:
    """``jsonl.read`` of the mixed log against ``read_ndjson`` of its NaN-free copy, taken in turn."""
    import polars as pl

    from parsers import jsonl

    path, clean = make_mixed(lines)
    print(f"issue 13: {path} ({path.stat().st_size / 1e6:.0f} MB, {lines} train lines, {NAN_LINES} with NaN)")
    best = {"read_ndjson": [math.inf, math.inf], "jsonl.read": [math.inf, math.inf]}
    for _ in range(max(repeat, 1)):
        for name, fn in (("read_ndjson", lambda: pl.read_ndjson(clean)),
                         ("jsonl.read", lambda: jsonl.read(path, path.parent))):
            w, c = time.perf_counter(), time.process_time()
            fn()
            best[name] = [min(best[name][0], time.perf_counter() - w), min(best[name][1], time.process_time() - c)]
    (fw, fc), (ow, oc) = best["read_ndjson"], best["jsonl.read"]
    print(f"read_ndjson {fw:6.2f} s wall {fc:6.2f} s CPU | jsonl.read {ow:6.2f} s wall {oc:6.2f} s CPU | "
          f"ratio x{ow / fw:.2f} wall, x{oc / fc:.2f} CPU (goal <= 2)")


_CHILD = r"""
import json, sys, time
def kb(field):
    for line in open("/proc/self/status"):
        if line.startswith(field):
            return int(line.split()[1])
import polars as pl
from forensics import api
import forensics.engine, forensics.recovery, parsers.discover, parsers.jsonl  # imports before the baseline
_read, _spent = parsers.jsonl.read, [0.0]
def _timed_read(*a, **k):  # the reader's own CPU (all threads), to tell the read from what follows it
    c = time.process_time()
    try:
        return _read(*a, **k)
    finally:
        _spent[0] += time.process_time() - c
parsers.jsonl.read = _timed_read
try:
    open("/proc/self/clear_refs", "w").write("5")  # VmHWM := VmRSS
except OSError:
    pass
base = kb("VmRSS:")
w0, c0 = time.perf_counter(), time.process_time()
if sys.argv[1] == "floor":
    pl.read_ndjson(sys.argv[2])
    out = {}
else:
    run = api.load(sys.argv[2])
    w1, c1 = time.perf_counter(), time.process_time()
    a = api.analyze_run(run)
    out = {"load_wall": w1 - w0, "load_cpu": c1 - c0, "read_cpu": _spent[0], "verdict": f"{a.verdict} {a.cause}"}
out.update(wall=time.perf_counter() - w0, cpu=time.process_time() - c0, peak_mb=(kb("VmHWM:") - base) / 1024)
if sys.argv[1] != "floor":
    out["table_mb"] = run.metrics.to_arrow().nbytes / 2**20
print(json.dumps(out))
"""


def _child(which: str, path: Path) -> dict:
    """One fresh process (``nice``-free: the caller's priority): its figures as a dict."""
    res = subprocess.run([sys.executable, "-c", _CHILD, which, str(path)], capture_output=True, text=True,
                         cwd=ROOT, check=False)
    if res.returncode:
        raise SystemExit(f"{which} {path}: exit {res.returncode}: {res.stderr.strip().splitlines()[-1:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def _best(which: str, path: Path, repeat: int) -> dict:
    """The run with the least CPU of ``repeat`` fresh processes."""
    return min((_child(which, path) for _ in range(max(repeat, 1))), key=lambda d: d["cpu"])


def issue17(quick: bool, repeat: int, sizes: tuple[int, int, int] | None = None) -> None:
    """Print issue 17's table: analyze against read_ndjson per run, peak RSS, growth, the 500-series run.

    ``sizes``: (small, large steps of the x 50 runs, steps of the x 500 run), else by ``quick``.
    """
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from bench_analyze import make_run

    small, large, layers = sizes or ((20_000, 200_000, 20_000) if quick else (100_000, 1_000_000, 100_000))
    configs = [(small, 50), (large, 50), (layers, 500)]
    print(f"{'run':>12} {'MB':>6} | {'read_ndjson wall/CPU s':>22} | {'analyze wall/CPU s':>18} {'(load CPU)':>10} | "
          f"{'x floor wall/CPU':>16} | {'jsonl.read CPU':>14} {'rest CPU':>8} {'rest x floor':>12} | "
          f"{'peak MB':>7} {'table MB':>8} {'x table':>7} | verdict")
    got: dict[tuple[int, int], tuple[dict, dict]] = {}
    for steps, n in configs:
        folder, clean = make_run(steps, n)
        floor, ours = _best("floor", clean, repeat), _best("analyze", folder, repeat)
        got[(steps, n)] = floor, ours
        mb = (folder / "metrics.jsonl").stat().st_size / 1e6
        rest, nan = ours["cpu"] - ours.get("read_cpu", math.nan), math.nan  # a base side may lack the read's figure
        print(f"{f'{steps}x{n}':>12} {mb:6.0f} | {floor['wall']:10.2f} {floor['cpu']:11.2f} | {ours['wall']:8.2f} "
              f"{ours['cpu']:9.2f} {ours['load_cpu']:10.2f} | {ours['wall'] / floor['wall']:7.2f} "
              f"{ours['cpu'] / floor['cpu']:8.2f} | {ours.get('read_cpu', nan):14.2f} {rest:8.2f} "
              f"{rest / floor['cpu']:12.2f} | "
              f"{ours['peak_mb']:7.0f} {ours['table_mb']:8.0f} "
              f"{ours['peak_mb'] / ours['table_mb']:7.2f} | {ours['verdict']}", flush=True)
    o1, o2 = got[(small, 50)][1], got[(large, 50)][1]
    size = large / small
    for what in ("wall", "cpu"):
        g = o2[what] / o1[what]
        print(f"growth {small} -> {large} steps ({what}): time x{g:.2f} for size x{size:.0f}: "
              f"time ratio / size ratio {g / size:.2f} (goal <= 1.3)")
    print("goals: analyze <= 3x read_ndjson (1M x 50 and 100k x 500), peak RSS <= 2x the Arrow table; "
          "'rest' is everything after jsonl.read (framing, objective, series, detectors, report): ~1x the floor")
