"""safetensors checkpoints: our own header parser and a chunked, bounded-memory tensor reducer.

Layout (``huggingface/safetensors:README.md``, ``safetensors/src/tensor.rs``; docs/formats.md#safetensors): a
little-endian u64 ``N``, ``N`` bytes of UTF-8 JSON (``{name: {dtype, shape, data_offsets: [begin,
end)}, "__metadata__": {str: str}}``, offsets relative to the start of the byte buffer that follows
the header), then the buffer, row-major and little-endian. The header is checked before anything is
allocated: at most 100 MB (``MAX_HEADER_SIZE``), inside the file, sizes that match ``numel *
itemsize``, no two tensors overlapping. A file cut short (the header complete, the data buffer
shorter than the header declares, the declared tensors tiling the buffer without holes as every
writer leaves them) keeps the tensors that lie entirely inside it; the cut ones are listed
(:func:`parse_header`). Tensors are streamed one by one in offset order with large sequential
``readinto`` calls (docs/formats.md#streaming-reduction: faster than mmap page faults on network file
systems), so a tensor of any size costs one chunk buffer.

Statistics (sum of squares, max |x|, NaN/inf/zero counts, the Adam-epsilon share) are exact in
float64. Most dtypes are reduced block by block as floats (:class:`Moments`; BF16 decoded by its bit
pattern, ``u16 << 16`` viewed as float32; FP8 through ``ml_dtypes``). Large BF16 and F16 tensors are
reduced from their raw 16-bit patterns instead (:class:`Bits16`): counts and max |x| from the bits, the
sum of squares from an exact float64 conversion (``ml_dtypes`` for BF16, a bit trick for F16: numpy's
float16 conversion is scalar), about twice as fast as the float path (benchmarks/bench_checkpoint.py); a
65536-bin histogram of the patterns is the other exact method, slower here.

The helpers here (:class:`TensorRef`, :func:`iter_raw`, :func:`iter_blocks`, :class:`Moments`,
:func:`tensor_stats`) also serve the torch zip reader (:mod:`parsers.torch_ckpt`), whose storages are
byte ranges of the zip file too.
"""

from __future__ import annotations

import functools
import json
import math
import os
import struct
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from forensics.model import Skip
from parsers.file_policy import is_readable_file

FORMAT = "safetensors"
MAX_HEADER_SIZE = 100_000_000
"""Largest header accepted, as in ``safetensors/src/tensor.rs``."""
CHUNK_BYTES = 4 << 20
"""Bytes per sequential read (the bound on the memory one open tensor stream holds). Small enough for the chunk
the kernel just copied to be reduced from the cache (``bench_checkpoint.py``, page-cached file, GB/s per CPU
second: BF16 1.1 with 32 MiB reads, 1.7 with 2-4 MiB; F16 0.8 / 1.0; F32 the same); still large sequential
reads, never mmap page faults (docs/formats.md#streaming-reduction)."""
BLOCK = 1 << 16
"""Elements reduced per numpy call (cache-sized; measured fastest between 2**14 and 2**18)."""
MAX_STRIDED_BYTES = 64 << 20
"""A non-contiguous view is materialised only when its storage span is at most this size."""
BITS16_MIN = 1 << 16
"""BF16/F16 tensors with at least this many elements are reduced from their bit patterns (:class:`Bits16`); below,
the float path costs less than folding a 65536-bin histogram."""
BITS16_BLOCK = 1 << 18
"""Elements per step of :class:`Bits16` (``bench_checkpoint.py --micro``: 2**14 pays numpy's per-call cost, 2**16
the histogram's 65536-bin output per call; 2**17 to 2**18 fastest for both methods)."""
BITS16_METHOD = {"BF16": "convert", "F16": "convert"}
"""The faster exact method per dtype (``bench_checkpoint.py --micro``, GB/s of 16-bit data per CPU second on a
shared 2-core AMD EPYC, steps of 2**18: BF16 convert 1.9, histogram 1.1, the float path before 0.6-0.9; F16
convert 1.5, histogram 0.8-1.0, the float path before 0.5: numpy's float16 conversion is scalar)."""

_FLOAT_DTYPES = {"F64": "<f8", "F32": "<f4", "F16": "<f2"}
_INT_DTYPES = {"I64": "<i8", "I32": "<i4", "I16": "<i2", "I8": "i1", "U64": "<u8", "U32": "<u4", "U16": "<u2",
               "U8": "u1", "BOOL": "u1"}
_FP8 = {"F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2", "F8_E4M3FNUZ": "float8_e4m3fnuz",
        "F8_E5M2FNUZ": "float8_e5m2fnuz", "F8_E8M0": "float8_e8m0fnu"}
ITEMSIZE = {**{k: 8 for k in ("F64", "I64", "U64")}, **{k: 4 for k in ("F32", "I32", "U32")},
            **{k: 2 for k in ("F16", "BF16", "I16", "U16")}, **{k: 1 for k in ("I8", "U8", "BOOL", *_FP8)}}
"""Bytes per element of every dtype we decode (safetensors dtype codes)."""


class CheckpointError(Exception):
    """A checkpoint file (or one tensor of it) cannot be read; the message is the skip reason."""


@dataclass(frozen=True)
class TensorRef:
    """Where one tensor's bytes are, without reading them.

    Attributes:
        path: The file holding the bytes (a safetensors file or a torch zip archive).
        name: Tensor name (the state-dict key; may be filled in later).
        dtype: safetensors dtype code (``"F32"``, ``"BF16"``, ``"F8_E4M3"``...).
        shape: Tensor shape.
        offset: Absolute byte offset of element 0 in ``path``, or the offset inside ``member``.
        member: Zip member to read through :mod:`zipfile` when it is compressed (else ``None``).
        stride: Element strides of a non-contiguous torch view (``None`` when C-contiguous).
        span: Storage bytes a strided view spans from ``offset`` (0 when contiguous).
    """

    path: str
    name: str
    dtype: str
    shape: tuple[int, ...]
    offset: int
    member: str | None = None
    stride: tuple[int, ...] | None = None
    span: int = 0

    @property
    def numel(self) -> int:
        """Number of elements (1 for a 0-d tensor)."""
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        """Bytes of the tensor's data (``numel * itemsize``)."""
        return self.numel * ITEMSIZE.get(self.dtype, 0)


class Moments:
    """Streaming per-tensor statistics over float blocks (float64 accumulation).

    ``l2``, ``rms`` and ``max_abs`` are taken over the finite values; NaN and +-inf are counted in
    ``n_nan``/``n_inf`` (a tensor with one inf keeps a meaningful norm). ``n_zero`` counts exact zeros.
    For ``exp_avg_sq`` tensors, ``small_below`` (a threshold on v) also counts ``0 < v <= small_below``
    and ``n_pos`` counts ``v > 0`` (the Adam-epsilon share, see :mod:`forensics.detectors.ckpt_update_growth`).
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


_BITS16 = ("BF16", "F16")
"""dtypes reduced from their raw 16-bit patterns by :class:`Bits16`."""
_INF16 = {"BF16": 0x7F80, "F16": 0x7C00}
"""Bit pattern of +inf; with the sign bit cleared, larger patterns are NaN, smaller ones finite and ordered by value."""


@functools.cache
def _table16(dtype: str) -> dict[str, np.ndarray]:
    """What each of the 65536 bit patterns of ``dtype`` (BF16 or F16) is worth.

    Returns:
        ``value`` (float64, exact), ``sq`` (value**2 in float64, exact for both dtypes; 0 where not finite),
        ``absval`` (|value|, -1 where not finite), ``nan``, ``inf`` and ``pos`` (value > 0: +inf counts,
        NaN does not) masks; each of shape (65536,).
    """
    bits = np.arange(1 << 16, dtype=np.uint32)
    with np.errstate(invalid="ignore", over="ignore"):  # signalling NaN patterns
        if dtype == "BF16":  # exact: a bfloat16 is the upper half of a float32 (docs/formats.md#streaming-reduction)
            value = (bits << 16).view(np.float32).astype(np.float64)
        else:
            value = bits.astype(np.uint16).view("<f2").astype(np.float64)
        fin = np.isfinite(value)
        sq = np.where(fin, value * value, 0.0)
        pos = value > 0
    out = {"value": value, "sq": sq, "absval": np.where(fin, np.abs(value), -1.0), "nan": np.isnan(value),
           "inf": np.isinf(value), "pos": pos}
    for a in out.values():
        a.setflags(write=False)
    return out


def _f16_magnitude(a: np.ndarray, u32: np.ndarray, out: np.ndarray) -> np.ndarray:
    """|x| of F16 elements from their magnitude bits ``a = bits & 0x7fff``, exactly, into float64 ``out``.

    The bit trick: the 15 magnitude bits shifted into a float32's exponent and mantissa slots (``a << 13``)
    read as a float32 are ``|x| * 2**-112`` for every finite pattern, subnormals included (they land on
    float32 subnormals); widened to float64 and scaled by ``2**112``, both exact. Non-finite patterns give
    finite garbage: mask them. Verified against numpy's conversion for all 65536 patterns (tests).

    Args:
        a: Magnitude bits, uint16, shape (n,).
        u32: Scratch, uint32, shape (n,).
        out: Result, float64, shape (n,).

    Returns:
        ``out``.
    """
    np.left_shift(a, 13, out=u32, dtype=np.uint32)
    np.copyto(out, u32.view(np.float32))
    out *= 2.0 ** 112
    return out


@functools.cache
def _float16_type(dtype: str) -> np.dtype | None:
    """The numpy dtype of a BF16 (``ml_dtypes.bfloat16``) or F16 element; None when ml_dtypes is missing."""
    if dtype == "F16":
        return np.dtype("<f2")
    try:
        import ml_dtypes
    except ImportError:
        return None
    return np.dtype(ml_dtypes.bfloat16)


class Bits16(Moments):
    """Exact streaming statistics of a BF16 or F16 tensor read from its raw 16-bit patterns.

    Two exact methods (:data:`BITS16_METHOD` picks the faster per dtype):

    - ``"convert"``: per :data:`BITS16_BLOCK`-element step, the counts and ``max_abs`` come from the bits
      (``bits & 0x7fff``: zero is 0, +-inf is :data:`_INF16`, NaN above it, and finite magnitudes are ordered
      like their patterns, so the largest finite pattern is the largest ``|x|``); the sum of squares from the
      block converted to float64 (BF16 by ``ml_dtypes``; F16 by the bit trick of :func:`_f16_magnitude`,
      numpy's float16 conversion being scalar; both exact) and ``np.einsum``. NaN/inf are masked only in the
      steps that hold them.
    - ``"hist"``: a 65536-bin histogram of the patterns (``np.bincount``); :meth:`result` folds it with
      :func:`_table16` (``sum(count * value**2)``, the largest finite ``|value|`` seen, the NaN/inf/zero/
      positive/small bins). No conversion at all.

    Both give :class:`Moments`' statistics: counts and ``max_abs`` identical, ``l2`` equal up to the float64
    summation order (16-bit squares are exact in float64). ``small_below`` is compared exactly (in float64;
    :class:`Moments` compares in the block's float32). Memory: one step's scratch buffers (at most 4 MiB)
    and the 65536 counts.

    Feed raw blocks only (:meth:`add_bits`); :meth:`add` (float blocks) is not supported.
    """

    __slots__ = ("dtype", "method", "counts", "_top", "_buf", "_p_small")

    def __init__(self, dtype: str, small_below: float | None = None, method: str | None = None) -> None:
        """Start empty.

        Args:
            dtype: ``"BF16"`` or ``"F16"``.
            small_below: As in :class:`Moments`.
            method: ``"convert"`` or ``"hist"``; default :data:`BITS16_METHOD` (``"hist"`` for BF16 when
                ml_dtypes is missing).

        Raises:
            ValueError: Another dtype or method.
        """
        if dtype not in _BITS16:
            raise ValueError(f"Bits16 reduces BF16 or F16, not {dtype}")
        method = method or BITS16_METHOD[dtype]
        if method == "convert" and _float16_type(dtype) is None:
            method = "hist"
        if method not in ("convert", "hist"):
            raise ValueError(f"unknown method {method!r} (convert or hist)")
        super().__init__(small_below)
        self.dtype, self.method = dtype, method
        self.counts = np.zeros(1 << 16, dtype=np.int64) if method == "hist" else None
        self._top = -1  # largest finite |x| bit pattern seen ("convert")
        self._buf: dict[str, np.ndarray] = {}
        self._p_small = 0
        if small_below is not None and method == "convert":  # positive patterns 1.._p_small are <= small_below
            v = _table16(dtype)["value"][1:_INF16[dtype]]
            self._p_small = int(np.searchsorted(v, small_below, side="right"))

    def add(self, b: np.ndarray) -> None:
        """Not supported: use :meth:`add_bits`.

        Raises:
            TypeError: Always.
        """
        raise TypeError("Bits16 takes raw 16-bit blocks (add_bits), not float blocks")

    def _scratch(self, key: str, dtype: Any, n: int) -> np.ndarray:
        buf = self._buf.get(key)
        if buf is None:
            buf = self._buf[key] = np.empty(BITS16_BLOCK, dtype=dtype)
        return buf[:n]

    def add_bits(self, raw: np.ndarray) -> None:
        """Fold one 1-D block of raw elements in (any 2-byte dtype: ``<u2`` or ``<f2`` as stored)."""
        bits = raw.view("<u2")
        for i in range(0, int(bits.shape[0]), BITS16_BLOCK):
            part = bits[i:i + BITS16_BLOCK]
            if self.method == "hist":
                idx = self._scratch("idx", np.intp, part.shape[0])
                np.copyto(idx, part)  # bincount would otherwise allocate this int64 copy on every call
                self.counts += np.bincount(idx, minlength=1 << 16)
            else:
                self._add_converted(part)

    def _add_converted(self, b: np.ndarray) -> None:
        m, inf = int(b.shape[0]), _INF16[self.dtype]
        a = self._scratch("abs", np.uint16, m)
        np.bitwise_and(b, 0x7FFF, out=a)
        top = int(a.max())
        f = self._scratch("f64", np.float64, m)
        if self.dtype == "F16":
            _f16_magnitude(a, self._scratch("u32", np.uint32, m), f)
        else:
            with np.errstate(invalid="ignore"):  # signalling NaN patterns
                np.copyto(f, b.view(_float16_type(self.dtype)), casting="unsafe")
        if top < inf:  # all finite: the common case
            self.sumsq += float(np.einsum("i,i->", f, f))
            self._top = max(self._top, top)
        else:
            fin = a < inf
            n_fin, n_inf = int(np.count_nonzero(fin)), int(np.count_nonzero(a == inf))
            self.n_inf += n_inf
            self.n_nan += m - n_fin - n_inf
            if n_fin:
                self._top = max(self._top, int(a[fin].max()))
                ff = f[fin]
                self.sumsq += float(np.einsum("i,i->", ff, ff))
        self.numel += m
        self.n_zero += m - int(np.count_nonzero(a))
        if self.small_below is not None:
            t = self._scratch("dec", np.uint16, m)
            np.subtract(b, 1, out=t)  # positive patterns 1..inf become 0..inf-1; 0 wraps to 0xffff
            self.n_pos += int(np.count_nonzero(t < inf))
            self.n_small += int(np.count_nonzero(t < self._p_small))

    def result(self) -> dict[str, Any]:
        """As :meth:`Moments.result`; ``n_small``/``n_pos`` are set too when ``small_below`` was given."""
        t = _table16(self.dtype)
        if self.method == "convert":
            self.max_abs = float(t["value"][self._top]) if self._top >= 0 else 0.0
            return super().result()
        nz = np.flatnonzero(self.counts)
        c = self.counts[nz]
        self.numel = int(c.sum())
        self.n_nan = int(c[t["nan"][nz]].sum())
        self.n_inf = int(c[t["inf"][nz]].sum())
        self.n_zero = int(self.counts[0] + self.counts[0x8000])
        self.sumsq = float(np.sum(c.astype(np.float64) * t["sq"][nz]))
        self.max_abs = max(float(t["absval"][nz].max()), 0.0) if nz.size else 0.0
        if self.small_below is not None:
            pos = t["pos"][nz]
            self.n_pos = int(c[pos].sum())
            self.n_small = int(c[pos & (t["value"][nz] <= self.small_below)].sum())
        return super().result()


def _decoder(dtype: str) -> tuple[np.dtype, np.dtype | None]:
    """(raw dtype to view the bytes as, float dtype to convert to or None when the view is final)."""
    if dtype in ("F32", "F64"):
        return np.dtype(_FLOAT_DTYPES[dtype]), None
    if dtype == "F16":
        return np.dtype("<f2"), np.dtype(np.float32)
    if dtype == "BF16":
        return np.dtype("<u2"), np.dtype(np.float32)
    if dtype in _INT_DTYPES:
        return np.dtype(_INT_DTYPES[dtype]), np.dtype(np.float64)
    if dtype in _FP8:
        try:
            import ml_dtypes
        except ImportError as exc:  # optional: only FP8 tensors need it
            raise CheckpointError(f"dtype {dtype} needs the ml_dtypes package (pip install ml-dtypes)") from exc
        return np.dtype(getattr(ml_dtypes, _FP8[dtype])), np.dtype(np.float32)
    raise CheckpointError(f"dtype {dtype} is not supported (complex or sub-byte)")


def _open_stream(ref: TensorRef) -> Any:
    """A binary file object positioned at the tensor's first byte."""
    if ref.member is None:
        fh = open(ref.path, "rb", buffering=0)  # noqa: SIM115 - closed by the caller
        fh.seek(ref.offset)
        return fh
    return _Member(ref.path, ref.member, ref.offset)


class _Member:
    """A compressed zip member read sequentially from ``offset`` (closes the archive with it)."""

    def __init__(self, path: str, member: str, offset: int) -> None:
        self.zf = zipfile.ZipFile(path)
        self.fh = self.zf.open(member)
        left = offset
        while left > 0:
            got = self.fh.read(min(left, CHUNK_BYTES))
            if not got:
                break
            left -= len(got)

    def readinto(self, view: memoryview) -> int:
        return self.fh.readinto(view)

    def close(self) -> None:
        self.fh.close()
        self.zf.close()


def _read_exact(fh: Any, view: memoryview) -> int:
    got = 0
    while got < len(view):
        k = fh.readinto(view[got:])
        if not k:
            break
        got += k
    return got


def _per_chunk(itemsize: int, chunk_bytes: int, block: int) -> int:
    """Elements per read: a multiple of ``block`` (at least one block) of about ``chunk_bytes``."""
    return max(block, (chunk_bytes // (itemsize * block)) * block)


def iter_raw(ref: TensorRef, chunk_bytes: int = CHUNK_BYTES, block: int = BLOCK) -> Iterator[np.ndarray]:
    """Stream a tensor's elements as stored: 1-D arrays of its raw dtype (``<u2`` for BF16, ``<f2`` for F16).

    Args:
        ref: The tensor.
        chunk_bytes: Bytes per sequential read (memory bound of the stream).
        block: Every chunk but the last holds a multiple of ``block`` elements.

    Yields:
        Chunks of about ``chunk_bytes`` bytes (at least ``block`` elements), in row-major order. A
        chunk is a view into a reused buffer: consume it before asking for the next one.

    Raises:
        CheckpointError: Unsupported dtype, a strided view too large to materialise, or the file
            ends before the tensor does (truncated).
    """
    raw_dt, _ = _decoder(ref.dtype)
    size = raw_dt.itemsize
    n_total = ref.numel
    per_chunk = _per_chunk(size, chunk_bytes, block)
    if ref.stride is not None:
        flat = _strided_raw(ref, raw_dt)
        for i in range(0, flat.shape[0], per_chunk):
            yield flat[i:i + per_chunk]
        return
    raw = bytearray(min(per_chunk, max(n_total, 1)) * size)
    done = 0
    fh = _open_stream(ref)
    try:
        while done < n_total:
            n = min(per_chunk, n_total - done)
            if _read_exact(fh, memoryview(raw)[: n * size]) < n * size:
                raise CheckpointError(f"truncated: tensor {ref.name!r} ends beyond the end of the file")
            yield np.frombuffer(raw, dtype=raw_dt, count=n)
            done += n
    finally:
        fh.close()


class _Converter:
    """Raw blocks of one dtype to float blocks, into reused buffers (see :func:`iter_blocks`)."""

    def __init__(self, dtype: str, block: int) -> None:
        _, out_dt = _decoder(dtype)
        self.conv = np.empty(block, dtype=out_dt) if out_dt is not None else None
        self.u32 = np.empty(block, dtype=np.uint32) if dtype == "BF16" else None

    def __call__(self, b: np.ndarray) -> np.ndarray:
        if self.conv is None:
            return b
        m = b.shape[0]
        if self.u32 is not None:  # BF16: exact, NaN/inf preserved (docs/formats.md#streaming-reduction, measured)
            w = self.u32[:m]
            w[...] = b
            w <<= 16
            return w.view(np.float32)
        out = self.conv[:m]
        np.copyto(out, b, casting="unsafe")
        return out


def iter_blocks(ref: TensorRef, chunk_bytes: int = CHUNK_BYTES, block: int = BLOCK) -> Iterator[np.ndarray]:
    """Stream a tensor as 1-D float blocks of ``block`` elements (the last one shorter).

    Args:
        ref: The tensor.
        chunk_bytes: Bytes per sequential read (memory bound of the stream).
        block: Elements per yielded block.

    Yields:
        float32 blocks (float types up to 32 bits; BF16 exact via its bit pattern) or float64
        blocks (F64, integers, BOOL), in row-major order. A block is a view into a reused buffer:
        consume it before asking for the next one.

    Raises:
        CheckpointError: Unsupported dtype, a strided view too large to materialise, or the file
            ends before the tensor does (truncated).
    """
    convert = _Converter(ref.dtype, block)
    for arr in iter_raw(ref, chunk_bytes, block):
        for i in range(0, arr.shape[0], block):
            yield convert(arr[i:i + block])


def _strided_raw(ref: TensorRef, raw_dt: np.dtype) -> np.ndarray:
    """A non-contiguous torch view materialised C-contiguous and flat (raw dtype)."""
    if ref.span > MAX_STRIDED_BYTES:
        raise CheckpointError(f"non-contiguous view over {ref.span} bytes of storage (limit {MAX_STRIDED_BYTES}); "
                              "not materialised")
    fh = _open_stream(ref)
    try:
        buf = bytearray(ref.span)
        if _read_exact(fh, memoryview(buf)) < ref.span:
            raise CheckpointError(f"truncated: storage of {ref.name!r} ends beyond the end of the file")
    finally:
        fh.close()
    base = np.frombuffer(buf, dtype=raw_dt)
    view = np.lib.stride_tricks.as_strided(base, ref.shape, tuple(s * raw_dt.itemsize for s in ref.stride or ()))
    return np.ascontiguousarray(view).reshape(-1)


def tensor_stats(ref: TensorRef, small_below: float | None = None, prev: TensorRef | None = None) -> dict[str, Any]:
    """Statistics of one tensor, streamed (see :class:`Moments`), and optionally its distance to another.

    BF16/F16 tensors of at least :data:`BITS16_MIN` elements are reduced from their bit patterns
    (:class:`Bits16`), everything else as float blocks; both give the same statistics.

    Args:
        ref: The tensor.
        small_below: For Adam second moments: also count ``0 < v <= small_below``.
        prev: The same tensor in an earlier checkpoint (same ``numel``, any dtype): also return
            ``||ref - prev||^2``, in the same pass over ``ref``.

    Returns:
        ``{"numel", "l2", "rms", "max_abs", "n_nan", "n_inf", "n_zero"}`` plus ``n_small``/``n_pos``
        when ``small_below`` is given and ``delta_sq`` (float64; NaN/inf when either tensor holds them)
        when ``prev`` is given.

    Raises:
        CheckpointError: See :func:`iter_blocks`; also when ``prev`` has another number of elements.
    """
    if prev is not None and prev.numel != ref.numel:
        raise CheckpointError(f"tensor {ref.name!r}: {ref.numel} elements, the earlier one {prev.numel}")
    bits16 = ref.dtype in _BITS16 and ref.numel >= BITS16_MIN
    m: Moments = Bits16(ref.dtype, small_below) if bits16 else Moments(small_below)
    dsq: float | None = None
    if prev is None and bits16:
        for raw in iter_raw(ref):
            m.add_bits(raw)  # type: ignore[attr-defined]
    elif prev is None:
        for b in iter_blocks(ref):
            m.add(b)
    else:
        dsq = 0.0
        d = np.empty(BLOCK, dtype=np.float64)
        convert = _Converter(ref.dtype, BLOCK)
        theirs = iter_blocks(prev)
        for raw in iter_raw(ref):  # chunks are whole multiples of BLOCK: aligned with prev's blocks
            if bits16:
                m.add_bits(raw)  # type: ignore[attr-defined]
            for i in range(0, raw.shape[0], BLOCK):
                a = convert(raw[i:i + BLOCK])
                if not bits16:
                    m.add(a)
                b = next(theirs)
                dd = d[: a.shape[0]]
                with np.errstate(invalid="ignore", over="ignore"):  # NaN/inf give a NaN/inf norm, as they should
                    np.subtract(a, b, out=dd, dtype=np.float64)
                dsq += float(np.einsum("i,i->", dd, dd))
        theirs.close()
    out = m.result()
    if small_below is not None:
        out.update(n_small=m.n_small, n_pos=m.n_pos)
    if dsq is not None:
        out["delta_sq"] = dsq
    return out


@dataclass(frozen=True)
class Header:
    """A validated safetensors header (see :func:`parse_header`).

    Attributes:
        tensors: The tensors to read: decodable and entirely inside the file, sorted by data offset,
            absolute offsets filled in.
        metadata: The ``__metadata__`` map.
        skipped: One Skip per tensor not read: a dtype we cannot decode, or cut by a truncation
            (``what`` = ``"<path>:<tensor>"``, the reason names the tensor's byte range and where the file ends).
        file_bytes: Size of the file in bytes.
        declared_bytes: Size the header declares: 8 + header + the end of the last tensor's data.
        cut: Names of the tensors cut by a truncation, in offset order (empty when the file is whole).
    """

    tensors: list[TensorRef]
    metadata: dict[str, str]
    skipped: list[Skip]
    file_bytes: int
    declared_bytes: int
    cut: tuple[str, ...] = ()

    @property
    def truncated(self) -> bool:
        """The file ends before the data the header declares (some tensors are cut)."""
        return self.file_bytes < self.declared_bytes


def parse_header(path: str | Path) -> Header:
    """Parse and validate a safetensors header without touching the tensor data.

    A file cut short is read as far as it goes: when the header is complete and the declared tensors
    tile the data buffer from 0 without holes or overlaps (as every writer leaves them) but the buffer
    is shorter than they declare, the tensors that lie entirely inside the file are kept and each cut
    one becomes a Skip (:attr:`Header.cut`). Offsets past the end that no truncation explains (a hole
    before them, a first tensor that does not start at 0) are refused.

    Args:
        path: The ``.safetensors`` file.

    Returns:
        The :class:`Header`.

    Raises:
        CheckpointError: Not a safetensors file, a header longer than 100 MB or cut itself (past the
            end of the file), malformed JSON or header entries, a size that does not match dtype x shape,
            overlapping tensors, or offsets past the end of the file not explained by a truncation.
            Nothing larger than the header is allocated.
    """
    path = str(path)
    size = os.path.getsize(path)
    with open(path, "rb") as fh:
        head = fh.read(8)
        if len(head) < 8:
            raise CheckpointError(f"truncated: {size} bytes, shorter than the 8-byte header length")
        (n,) = struct.unpack("<Q", head)
        if n > MAX_HEADER_SIZE:
            raise CheckpointError(f"header length {n} exceeds the {MAX_HEADER_SIZE}-byte limit (corrupt or not "
                                  "safetensors); not read")
        if 8 + n > size:
            raise CheckpointError(f"truncated: header length {n} runs past the end of the file ({size} bytes): "
                                  "the header itself is cut, or not safetensors")
        text = fh.read(n)
    if not text.startswith(b"{"):
        raise CheckpointError("header does not start with '{' (not a safetensors file)")
    try:
        obj = json.loads(text.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise CheckpointError(f"header is not valid JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise CheckpointError("header is not a JSON object")
    meta = obj.pop("__metadata__", None) or {}
    if not isinstance(meta, dict):
        meta = {}
    start, buf_len = 8 + n, size - 8 - n
    entries: list[tuple[int, int, str, str, tuple[int, ...]]] = []  # begin, end, name, dtype, shape
    for name, e in obj.items():
        try:
            dtype, shape, (b, end) = e["dtype"], e["shape"], e["data_offsets"]
            ok = (isinstance(dtype, str) and isinstance(shape, list)
                  and all(isinstance(d, int) and d >= 0 for d in shape)
                  and isinstance(b, int) and isinstance(end, int) and 0 <= b <= end)
        except (TypeError, KeyError, ValueError):
            ok = False
        if not ok:
            raise CheckpointError(f"malformed header entry for tensor {name!r}")
        if dtype in ITEMSIZE and math.prod(shape) * ITEMSIZE[dtype] != end - b:
            raise CheckpointError(f"tensor {name!r}: {end - b} bytes for {dtype} x {shape} (expected "
                                  f"{math.prod(shape) * ITEMSIZE[dtype]})")
        entries.append((b, end, str(name), dtype, tuple(shape)))
    entries.sort(key=lambda x: (x[0], x[1]))
    for (_, e0, n0, *_), (b1, _, n1, *_) in zip(entries, entries[1:], strict=False):
        if b1 < e0:
            raise CheckpointError(f"tensors {n0!r} and {n1!r} overlap in the data buffer")
    declared = max((e for _, e, *_ in entries), default=0)
    if declared > buf_len:  # explained by a truncation only if the tensors tile [0, declared) as written
        pos = 0
        for b, e, name, *_ in entries:
            if b != pos:
                raise CheckpointError(f"corrupt: tensor {name!r} at bytes [{b}, {e}) of a data buffer that holds "
                                      f"{buf_len} bytes, after a hole at {pos} (not a truncated file)")
            pos = e
    refs, skipped, cut = [], [], []
    for b, end, name, dtype, shape in entries:
        if end > buf_len:
            cut.append(name)
            skipped.append(Skip(f"{path}:{name}", f"truncated: tensor cut, its data [{start + b}, {start + end}) "
                                f"runs past the end of the file at byte {size} (the header declares "
                                f"{start + declared} bytes)"))
        elif dtype not in ITEMSIZE:
            skipped.append(Skip(f"{path}:{name}", f"dtype {dtype} not decoded (complex or sub-byte)"))
        else:
            refs.append(TensorRef(path=path, name=name, dtype=dtype, shape=shape, offset=start + b))
    return Header(tensors=refs, metadata={str(k): str(v) for k, v in meta.items()}, skipped=skipped,
                  file_bytes=size, declared_bytes=max(size, start + declared), cut=tuple(cut))


def read_header(path: str | Path) -> tuple[list[TensorRef], dict[str, str], list[Skip]]:
    """``(tensors, metadata, skipped)`` of :func:`parse_header` (cut tensors are in ``skipped``).

    Args:
        path: The ``.safetensors`` file.

    Returns:
        The tensors to read (sorted by data offset), the ``__metadata__`` map, and one Skip per
        tensor not read (undecodable dtype, cut by a truncation).

    Raises:
        CheckpointError: See :func:`parse_header`.
    """
    h = parse_header(path)
    return h.tensors, h.metadata, h.skipped


def read_index(index: str | Path) -> tuple[dict[str, str], list[str]]:
    """A sharded checkpoint's index (``model.safetensors.index.json``, ``pytorch_model.bin.index.json``).

    Args:
        index: The index file.

    Returns:
        ``(weight_map, missing)``: tensor name -> shard file name, and the shard files the index
        lists that are not in its folder.

    Raises:
        CheckpointError: The index is not JSON or has no ``weight_map``.
    """
    index = Path(index)
    try:
        obj = json.loads(index.read_text(encoding="utf-8"))
        wmap = {str(k): str(v) for k, v in obj["weight_map"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CheckpointError(f"unreadable index: {type(exc).__name__}: {exc}") from None
    # a shard is a file name in the index's folder: a name with a path in it ("../../etc/passwd") is never
    # looked up (that would tell which paths outside the run exist) and counts as missing
    shards = set(wmap.values())
    missing = sorted(s for s in shards if "/" in s or "\\" in s or s in ("", ".", "..")
                     or not is_readable_file(index.parent / s))
    return wmap, missing

