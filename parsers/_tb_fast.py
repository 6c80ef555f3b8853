"""Vectorised decoding of the one Event shape that makes up almost every scalar event file.

    Event { double wall_time = 1; int64 step = 2; Summary summary = 5 {
        Value value = 1 { string tag = 1; <value fields> } } }

with exactly one value: its tag, then ``simple_value`` or a rank-0 float/double tensor, optionally
with ``scalars`` plugin metadata (what ``torch.utils.tensorboard``'s ``add_scalar``, both styles, and
``tf.summary.scalar`` write). The fixed part (wall time, step, the three nested lengths, the tag) is
parsed with whole-array operations over every frame of a window; the value fields, whose layout
repeats, are matched against templates: the first frame of a layout is decoded by
:func:`value_fields` (the exact rules) and every frame whose bytes equal it outside the number takes
the same reading. Anything else goes to the general decoder (``parsers/_tb_proto.py``), so the fast
path never decides anything the general decoder would decide differently
(``tests/test_parsers_tensorboard.py`` checks both give the same table).
"""

from __future__ import annotations

import numpy as np

from parsers import _tfrecord as tfr

GENERIC, SIMPLE_VALUE, DT_FLOAT, DT_DOUBLE = 0, 1, 2, 3  # kinds of a frame (a fast one: its encoding)
_SCALARS_META = b"\x0a\x09\x0a\x07scalars"  # SummaryMetadata{plugin_data{plugin_name: "scalars"}}
MAX_VALUE_FIELDS = 64  # bytes after the tag read by templates; longer: the general decoder
MAX_TEMPLATES = 8  # layouts tried per length of the value fields
_K1, _K2 = np.uint64(0x9E3779B97F4A7C15), np.uint64(0xC2B2AE3D27D4EB4F)


def varint(b: bytes, i: int, end: int) -> tuple[int, int]:
    """(value as int64, next offset) of the varint at ``i``; next offset -1 when it runs past ``end``."""
    val, shift = 0, 0
    while i < end and shift < 64:
        x = b[i]
        i += 1
        val |= (x & 0x7F) << shift
        if x < 0x80:
            val &= (1 << 64) - 1
            return (val - (1 << 64) if val >= 1 << 63 else val), i
        shift += 7
    return 0, -1


def _tensor(b: bytes, i: int, te: int) -> tuple[int, int]:
    """(encoding, offset of the number) of a rank-0 DT_FLOAT/DT_DOUBLE TensorProto ``b[i:te]``; (0, -1) else."""
    dt, cnt, width, vat = -1, 0, 0, -1
    while i < te:
        k2 = b[i]
        i += 1
        if k2 == 0x08 and dt == -1:
            dt, i = varint(b, i, te)
            if i < 0:
                return 0, -1
        elif k2 == 0x12 and i < te and b[i] == 0:  # an empty TensorShapeProto: rank 0
            i += 1
        elif i < te and ((k2 == 0x2A and b[i] == 4) or (k2 == 0x32 and b[i] == 8) or (
                k2 == 0x22 and b[i] in (4, 8))) and i + 1 + b[i] <= te:
            # one packed float_val (4 bytes) or double_val (8 bytes), or tensor_content (4 or 8 bytes)
            width = b[i]
            vat, cnt, i = i + 1, cnt + 1, i + 1 + width
        elif k2 == 0x2D and i + 4 <= te:  # float_val, not packed
            vat, cnt, width, i = i, cnt + 1, 4, i + 4
        elif k2 == 0x31 and i + 8 <= te:  # double_val, not packed
            vat, cnt, width, i = i, cnt + 1, 8, i + 8
        else:
            return 0, -1
    if cnt != 1 or not ((dt == 1 and width == 4) or (dt == 2 and width == 8)):
        return 0, -1
    return (DT_FLOAT if dt == 1 else DT_DOUBLE), vat


def value_fields(b: bytes) -> tuple[int, int, bool]:
    """The fields after a Value's tag: (encoding, offset of the number, scalars metadata); encoding 0: other.

    Accepted: ``simple_value`` (field 2, float32), or ``tensor`` (field 8) holding one DT_FLOAT or
    DT_DOUBLE number of rank 0 in ``float_val``/``double_val`` (packed or not) or ``tensor_content``,
    each at most once, plus optionally ``metadata`` (field 9) that says exactly ``plugin_name:
    "scalars"`` (with or without ``data_class: DATA_CLASS_SCALAR``).
    """
    enc, vat, plugin, i, end = 0, -1, False, 0, len(b)
    m = len(_SCALARS_META)
    while i < end:
        key = b[i]
        i += 1
        if key == 0x15 and enc == 0 and i + 4 <= end:
            enc, vat, i = SIMPLE_VALUE, i, i + 4
        elif key == 0x42 and enc == 0:
            tn, i = varint(b, i, end)
            if i < 0 or tn < 0 or i + tn > end:
                return 0, -1, False
            enc, vat = _tensor(b, i, i + tn)
            if enc == 0:
                return 0, -1, False
            i += tn
        elif key == 0x4A and not plugin:
            mn, i = varint(b, i, end)
            if i < 0 or mn < 0 or i + mn > end or mn not in (m, m + 2) or b[i:i + m] != _SCALARS_META:
                return 0, -1, False
            if mn == m + 2 and b[i + m:i + m + 2] != b"\x20\x01":
                return 0, -1, False
            plugin, i = True, i + mn
        else:
            return 0, -1, False
    return enc, vat, plugin


def _varints(buf: np.ndarray, at: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Vectorised :func:`varint`: (value int64, next offset, ok) at each offset, never reading past ``end``.

    One byte read for all; varints of 2-8 bytes decoded from one 8-byte word (the first byte without
    a continuation bit found by bit tricks); longer ones byte by byte. Needs 16 bytes of padding.
    """
    inside = at < end
    b = buf[at]
    val, nxt, ok = b.astype(np.int64), at + 1, inside & (b < 0x80)
    multi = np.flatnonzero(inside & (b >= 0x80))
    if not len(multi):
        return val, nxt, ok
    am = at[multi]
    w = tfr.rows(buf, am, 8).view("<u8").ravel()
    stop = ~w & np.uint64(0x8080808080808080)  # bit 7 of each byte that ends the varint
    short = stop != 0
    low = stop & (~stop + np.uint64(1))  # the first such byte's bit 7 alone: 2**(8j + 7)
    nb = np.full(len(am), 10, np.int64)
    nb[short] = (np.log2(low[short].astype(np.float64)).astype(np.int64) - 7) // 8 + 1
    acc = np.zeros(len(am), np.uint64)
    for k in range(int(nb[short].max(initial=0))):
        part = (w >> np.uint64(8 * k)) & np.uint64(0x7F)
        acc |= np.where(k < nb, part, np.uint64(0)) << np.uint64(7 * k)
    val[multi], nxt[multi], ok[multi] = acc.view(np.int64), am + nb, short & (am + nb <= end[multi])
    long = multi[~short]
    if len(long):
        val[long], nxt[long], ok[long] = _long_varints(buf, at[long], end[long])
    return val, np.where(ok, nxt, np.minimum(nxt, end)), ok  # a bad one points at most at its end


def _long_varints(buf: np.ndarray, at: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Varints whose first 8 bytes all carry a continuation bit: read as rows of 10 bytes."""
    r = tfr.rows(buf, at, 10)
    stop = r < 0x80
    n = np.argmax(stop, axis=1) + 1
    r = np.where(np.arange(10) < n[:, None], r & 0x7F, 0)
    acc = np.zeros(len(at), np.uint64)
    for k in range(10):
        acc |= r[:, k].astype(np.uint64) << np.uint64(7 * k)
    return acc.view(np.int64), at + n, stop.any(axis=1) & (at + n <= end)


def _nested(buf: np.ndarray, i: np.ndarray, e: np.ndarray, keep: np.ndarray, key: int, whole: bool,
            ) -> tuple[np.ndarray, np.ndarray]:
    """Read ``key`` then a length varint at ``i``: (offset after it, length); ``keep`` narrowed in place.

    ``whole``: the length must run exactly to ``e`` and the message must not be empty.
    """
    keep &= (i < e) & (buf[i] == key)
    n, nxt, ok = _varints(buf, i + 1, e)
    keep &= ok & (n >= 0) & ((n == e - nxt) & (nxt < e) if whole else (n <= e - nxt))
    return nxt, n


def scalar_events(buf: np.ndarray, p: np.ndarray, e: np.ndarray) -> dict[str, np.ndarray]:
    """The frames (payloads ``buf[p[k]:e[k]]``) that are single scalar Events, decoded.

    Returns:
        ``index`` (into ``p``) of each fast frame, its ``kind`` (``SIMPLE_VALUE``, ``DT_FLOAT``,
        ``DT_DOUBLE``), ``step`` (int64), ``wall`` (float64 s), ``value`` (float64: the float32 or
        float64 exactly), ``tag_at``/``tag_len`` (the tag's bytes in ``buf``), ``plugin`` (bool: it
        carried ``scalars`` metadata).
    """
    k = np.flatnonzero((e - p >= 15) & (buf[p] == 0x09))
    p, e = p[k], e[k]
    i, step, keep = p + 9, np.zeros(len(k), np.int64), np.ones(len(k), bool)
    hs = np.flatnonzero(buf[i] == 0x10)
    v, nxt, ok = _varints(buf, i[hs] + 1, e[hs])
    step[hs], i[hs], keep[hs] = v, nxt, ok
    i, _ = _nested(buf, i, e, keep, 0x2A, True)
    i, _ = _nested(buf, i, e, keep, 0x0A, True)
    tag_at, tag_len = _nested(buf, i, e, keep, 0x0A, False)
    r = tag_at + tag_len
    kind, vat, plugin = _templates(buf, r, e - r, keep)
    f = np.flatnonzero(kind != GENERIC)
    kind, vat, p = kind[f], vat[f], p[f]
    with np.errstate(invalid="ignore"):  # a signalling NaN is quieted, as struct.unpack does
        value = tfr.f32(buf, vat).astype(np.float64)
        dbl = np.flatnonzero(kind == DT_DOUBLE)
        value[dbl] = tfr.f64(buf, vat[dbl])
        wall = tfr.f64(buf, p + 1)
    return {"index": k[f], "kind": kind, "step": step[f], "wall": wall, "value": value, "tag_at": tag_at[f],
            "tag_len": tag_len[f], "plugin": plugin[f]}


def _templates(buf: np.ndarray, r: np.ndarray, rl: np.ndarray, keep: np.ndarray,
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(kind, offset of the number, scalars metadata) of the value fields ``buf[r:r+rl]`` of each frame.

    Rows are compared eight bytes at a time (uint64 words; bytes past the fields are masked out).
    """
    kind, vat, plugin = np.zeros(len(r), np.int8), np.zeros(len(r), np.int64), np.zeros(len(r), bool)
    sel = keep & (rl >= 1) & (rl <= MAX_VALUE_FIELDS)
    for length in np.flatnonzero(np.bincount(rl[sel], minlength=1)).tolist():
        g = np.flatnonzero(sel & (rl == length))
        nw = (length + 7) // 8
        words = tfr.rows(buf, r[g], 8 * nw).view("<u8")
        pending = np.arange(len(g))
        for _ in range(MAX_TEMPLATES):
            if not len(pending):
                break
            t = words[pending[0]]
            enc, at, meta = value_fields(t.view(np.uint8)[:length].tobytes())
            care = np.zeros(8 * nw, np.uint8)
            care[:length] = 0xFF
            if enc:
                care[at:at + (8 if enc == DT_DOUBLE else 4)] = 0
            care = care.view("<u8")
            rows = words if len(pending) == len(g) else words[pending]
            same = np.ones(len(pending), bool)
            for w in range(nw):
                same &= ((rows[:, w] ^ t[w]) & care[w]) == 0
            hit = g[pending[same]]
            kind[hit], vat[hit], plugin[hit] = enc, r[hit] + at, meta
            pending = pending[~same]
    return kind, vat, plugin


def tag_groups(buf: np.ndarray, at: np.ndarray, n: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """Group equal tags (bytes ``buf[at:at+n]``): (first row of each group, group of every row).

    Tags are hashed eight bytes at a time and then compared byte for byte with their group's first
    row; None when two different tags met in one hash (the caller then interns row by row).
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    words = []
    h = n.astype(np.uint64) * _K1
    for w in range(int(n.max(initial=0) + 7) // 8):
        word = tfr.rows(buf, np.minimum(at + 8 * w, len(buf) - 8), 8).view("<u8").ravel()
        left = np.clip(n - 8 * w, 0, 8).astype(np.uint64)
        word = word & np.where(left >= 8, np.uint64(0xFFFFFFFFFFFFFFFF),
                               (np.uint64(1) << (left * np.uint64(8))) - np.uint64(1))
        words.append(word)
        h = (h ^ word) * _K2
        h ^= h >> np.uint64(31)
    codes = pc.dictionary_encode(pa.Array.from_buffers(pa.uint64(), len(h), [None, pa.py_buffer(h)])).indices
    codes = np.frombuffer(codes.buffers()[1], np.int32, len(h), codes.offset * 4)
    first = np.empty(int(codes.max(initial=-1)) + 1, np.int64)
    first[codes[::-1]] = np.arange(len(codes) - 1, -1, -1)
    rep = first[codes]
    if not np.array_equal(n[rep], n) or any(not np.array_equal(word[rep], word) for word in words):
        return None
    return first, codes
