"""Per-tensor checkpoint statistics against a plain copy of the same bytes, measured in the same run (issue 17).

Writes, in the temp folder, one safetensors file per dtype (F32, BF16, F16) of about ``--size-mb`` MB
(default 384): one embedding of a quarter of the file (much larger than a read chunk), 16 MiB tensors
and 64 small ones, N(0, 0.02) values written with numpy (no torch needed). The files are deleted at the
end unless ``--keep``. The page cache is warmed first, so this measures decoding and reduction against
the memory bandwidth, not the disk. Each method runs in its own subprocess (BLAS/OpenMP at one thread)
so that its peak RSS growth (``VmHWM``, reset after the imports) is its own; each is timed ``--repeat``
times (default 3) and the best wall time is kept (the machine may be shared):

- ``copy``: the file's tensor bytes read into one preallocated, already touched buffer (``readinto``,
  4 MiB at a time into consecutive slices: the kernel's copy out of the page cache);
- ``copy-mmap``: ``np.copyto`` of the memory-mapped file into such a buffer (the user-space copy);
- ``copyfile``: ``shutil.copyfile`` of the whole file to a new file beside it (deleted after each pass: the
  in-kernel copy a user would make of a checkpoint);
- ``ours``: :func:`parsers.safetensors_ckpt.read_header` + :func:`parsers.tensors.stats_many` of all the file's
  tensors, as ``forensics`` reads a checkpoint (all the cores the process may use, :data:`parsers.tensors.WORKERS`:
  forked worker processes from :data:`parsers.tensors.FORK_BYTES`, whose CPU time is counted with ours);
- ``ours-1``: the same with one worker (the per-core figure);
  each ``ours`` line names the F32/BF16/F16 kernel it ran: ``compiled`` (``_forensics_tensor_kernels``, built by
  ``pip install .`` or ``python setup.py build_ext --inplace``), else ``numkong``;
- ``before``, ``before-1`` (``--before DIR``): ``ours`` and ``ours-1`` of another checkout, in the same run;
- ``numpy`` (``--numpy``): every tensor read whole with ``np.fromfile`` (BF16 by the bit shift, F16 as
  numpy float16), then the same statistics as a user would write them.

Printed per file and method: seconds, GB/s by the wall clock and by CPU time (user + system), peak RSS
growth, the sum of the tensors' l2 norms (equal across our methods); then ``ours`` and ``ours-1`` against
each copy, as ratios of wall times and of CPU times (the issue's goal: at most 2x; on a shared machine the
CPU ratio is the steadier one: the wall clock also counts the time other processes hold the cores), and our
RSS growth against the bound (the largest tensor's read buffers: a few MB); at the end one table of the
ratios per dtype.

Usage: ``python benchmarks/bench_checkpoint.py [--size-mb 384] [--dtype F32 BF16 F16] [--repeat 3] [--keep]
[--numpy] [--before DIR] [--wait-idle S]``. ``--wait-idle S`` waits up to S seconds before each method for half a
second of idle CPUs (a shared machine). ``FORENSICS_BENCH_SRC=/path/to/checkout`` times another checkout's readers
instead of this one's.
"""

from __future__ import annotations

import argparse
import json
import math
import mmap
import os
import resource
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, os.environ.get("FORENSICS_BENCH_SRC") or str(Path(__file__).resolve().parents[1]))

from parsers import safetensors_ckpt as sc  # noqa: E402

BIG = 16 << 20
ITEM = {"F32": 4, "BF16": 2, "F16": 2}
RAW = {"F32": "<f4", "BF16": "<u2", "F16": "<f2"}
ONE_THREAD = {k: "1" for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}
COPY_CHUNK = 4 << 20
COPIES = ("copy", "copy-mmap", "copyfile")
BEFORE = ["before", "before-1"]  # ours and ours-1 of the --before checkout


def bench_path(size_mb: int, dtype: str) -> Path:
    """Where the generated file of that size and dtype lives (the temp folder)."""
    return Path(tempfile.gettempdir()) / f"forensics_bench_ckpt_{size_mb}_{dtype}.safetensors"


def make_file(size_mb: int, dtype: str) -> Path:
    """Write (or reuse) a safetensors file of about ``size_mb`` MB in ``dtype`` (F32, BF16 or F16)."""
    path = bench_path(size_mb, dtype)
    if path.exists():
        return path
    item = ITEM[dtype]
    embed = max(16 << 20, (size_mb << 20) // 4)  # one tensor much larger than a read chunk
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


def _np_stats(x: np.ndarray) -> float:
    """l2 of a whole array (with max_abs and the NaN/inf/zero counts computed too), as a user would in numpy."""
    x64 = x.astype(np.float64)
    fin = np.isfinite(x64)
    if not fin.all():
        x64 = x64[fin]
    float(np.abs(x64).max()) if x64.size else 0.0
    int(np.isnan(x).sum()), int(np.isinf(x).sum()), int(x.size - np.count_nonzero(x))
    return math.sqrt(float(x64 @ x64))


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


def _data_range(path: str) -> tuple[int, int]:
    """(first, end) byte offsets of the tensor data in a safetensors file."""
    with open(path, "rb") as fh:
        (n,) = struct.unpack("<Q", fh.read(8))
    return 8 + n, os.path.getsize(path)


def _pass(method: str, path: str, buf: np.ndarray | None) -> float:
    """One timed pass of ``method``; returns the sum of the l2 norms (0 for the copies)."""
    if method == "copy":
        lo, hi = _data_range(path)
        view = memoryview(buf)  # type: ignore[arg-type]
        with open(path, "rb", buffering=0) as fh:
            fh.seek(lo)
            for i in range(0, hi - lo, COPY_CHUNK):
                fh.readinto(view[i:min(i + COPY_CHUNK, hi - lo)])
        return 0.0
    if method == "copy-mmap":
        lo, hi = _data_range(path)
        with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as m:
            src = np.frombuffer(m, np.uint8, count=hi - lo, offset=lo)
            np.copyto(buf, src)  # type: ignore[arg-type]
            del src
        return 0.0
    if method == "copyfile":
        dst = path + ".copy"
        try:
            shutil.copyfile(path, dst)
        finally:
            Path(dst).unlink(missing_ok=True)
        return 0.0
    refs, _, _ = sc.read_header(path)
    if method == "numpy":
        total = 0.0
        for r in refs:
            raw = np.fromfile(path, dtype=RAW[r.dtype], count=r.numel, offset=r.offset)
            total += _np_stats((raw.astype(np.uint32) << 16).view(np.float32) if r.dtype == "BF16" else raw)
        return total
    try:
        from parsers.tensors import stats_many
    except ImportError:  # an older checkout: one tensor at a time
        return sum(sc.tensor_stats(r)["l2"] for r in refs)
    return sum(st["l2"] for st in stats_many([(r, None, None) for r in refs]))


def worker(method: str, path: str, repeat: int) -> dict:
    """Run one method ``repeat`` times; the best wall seconds with its CPU seconds, the l2 sum, RSS growth."""
    if method == "ours-1":
        try:
            from parsers import tensors

            tensors.WORKERS = 1
        except ImportError:  # an older checkout: one core anyway
            pass
    buf = None
    if method in ("copy", "copy-mmap"):
        lo, hi = _data_range(path)
        buf = np.ones(hi - lo, np.uint8)  # preallocated and touched: the copy pays no page faults
    _reset_peak()
    base_rss = _peak_mb()
    best = {"seconds": math.inf}
    for _ in range(repeat):
        t0, r0 = time.perf_counter(), _cpu()
        total = _pass(method, path, buf)
        seconds, cpu = time.perf_counter() - t0, _cpu() - r0
        if seconds < best["seconds"]:
            best = {"seconds": seconds, "cpu": cpu, "l2_sum": total}
    peak = _peak_mb()
    kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024  # forked workers (0 when none ran)
    return best | {"rss_growth_mb": peak - base_rss, "rss_base_mb": base_rss, "worker_peak_rss_mb": kids,
                   "kernel": _kernel() if method.startswith("ours") else ""}


def _kernel() -> str:
    """Which F32/BF16/F16 kernel this checkout's reducer uses: the compiled one (and its ISA), numkong or numpy."""
    try:
        from parsers import _tensor_kernels as k
    except ImportError:
        return "?"
    nat = getattr(k, "_native", lambda: None)()
    if nat is not None:
        return f"compiled ({nat.ISA})"
    return "numkong" if getattr(k, "_numkong", lambda: None)() is not None else "numpy"


def _cpu() -> float:
    """CPU seconds (user + system) of this process and of its ended children (the forked workers of ``ours``)."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def _run_dtype(dtype: str, args: argparse.Namespace, env: dict, made: list[Path]) -> dict:
    existed = bench_path(args.size_mb, dtype).exists()
    path = make_file(args.size_mb, dtype)
    if not existed:
        made.append(path)
    size = _data_range(str(path))[1] - _data_range(str(path))[0]
    with open(path, "rb") as fh:  # warm the page cache
        while fh.read(64 << 20):
            pass
    largest = max(r.nbytes for r in sc.read_header(path)[0]) / 2**20
    try:
        from parsers.tensors import WORKERS as workers
    except ImportError:  # an older checkout: one thread
        workers = 1
    print(f"{dtype}: {path.name} ({size / 2**20:.0f} MiB of tensors, largest {largest:.0f} MiB), best of "
          f"{args.repeat}; ours with {workers} workers, on {os.cpu_count()} CPUs; load average {_load()}", flush=True)
    res = {}
    methods = [*COPIES, "ours", "ours-1"] + (BEFORE if args.before else []) + (["numpy"] if args.numpy else [])
    for m in methods:
        _wait_idle(args.wait_idle)
        env_m = {**env, "FORENSICS_BENCH_SRC": args.before} if m in BEFORE else env
        out = subprocess.run([sys.executable, __file__, "--worker", m.replace("before", "ours"), str(path),
                              str(args.repeat)], capture_output=True, text=True, env=env_m)
        if out.returncode != 0:
            print(f"  {m:10s} failed: {out.stderr.strip().splitlines()[-1:]}")
            continue
        r = res[m] = json.loads(out.stdout)
        print(f"  {m:10s} {r['seconds']:6.3f} s  {size / r['seconds'] / 1e9:5.2f} GB/s wall  "
              f"{size / max(r['cpu'], 1e-9) / 1e9:5.2f} GB/s CPU  peak RSS +{r['rss_growth_mb']:5.0f} MB"
              + (f" (forked workers' peak RSS {r['worker_peak_rss_mb']:.0f} MB, this process's "
                 f"{r['rss_base_mb']:.0f} MB before: shared at the fork)" if r.get("worker_peak_rss_mb") else "")
              + (f"  sum of l2 {r['l2_sum']:.15g}" if m not in COPIES else "")
              + (f"  kernel: {r['kernel']}" if r.get("kernel") else ""), flush=True)
    print(f"  load average after {dtype}: {_load()}", flush=True)
    return _ratios(dtype, size, res)


def _wait_idle(limit: float) -> None:
    """Wait up to ``limit`` seconds for half a second in which every CPU was at least 90% idle (a shared machine)."""
    end = time.monotonic() + limit
    while time.monotonic() < end:
        def sample() -> tuple[int, int]:
            v = [int(x) for x in Path("/proc/stat").read_text().split("\n")[0].split()[1:9]]
            return sum(v), v[3] + v[4]
        try:
            t1, i1 = sample()
            time.sleep(0.5)
            t2, i2 = sample()
        except OSError:  # not Linux: no waiting
            return
        if (i2 - i1) >= 0.9 * max(1, t2 - t1):
            return


def _load() -> str:
    """The 1-minute load average (a 2-core machine shared with other work shows it in the wall ratios)."""
    try:
        return f"{os.getloadavg()[0]:.2f}"
    except OSError:
        return "?"



def _ratios(dtype: str, size: int, res: dict) -> dict:
    """Print ours (all workers, one worker) against each copy as time ratios, wall and CPU; return them."""
    out = {}
    for ours in ("ours", "ours-1", *BEFORE):
        for ref in COPIES:
            if ours in res and ref in res:
                o, c = res[ours], res[ref]
                out[(ours, ref)] = (o["seconds"] / c["seconds"], o["cpu"] / max(c["cpu"], 1e-9))
    if "ours" in res:
        o = res["ours"]
        print(f"  -> {dtype} ours {size / o['seconds'] / 1e9:.2f} GB/s wall, {size / max(o['cpu'], 1e-9) / 1e9:.2f}"
              f" GB/s CPU; RSS growth {o['rss_growth_mb']:.0f} MB", flush=True)
    for (ours, ref), (w, c) in out.items():
        print(f"     {ours:8s} / {ref:9s}: {w:5.2f}x the wall time, {c:5.2f}x the CPU time (goal <= 2x)", flush=True)
    return out


def _table(table: dict) -> None:
    """One line per dtype: ours against each copy, wall and CPU ratios (the issue's figures)."""
    print("\nratio of times, ours / copy (wall, CPU); goal <= 2x")
    head = "".join(f"  {ref + ' wall':>15s} {ref + ' CPU':>14s}" for ref in COPIES)
    print(f"{'dtype':6s}{head}  ours-1/copy CPU")
    for dtype, r in table.items():
        cells = "".join(f"  {r[('ours', ref)][0]:14.2f}x {r[('ours', ref)][1]:13.2f}x" if ('ours', ref) in r
                        else f"  {'-':>15s} {'-':>14s}" for ref in COPIES)
        one = f"{r[('ours-1', 'copy')][1]:.2f}x" if ("ours-1", "copy") in r else "-"
        print(f"{dtype:6s}{cells}  {one:>15s}", flush=True)
    if any(("before", "copy") in r for r in table.values()):
        print("the --before checkout in the same run, before / copy (wall, CPU):")
        for dtype, r in table.items():
            cells = "".join(f"  {r[('before', ref)][0]:14.2f}x {r[('before', ref)][1]:13.2f}x" if ("before", ref) in r
                            else f"  {'-':>15s} {'-':>14s}" for ref in COPIES)
            one = f"{r[('before-1', 'copy')][1]:.2f}x" if ("before-1", "copy") in r else "-"
            print(f"{dtype:6s}{cells}  {one:>15s}", flush=True)


def main() -> None:
    """Run every method on each dtype variant and print one line per method and the ratio to the copy."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--size-mb", type=int, default=384)
    ap.add_argument("--dtype", nargs="+", default=["F32", "BF16", "F16"], choices=sorted(ITEM))
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--keep", action="store_true", help="keep the generated files in the temp folder for next time")
    ap.add_argument("--numpy", action="store_true", help="also time whole-tensor numpy statistics")
    ap.add_argument("--before", metavar="DIR", help="also time another checkout's readers in the same run "
                    "(git worktree add DIR main, or git archive main | tar -x -C DIR)")
    ap.add_argument("--wait-idle", type=float, default=0.0, metavar="S",
                    help="before each method wait up to S seconds for the CPUs to be idle (a shared machine)")
    ap.add_argument("--worker", nargs=3, metavar=("METHOD", "FILE", "REPEAT"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker[0], args.worker[1], int(args.worker[2]))))
        return
    env = {**os.environ, **ONE_THREAD}
    made: list[Path] = []
    table = {}
    try:
        for dtype in args.dtype:
            table[dtype] = _run_dtype(dtype, args, env, made)
        _table(table)
    finally:
        if not args.keep:
            for p in made:
                p.unlink(missing_ok=True)


if __name__ == "__main__":
    main()
