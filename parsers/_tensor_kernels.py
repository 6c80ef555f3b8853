"""The reductions behind :func:`parsers.tensors.tensor_stats`: per-block numpy kernels, no I/O.

Two reducers give the same statistics (sum of squares in float64, max |x|, NaN/inf/zero counts, the
Adam-epsilon share):

- :func:`reduce_bits` for F32, BF16 and F16, from the raw bit patterns: ``bits & mask`` (the sign
  cleared) is zero for +-0, :data:`Kind.inf` for +-inf, above it for NaN, and finite magnitudes are
  ordered like their patterns, so the counts and ``max |x|`` are integer reductions
  (``np.maximum.reduce``, ``np.count_nonzero`` on the masked view); the sum of squares comes from the
  magnitudes as exact float32 values (:func:`widen`: BF16 by ``<< 16`` into float32's upper half, F16 by
  the CPU's half-precision conversion in ``numkong``) whose squares, each exact in float64, are accumulated
  in float64 by ``numkong.moments`` in one SIMD pass without the GIL (:func:`sum_squares32`; without
  numkong: converted to float64 and summed by BLAS dot products of :data:`ROW`-element rows). NaN/inf are
  masked only in the blocks that hold them.
- :class:`Moments` for everything else (F64, integers, FP8 through ``ml_dtypes``), over float blocks.

Where the compiled kernel is built and the CPU has AVX-512 (:func:`_native`, parsers/_tensor_native.c),
:func:`reduce_bits` hands the block to it instead: the same statistics in one pass over the patterns, its float64 sum
of the same exact squares in a fixed order of its own (docs/formats.md#streaming-reduction).

Every buffer is a :class:`Scratch` of one block, reused across calls (one per worker thread).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np


class Moments:
    """Streaming per-tensor statistics over float blocks (float64 accumulation).

    ``l2``, ``rms`` and ``max_abs`` are taken over the finite values; NaN and +-inf are counted in
    ``n_nan``/``n_inf`` (a tensor with one inf keeps a meaningful norm). ``n_zero`` counts exact zeros.
    For ``exp_avg_sq`` tensors, ``small_below`` (a threshold on v) also counts ``0 < v <= small_below``
    and ``n_pos`` counts ``v > 0`` (the Adam-epsilon share, see :mod:`forensics.detectors.checkpoint_update_growth`).
    """

    __slots__ = ("numel", "sumsq", "max_abs", "n_nan", "n_inf", "n_zero", "small_below", "n_small", "n_pos")

    def __init__(self, small_below: float | None = None) -> None:
        self.numel = self.n_nan = self.n_inf = self.n_zero = self.n_small = self.n_pos = 0
        self.sumsq = 0.0
        self.max_abs = 0.0
        self.small_below = small_below

    def add(self, b: np.ndarray) -> None:
        """Fold one 1-D float32/float64 block in."""
        n = int(b.shape[0])
        if n == 0:
            return
        self.numel += n
        s = float(np.einsum("i,i->", b, b, dtype=np.float64))
        if math.isfinite(s):
            mx = max(float(b.max()), -float(b.min()))
        else:  # NaN/inf present (or float64 squares overflowed): the slow, masked path
            fin = np.isfinite(b)
            n_fin = int(np.count_nonzero(fin))
            n_nan = int(np.count_nonzero(np.isnan(b)))
            self.n_nan += n_nan
            self.n_inf += n - n_fin - n_nan
            f = b[fin]
            s = float(np.einsum("i,i->", f, f, dtype=np.float64)) if n_fin else 0.0
            mx = max(float(f.max()), -float(f.min())) if n_fin else 0.0
        self.sumsq += s
        self.max_abs = max(self.max_abs, mx)
        self.n_zero += n - int(np.count_nonzero(b))
        if self.small_below is not None:
            pos = b > 0
            self.n_pos += int(np.count_nonzero(pos))
            self.n_small += int(np.count_nonzero(pos & (b <= self.small_below)))

    def result(self) -> dict[str, Any]:
        """``numel, l2, rms, max_abs, n_nan, n_inf, n_zero`` (the TENSORS_SCHEMA statistics)."""
        n_fin = self.numel - self.n_nan - self.n_inf
        return {"numel": self.numel, "l2": math.sqrt(self.sumsq), "rms": math.sqrt(self.sumsq / n_fin) if n_fin else
                float("nan"), "max_abs": self.max_abs if n_fin else float("nan"), "n_nan": self.n_nan,
                "n_inf": self.n_inf, "n_zero": self.n_zero}

@dataclass(frozen=True)
class Kind:
    """How the bit patterns of one float dtype are read.

    Attributes:
        uint: The unsigned integer dtype of the same width (the raw view).
        mask: All bits but the sign.
        inf: The pattern of +inf; larger masked patterns are NaN.
        shift: Left shift that puts a masked pattern into a float32 (0 for F32 itself).
        scale: Factor from the squares of those float32 values to the true squares (``2**224`` for F16 widened by
            the shift, see :func:`widen`).
        float: The numpy dtype of one element (to print ``max_abs`` from its pattern).
    """

    uint: Any
    mask: int
    inf: int
    shift: int
    scale: float
    float: Any


KINDS = {
    "F32": Kind(np.uint32, 0x7FFFFFFF, 0x7F800000, 0, 1.0, np.float32),
    "BF16": Kind(np.uint16, 0x7FFF, 0x7F80, 16, 1.0, None),
    "F16": Kind(np.uint16, 0x7FFF, 0x7C00, 13, 2.0 ** 224, np.float16),
}
"""The dtypes :func:`reduce_bits` reduces (docs/formats.md#streaming-reduction)."""


class Scratch:
    """Reused per-thread buffers of at most ``block`` elements each, by name."""

    def __init__(self, block: int) -> None:
        self.block = block
        self._bufs: dict[tuple[str, Any], np.ndarray] = {}
        self.raw: dict[int, bytearray] = {}

    def get(self, key: str, dtype: Any, n: int) -> np.ndarray:
        """The first ``n`` elements of buffer ``key`` (allocated once, ``block`` elements of ``dtype``)."""
        buf = self._bufs.get((key, dtype))
        if buf is None:
            buf = self._bufs[key, dtype] = np.empty(self.block, dtype=dtype)
        return buf[:n]

    def bytes(self, slot: int, n: int) -> bytearray:
        """A reused byte buffer of at least ``n`` bytes (``slot`` 0 for the tensor, 1 for the earlier one)."""
        buf = self.raw.get(slot)
        if buf is None or len(buf) < n:
            buf = self.raw[slot] = bytearray(n)
        return buf


class Acc:
    """Partial statistics of one range of a tensor (merged in range order by :meth:`merge`)."""

    __slots__ = ("numel", "sumsq", "top", "n_nan", "n_inf", "n_zero", "n_small", "n_pos", "delta_sq")

    def __init__(self) -> None:
        self.numel = self.n_nan = self.n_inf = self.n_zero = self.n_small = self.n_pos = 0
        self.top = -1  # the largest finite masked pattern seen
        self.sumsq = self.delta_sq = 0.0

    def merge(self, o: Acc) -> None:
        """Fold another range's statistics in."""
        self.numel += o.numel
        self.sumsq += o.sumsq
        self.delta_sq += o.delta_sq
        self.top = max(self.top, o.top)
        self.n_nan += o.n_nan
        self.n_inf += o.n_inf
        self.n_zero += o.n_zero
        self.n_small += o.n_small
        self.n_pos += o.n_pos

    def result(self, dtype: str) -> dict[str, Any]:
        """``numel, l2, rms, max_abs, n_nan, n_inf, n_zero`` as :meth:`Moments.result` gives them."""
        n_fin = self.numel - self.n_nan - self.n_inf
        return {"numel": self.numel, "l2": math.sqrt(self.sumsq), "rms": math.sqrt(self.sumsq / n_fin) if n_fin
                else float("nan"), "max_abs": pattern_value(dtype, self.top) if n_fin else float("nan"),
                "n_nan": self.n_nan, "n_inf": self.n_inf, "n_zero": self.n_zero}


def pattern_value(dtype: str, pattern: int) -> float:
    """The value of a non-negative bit pattern of ``dtype`` (0.0 for ``-1``: nothing seen)."""
    if pattern < 0:
        return 0.0
    k = KINDS[dtype]
    if k.float is None:  # BF16: the upper half of a float32
        return float(np.array(pattern << 16, np.uint32).view(np.float32))
    return float(np.array(pattern, k.uint).view(k.float))


@functools.cache
def _patterns16(dtype: str) -> np.ndarray:
    """Values (float64) of the positive finite 16-bit patterns 1 .. inf - 1, increasing."""
    k = KINDS[dtype]
    bits = np.arange(1, k.inf, dtype=np.uint32)
    if dtype == "BF16":
        return (bits << 16).view(np.float32).astype(np.float64)
    return bits.astype(np.uint16).view(np.float16).astype(np.float64)


def small_pattern(dtype: str, small_below: float) -> int:
    """``P`` such that the positive patterns ``1 .. P`` are exactly the values ``0 < v <= small_below`` (float64)."""
    if dtype != "F32":
        return int(np.searchsorted(_patterns16(dtype), small_below, side="right"))
    with np.errstate(over="ignore"):
        c = np.float32(small_below)
    if not float(c) <= small_below:  # rounded up (or NaN)
        c = np.nextafter(c, np.float32(-np.inf))
    return int(np.array(c, np.float32).view(np.uint32)) if c > 0 else 0


_AND, _SHL, _COPY, _MAX, _CNZ = np.bitwise_and, np.left_shift, np.copyto, np.maximum.reduce, np.count_nonzero


def reduce_bits(dtype: str, bits: np.ndarray, acc: Acc, s: Scratch, small: int | None = None,
                own: bool = False) -> None:
    """Fold a 1-D block of raw patterns (``KINDS[dtype].uint``, at most ``s.block`` elements) into ``acc``.

    Per block: one ``bits & mask``, its ``np.maximum.reduce`` (max |x|, and whether the block holds NaN/inf)
    and ``np.count_nonzero`` (zeros); then the finite magnitudes as exact float32 (:func:`widen`) and the sum
    of their squares in float64 (:func:`sum_squares32`), skipped for a block of zeros.

    Args:
        dtype: ``"F32"``, ``"BF16"`` or ``"F16"``.
        bits: The patterns as stored.
        acc: The statistics so far.
        s: Scratch buffers.
        small: :func:`small_pattern` of the Adam-epsilon threshold, or None (no ``n_small``/``n_pos``).
        own: ``bits`` may be overwritten (the reader's own buffer, not needed after this call): the masked
            patterns are written there instead of into scratch (one cache-sized buffer less).
    """
    k = KINDS[dtype]
    m = int(bits.shape[0])
    if m == 0:
        return
    nat = _native()
    if nat is not None:  # the compiled one-pass kernel: the same statistics from one read of the block
        top, n_zero, n_inf, n_nan, n_pos, n_small, sq = nat.reduce(
            bits if bits.flags.c_contiguous else np.ascontiguousarray(bits), bits.itemsize, k.mask, k.inf, k.shift,
            -1 if small is None else small, False)
        acc.numel += m
        acc.n_zero += n_zero
        acc.n_inf += n_inf
        acc.n_nan += n_nan
        if small is not None:
            acc.n_pos += n_pos
            acc.n_small += n_small
        if top > acc.top:
            acc.top = top
        acc.sumsq += sq * k.scale
        return
    if small is not None:
        t = s.get("dec", k.uint, m)
        np.subtract(bits, 1, out=t)  # positive patterns 1..inf become 0..inf-1; +-0 and negatives stay above
        acc.n_pos += int(_CNZ(t < k.inf))
        acc.n_small += int(_CNZ(t < small))
    a = bits if own else s.get("abs", k.uint, m)
    _AND(bits, k.mask, out=a)
    top = int(_MAX(a))
    acc.numel += m
    acc.n_zero += m - _CNZ(a)
    if top >= k.inf:  # NaN or inf in this block: count them, keep the finite magnitudes
        fin = a < k.inf
        n_inf = int(_CNZ(a == k.inf))
        a = a[fin]
        acc.n_inf += n_inf
        acc.n_nan += m - int(a.shape[0]) - n_inf
        top = int(_MAX(a)) if a.shape[0] else -1
    if top > acc.top:
        acc.top = top
    if top > 0:  # else only zeros (or nothing finite): no squares to add
        f, scale = widen(dtype, a, s)
        acc.sumsq += sum_squares32(f, s) * scale


def widen(dtype: str, a: np.ndarray, s: Scratch) -> tuple[np.ndarray, float]:
    """Masked patterns ``a`` of ``dtype`` as exact float32 values ``f`` and ``scale``: the squares are ``f**2 * scale``.

    F32 is a view. BF16 is read two patterns at a time as uint32: ``w << 16`` is the first one's float32 and
    ``w & 0xFFFF0000`` the second one's (two uint32 passes over half the elements, no widening copy). F16 is
    converted by ``numkong.astype`` (the CPU's half-precision conversion, 0.09 ns per element here), or without
    numkong widened to uint32 and shifted in place (``np.copyto`` then ``<<= 13``: ``|x| * 2**-112``, scale
    ``2**224``; 0.15 ns; numpy's own float16 cast is 0.86). The order of the values is fixed by ``a`` alone (a sum
    over them gives the same bits for the same block).
    """
    m = int(a.shape[0])
    k = KINDS[dtype]
    if not k.shift:
        return a.view(np.float32), 1.0
    u32 = s.get("u32", np.uint32, m)
    if k.shift == 16 and m > 1:
        h = m >> 1
        w = a[:2 * h].view(np.uint32)
        _SHL(w, 16, out=u32[:h])
        _AND(w, 0xFFFF0000, out=u32[h:2 * h])
        if m & 1:
            u32[m - 1] = int(a[m - 1]) << 16
        return u32.view(np.float32), 1.0
    nk = _numkong() if k.float is np.float16 else None
    if nk is not None:
        nk.astype(a.view(np.float16), "float32", out=u32.view(np.float32))
        return u32.view(np.float32), 1.0
    _COPY(u32, a)
    _SHL(u32, k.shift, out=u32)
    return u32.view(np.float32), k.scale


@functools.cache
def _native() -> Any:
    """The compiled one-pass kernel ``_forensics_tensor_kernels``, or None where it was not built or has no SIMD loop.

    parsers/_tensor_native.c, built by setup.py where a C compiler is found. Its vector loop needs AVX-512 (x86-64
    with AVX-512F/BW); its portable loop (same bits, ~3-6 ns per element) is slower than numkong, so on other CPUs,
    as without the module, :func:`reduce_bits` takes its numpy/numkong path (the same statistics).
    """
    try:
        import _forensics_tensor_kernels
    except ImportError:
        return None
    return _forensics_tensor_kernels if _forensics_tensor_kernels.ISA != "portable" else None


@functools.cache
def _numkong() -> Any:
    """The ``numkong`` module (SIMD kernels; imported on first use, 0.2 s), or None where it is not installed."""
    try:
        import numkong
    except ImportError:
        return None
    return numkong


def sum_squares32(f: np.ndarray, s: Scratch) -> float:
    """``sum(f * f)`` of a 1-D float32 block, every square exact and accumulated in float64.

    With ``numkong`` (a runtime dependency): ``numkong.moments``, whose float32 kernels convert to float64 before
    multiplying and accumulate in float64 registers, one pass without the GIL (0.07 ns per element here, against
    0.3 for numpy's float64 conversion and dot; checked exact against ``math.fsum`` in tests/test_checkpoints.py,
    independent of the buffer's alignment). Without it: the values converted to float64 into a reused buffer and
    :func:`sum_squares`. NaN/inf give NaN/inf (callers mask them first).
    """
    nk = _numkong()
    if nk is not None:
        return float(nk.moments(f)[1])
    d = s.get("f64", np.float64, int(f.shape[0]))
    _COPY(d, f)
    return sum_squares(d)


ROW = 8192
"""Elements per BLAS dot product in :func:`sum_squares`. OpenBLAS computes a dot of at most 10000 elements on
the calling thread (``kernel/x86_64/ddot.c``); above that it wakes its own threads, which on a loaded machine made
one 65536-element dot 10x slower (measured here), and the parallelism is already ours (one worker per core)."""

_vecdot = getattr(np, "vecdot", None) or (lambda x, y: np.einsum("ij,ij->i", x, y))


def sum_squares(f: np.ndarray) -> float:
    """``sum(f * f)`` of a 1-D float64 block, accumulated in float64.

    One ``np.vecdot`` over :data:`ROW`-element rows (a BLAS ``ddot`` per row, no squares written: 2-3x faster
    than ``np.multiply`` + ``np.add.reduce``), the row sums added in order (the same input gives the same bits).
    NaN/inf give NaN/inf (callers mask them first).
    """
    m = int(f.shape[0])
    k = m - m % ROW
    total = 0.0
    if k:
        rows = f[:k].reshape(-1, ROW)
        total = sum(_vecdot(rows, rows).tolist())
    if k < m:
        total += float(np.dot(f[k:], f[k:]))
    return total


def delta_sq(a: np.ndarray, b: np.ndarray, s: Scratch) -> float:
    """``sum((a - b)**2)`` in float64 of two float blocks of the same length (NaN/inf give NaN/inf)."""
    d = s.get("delta", np.float64, int(a.shape[0]))
    with np.errstate(invalid="ignore", over="ignore"):
        np.subtract(a, b, out=d, dtype=np.float64)
        return sum_squares(d)
