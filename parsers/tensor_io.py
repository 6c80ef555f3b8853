"""Where a checkpoint tensor's bytes are (:class:`TensorRef`) and how they are streamed in bounded memory.

Format-neutral: a safetensors tensor and a torch storage are both a byte range of a file (or, for a
compressed zip member, a range of the member). Streams use large sequential ``readinto`` calls into one
reused buffer (docs/formats.md#streaming-reduction: faster than mmap page faults on network file
systems), so a tensor of any size costs one chunk buffer; :func:`read_range` is the positional form the
parallel reducer (:mod:`parsers.tensors`) gives each worker.
"""

from __future__ import annotations

import math
import os
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

CHUNK_BYTES = 4 << 20
"""Bytes per sequential read of :func:`iter_raw` (the bound on the memory one open tensor stream holds; the
parallel reducer reads :data:`parsers.tensors.READ_BYTES` at a time instead): large sequential reads, never
mmap page faults (docs/formats.md#streaming-reduction)."""
BLOCK = 1 << 17
"""Elements reduced per numpy call (cache-sized; the reader of ``reduce_bits`` measured fastest at 2**17 of 2**15 to
2**18, 5-8% ahead of 2**16: fewer Python calls per element, its buffers still in the core's L2 cache)."""
MAX_STRIDED_BYTES = 64 << 20
"""A non-contiguous view is materialised only when its storage span is at most this size."""

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



def decoder(dtype: str) -> tuple[np.dtype, np.dtype | None]:
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


def read_range(fd: int, offset: int, view: memoryview) -> int:
    """Fill ``view`` from byte ``offset`` of the open file ``fd`` (``os.preadv``, no shared file position).

    Returns:
        Bytes read: ``len(view)`` unless the file ends first.
    """
    got = 0
    while got < len(view):
        k = os.preadv(fd, [view[got:]], offset + got)
        if not k:
            break
        got += k
    return got


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
    raw_dt, _ = decoder(ref.dtype)
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


class Converter:
    """Raw blocks of one dtype to float blocks, into reused buffers (see :func:`iter_blocks`)."""

    def __init__(self, dtype: str, block: int) -> None:
        _, out_dt = decoder(dtype)
        self.conv = np.empty(block, dtype=out_dt) if out_dt is not None else None
        self.u32 = np.empty(block, dtype=np.uint32) if dtype == "BF16" else None

    def __call__(self, b: np.ndarray) -> np.ndarray:
        """The block as float32 (float types up to 32 bits) or float64 (F64, integers); a reused buffer."""
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
    convert = Converter(ref.dtype, block)
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

