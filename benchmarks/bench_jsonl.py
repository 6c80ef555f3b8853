"""Speed and peak memory of our JSONL reader against ``polars.read_ndjson`` on the same file.

Writes (once, cached in the temp folder) a trainer-style JSONL log of ``--lines`` lines (default
1,000,000, about 270 MB): ``step``, ``loss``, ``lr``, ``grad_norm``, ``loss_scale``, ``tokens``, a
nested ``{"train": {"loss", "ppl"}}``, ``_timestamp`` and ``_runtime`` on every line, an
``{"eval": {...}}`` line every 1,000 steps (the same step as a train line), and a few lines with bare
``NaN``/``Infinity`` near the end (a diverging run). polars rejects those tokens, so it reads a copy
without them (written beside the file); ours reads the file as is. Then, in this run:

- times ``parsers.jsonl.read`` (engine ``"auto"``) and ``polars.read_ndjson`` (best of ``--repeat``),
  and prints seconds, the ratio, rows/s and MB/s;
- times the per-line engine (``engine="python"``) on the first ``--python-lines`` lines, for scale;
- measures the peak memory of each reader in a fresh subprocess (peak RSS during the read minus RSS
  before it, imports done: ``VmHWM`` reset with ``/proc/self/clear_refs``, else ``ru_maxrss``) and
  prints it against the ``nbytes`` of our resulting Arrow table (the long metrics table) and the
  ``estimated_size`` of polars' frame.

Usage: ``python benchmarks/bench_jsonl.py [--lines N] [--repeat R] [--python-lines M] [--no-memory]``.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

NAN_LINES = 20  # lines with NaN/Infinity tokens, among the last 200


def make_file(lines: int) -> tuple[Path, Path]:
    """Write (or reuse) the log and its copy without NaN/Infinity lines; returns both paths."""
    folder = Path(tempfile.gettempdir()) / f"forensics_bench_jsonl_{lines}"
    path, clean = folder / "metrics.jsonl", folder / "metrics_no_nan.jsonl"
    if path.exists() and clean.exists():
        return path, clean
    folder.mkdir(parents=True, exist_ok=True)
    rng = random.Random(0)
    t0 = 1.7e9
    nan_at = set(range(lines - 200, lines, 200 // NAN_LINES))
    tmp, tmp_clean = path.with_suffix(".tmp"), clean.with_suffix(".tmp")
    with open(tmp, "w") as out, open(tmp_clean, "w") as out_clean:
        batch, batch_clean = [], []
        for s in range(lines):
            loss = 10.0 * math.exp(-s / 2e5) + rng.random() * 0.1
            scale = 65536.0 if s < lines // 2 else 32768.0
            gn = rng.lognormvariate(0.0, 0.5)
            if s in nan_at:
                rec = (f'{{"step": {s}, "loss": NaN, "lr": {3e-4!r}, "grad_norm": Infinity, "loss_scale": {scale!r}, '
                       f'"tokens": {s * 524288}, "train": {{"loss": NaN, "ppl": Infinity}}, '
                       f'"_timestamp": {t0 + s * 0.35!r}, "_runtime": {s * 0.35!r}}}\n')
            else:
                rec = (f'{{"step": {s}, "loss": {loss!r}, "lr": {3e-4 * min(1.0, s / 2000)!r}, "grad_norm": {gn!r}, '
                       f'"loss_scale": {scale!r}, "tokens": {s * 524288}, '
                       f'"train": {{"loss": {loss!r}, "ppl": {math.exp(min(loss, 50.0))!r}}}, '
                       f'"_timestamp": {t0 + s * 0.35!r}, "_runtime": {s * 0.35!r}}}\n')
                batch_clean.append(rec)
            batch.append(rec)
            if s % 1000 == 999:
                ev = json.dumps({"step": s, "eval": {"loss": loss + 0.1, "ppl": math.exp(min(loss + 0.1, 50.0))}})
                batch.append(ev + "\n")
                batch_clean.append(ev + "\n")
            if len(batch) >= 10000:
                out.writelines(batch)
                out_clean.writelines(batch_clean)
                batch, batch_clean = [], []
        out.writelines(batch)
        out_clean.writelines(batch_clean)
    tmp.replace(path)
    tmp_clean.replace(clean)
    return path, clean


def timed(fn, repeat: int) -> tuple[float, int]:
    """Best wall time of ``repeat`` calls, and the row count the call returned."""
    best, rows = float("inf"), 0
    for _ in range(repeat):
        t0 = time.perf_counter()
        rows = fn()
        best = min(best, time.perf_counter() - t0)
    return best, rows


def timed_pair(a, b, repeat: int) -> tuple[tuple[float, float, int], tuple[float, float, int]]:
    """Best wall and CPU seconds of ``a`` and ``b``, and the row count each returned.

    They are called in turn ``repeat`` times, so that a shared machine's load weighs on both alike.
    """
    best = [[float("inf"), float("inf"), 0], [float("inf"), float("inf"), 0]]
    for _ in range(repeat):
        for i, fn in enumerate((a, b)):
            w, c = time.perf_counter(), time.process_time()
            rows = fn()
            best[i] = [min(best[i][0], time.perf_counter() - w), min(best[i][1], time.process_time() - c), rows]
    return tuple(best[0]), tuple(best[1])  # type: ignore[return-value]


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


def child(which: str, path: Path, chunk: int = 0) -> None:
    """In a fresh process: read ``path`` once and print peak-memory figures as one JSON line.

    The peak is ``VmHWM`` (reset just before the read with ``clear_refs``) minus ``VmRSS`` before the
    read; where ``/proc`` is missing, ``ru_maxrss`` after minus before (which a forked child may inherit
    from its parent, hence the ``/proc`` way first).
    """
    import polars as pl

    from parsers import jsonl

    exact = _reset_peak()
    before = _status_mb("VmRSS") if exact else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    if which == "ours":
        table = jsonl.read(path, path.parent, chunk_bytes=chunk or jsonl.CHUNK_BYTES).metrics
        size, rows = table.nbytes, table.num_rows
    else:
        df = pl.read_ndjson(path)
        size, rows = df.estimated_size(), df.height
    peak = _status_mb("VmHWM") if exact else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    print(json.dumps({"before_mb": before, "peak_mb": peak, "result_mb": size / 2**20, "rows": rows,
                      "method": "VmHWM (clear_refs)" if exact else "ru_maxrss"}))


def memory(which: str, path: Path, chunk: int = 0) -> dict:
    """Run :func:`child` in a subprocess and return its figures."""
    out = subprocess.run([sys.executable, __file__, "--child", which, str(path), str(chunk)], check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    """Run the benchmark and print one line per measurement."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--lines", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--python-lines", type=int, default=100_000)
    ap.add_argument("--no-memory", action="store_true")
    ap.add_argument("--chunk-mb", type=int, default=0, help="block size of our reader (default: the module's)")
    ap.add_argument("--child", nargs=3, metavar=("WHICH", "PATH", "CHUNK"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child[0], Path(args.child[1]), int(args.child[2]))
        return
    import polars as pl

    from parsers import jsonl

    path, clean = make_file(args.lines)
    mb = path.stat().st_size / 1e6
    print(f"file: {path} ({mb:.1f} MB, {args.lines} train lines, {NAN_LINES} with NaN/Infinity)")
    try:
        pl.read_ndjson(path)
        print("polars reads the file with NaN lines as is")
        polars_path = path
    except Exception as exc:  # noqa: BLE001 - report what polars says
        print(f"polars cannot read it ({type(exc).__name__}: {str(exc).splitlines()[0][:80]}); "
              f"polars reads {clean.name} (the same file less the {NAN_LINES} NaN lines)")
        polars_path = clean
    res = jsonl.read(path, path.parent)
    print(f"ours: engine={res.meta['engine']}, {res.meta['python_lines']} line(s) read by the per-line path, "
          f"{res.metrics.num_rows} metric rows, skipped={len(res.skipped)}")
    chunk = args.chunk_mb << 20 if args.chunk_mb else jsonl.CHUNK_BYTES
    (ours, ours_cpu, rows), (pol, pol_cpu, lines) = timed_pair(
        lambda: jsonl.read(path, path.parent, chunk_bytes=chunk).metrics.num_rows,
        lambda: pl.read_ndjson(polars_path).height, args.repeat)
    print(f"{'ours (auto, ' + str(chunk >> 20) + ' MB blocks)':34s} {ours:7.3f} s (CPU {ours_cpu:6.2f} s)  "
          f"{rows / ours / 1e6:6.2f} M metric rows/s  {lines / ours / 1e6:5.2f} M lines/s  {mb / ours:7.1f} MB/s")
    print(f"{'polars.read_ndjson':34s} {pol:7.3f} s (CPU {pol_cpu:6.2f} s)  {'':22s}"
          f"{lines / pol / 1e6:5.2f} M lines/s  {polars_path.stat().st_size / 1e6 / pol:7.1f} MB/s")
    print(f"ratio ours / polars: {ours / pol:.2f} wall, {ours_cpu / pol_cpu:.2f} CPU (goal: <= 2)")
    if args.python_lines:
        head = path.with_name(f"head_{args.python_lines}.jsonl")
        if not head.exists():
            with open(path, "rb") as src, open(head, "wb") as dst:
                dst.writelines(line for _, line in zip(range(args.python_lines), src, strict=False))
        py, py_rows = timed(lambda: jsonl.read(head, head.parent, engine="python").metrics.num_rows, 1)
        au, _ = timed(lambda: jsonl.read(head, head.parent).metrics.num_rows, 1)
        print(f"per-line engine on the first {args.python_lines} lines: {py:.3f} s "
              f"({py_rows / py / 1e6:.2f} M rows/s); auto on the same: {au:.3f} s (x{py / au:.1f})")
    if not args.no_memory:
        m = memory("ours", path, chunk)
        p = memory("polars", polars_path)
        for name, f in (("ours", m), ("polars", p)):
            delta = f["peak_mb"] - f["before_mb"]
            print(f"peak memory {name:7s} {delta:8.1f} MB over the process before the read ({f['method']}); "
                  f"result {f['result_mb']:7.1f} MB ({f['rows']} rows); peak / result = {delta / f['result_mb']:.2f}")
        print(f"ours: peak / Arrow table = {(m['peak_mb'] - m['before_mb']) / m['result_mb']:.2f} (goal: <= 2)")


if __name__ == "__main__":
    main()
