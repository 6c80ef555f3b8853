"""The W&B transaction log (``run-<id>.wandb``) below the record level: framing and protobuf wire format.

Used by :mod:`parsers.wandb_run` (the parser) and ``benchmarks/bench_wandb.py``; no wandb import.

Framing (``docs/formats.md#wandb-framing``; wandb ``sdk/internal/datastore.py``, ``core/pkg/leveldb/record.go``): a
7-byte header (``:W&B``, uint16 LE 0xBEE1, version 0), then the LevelDB log format in 32 KiB blocks
counted from file offset 0 (block 0 holds the header). A chunk is ``uint32 LE crc | uint16 LE length |
uint8 type | payload`` and never straddles a block (fewer than 7 bytes left are zero padding). Unlike
LevelDB, the crc is the plain IEEE CRC-32 (zlib) of the type byte + payload (checked on real 0.31.0
files). A record is one FULL chunk, or FIRST + MIDDLE* + LAST; its payload is a ``wandb_internal.Record``.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable
from typing import Any

from forensics.model import Skip

MAGIC = b":W&B\xe1\xbe\x00"  # ":W&B", uint16 LE 0xBEE1, version 0
BLOCK = 32768  # bytes per block, counted from file offset 0
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4  # chunk types
_CHUNK = struct.Struct("<IHB")  # crc, length, type
_TYPE_CRC = {t: zlib.crc32(bytes([t])) for t in (FULL, FIRST, MIDDLE, LAST)}  # CRC-32 seeded by the type byte
# HistoryItem / SummaryItem / ConfigItem fields (wandb/proto/wandb_internal.proto, wandb 0.31.0 wheel:
# site-packages/wandb/proto/v6/wandb_internal_pb2.py): key = 1, nested_key = 2 (repeated), value_json = 16.
ITEM_KEY, ITEM_NESTED, ITEM_VALUE_JSON = 1, 2, 16


class Corrupt(Exception):
    """A payload whose chunks were intact but that does not decode as protobuf."""


def varint(b: bytes, i: int) -> tuple[int, int]:
    """The base-128 varint at ``b[i]``: ``(value, index after it)``; raises :class:`Corrupt` past 10 bytes."""
    val = shift = 0
    while b[i] >= 0x80:
        val |= (b[i] & 0x7F) << shift
        i, shift = i + 1, shift + 7
        if shift > 63:
            raise Corrupt("varint too long")
    return val | b[i] << shift, i + 1


def fields(b: bytes, i: int = 0, end: int | None = None) -> list[tuple[int, int, int]]:
    """Fields of the protobuf message ``b[i:end]``, in order.

    Returns:
        ``(number, a, e)`` with the payload ``b[a:e]`` for length-delimited fields; ``(number, value, -1)``
        for varint and fixed-width ones (fixed64/fixed32 as unsigned ints).

    Raises:
        Corrupt: A group wire type (never written by proto3) or a field running past ``end``.
        IndexError: The message is cut inside a field.
    """
    end = len(b) if end is None else end
    out = []
    while i < end:
        key = b[i]
        i += 1
        if key >= 0x80:
            key, i = varint(b, i - 1)
        wt = key & 7
        if wt == 2:
            n = b[i]
            i += 1
            if n >= 0x80:
                n, i = varint(b, i - 1)
            out.append((key >> 3, i, i + n))
            i += n
        elif wt == 0:
            v, i = varint(b, i)
            out.append((key >> 3, v, -1))
        elif wt in (1, 5):
            w = 8 if wt == 1 else 4
            out.append((key >> 3, int.from_bytes(b[i:i + w], "little"), -1))
            i += w
        else:
            raise Corrupt(f"unsupported wire type {wt}")
    if i != end:
        raise Corrupt("a field runs past the end of its message")
    return out


def msg(b: bytes, a: int, e: int) -> dict[int, tuple[int, int]]:
    """The last value of each field of the message ``b[a:e]``, as :func:`fields` gives it."""
    return {f: (x, y) for f, x, y in fields(b, a, e)}


def items(b: bytes, a: int, e: int, keys: dict, item_fields: tuple[int, ...]) -> list[tuple[int, Any, Any]]:
    """Fields of a History/Summary/ConfigRecord ``b[a:e]``, with the Items of ``item_fields`` decoded.

    Args:
        b: The bytes that hold the record.
        a: Start of the record in ``b``.
        e: End of the record in ``b``.
        keys: Memo of item keys, by their encoded bytes (one dict per file).
        item_fields: Field numbers that hold Items (HistoryRecord.item = 1; update = 1, remove = 2).

    Returns:
        ``(field, (key parts, parts joined with '/'), value_json bytes or None)`` per Item, ``(field,
        None, (a, e))`` for other fields. The fast path expects the writers' field order (keys, then
        ``value_json``); anything else is decoded field by field.
    """
    out: list[tuple[int, Any, Any]] = []
    for f, x, y in fields(b, a, e):
        if f not in item_fields or y < 0:
            out.append((f, None, (x, y)))
            continue
        j = x
        while j < y and (b[j] == 0x0A or b[j] == 0x12):  # key (1), nested_key (2)
            n = b[j + 1]
            j += 2
            if n >= 0x80:
                n, j = varint(b, j - 1)
            j += n
        k = keys.get(b[x:j])
        if k is None:
            fl = fields(b, x, j)
            parts = tuple(b[p:q].decode("utf-8", "replace") for g, p, q in fl if g == ITEM_NESTED) or tuple(
                b[p:q].decode("utf-8", "replace") for g, p, q in fl if g == ITEM_KEY)[-1:] or ("",)
            k = keys[b[x:j]] = (parts, "/".join(parts))
        if j + 3 <= y and b[j] == 0x82 and b[j + 1] == 0x01 and b[j + 2] < 0x80 and j + 3 + b[j + 2] == y:
            out.append((f, k, b[j + 3:y]))  # value_json (16) is the last field
        else:
            out.append((f, k, next((b[p:q] for g, p, q in fields(b, j, y) if g == ITEM_VALUE_JSON), None)))
    return out


def _zeros_to_end(data: Any, pos: int, n: int, step: int = 1 << 20) -> bool:
    """True when every byte from ``pos`` to ``n`` is zero (read 1 MiB at a time: ``data`` may be an mmap)."""
    zero = bytes(step)
    while pos < n:
        piece = data[pos:min(n, pos + step)]
        if piece != zero[:len(piece)]:
            return False
        pos += len(piece)
    return True


def _cut_tail(data: bytes, pos: int, left: int) -> tuple[int, str] | None:
    """``(offset, why)`` when the data ends at ``pos`` (a cut chunk header or chunk, or zeros to the end)."""
    n, size = len(data), _CHUNK.size
    if pos + size > n:
        return pos, f"truncated chunk header at end of file ({n - pos} of 7 bytes)"
    crc, length, typ = _CHUNK.unpack_from(data, pos)
    end = pos + size + length
    if end > n and length <= left - size and typ in _TYPE_CRC:
        return pos, f"truncated chunk at end of file ({n - pos} of {end - pos} bytes)"
    if crc == length == typ == 0 and _zeros_to_end(data, pos, n):
        return pos, f"zero bytes from here to the end of file ({n - pos}; preallocated, never written)"
    return None


def _deliver(record: bytes, on_record: Callable[[bytes], None], where: str, skipped: list[Skip]) -> None:
    """Call ``on_record``; a record it cannot decode is listed at ``where`` and skipped."""
    try:
        on_record(record)
    except (Corrupt, IndexError, ValueError) as exc:
        skipped.append(Skip(where, f"undecodable record ({exc}); skipped"))


def walk(data: bytes, rel: str, on_record: Callable[[bytes], None], skipped: list[Skip]) -> int:
    """Walk the blocks and chunks of a whole file, calling ``on_record`` with each reassembled record.

    A bad chunk (type, length or CRC) is listed and the walk resumes at the next block; continuation
    chunks whose FIRST was lost there are dropped quietly. A record that ``on_record`` cannot decode
    (:class:`Corrupt`, ``IndexError``, ``ValueError``) is listed and skipped. A cut tail (partial header,
    partial chunk, a record without its LAST chunk) or a zero-filled tail ends the walk with one entry.

    Args:
        data: The file's bytes, header included (the caller has checked :data:`MAGIC`).
        rel: The file's path for ``Skip.what`` (``"<rel>:<byte offset>"``).
        on_record: Called with each record's payload, in file order.
        skipped: Damage is appended here.

    Returns:
        The number of bytes skipped as damaged (from a bad chunk to the next block boundary).
    """
    n, pos, damaged, size = len(data), len(MAGIC), 0, _CHUNK.size
    parts: list[bytes] | None = None
    start, resynced, tail = 0, False, None
    while pos < n:
        left = BLOCK - pos % BLOCK
        if left < size:  # block trailer: zero padding
            pos += left
            continue
        tail = _cut_tail(data, pos, left)
        if tail:
            break
        crc, length, typ = _CHUNK.unpack_from(data, pos)
        end = pos + size + length
        why = (f"bad chunk header (type {typ}, length {length})" if typ not in _TYPE_CRC or length > left - size
               else "bad chunk CRC" if zlib.crc32(data[pos + size:end], _TYPE_CRC[typ]) != crc else "")
        if why:
            nxt = min(n, pos + left)
            damaged += nxt - pos
            lost = f"; the record started at {start} is lost" if parts is not None else ""
            skipped.append(Skip(f"{rel}:{pos}", f"{why}; skipped to the next block at {nxt}{lost}"))
            pos, parts, resynced = nxt, None, True
            continue
        payload, whole = data[pos + size:end], None
        if typ in (FULL, FIRST) and parts is not None:
            skipped.append(Skip(f"{rel}:{start}", "record without its LAST chunk; dropped"))
        if typ in (FULL, FIRST):
            parts, whole, start = ([payload], None, pos) if typ == FIRST else (None, payload, pos)
        elif parts is None:  # MIDDLE/LAST whose FIRST was lost (expected right after a resync)
            if not resynced:
                skipped.append(Skip(f"{rel}:{pos}", "continuation chunk without its FIRST chunk; dropped"))
        else:
            parts.append(payload)
            parts, whole = (None, b"".join(parts)) if typ == LAST else (parts, None)
        pos = end
        if whole is not None:
            resynced = False
            _deliver(whole, on_record, f"{rel}:{start}", skipped)
    if parts is not None:  # the file ends inside a multi-chunk record
        where, why = tail or (n, "the file ends inside a record")
        tail = (where, f"{why}; the record started at {start} is incomplete")
    if tail:
        skipped.append(Skip(f"{rel}:{tail[0]}", f"{tail[1]}; dropped (killed job?)"))
    return damaged
