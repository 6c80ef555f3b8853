"""safetensors checkpoints: our own header parser and a chunked, bounded-memory tensor reducer.

Layout (``huggingface/safetensors:README.md``, ``safetensors/src/tensor.rs``; formats.md 6.1): a
little-endian u64 ``N``, ``N`` bytes of UTF-8 JSON (``{name: {dtype, shape, data_offsets: [begin,
end)}, "__metadata__": {str: str}}``, offsets relative to the start of the byte buffer that follows
the header), then the buffer, row-major and little-endian. The header is checked before anything is
allocated: at most 100 MB (``MAX_HEADER_SIZE``), offsets inside the file, sizes that match
``numel * itemsize``, no two tensors overlapping. Tensors are streamed one by one in offset order with
large sequential ``readinto`` calls (formats.md 6.7: faster than mmap page faults on network file
systems) and reduced block by block in float64 (sum of squares, max |x|, NaN/inf/zero counts), so a
tensor of any size costs one chunk buffer. BF16 is decoded exactly by its bit pattern (``u16 << 16``
viewed as float32); FP8 through ``ml_dtypes``.

The helpers here (:class:`TensorRef`, :func:`iter_blocks`, :class:`Moments`) also serve the torch
zip reader (:mod:`parsers.torch_ckpt`), whose storages are byte ranges of the zip file too.
"""

from __future__ import annotations

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

FORMAT = "safetensors"
MAX_HEADER_SIZE = 100_000_000
"""Largest header accepted, as in ``safetensors/src/tensor.rs``."""
CHUNK_BYTES = 32 << 20
"""Bytes per sequential read (the bound on the memory one open tensor stream holds)."""
BLOCK = 1 << 16
"""Elements reduced per numpy call (cache-sized; measured fastest between 2**14 and 2**18)."""
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
    raw_dt, out_dt = _decoder(ref.dtype)
    size = raw_dt.itemsize
    n_total = ref.numel
    if ref.stride is not None:
        yield from _strided_blocks(ref, raw_dt, out_dt, block)
        return
    per_chunk = max(block, (chunk_bytes // (size * block)) * block)
    raw = bytearray(min(per_chunk, max(n_total, 1)) * size)
    conv = np.empty(block, dtype=out_dt) if out_dt is not None else None
    u32 = np.empty(block, dtype=np.uint32) if ref.dtype == "BF16" else None
    done = 0
    fh = _open_stream(ref)
    try:
        while done < n_total:
            n = min(per_chunk, n_total - done)
            mv = memoryview(raw)[: n * size]
            if _read_exact(fh, mv) < n * size:
                raise CheckpointError(f"truncated: tensor {ref.name!r} ends beyond the end of the file")
            arr = np.frombuffer(raw, dtype=raw_dt, count=n)
            for i in range(0, n, block):
                yield _convert(arr[i:i + block], ref.dtype, conv, u32)
            done += n
    finally:
        fh.close()


def _convert(b: np.ndarray, dtype: str, conv: np.ndarray | None, u32: np.ndarray | None) -> np.ndarray:
    if conv is None:
        return b
    m = b.shape[0]
    if u32 is not None:  # BF16: exact, NaN/inf preserved (formats.md 6.7, measured)
        w = u32[:m]
        w[...] = b
        w <<= 16
        return w.view(np.float32)
    out = conv[:m]
    np.copyto(out, b, casting="unsafe")
    return out


def _strided_blocks(ref: TensorRef, raw_dt: np.dtype, out_dt: np.dtype | None, block: int) -> Iterator[np.ndarray]:
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
    flat = np.ascontiguousarray(view).reshape(-1)
    conv = np.empty(block, dtype=out_dt) if out_dt is not None else None
    u32 = np.empty(block, dtype=np.uint32) if ref.dtype == "BF16" else None
    for i in range(0, flat.shape[0], block):
        yield _convert(flat[i:i + block], ref.dtype, conv, u32)


def tensor_stats(ref: TensorRef, small_below: float | None = None) -> dict[str, Any]:
    """Statistics of one tensor, streamed (see :class:`Moments`).

    Args:
        ref: The tensor.
        small_below: For Adam second moments: also count ``0 < v <= small_below``.

    Returns:
        ``{"numel", "l2", "rms", "max_abs", "n_nan", "n_inf", "n_zero"}`` plus ``n_small``/``n_pos``
        when ``small_below`` is given.

    Raises:
        CheckpointError: See :func:`iter_blocks`.
    """
    m = Moments(small_below)
    for b in iter_blocks(ref):
        m.add(b)
    out = m.result()
    if small_below is not None:
        out.update(n_small=m.n_small, n_pos=m.n_pos)
    return out


def read_header(path: str | Path) -> tuple[list[TensorRef], dict[str, str], list[Skip]]:
    """Parse and validate a safetensors header without touching the tensor data.

    Args:
        path: The ``.safetensors`` file.

    Returns:
        ``(tensors, metadata, skipped)``: tensors sorted by data offset (absolute offsets filled in),
        the ``__metadata__`` map, and one Skip per tensor whose dtype we cannot decode.

    Raises:
        CheckpointError: Not a safetensors file, a header longer than 100 MB or past the end of the
            file, malformed JSON, offsets out of range (truncated file), a size that does not match
            dtype x shape, or overlapping tensors. Nothing larger than the header is allocated.
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
            raise CheckpointError(f"header length {n} runs past the end of the file ({size} bytes): truncated "
                                  "or not safetensors")
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
    refs, skipped = [], []
    spans: list[tuple[int, int, str]] = []
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
        if end > buf_len:
            raise CheckpointError(f"truncated or corrupt: tensor {name!r} ends at byte {end} of the data buffer, "
                                  f"which holds {buf_len} bytes")
        spans.append((b, end, name))
        if dtype not in ITEMSIZE:
            skipped.append(Skip(f"{path}:{name}", f"dtype {dtype} not decoded (complex or sub-byte)"))
            continue
        if math.prod(shape) * ITEMSIZE[dtype] != end - b:
            raise CheckpointError(f"tensor {name!r}: {end - b} bytes for {dtype} x {shape} (expected "
                                  f"{math.prod(shape) * ITEMSIZE[dtype]})")
        refs.append(TensorRef(path=path, name=name, dtype=dtype, shape=tuple(shape), offset=start + b))
    spans.sort()
    for (_, e0, n0), (b1, _, n1) in zip(spans, spans[1:], strict=False):
        if b1 < e0:
            raise CheckpointError(f"tensors {n0!r} and {n1!r} overlap in the data buffer")
    refs.sort(key=lambda r: r.offset)
    return refs, {str(k): str(v) for k, v in meta.items()}, skipped


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
    missing = sorted({s for s in wmap.values() if not (index.parent / s).is_file()})
    return wmap, missing

