"""Per-tensor checkpoint statistics: our streaming reader against what a user would otherwise run.

Writes (once, cached in the temp folder) a safetensors file of about ``--size-mb`` MB (default 200;
the issue's target is >= 2048) in F32 and in BF16: one embedding of a quarter of the file (64-512 MiB,
larger than a 32 MiB read chunk), 16 MiB tensors and 64 small ones, written with
numpy (no torch needed). The page cache is warmed first, so this measures decoding and reduction, not
the disk. Each method runs in its own subprocess so that its peak RSS (``VmHWM``, reset after the
imports; ``ru_maxrss`` elsewhere) is its own:

- ``ours``: :func:`parsers.safetensors_ckpt.read_header` + :func:`tensor_stats` (streamed, 32 MiB chunks);
- ``numpy``: every tensor read whole with ``np.fromfile`` (BF16 via the same bit trick), then
  ``x.astype(float64)`` norm, ``abs().max()``, NaN/inf/zero counts over the whole array;
- ``safetensors.numpy``: ``safetensors.numpy.load_file`` (the whole file in memory) + the same numpy
  reductions (F32 only: numpy has no bfloat16, safetensors/safetensors#598);
- ``torch``: ``safetensors.torch.load_file`` + ``double().norm()``, ``abs().max()``, counts (if installed).

Usage: ``python benchmarks/bench_checkpoint.py [--size-mb 200] [--dtype F32 BF16]``.
"""

from __future__ import annotations

import argparse
import json
import math
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


def make_file(size_mb: int, dtype: str) -> Path:
    """Write (or reuse) a safetensors file of about ``size_mb`` MB in ``dtype`` (F32 or BF16)."""
    path = Path(tempfile.gettempdir()) / f"forensics_bench_ckpt_{size_mb}_{dtype}.safetensors"
    if path.exists():
        return path
    item = 4 if dtype == "F32" else 2
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
    with open(tmp, "wb") as fh:
        fh.write(struct.pack("<Q", len(hb)) + hb)
        for shape in shapes.values():
            x = rng.standard_normal(math.prod(shape), dtype=np.float32) * 0.02
            fh.write(x.tobytes() if dtype == "F32" else (x.view(np.uint32) >> 16).astype(np.uint16).tobytes())
    tmp.rename(path)
    return path


def _np_stats(x: np.ndarray) -> tuple:
    x64 = x.astype(np.float64)
    return (math.sqrt(float(x64 @ x64)), float(np.abs(x).max()) if x.size else 0.0, int(np.isnan(x).sum()),
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
    """Run one method over the file; return seconds, the sum of the l2 norms, peak RSS and its growth in MB."""
    _reset_peak()
    base_rss = _peak_mb()  # after imports
    t0 = time.perf_counter()
    total = 0.0
    if method == "ours":
        refs, _, _ = sc.read_header(path)
        total = sum(sc.tensor_stats(r)["l2"] for r in refs)
    elif method == "numpy":
        refs, _, _ = sc.read_header(path)
        for r in refs:
            raw = np.fromfile(path, dtype="<u2" if r.dtype == "BF16" else "<f4", count=r.numel, offset=r.offset)
            x = (raw.astype(np.uint32) << 16).view(np.float32) if r.dtype == "BF16" else raw
            total += _np_stats(x)[0]
    elif method == "safetensors.numpy":
        from safetensors.numpy import load_file

        total = sum(_np_stats(x.reshape(-1))[0] for x in load_file(path).values())
    elif method == "torch":
        import torch
        from safetensors.torch import load_file

        torch.set_num_threads(1)
        for t in load_file(path).values():
            total += float(t.double().norm())
            float(t.abs().max()) if t.numel() else 0.0
            int(t.isnan().sum()), int(t.isinf().sum()), int((t == 0).sum())
    seconds = time.perf_counter() - t0
    peak = _peak_mb()
    return {"seconds": seconds, "l2_sum": total, "peak_rss_mb": peak, "rss_growth_mb": peak - base_rss}


def main() -> None:
    """Run every method on each dtype variant and print one line per method."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--size-mb", type=int, default=200)
    ap.add_argument("--dtype", nargs="+", default=["F32", "BF16"])
    ap.add_argument("--worker", nargs=2, metavar=("METHOD", "FILE"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker(*args.worker)))
        return
    try:
        import torch  # noqa: F401

        has_torch = True
    except ImportError:
        has_torch = False
    for dtype in args.dtype:
        path = make_file(args.size_mb, dtype)
        size = path.stat().st_size
        with open(path, "rb") as fh:  # warm the page cache
            while fh.read(64 << 20):
                pass
        largest = max(r.nbytes for r in sc.read_header(path)[0]) / 2**20
        print(f"{dtype}: {path} ({size / 2**20:.0f} MiB, largest tensor {largest:.0f} MiB)")
        methods = ["ours", "numpy"] + (["safetensors.numpy"] if dtype == "F32" else []) + (["torch"] if has_torch
                                                                                           else [])
        base = None
        for m in methods:
            out = subprocess.run([sys.executable, __file__, "--worker", m, str(path)], capture_output=True, text=True)
            if out.returncode != 0:
                print(f"  {m:18s} failed: {out.stderr.strip().splitlines()[-1:]}")
                continue
            r = json.loads(out.stdout)
            base = base or r
            print(f"  {m:18s} {r['seconds']:7.2f} s  {size / r['seconds'] / 1e9:6.2f} GB/s  peak RSS "
                  f"{r['peak_rss_mb']:6.0f} MB (+{r['rss_growth_mb']:5.0f} MB over imports)  time "
                  f"x{r['seconds'] / base['seconds']:.2f} of ours  (sum of l2 {r['l2_sum']:.6g})")


if __name__ == "__main__":
    main()
