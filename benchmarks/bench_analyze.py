"""Speed and peak memory of ``forensics analyze`` against the read floor, ``polars.read_ndjson``.

Writes (once, cached under the temp folder; never committed) realistic JSONL runs:

- ``loss`` (a falling power law with log-normal noise and one transient spike that recovers), ``lr``
  (linear warm-up, then cosine decay), ``grad_norm`` (log-normal, with a few fp16 overflow checks: inf
  at a step where the dynamic scaler halves ``loss_scale``), ``loss_scale`` (doubles every 2,000 clean
  steps, halves at an overflow), ``throughput``, ``step_time``, ``tokens``;
- per-layer series: for each layer the Q/K/V projection weight norms (slow drift) and the layer's
  gradient norm (log-normal, one extreme value 1e6 somewhere);

so that ``--metrics 50`` gives 7 run series + 43 per-layer series, ``--metrics 500`` 7 + 493. A few
lines carry bare ``NaN``/``Infinity`` (the overflow checks); polars rejects those tokens, so the read
floor reads a copy without those lines (written beside the file, a handful of lines shorter).

In one run, for each configuration, it prints:

- the read floor: ``polars.read_ndjson`` of the copy (best of ``--repeat``);
- ``analyze``: ``forensics.api.load`` + ``forensics.api.analyze_run`` in this process (imports done;
  the time split into load and analysis), and the ratio to the floor;
- the growth 100k -> 1M steps: ratio of analyze times against the ratio of sizes (linear = 1.0);
- peak RSS of a whole ``analyze`` in a fresh subprocess (``VmHWM`` reset with ``/proc/self/clear_refs``
  after the imports, minus the RSS then; else ``ru_maxrss``) against the ``nbytes`` of the long Arrow
  metrics table.

Usage: ``python benchmarks/bench_analyze.py [--steps 100000,1000000] [--metrics 50] [--layers-steps 100000]
[--layers-metrics 500] [--repeat 1] [--profile N] [--split]``; ``--split`` prints the CPU of each stage of one
analyze (load, decision, report) and of each detector (:func:`analyze_split`).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

RUN_SERIES = ("loss", "lr", "grad_norm", "loss_scale", "throughput", "step_time", "tokens")


def _layer_names(n: int) -> list[str]:
    """``n`` per-layer metric names: q/k/v weight norms and the gradient norm of each layer, in that order."""
    names: list[str] = []
    layer = 0
    while len(names) < n:
        for which in ("q_proj", "k_proj", "v_proj"):
            names.append(f"weight_norm/layers.{layer}.self_attn.{which}")
        names.append(f"grad_norm/layers.{layer}.mlp")
        layer += 1
    return names[:n]


def _columns(steps: int, n_metrics: int, seed: int = 0) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """The run's columns (float64, shape (steps,)) and the rows that hold a non-finite value."""
    rng = np.random.default_rng(seed)
    s = np.arange(steps, dtype=np.float64)
    cols: dict[str, np.ndarray] = {}
    cols["loss"] = 2.0 + 8.0 * (1.0 + s / 500.0) ** -0.5 * np.exp(rng.normal(0, 0.02, steps))
    spike = int(steps * 0.6)
    cols["loss"][spike:spike + 30] *= np.linspace(3.0, 1.0, 30)  # a transient spike that recovers
    warm = max(100, steps // 100)
    lr = 3e-4 * np.minimum(1.0, (s + 1) / warm)
    decay = np.clip((s - warm) / max(1, steps - warm), 0, 1)
    cols["lr"] = np.where(s < warm, lr, 3e-5 + 0.5 * (3e-4 - 3e-5) * (1 + np.cos(np.pi * decay)))
    gn = np.exp(rng.normal(0.0, 0.3, steps)) * (1.0 + 2.0 / (1.0 + s / 1000.0))
    overflow = np.sort(rng.choice(np.arange(warm, steps), size=8, replace=False))
    gn[overflow] = np.inf
    cols["grad_norm"] = gn
    factor = np.ones(steps)
    factor[np.minimum(overflow + 1, steps - 1)] = 0.5  # the scaler halves after an overflow
    growth = np.arange(2000, steps, 2000)
    recent = np.searchsorted(overflow, growth) - np.searchsorted(overflow, growth - 2000)
    factor[growth[recent == 0]] *= 2.0  # and doubles after 2,000 clean steps
    scale = np.clip(65536.0 * np.cumprod(factor), 1.0, 2.0 ** 24)
    cols["loss_scale"] = scale
    cols["throughput"] = 1.2e5 * np.exp(rng.normal(0, 0.01, steps))
    cols["step_time"] = 4.0 * np.exp(rng.normal(0, 0.01, steps))
    cols["tokens"] = (s + 1) * 524288.0
    for k, name in enumerate(_layer_names(max(0, n_metrics - len(RUN_SERIES)))):
        if name.startswith("grad_norm/"):
            v = np.exp(rng.normal(-2.0, 0.3, steps))
            v[int(rng.integers(warm, steps))] = 1e6  # one extreme value
        else:
            v = (10.0 + k % 7) * (1.0 + 0.2 * s / steps) * np.exp(rng.normal(0, 0.001, steps))
        cols[name] = v
    return cols, overflow


def make_run(steps: int, n_metrics: int) -> tuple[Path, Path]:
    """Write (or reuse) the run folder and the floor's NaN-free copy; returns (run folder, copy)."""
    import polars as pl

    folder = Path(tempfile.gettempdir()) / f"forensics_bench_analyze_{steps}x{n_metrics}"
    run, clean = folder / "run" / "metrics.jsonl", folder / "metrics_no_nan.jsonl"
    if run.exists() and clean.exists():
        return run.parent, clean
    run.parent.mkdir(parents=True, exist_ok=True)
    cols, bad_rows = _columns(steps, n_metrics)
    bad = set(bad_rows.tolist())
    chunk = 50_000
    tmp, tmp_clean = run.with_suffix(".tmp"), clean.with_suffix(".tmp")
    with open(tmp, "wb") as out, open(tmp_clean, "wb") as out_clean:
        cuts = sorted({*range(0, steps, chunk), *bad, *(b + 1 for b in bad), steps})
        for lo, hi in zip(cuts, cuts[1:], strict=False):  # in step order, the non-finite lines alone
            if lo in bad:  # as trainers print them (json.dumps writes NaN/Infinity)
                line = json.dumps({"step": lo, **{k: float(v[lo]) for k, v in cols.items()}}) + "\n"
                out.write(line.encode())
                continue
            frame = pl.DataFrame({"step": np.arange(lo, hi), **{k: v[lo:hi] for k, v in cols.items()}})
            buf = frame.write_ndjson().encode()
            out.write(buf)
            out_clean.write(buf)
    tmp.replace(run)
    tmp_clean.replace(clean)
    return run.parent, clean


def read_floor(clean: Path, repeat: int) -> float:
    """Best wall time of ``polars.read_ndjson`` of the NaN-free copy."""
    import polars as pl

    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        pl.read_ndjson(clean)
        best = min(best, time.perf_counter() - t0)
    return best


def time_analyze(folder: Path, repeat: int) -> tuple[float, float, float, str]:
    """(total, load, analysis) best wall seconds of ``api.load`` + ``api.analyze_run``, and the verdict line."""
    from forensics import api

    best = (float("inf"), 0.0, 0.0, "")
    for _ in range(repeat):
        t0 = time.perf_counter()
        run = api.load(folder)
        t1 = time.perf_counter()
        a = api.analyze_run(run)
        t2 = time.perf_counter()
        if t2 - t0 < best[0]:
            best = (t2 - t0, t1 - t0, t2 - t1, f"{a.verdict} {a.cause} onset={a.onset}")
    return best


_CHILD = """
import json, resource, sys
from forensics import api
import parsers.discover, parsers.jsonl, forensics.recovery  # imports done before the baseline


def kb(field):
    try:
        for line in open("/proc/self/status"):
            if line.startswith(field):
                return int(line.split()[1])
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


try:
    open("/proc/self/clear_refs", "w").write("5")  # reset VmHWM to the current RSS
except OSError:
    pass
base = kb("VmRSS:")
run = api.load(sys.argv[1])
nbytes = run.metrics.to_arrow().nbytes
api.analyze_run(run)
print(json.dumps({"base_kb": base, "peak_kb": kb("VmHWM:"), "table_bytes": nbytes}))
"""


def peak_rss(folder: Path) -> tuple[float, float]:
    """(peak RSS growth of a whole analyze in a fresh process, Arrow table nbytes), both MB."""
    out = subprocess.run([sys.executable, "-c", _CHILD, str(folder)], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[1])
    d = json.loads(out.stdout.strip().splitlines()[-1])
    return (d["peak_kb"] - d["base_kb"]) / 1024, d["table_bytes"] / 2**20


def analyze_split(folder: Path) -> list[tuple[str, float]]:
    """CPU seconds (this process, imports done) of each stage of one ``analyze``, as (stage, seconds) rows.

    Stages: ``load`` (the read), ``analyze_run`` (the whole decision) and its parts, measured on a second fresh
    load: ``facts``, each evaluated detector (``missing`` + ``detect``; a detector that is the first to ask for
    a series pays for building it; codes not evaluated are left out) and the rest (engine rules, onset,
    calibration, recovery plan: ``analyze_run`` minus facts and detectors); then the report (``render`` to
    JSON, then to HTML, the first HTML render of the process).
    """
    from forensics import api
    from forensics.detectors import DETECTORS
    from forensics.facts import run_facts
    from reports import ReportFormat, render

    cpu = time.process_time
    rows: list[tuple[str, float]] = []
    t0 = cpu()
    run = api.load(folder)
    t1 = cpu()
    analysis = api.analyze_run(run)
    t2 = cpu()
    render(analysis, run, ReportFormat("json"))
    t3 = cpu()
    render(analysis, run, ReportFormat("html"), html_path=str(Path(tempfile.gettempdir()) / "bench_split.html"))
    t4 = cpu()
    rows += [("load", t1 - t0), ("analyze_run", t2 - t1)]
    del run, analysis  # one run in memory at a time
    run = api.load(folder)  # fresh: RunData caches its series (the first detector to ask for one pays for it)
    t0 = cpu()
    facts = run_facts(run)
    rows.append(("  facts", cpu() - t0))
    for det in DETECTORS:
        args = (run, facts) if det.uses_facts else (run,)
        t0 = cpu()
        if det.missing(*args):
            continue
        det.detect(*args)  # type: ignore[call-arg]
        rows.append((f"  {det.code} {det.name}", cpu() - t0))
    rows.append(("  rest of analyze_run", (t2 - t1) - sum(t for name, t in rows if name.startswith("  "))))
    return rows + [("render json", t3 - t2), ("render html (first: imports bokeh, scipy.signal)", t4 - t3)]


def print_split(folder: Path) -> None:
    """Print :func:`analyze_split` of ``folder``, one stage a line, with its share of the whole."""
    rows = analyze_split(folder)
    total = sum(t for name, t in rows if not name.startswith("  "))
    print(f"in-process CPU of one analyze of {folder.name} (imports done): {total:.2f} s")
    for name, t in rows:
        print(f"  {name:44s} {t:7.3f} s  {100 * t / total:5.1f} %")


def profile(folder: Path, top: int) -> None:
    """A cProfile listing of one in-process analyze, the ``top`` functions by cumulative time."""
    import cProfile
    import pstats

    from forensics import api

    pr = cProfile.Profile()
    pr.enable()
    api.analyze_run(api.load(folder))
    pr.disable()
    pstats.Stats(pr).sort_stats("cumulative").print_stats(top)


def main() -> None:
    """Parse arguments, write the runs, print every figure against its reference."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", default="100000,1000000", help="step counts of the run-series runs (comma list)")
    ap.add_argument("--metrics", type=int, default=50)
    ap.add_argument("--layers-steps", type=int, default=100_000)
    ap.add_argument("--layers-metrics", type=int, default=500, help="0 to leave the per-layer run out")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--no-memory", action="store_true")
    ap.add_argument("--profile", type=int, default=0, help="print a cProfile of the largest run (top N)")
    ap.add_argument("--split", action="store_true", help="print the CPU of each stage and detector, largest run")
    args = ap.parse_args()
    configs = [(int(x), args.metrics) for x in args.steps.split(",") if x]
    if args.layers_metrics:
        configs.append((args.layers_steps, args.layers_metrics))
    print(f"{'run':>16} {'MB':>7} {'read_ndjson s':>13} {'analyze s':>9} {'(load':>7} {'+ analysis)':>11} "
          f"{'x floor':>7} {'peak RSS MB':>11} {'table MB':>8} {'x table':>7}  verdict")
    times: dict[tuple[int, int], float] = {}
    for steps, n in configs:
        folder, clean = make_run(steps, n)
        floor = read_floor(clean, args.repeat)
        total, load, analysis, verdict = time_analyze(folder, args.repeat)
        times[(steps, n)] = total
        rss, table = (float("nan"), float("nan")) if args.no_memory else peak_rss(folder)
        mb = (folder / "metrics.jsonl").stat().st_size / 2**20
        print(f"{f'{steps}x{n}':>16} {mb:7.0f} {floor:13.2f} {total:9.2f} {load:7.2f} {analysis:11.2f} "
              f"{total / floor:7.2f} {rss:11.0f} {table:8.0f} {rss / table:7.2f}  {verdict}", flush=True)
    run_steps = sorted(s for s, n in times if n == args.metrics)
    if len(run_steps) >= 2:
        a, b = run_steps[0], run_steps[-1]
        growth = times[(b, args.metrics)] / times[(a, args.metrics)]
        print(f"growth {a} -> {b} steps: time x{growth:.2f} for size x{b / a:.2f} "
              f"(time ratio / size ratio = {growth / (b / a):.2f}; linear = 1.0, goal <= 1.3)")
    if args.split:
        print_split(make_run(*configs[-1])[0])
    if args.profile:
        profile(make_run(*configs[-1])[0], args.profile)


if __name__ == "__main__":
    main()
