"""Per-tensor checkpoint statistics: our streaming reader against a plain numpy pass over the same file.

Writes, in the temp folder, one safetensors file per dtype (F32, BF16, F16) of about ``--size-mb`` MB
(default 2048, the issue's target): one embedding of a quarter of the file (64-512 MiB, much larger than
a 4 MiB read chunk), 16 MiB tensors and 64 small ones, N(0, 0.02) values written with numpy (no torch
needed). The files are deleted at the end unless ``--keep`` (then reused by the next run). The page
cache is warmed first, so this measures decoding and reduction, not the disk. Each method runs in its
own single-threaded subprocess (``OMP/OPENBLAS/MKL_NUM_THREADS=1``: the goal is per core) so that its
peak RSS (``VmHWM``, reset after the imports; ``ru_maxrss`` elsewhere) is its own:

- ``ours``: :func:`parsers.safetensors_ckpt.read_header` + :func:`tensor_stats` (streamed, 4 MiB chunks;
  BF16/F16 from their bit patterns, :class:`parsers.safetensors_ckpt.Bits16`);
- ``ours-float``: the same with :class:`Bits16` off (BF16/F16 converted to float32 block by block and
  reduced by :class:`Moments`, the reducer used before issue 4's change; 16-bit files only);
- ``ours+delta`` (with ``--delta``): statistics plus the update norm against a previous checkpoint (the
  same file streamed a second time), as :func:`parsers.checkpoints.read_checkpoints` does from the second
  checkpoint on; its GB/s count the file once;
- ``numpy``: every tensor read whole with ``np.fromfile`` (BF16 via the exact bit shift, F16 as numpy
  float16), then the same statistics over the whole array: float64 sum of squares and max |x| over the
  finite values, NaN/inf/zero counts;
- ``torch``: ``safetensors.torch.load_file`` (the whole file) + ``double()`` norm, ``abs().max()``,
  counts (only with ``--torch``).

Printed per file and method: seconds, GB/s by the wall clock and by CPU time (user + system; the
machine may be shared: CPU time is the per-core figure) with the system share (page faults of fresh
allocations, the kernel's copies out of the page cache), time relative to numpy, peak RSS growth over
the imports, and the sum of the tensors' l2 norms (equal across methods); then ours against numpy and
our RSS growth against the bound of the issue (largest tensor + 256 MB).

``--micro`` instead times the ways to reduce 16-bit blocks in memory (no file): :class:`Bits16`'s two
exact methods (counts and max from the bits + float64 conversion, ``ml_dtypes`` for BF16 and the bit trick
of ``_f16_magnitude`` for F16, and ``np.einsum``; a 65536-bin
``np.bincount`` histogram) with several step sizes, against the float path (conversion to float32 by
bit shift, numpy or ``ml_dtypes``, then :class:`Moments`) with several block sizes.

Usage: ``python benchmarks/bench_checkpoint.py [--size-mb 2048] [--dtype F32 BF16 F16] [--keep] [--delta]
[--torch]``
or ``python benchmarks/bench_checkpoint.py --micro``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from parsers import safetensors_ckpt as sc  # noqa: E402

BIG = 16 << 20
ITEM = {"F32": 4, "BF16": 2, "F16": 2}
RAW = {"F32": "<f4", "BF16": "<u2", "F16": "<f2"}
ONE_THREAD = {k: "1" for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}


def bench_path(size_mb: int, dtype: str) -> Path:
    """Where the generated file of that size and dtype lives (the temp folder)."""
    return Path(tempfile.gettempdir()) / f"forensics_bench_ckpt_{size_mb}_{dtype}.safetensors"


def make_file(size_mb: int, dtype: str) -> Path:
    """Write (or reuse) a safetensors file of about ``size_mb`` MB in ``dtype`` (F32, BF16 or F16)."""
    path = bench_path(size_mb, dtype)
    if path.exists():
        return path
    item = ITEM[dtype]
    embed = max(64 << 20, min(512 << 20, (size_mb << 20) // 4))  # one tensor larger than a read chunk
    shapes = {"embed.weight": [embed // item // 1024, 1024]}
    shapes |= {f"layers.{i}.w": [BIG // item // 1024, 1024] for i in range(max(1, ((size_mb << 20) - embed) // BIG))}
    shapes |= {f"layers.{i}.b": [1024] for i in range(64)}
    header, off = {}, 0
    for name, shape in shapes.items():
        nb = math.prod(shape) * item
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + nb]}
        off += nb
    hb = json.dumps(header).encode()
    hb += b" " * (-len(hb) % 8)
    rng = np.random.default_rng(0)
    tmp = path.with_suffix(".tmp")
    try:
        with open(tmp, "wb") as fh:
            fh.write(struct.pack("<Q", len(hb)) + hb)
            for shape in shapes.values():
                n = math.prod(shape)
                for i in range(0, n, 1 << 24):  # 64 MiB of float32 at a time
                    x = rng.standard_normal(min(1 << 24, n - i), dtype=np.float32) * 0.02
                    if dtype == "BF16":
                        x = (x.view(np.uint32) >> 16).astype(np.uint16)
                    elif dtype == "F16":
                        x = x.astype(np.float16)
                    fh.write(x.tobytes())
        tmp.rename(path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def _np_stats(x: np.ndarray) -> tuple[float, float, int, int, int]:
    """(l2, max_abs, n_nan, n_inf, n_zero) of a whole array, as a user would write them in numpy."""
    x64 = x.astype(np.float64)
    fin = np.isfinite(x64)
    if not fin.all():
        x64 = x64[fin]
    return (math.sqrt(float(x64 @ x64)), float(np.abs(x64).max()) if x64.size else 0.0, int(np.isnan(x).sum()),
            int(np.isinf(x).sum()), int(x.size - np.count_nonzero(x)))


def _peak_mb() -> float:
    """Peak RSS in MB: VmHWM (Linux; reset by :func:`_reset_peak`), else ``ru_maxrss``."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _reset_peak() -> None:
    try:
        Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS (Linux >= 4.0)
    except OSError:
        pass


def worker(method: str, path: str) -> dict:
    """Run one method over the file; return wall and CPU seconds, the sum of the l2 norms, peak RSS and growth."""
    sc._table16("BF16"), sc._table16("F16")  # part of the import cost, not of the pass
    _reset_peak()
    base_rss = _peak_mb()  # after imports
    t0, r0 = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
    total = 0.0
    if method in ("ours", "ours-float", "ours+delta"):
        if method == "ours-float":
            sc.BITS16_MIN = 1 << 62
        refs, _, _ = sc.read_header(path)
        if method == "ours+delta":  # as read_checkpoints does from the second checkpoint on: two streams
            total = sum(sc.tensor_stats(r, prev=r)["l2"] for r in refs)
        else:
            total = sum(sc.tensor_stats(r)["l2"] for r in refs)
    elif method == "numpy":
        refs, _, _ = sc.read_header(path)
        for r in refs:
            raw = np.fromfile(path, dtype=RAW[r.dtype], count=r.numel, offset=r.offset)
            x = (raw.astype(np.uint32) << 16).view(np.float32) if r.dtype == "BF16" else raw
            total += _np_stats(x)[0]
    elif method == "torch":
        import torch
        from safetensors.torch import load_file

        torch.set_num_threads(1)
        for t in load_file(path).values():
            total += float(t.double().norm())
            float(t.abs().max()) if t.numel() else 0.0
            int(t.isnan().sum()), int(t.isinf().sum()), int((t == 0).sum())
    seconds, r1 = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_SELF)
    user, system = r1.ru_utime - r0.ru_utime, r1.ru_stime - r0.ru_stime
    peak = _peak_mb()
    return {"seconds": seconds, "cpu": user + system, "sys": system, "l2_sum": total, "peak_rss_mb": peak,
            "rss_growth_mb": peak - base_rss}


def micro(n: int = 1 << 25, repeat: int = 5) -> None:
    """Time the ways to reduce ``n`` 16-bit elements held in memory (best CPU time of ``repeat``)."""
    import ml_dtypes

    rng = np.random.default_rng(0)
    x = rng.standard_normal(n, dtype=np.float32) * 0.02
    data = {"BF16": (x.view(np.uint32) >> 16).astype(np.uint16), "F16": x.astype(np.float16).view(np.uint16)}

    def best(fn) -> float:  # noqa: ANN001
        t = math.inf
        for _ in range(repeat):
            c0 = time.process_time()
            fn()
            t = min(t, time.process_time() - c0)
        return 2 * n / t / 1e9

    def bits16(u: np.ndarray, dtype: str, method: str, block: int):  # noqa: ANN202
        def run() -> None:
            sc.BITS16_BLOCK = block
            m = sc.Bits16(dtype, method=method)
            for i in range(0, n, 2 << 20):  # 4 MiB chunks, as iter_raw gives them
                m.add_bits(u[i:i + (2 << 20)])
            m.result()
        return run

    def floats(u: np.ndarray, dtype: str, block: int, how: str):  # noqa: ANN202
        conv = sc._Converter(dtype, block)
        f32 = np.empty(block, np.float32)
        view = u.view(ml_dtypes.bfloat16 if dtype == "BF16" else np.float16)

        def run() -> None:
            m = sc.Moments()
            for i in range(0, n, block):
                if how == "ml_dtypes":
                    b = f32[: min(block, n - i)]
                    np.copyto(b, view[i:i + block], casting="unsafe")
                else:
                    b = conv(u[i:i + block] if dtype == "BF16" else view[i:i + block])
                m.add(b)
            m.result()
        return run

    keep = sc.BITS16_BLOCK
    print(f"micro-benchmark: {n} elements ({2 * n / 2**20:.0f} MiB) per dtype, best of {repeat}, GB/s of 16-bit "
          "data per CPU second")
    for dtype, u in data.items():
        for k in (14, 16, 17, 18):
            print(f"  {dtype:5s} Bits16 convert (bits + exact f64 + einsum),     steps of 2^{k}  "
                  f"{best(bits16(u, dtype, 'convert', 1 << k)):6.2f}", flush=True)
        for k in (14, 16, 17, 18, 20):
            print(f"  {dtype:5s} Bits16 hist    (np.bincount, 65536 bins),       steps of 2^{k}  "
                  f"{best(bits16(u, dtype, 'hist', 1 << k)):6.2f}", flush=True)
        how = "bit shift" if dtype == "BF16" else "numpy f16"
        for k in (14, 16, 18):
            print(f"  {dtype:5s} float path ({how} -> f32, Moments),          blocks of 2^{k} "
                  f"{best(floats(u, dtype, 1 << k, how)):6.2f}", flush=True)
        if dtype == "BF16":
            print(f"  {dtype:5s} float path (ml_dtypes -> f32, Moments),          blocks of 2^16 "
                  f"{best(floats(u, dtype, 1 << 16, 'ml_dtypes')):6.2f}", flush=True)
    sc.BITS16_BLOCK = keep


def main() -> None:
    """Run every method on each dtype variant and print one line per method."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--size-mb", type=int, default=2048)
    ap.add_argument("--dtype", nargs="+", default=["F32", "BF16", "F16"], choices=sorted(ITEM))
    ap.add_argument("--keep", action="store_true", help="keep the generated files in the temp folder for next time")
    ap.add_argument("--torch", action="store_true", help="also time safetensors.torch.load_file + torch")
    ap.add_argument("--delta", action="store_true", help="also time statistics + update norm (two streams)")
    ap.add_argument("--micro", action="store_true", help="only the in-memory micro-benchmark of 16-bit reductions")
    ap.add_argument("--worker", nargs=2, metavar=("METHOD", "FILE"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker(*args.worker)))
        return
    if args.micro:
        micro()
        return
    env = {**os.environ, **ONE_THREAD}
    made: list[Path] = []
    try:
        for dtype in args.dtype:
            existed = bench_path(args.size_mb, dtype).exists()
            t0 = time.perf_counter()
            path = make_file(args.size_mb, dtype)
            if not existed:
                made.append(path)
            size = path.stat().st_size
            with open(path, "rb") as fh:  # warm the page cache
                while fh.read(64 << 20):
                    pass
            largest = max(r.nbytes for r in sc.read_header(path)[0]) / 2**20
            print(f"{dtype}: {path} ({size / 2**20:.0f} MiB, largest tensor {largest:.0f} MiB; written in "
                  f"{time.perf_counter() - t0:.0f} s)", flush=True)
            methods = (["ours"] + (["ours-float"] if dtype != "F32" else []) + (["ours+delta"] if args.delta else [])
                       + ["numpy"] + (["torch"] if args.torch else []))
            res = {}
            for m in methods:
                out = subprocess.run([sys.executable, __file__, "--worker", m, str(path)], capture_output=True,
                                     text=True, env=env)
                if out.returncode != 0:
                    print(f"  {m:11s} failed: {out.stderr.strip().splitlines()[-1:]}")
                    continue
                res[m] = json.loads(out.stdout)
            ref = res.get("numpy")
            for m, r in res.items():
                rel = f"x{r['seconds'] / ref['seconds']:.2f} wall, x{r['cpu'] / ref['cpu']:.2f} CPU of numpy" if ref \
                    else ""
                print(f"  {m:11s} {r['seconds']:6.2f} s  {size / r['seconds'] / 1e9:5.2f} GB/s wall  "
                      f"{size / r['cpu'] / 1e9:5.2f} GB/s CPU ({100 * r['sys'] / r['cpu']:3.0f}% sys)  {rel}  "
                      f"peak RSS +{r['rss_growth_mb']:5.0f} MB  sum of l2 {r['l2_sum']:.10g}", flush=True)
            if "ours" in res and ref:
                o = res["ours"]
                print(f"  -> ours/numpy speed: {ref['seconds'] / o['seconds']:.2f}x wall, {ref['cpu'] / o['cpu']:.2f}x "
                      f"CPU; RSS growth {o['rss_growth_mb']:.0f} MB vs bound largest tensor + 256 = "
                      f"{largest + 256:.0f} MB", flush=True)
    finally:
        if not args.keep:
            for p in made:
                p.unlink(missing_ok=True)


if __name__ == "__main__":
    main()
