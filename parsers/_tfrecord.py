"""Compiled TFRecord framing and Event fast path for :mod:`parsers.tensorboard` (numba).

A TensorBoard event file is a sequence of TFRecord frames
``uint64 length | uint32 masked_crc32c(length) | payload | uint32 masked_crc32c(payload)``
(``docs/formats.md#tensorboard``). :func:`scan` walks the frames of a memory-mapped file in compiled
code, checks both CRCs, and decodes the one Event shape that makes up almost every scalar file:

    Event { double wall_time = 1; int64 step = 2; Summary summary = 5 {
        Value value = 1 { string tag = 1; float simple_value = 2; } } }

(exactly one value: its tag, then ``simple_value`` or a rank-0 float/double tensor, optionally with
``scalars`` plugin metadata; what ``torch.utils.tensorboard``'s ``add_scalar`` (both styles) and
``tf.summary.scalar`` write). Every other payload (file version, session log,
metadata, tensors, histograms, several values per summary) is reported back by position for the
general Python decoder, and the first frame whose framing or CRC is bad stops the scan so the caller
can list the damage and resynchronise. The fast path therefore never decides anything the general
decoder would decide differently; ``tests/test_parsers_tensorboard.py`` checks both give the same table.

CRC-32C (Castagnoli, polynomial ``0x82F63B78`` reflected) is computed slicing-by-8 from tables built
here and checked against the ``crc32c`` library in the tests; ``mask(c) = ((c >> 15) | (c << 17)) +
0xA282EAD8`` as in TensorFlow's ``tensorflow/core/lib/hash/crc32c.h``.
"""

from __future__ import annotations

import numpy as np
from numba import njit

GENERIC, SIMPLE_VALUE, DT_FLOAT, DT_DOUBLE = 0, 1, 2, 3  # kinds of a frame the scan read (a fast one: its encoding)
_SCALARS_META = np.frombuffer(b"\x0a\x09\x0a\x07scalars", np.uint8)  # SummaryMetadata{plugin_data{plugin_name}}
DONE, TRUNCATED, BAD_LENGTH_CRC, ABSURD_LENGTH, BAD_PAYLOAD_CRC, FULL = range(6)  # why a scan stopped


def _crc_tables() -> np.ndarray:
    """Slicing-by-8 tables for CRC-32C, shape (8, 256) uint32."""
    t = np.zeros((8, 256), np.uint32)
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        t[0, i] = c
    for k in range(1, 8):
        t[k] = (t[k - 1] >> 8) ^ t[0][t[k - 1] & 0xFF]
    return t


TABLES = _crc_tables()


@njit(cache=True, nogil=True)
def masked_crc(buf: np.ndarray, a: int, e: int, t: np.ndarray) -> int:  # pragma: no cover - compiled
    """Masked CRC-32C of ``buf[a:e]`` (uint8 array) as TFRecord stores it."""
    c = np.uint32(0xFFFFFFFF)
    i = a
    while i + 8 <= e:
        lo = c ^ (np.uint32(buf[i]) | (np.uint32(buf[i + 1]) << 8) | (np.uint32(buf[i + 2]) << 16)
                  | (np.uint32(buf[i + 3]) << 24))
        c = (t[7, lo & 0xFF] ^ t[6, (lo >> 8) & 0xFF] ^ t[5, (lo >> 16) & 0xFF] ^ t[4, lo >> 24]
             ^ t[3, buf[i + 4]] ^ t[2, buf[i + 5]] ^ t[1, buf[i + 6]] ^ t[0, buf[i + 7]])
        i += 8
    while i < e:
        c = t[0, (c ^ buf[i]) & 0xFF] ^ (c >> 8)
        i += 1
    c = c ^ np.uint32(0xFFFFFFFF)
    return int(((c >> np.uint32(15)) | (c << np.uint32(17))) + np.uint32(0xA282EAD8)) & 0xFFFFFFFF


@njit(cache=True, nogil=True)
def _u32(buf: np.ndarray, i: int) -> int:  # pragma: no cover - compiled
    return int(buf[i]) | (int(buf[i + 1]) << 8) | (int(buf[i + 2]) << 16) | (int(buf[i + 3]) << 24)


@njit(cache=True, nogil=True)
def _varint(buf: np.ndarray, i: int, end: int) -> tuple[int, int]:  # pragma: no cover - compiled
    """(value, next offset) of the varint at ``i``; next offset -1 when it runs past ``end``."""
    val = np.uint64(0)
    shift = np.uint64(0)
    while i < end and shift < 64:
        x = buf[i]
        i += 1
        val |= np.uint64(x & 0x7F) << shift
        if x < 0x80:
            return np.int64(val), i
        shift += np.uint64(7)
    return 0, -1


@njit(cache=True, nogil=True)
def _value_fields(buf: np.ndarray, i: int, end: int) -> tuple[int, int, bool]:  # pragma: no cover - compiled
    """The fields after a Value's tag, ``buf[i:end]``: (encoding, offset of the number, scalars metadata).

    Accepted: ``simple_value`` (field 2, float32), or ``tensor`` (field 8) holding one DT_FLOAT or
    DT_DOUBLE number of rank 0 in ``float_val``/``double_val`` (packed or not) or ``tensor_content``,
    each at most once, plus optionally ``metadata`` (field 9) that says exactly ``plugin_name:
    "scalars"`` (with or without ``data_class: DATA_CLASS_SCALAR``). Anything else: encoding 0.
    """
    enc, vat, plugin = 0, -1, False
    while i < end:
        key = buf[i]
        i += 1
        if key == 0x15 and enc == 0 and i + 4 <= end:
            enc, vat = SIMPLE_VALUE, i
            i += 4
        elif key == 0x42 and enc == 0:
            tn, i = _varint(buf, i, end)
            if i < 0 or tn < 0 or i + tn > end:
                return 0, -1, False
            te, dt, cnt, width = i + tn, -1, 0, 0
            while i < te:
                k2 = buf[i]
                i += 1
                if k2 == 0x08 and dt == -1:
                    dt, i = _varint(buf, i, te)
                    if i < 0:
                        return 0, -1, False
                elif k2 == 0x12 and i < te and buf[i] == 0:  # an empty TensorShapeProto: rank 0
                    i += 1
                elif i < te and ((k2 == 0x2A and buf[i] == 4) or (k2 == 0x32 and buf[i] == 8) or (
                        k2 == 0x22 and (buf[i] == 4 or buf[i] == 8))) and i + 1 + buf[i] <= te:
                    # one packed float_val (4 bytes) or double_val (8 bytes), or tensor_content (4 or 8 bytes)
                    width = int(buf[i])
                    vat, cnt, i = i + 1, cnt + 1, i + 1 + width
                elif k2 == 0x2D and i + 4 <= te:  # float_val, not packed
                    vat, cnt, width, i = i, cnt + 1, 4, i + 4
                elif k2 == 0x31 and i + 8 <= te:  # double_val, not packed
                    vat, cnt, width, i = i, cnt + 1, 8, i + 8
                else:
                    return 0, -1, False
            if cnt != 1 or not ((dt == 1 and width == 4) or (dt == 2 and width == 8)):
                return 0, -1, False
            enc = DT_FLOAT if dt == 1 else DT_DOUBLE
        elif key == 0x4A and not plugin:
            mn, i = _varint(buf, i, end)
            m = _SCALARS_META.shape[0]
            if i < 0 or mn < 0 or i + mn > end or (mn != m and mn != m + 2):
                return 0, -1, False
            for k in range(m):
                if buf[i + k] != _SCALARS_META[k]:
                    return 0, -1, False
            if mn == m + 2 and (buf[i + m] != 0x20 or buf[i + m + 1] != 0x01):
                return 0, -1, False
            plugin, i = True, i + mn
        else:
            return 0, -1, False
    return enc, vat, plugin


@njit(cache=True, nogil=True)
def scan(buf: np.ndarray, pos: int, check_crc: bool, max_record: int, tables: np.ndarray,
         rec: np.ndarray, kind: np.ndarray, step: np.ndarray, wall_at: np.ndarray, value_at: np.ndarray,
         tag_at: np.ndarray, tag_len: np.ndarray, tag_hash: np.ndarray,
         has_plugin: np.ndarray) -> tuple[int, int, int]:  # pragma: no cover
    """Read frames from byte ``pos`` until the end, damage, or ``len(rec)`` frames.

    Args:
        buf: The whole file, uint8 (a memory map; never copied).
        pos: Byte offset of the first frame header.
        check_crc: Verify length and payload CRCs.
        max_record: Longest plausible payload (bytes); longer is damage.
        tables: :data:`TABLES`.
        rec: Output, int64, one slot per frame (its length is the batch size): the header's offset.
        kind: Output, int8: ``GENERIC``, or the encoding of a fast frame: ``SIMPLE_VALUE`` (float32),
            ``DT_FLOAT``, ``DT_DOUBLE``. The other outputs are set for fast frames only.
        step: Output, int64: the Event's step.
        wall_at: Output, int64: byte offset of its wall_time (float64, s since epoch).
        value_at: Output, int64: byte offset of its value (float32 or float64 by ``kind``).
        tag_at: Output, int64: byte offset of the tag (UTF-8).
        tag_len: Output, int64: tag length in bytes.
        tag_hash: Output, uint64: FNV-1a 64-bit hash of the tag bytes (callers verify equality).
        has_plugin: Output, bool: the value carried ``scalars`` plugin metadata.

    Returns:
        (frames written, byte offset where the scan stopped, stop reason: ``DONE``, ``FULL``, or the
        damage found at that offset: ``TRUNCATED``, ``BAD_LENGTH_CRC``, ``ABSURD_LENGTH``,
        ``BAD_PAYLOAD_CRC``).
    """
    size = buf.shape[0]
    n = 0
    cap = rec.shape[0]
    while pos < size:
        if n == cap:
            return n, pos, FULL
        if size - pos < 12:
            return n, pos, TRUNCATED
        length = 0
        for k in range(8):
            length |= int(buf[pos + k]) << (8 * k)
        if check_crc and masked_crc(buf, pos, pos + 8, tables) != _u32(buf, pos + 8):
            return n, pos, BAD_LENGTH_CRC
        if length > max_record or length < 0:
            return n, pos, ABSURD_LENGTH
        p = pos + 12
        end = p + length
        if end + 4 > size:
            return n, pos, TRUNCATED
        if check_crc and masked_crc(buf, p, end, tables) != _u32(buf, end):
            return n, pos, BAD_PAYLOAD_CRC
        rec[n] = pos
        kind[n] = GENERIC
        has_plugin[n] = False
        pos = end + 4
        # fast path: 09 <wall f64> [10 <step varint>] 2a <n> 0a <n1> 0a <t> <tag> 15 <f32>, nothing else
        if length < 15 or buf[p] != 0x09:
            n += 1
            continue
        i = p + 9
        s = 0
        if buf[i] == 0x10:
            s, i = _varint(buf, i + 1, end)
            if i < 0:
                n += 1
                continue
        if i >= end or buf[i] != 0x2A:
            n += 1
            continue
        sn, i = _varint(buf, i + 1, end)
        if i < 0 or i + sn != end or i >= end or buf[i] != 0x0A:
            n += 1
            continue
        vn, i = _varint(buf, i + 1, end)
        if i < 0 or i + vn != end or i >= end or buf[i] != 0x0A:
            n += 1
            continue
        tl, i = _varint(buf, i + 1, end)
        if i < 0 or tl < 0 or i + tl > end:  # a varint over 2**63 reads as negative: never index with it
            n += 1
            continue
        enc, vat, plugin = _value_fields(buf, i + tl, end)
        if enc == 0:
            n += 1
            continue
        h = np.uint64(0xCBF29CE484222325)
        for k in range(i, i + tl):
            h = (h ^ np.uint64(buf[k])) * np.uint64(0x100000001B3)
        kind[n] = enc
        step[n] = s
        wall_at[n] = p + 1
        value_at[n] = vat
        tag_at[n] = i
        tag_len[n] = tl
        tag_hash[n] = h
        has_plugin[n] = plugin
        n += 1
    return n, pos, DONE


@njit(cache=True, nogil=True)
def same_bytes(buf: np.ndarray, at: np.ndarray, ref_at: np.ndarray, length: np.ndarray) -> bool:  # pragma: no cover
    """True when ``buf[at[i]:at[i]+length[i]] == buf[ref_at[i]:ref_at[i]+length[i]]`` for every i."""
    for i in range(at.shape[0]):
        a, r = at[i], ref_at[i]
        for k in range(length[i]):
            if buf[a + k] != buf[r + k]:
                return False
    return True
