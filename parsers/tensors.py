"""Format-neutral checkpoint tensors: the reader contract and the streaming, parallel statistics reducer.

**The reader contract.** Every checkpoint format module (:mod:`parsers.safetensors_ckpt`,
:mod:`parsers.torch_ckpt`) has ``FORMAT`` (its name), ``sniff(path) -> bool`` and
``read(path) -> Loaded``: a :class:`Loaded` holds the saved object with every readable tensor as a
:class:`TensorRef` (a byte range of the file, nothing read yet), the skips (the file's own first when it
is damaged), and the ``truncated``/``salvaged`` flags. ``read`` raises :class:`CheckpointError` (the
message is the skip reason) for a file it cannot read at all, and nothing else; it never reads tensor
data. :mod:`parsers.checkpoints` works on that contract only.

**The reducer.** :func:`tensor_stats` streams one tensor once in bounded memory and returns its
statistics (and optionally its distance to the same tensor of an earlier checkpoint). F32, BF16 and F16
are reduced from their bit patterns (:func:`parsers._tensor_kernels.reduce_bits`), everything else as
float blocks (:class:`parsers._tensor_kernels.Moments`); both exact to float64 rounding. With the compiled
kernel (:func:`parsers._tensor_kernels._native`) a range's reads go to it block by block (:func:`_task_native`).
A tensor of more than :data:`TASK_BYTES` lying plainly in a file is cut into ranges of that size, reduced by
:data:`WORKERS` workers (each reads its range with ``os.preadv`` into its own :data:`READ_BYTES` buffer, so the
bytes are reduced from the cache they were just copied to) and merged in range order: the result does not depend on the
number of workers, and memory is one read buffer and one block of scratch per worker. :func:`stats_many` sends
the pieces of many tensors (a whole checkpoint: ranges of the large ones, the small ones whole) to the workers
together, so a model of many small tensors keeps every core busy too. From :data:`FORK_BYTES` of such ranges in
one call the workers are processes (this one and forked copies, :mod:`parsers._tensor_fork`: two threads making
short numpy calls hand the GIL to each other thousands of times a second, which on the 2-core machine made two
threads slower than one); below that, or off Linux, a pool of threads (``benchmarks/bench_checkpoint.py``).
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from forensics.model import Skip
from parsers import _tensor_fork as _fork
from parsers._tensor_kernels import (
    KINDS,
    Acc,
    Moments,
    Scratch,
    _native,
    _numkong,
    delta_sq,
    reduce_bits,
    small_pattern,
)
from parsers.tensor_io import (
    BLOCK,
    CHUNK_BYTES,
    ITEMSIZE,
    CheckpointError,
    Converter,
    TensorRef,
    decoder,
    iter_blocks,
    iter_raw,
    read_range,
)

__all__ = ["BLOCK", "CHUNK_BYTES", "ITEMSIZE", "CheckpointError", "Job", "Loaded", "Moments", "TensorRef",
           "iter_blocks", "iter_raw", "stats_many", "tensor_stats"]

TASK_BYTES = 4 << 20
"""Bytes of one tensor per worker task (``bench_checkpoint.py``: small enough that a 16 MiB tensor keeps two
workers busy, large enough that the pool's hand-over, ~50 us, is under 5% of a task)."""
READ_BYTES = 256 << 10
"""Bytes per ``preadv`` inside a task: the chunk stays in the core's cache while it is reduced (page-cached file,
one worker, GB/s per CPU second, F32 / BF16: 256 KiB 2.72 / 1.60, 1 MiB 2.50 / 1.51, 4 MiB 2.56 / 1.51)."""
WORKERS = max(1, min(4, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1))
"""Threads reducing one tensor's ranges (the cores this process may use, at most 4)."""


@dataclass
class Loaded:
    """What a format reader's ``read`` gives for one checkpoint file (the reader contract).

    Attributes:
        obj: The saved object with every readable tensor as a :class:`TensorRef` (safetensors: ``{name:
            ref}`` in data-offset order; torch: the unpickled structure). A tensor whose bytes are missing
            or cut is left out (a dict key dropped, a list slot ``None``).
        skipped: When the file is damaged (``truncated`` or ``salvaged``), first one :class:`Skip` for the
            file itself (``what`` = ``"<path>"`` or ``"<path>:<offset>"``, the reason saying what was read);
            then one per tensor left out (``what`` = ``"<path>:<where>"``).
        truncated: The file ends before its format says it does (killed job, full disk): never a
            checkpoint to resume from.
        salvaged: The file's index (a zip central directory) was missing or unusable; its tensors were
            found another way.
        size: File size in bytes (where a truncated file ends).
        metadata: String metadata the format stores (safetensors ``__metadata__``), else empty.
    """

    obj: Any
    skipped: list[Skip] = field(default_factory=list)
    truncated: bool = False
    salvaged: bool = False
    size: int = 0
    metadata: dict[str, str] = field(default_factory=dict)

    @property
    def complete(self) -> bool:
        """Nothing was missing, cut or salvaged: the format's own loader would read the file as it is."""
        return not (self.truncated or self.salvaged or self.skipped)

    @property
    def damaged(self) -> bool:
        """``skipped[0]`` is the file's own entry (see :attr:`skipped`)."""
        return bool(self.truncated or self.salvaged) and bool(self.skipped)


def _plain(ref: TensorRef) -> bool:
    """The tensor's bytes are one contiguous range of the file (no zip inflation, no strided view)."""
    return ref.member is None and ref.stride is None


_POOL: dict[int, ThreadPoolExecutor] = {}


def _pool() -> ThreadPoolExecutor:
    """The worker pool of this process (a forked child makes its own: the parent's threads are not in it)."""
    pid = os.getpid()
    if pid not in _POOL:
        _POOL.clear()
        _POOL[pid] = ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="tensor-stats")
    return _POOL[pid]


_local = threading.local()


def _scratch() -> Scratch:
    s = getattr(_local, "scratch", None)
    if s is None:
        s = _local.scratch = Scratch(BLOCK)
    return s


def _fill(fd: int, ref: TensorRef, lo: int, n: int, slot: int, s: Scratch) -> np.ndarray:
    """Elements ``lo .. lo + n`` of ``ref`` as stored (raw dtype), read into scratch ``slot``."""
    raw_dt = decoder(ref.dtype)[0]
    buf = s.bytes(slot, n * raw_dt.itemsize)
    if read_range(fd, ref.offset + lo * raw_dt.itemsize, memoryview(buf)[: n * raw_dt.itemsize]) < n * raw_dt.itemsize:
        raise CheckpointError(f"truncated: tensor {ref.name!r} ends beyond the end of the file")
    return np.frombuffer(buf, dtype=raw_dt, count=n)


def _task_native(ref: TensorRef, lo: int, hi: int, small: int | None) -> Acc:
    """:func:`_task` without ``prev`` by the compiled kernel: its reads handed to it block by block, no numpy calls.

    The same blocks, folded in the same order, as :func:`parsers._tensor_kernels.reduce_bits` would (the same bits).
    """
    kind, item, acc = KINDS[ref.dtype], ITEMSIZE[ref.dtype], Acc()
    reduce, mask, inf, shift, scale = _native().reduce, kind.mask, kind.inf, kind.shift, kind.scale
    arg = -1 if small is None else small
    per_read = max(BLOCK, READ_BYTES // item // BLOCK * BLOCK) * item
    step = BLOCK * item
    view = memoryview(_scratch().bytes(0, per_read))
    fd = os.open(ref.path, os.O_RDONLY)
    try:
        for at in range(ref.offset + lo * item, ref.offset + hi * item, per_read):
            nb = min(per_read, ref.offset + hi * item - at)
            if read_range(fd, at, view[:nb]) < nb:
                raise CheckpointError(f"truncated: tensor {ref.name!r} ends beyond the end of the file")
            for j in range(0, nb, step):
                top, n_zero, n_inf, n_nan, n_pos, n_small, sq = reduce(view[j:min(j + step, nb)], item, mask, inf,
                                                                       shift, arg, False)
                acc.n_zero += n_zero
                acc.n_inf += n_inf
                acc.n_nan += n_nan
                acc.n_pos += n_pos
                acc.n_small += n_small
                if top > acc.top:
                    acc.top = top
                acc.sumsq += sq * scale
    finally:
        os.close(fd)
    acc.numel = hi - lo
    return acc


def _task(ref: TensorRef, lo: int, hi: int, small: int | None, prev: TensorRef | None) -> Acc:
    """Statistics of elements ``lo .. hi`` of a plain F32/BF16/F16 tensor (and the delta to ``prev``)."""
    if prev is None and _native() is not None:
        return _task_native(ref, lo, hi, small)
    s, acc, kind = _scratch(), Acc(), KINDS[ref.dtype]
    per_read = max(BLOCK, READ_BYTES // ITEMSIZE[ref.dtype] // BLOCK * BLOCK)
    fds = [os.open(ref.path, os.O_RDONLY)] + ([os.open(prev.path, os.O_RDONLY)] if prev is not None else [])
    conv = (Converter(ref.dtype, BLOCK), Converter(prev.dtype, BLOCK)) if prev is not None else None
    try:
        for i in range(lo, hi, per_read):
            n = min(per_read, hi - i)
            raw = _fill(fds[0], ref, i, n, 0, s)
            theirs = _fill(fds[1], prev, i, n, 1, s) if prev is not None else None
            bits = raw.view(kind.uint)
            for j in range(0, n, BLOCK):
                reduce_bits(ref.dtype, bits[j:j + BLOCK], acc, s, small, own=conv is None)
                if conv is not None and theirs is not None:
                    acc.delta_sq += delta_sq(conv[0](raw[j:j + BLOCK]), conv[1](theirs[j:j + BLOCK]), s)
    finally:
        for fd in fds:
            os.close(fd)
    return acc


def _stream_bits(ref: TensorRef, small: int | None, prev: TensorRef | None) -> Acc:
    """An F32/BF16/F16 tensor that is a compressed member or a strided view: one sequential stream."""
    s, acc = _scratch(), Acc()
    theirs = iter_blocks(prev) if prev is not None else None
    conv = Converter(ref.dtype, BLOCK)
    for raw in iter_raw(ref):  # chunks are whole multiples of BLOCK: aligned with prev's blocks
        bits = raw.view(KINDS[ref.dtype].uint)
        for j in range(0, raw.shape[0], BLOCK):
            reduce_bits(ref.dtype, bits[j:j + BLOCK], acc, s, small)
            if theirs is not None:
                acc.delta_sq += delta_sq(conv(raw[j:j + BLOCK]), next(theirs), s)
    if theirs is not None:
        theirs.close()
    return acc


def _float_stats(ref: TensorRef, small_below: float | None, prev: TensorRef | None) -> dict[str, Any]:
    """Statistics of any other dtype over float blocks (:class:`Moments`), with the delta to ``prev``."""
    m, dsq, s = Moments(small_below), 0.0, _scratch()
    theirs = iter_blocks(prev) if prev is not None else None
    for b in iter_blocks(ref):
        m.add(b)
        if theirs is not None:
            dsq += delta_sq(b, next(theirs), s)
    if theirs is not None:
        theirs.close()
    out = m.result()
    if small_below is not None:
        out.update(n_small=m.n_small, n_pos=m.n_pos)
    if prev is not None:
        out["delta_sq"] = dsq
    return out


Job = tuple[TensorRef, "float | None", "TensorRef | None"]
"""One tensor to reduce: ``(ref, small_below, prev)`` as the arguments of :func:`tensor_stats`."""


def _tasks(job: Job) -> list[tuple[Any, int]]:
    """The pieces of work of one job, each with its bytes when a forked worker may run it (else 0).

    Ranges of a plain F32/BF16/F16 tensor (forkable), else the whole tensor in one piece (kept in this process).
    """
    ref, small_below, prev = job
    if prev is not None and prev.numel != ref.numel:
        raise CheckpointError(f"tensor {ref.name!r}: {ref.numel} elements, the earlier one {prev.numel}")
    if ref.dtype not in KINDS:
        return [(lambda: _float_stats(ref, small_below, prev), 0)]
    small = small_pattern(ref.dtype, small_below) if small_below is not None else None
    if not (_plain(ref) and (prev is None or _plain(prev))):
        return [(lambda: _stream_bits(ref, small, prev), 0)]
    if prev is not None:
        decoder(prev.dtype)  # imports what prev needs (ml_dtypes) here, before any fork
    per_task = max(BLOCK, TASK_BYTES // ITEMSIZE[ref.dtype] // BLOCK * BLOCK)
    return [(lambda lo=lo: _task(ref, lo, min(lo + per_task, ref.numel), small, prev),
             (min(lo + per_task, ref.numel) - lo) * ITEMSIZE[ref.dtype]) for lo in range(0, ref.numel, per_task)]


def _run(task: Any) -> Any:
    try:
        return task()
    except (CheckpointError, OSError, ValueError) as exc:
        return exc


def _finish(job: Job, parts: list[Any]) -> dict[str, Any] | Exception:
    """One job's result from its tasks' (in order): the statistics, or the first error."""
    ref, small_below, prev = job
    if any(isinstance(p, Exception) for p in parts):
        return next(p for p in parts if isinstance(p, Exception))
    if parts and isinstance(parts[0], dict):
        return parts[0]
    acc = Acc()
    for p in parts:
        acc.merge(p)
    out = acc.result(ref.dtype)
    if small_below is not None:
        out.update(n_small=acc.n_small, n_pos=acc.n_pos)
    if prev is not None:
        out["delta_sq"] = acc.delta_sq
    return out


IN_FLIGHT = 256
"""Pieces handed to the pool at a time (a header of a million tiny tensors must not queue a million futures)."""


FORK_BYTES = 64 << 20
"""Plain F32/BF16/F16 bytes in one call from which their ranges go to :data:`WORKERS` processes (this one and
forked copies, :mod:`parsers._tensor_fork`) instead of threads: a fork and its exit cost about 4 ms of CPU here,
under 5% of reducing this much; threads pay far more in hand-overs of the GIL (see that module)."""


def _threads(tasks: list[Any]) -> list[Any]:
    """Every task's result in order: in the thread pool, :data:`IN_FLIGHT` at a time, or here when there is one."""
    if len(tasks) <= 1 or WORKERS == 1:
        return [_run(t) for t in tasks]
    out: list[Any] = []
    for i in range(0, len(tasks), IN_FLIGHT):
        out += _pool().map(_run, tasks[i:i + IN_FLIGHT])
    return out


def _run_all(tasks: list[tuple[Any, int]]) -> list[Any]:
    """Every task's result in order: the forkable ones in processes when they are :data:`FORK_BYTES` or more."""
    forkable = [i for i, (_, nbytes) in enumerate(tasks) if nbytes]
    if WORKERS == 1 or not _fork.AVAILABLE or sum(tasks[i][1] for i in forkable) < FORK_BYTES:
        return _threads([t for t, _ in tasks])
    _native(), _numkong()  # imported here, not in a child
    out: list[Any] = [None] * len(tasks)
    for i in range(0, len(forkable), _fork.MAX_TASKS):
        part = forkable[i:i + _fork.MAX_TASKS]
        todo = [tasks[j][0] for j in part]
        big = sum(tasks[j][1] for j in part) >= FORK_BYTES  # a short last batch is not worth a fork
        for j, r in zip(part, _fork.run_forked(todo, _run, WORKERS) if big else _threads(todo), strict=True):
            out[j] = r
    rest = [i for i, (_, nbytes) in enumerate(tasks) if not nbytes]
    for j, r in zip(rest, _threads([tasks[j][0] for j in rest]), strict=True):
        out[j] = r
    return out


def stats_many(jobs: list[Job]) -> list[dict[str, Any] | Exception]:
    """:func:`tensor_stats` of several tensors, their pieces spread over :data:`WORKERS` workers.

    A tensor of more than :data:`TASK_BYTES` lying plainly in a file is cut into ranges; every other
    tensor is one piece; the pieces of all jobs go to the workers together (so many small tensors keep every
    core busy too) and each job's are merged in range order. The workers are forked processes when the
    plain ranges come to :data:`FORK_BYTES` or more, else threads. Memory: one read buffer and one block of
    scratch per worker, and the small per-piece results.

    Args:
        jobs: ``(ref, small_below, prev)`` per tensor.

    Returns:
        Per job, in order, what :func:`tensor_stats` returns, or the :class:`CheckpointError`
        (``OSError``, ``ValueError``) it would raise.
    """
    pieces: list[list[Any] | Exception] = []
    for job in jobs:
        try:
            pieces.append(_tasks(job))
        except CheckpointError as exc:
            pieces.append(exc)
    flat = [t for p in pieces if not isinstance(p, Exception) for t in p]
    done = iter(_run_all(flat))
    return [p if isinstance(p, Exception) else _finish(job, [next(done) for _ in p])
            for job, p in zip(jobs, pieces, strict=True)]


def tensor_stats(ref: TensorRef, small_below: float | None = None, prev: TensorRef | None = None) -> dict[str, Any]:
    """Statistics of one tensor, streamed once in bounded memory, and optionally its distance to another.

    F32/BF16/F16 from their bit patterns (:func:`parsers._tensor_kernels.reduce_bits`), other dtypes as
    float blocks (:class:`Moments`); a large tensor in parallel ranges (:func:`stats_many`).

    Args:
        ref: The tensor.
        small_below: For Adam second moments: also count ``0 < v <= small_below`` (compared exactly).
        prev: The same tensor in an earlier checkpoint (same ``numel``, any dtype): also return
            ``||ref - prev||^2``, in the same pass over ``ref``.

    Returns:
        ``{"numel", "l2", "rms", "max_abs", "n_nan", "n_inf", "n_zero"}`` (``l2``, ``rms`` and ``max_abs``
        over the finite values; float64 sums) plus ``n_small``/``n_pos`` when ``small_below`` is given and
        ``delta_sq`` (float64; NaN/inf when either tensor holds them) when ``prev`` is given.

    Raises:
        CheckpointError: Unsupported dtype, a strided view too large to materialise, the file ends before
            the tensor does (truncated), or ``prev`` has another number of elements.
    """
    (out,) = stats_many([(ref, small_below, prev)])
    if isinstance(out, Exception):
        raise out
    return out
