"""safetensors checkpoints: our own header parser, a thin format reader of the :mod:`parsers.tensors` contract.

Layout (``huggingface/safetensors:README.md``, ``safetensors/src/tensor.rs``; docs/formats.md#safetensors): a
little-endian u64 ``N``, ``N`` bytes of UTF-8 JSON (``{name: {dtype, shape, data_offsets: [begin,
end)}, "__metadata__": {str: str}}``, offsets relative to the start of the byte buffer that follows
the header), then the buffer, row-major and little-endian. The header is checked before anything is
allocated: at most 100 MB (``MAX_HEADER_SIZE``), inside the file, sizes that match ``numel *
itemsize``, no two tensors overlapping. A file cut short (the header complete, the data buffer
shorter than the header declares, the declared tensors tiling the buffer without holes as every
writer leaves them) keeps the tensors that lie entirely inside it; the cut ones are listed
(:func:`parse_header`).

:func:`read` is the reader contract (``read(path) -> parsers.tensors.Loaded``, as
:func:`parsers.torch_ckpt.read`): the object is ``{name: TensorRef}`` in data-offset order. The tensors
are streamed later by :func:`parsers.tensors.tensor_stats` (re-exported here with :class:`TensorRef` and
:class:`CheckpointError` for older callers).
"""

from __future__ import annotations

import json
import math
import os
import struct
from dataclasses import dataclass
from pathlib import Path

from forensics.model import Skip
from parsers.ckpt_layouts import read_index
from parsers.tensors import ITEMSIZE, CheckpointError, Loaded, TensorRef, iter_blocks, tensor_stats

__all__ = ["FORMAT", "ITEMSIZE", "MAX_HEADER_SIZE", "CheckpointError", "Header", "Loaded", "TensorRef", "iter_blocks",
           "parse_header", "read", "read_header", "read_index", "sniff", "tensor_stats"]

FORMAT = "safetensors"
MAX_HEADER_SIZE = 100_000_000
"""Largest header accepted, as in ``safetensors/src/tensor.rs``."""


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
    n, obj = _header_json(path, size)
    meta = obj.pop("__metadata__", None) or {}
    if not isinstance(meta, dict):
        meta = {}
    start, buf_len = 8 + n, size - 8 - n
    entries = _entries(obj, buf_len)
    declared = max((e for _, e, *_ in entries), default=0)
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


def _header_json(path: str, size: int) -> tuple[int, dict]:
    """The header length ``N`` and the header's JSON object, checked before anything larger is read."""
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
    return n, obj


def _entries(obj: dict, buf_len: int) -> list[tuple[int, int, str, str, tuple[int, ...]]]:
    """``(begin, end, name, dtype, shape)`` of every tensor entry, sorted by offset, checked against each other.

    Offsets past ``buf_len`` are accepted only when the tensors tile ``[0, declared)`` without holes (a cut file).
    """
    entries: list[tuple[int, int, str, str, tuple[int, ...]]] = []
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
    if max((e for _, e, *_ in entries), default=0) > buf_len:  # a truncation only if they tile [0, declared)
        pos = 0
        for b, e, name, *_ in entries:
            if b != pos:
                raise CheckpointError(f"corrupt: tensor {name!r} at bytes [{b}, {e}) of a data buffer that holds "
                                      f"{buf_len} bytes, after a hole at {pos} (not a truncated file)")
            pos = e
    return entries


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


def read(path: str | Path) -> Loaded:
    """Read a safetensors file's structure (the reader contract of :mod:`parsers.tensors`).

    Args:
        path: The ``.safetensors`` file.

    Returns:
        A :class:`Loaded`: ``obj`` = ``{name: TensorRef}`` of the tensors to read, in data-offset order;
        ``metadata`` = ``__metadata__``; ``skipped`` = for a cut file first the file's own entry (``what``
        = the path; the reason names where the file ends, how many tensors were cut and read), then one
        per tensor not read (cut, or a dtype we cannot decode); ``truncated`` when the file is cut.

    Raises:
        CheckpointError: See :func:`parse_header`.
    """
    h = parse_header(path)
    skipped = list(h.skipped)
    if h.truncated:
        cut = ", ".join(h.cut[:3]) + (", ..." if len(h.cut) > 3 else "")
        skipped.insert(0, Skip(str(path), f"truncated at byte {h.file_bytes} of {h.declared_bytes}: {len(h.cut)} "
                                          f"tensors cut ({cut}), {len(h.tensors)} read; never resume from it"))
    return Loaded({r.name: r for r in h.tensors}, skipped, truncated=h.truncated, size=h.file_bytes,
                  metadata=h.metadata)


def sniff(path: Path) -> bool:
    """True for a ``.safetensors`` file whose first 8 bytes give a header length that fits in the file."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(9)
        return (path.suffix == ".safetensors" and len(head) == 9 and head[8:9] == b"{"
                and 8 + struct.unpack("<Q", head[:8])[0] <= os.path.getsize(path))
    except OSError:
        return False
