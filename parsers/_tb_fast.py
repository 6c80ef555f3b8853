"""Vectorised decoding of the one Event shape that makes up almost every scalar event file.

    Event { double wall_time = 1; int64 step = 2; Summary summary = 5 {
        Value value = 1 { string tag = 1; <value fields> } } }

with exactly one value: its tag, then ``simple_value`` or a rank-0 float/double tensor, optionally
with ``scalars`` plugin metadata (what ``torch.utils.tensorboard``'s ``add_scalar``, both styles, and
``tf.summary.scalar`` write). Wall time and step are parsed with whole-array operations over every
frame of a window; the rest of the Event (from ``summary`` on: lengths, tag, value fields), whose
bytes repeat per tag, is matched by layout (:func:`layouts`): the first frame of a layout is read by
:func:`summary_fields` (the exact rules) and every frame whose bytes equal it outside the number
takes the same reading, tag included; frames of other layouts of the same length are grouped by a
hash of their bytes, so many tags cost one pass. Anything else goes to the general decoder
(``parsers/_tb_proto.py``), so the fast path never decides anything the general decoder would decide
differently (``tests/test_parsers_tensorboard.py`` checks both give the same table).
"""

from __future__ import annotations

import numpy as np

from parsers import _tfrecord as tfr

GENERIC, SIMPLE_VALUE, DT_FLOAT, DT_DOUBLE = 0, 1, 2, 3  # kinds of a frame (a fast one: its encoding)
_SCALARS_META = b"\x0a\x09\x0a\x07scalars"  # SummaryMetadata{plugin_data{plugin_name: "scalars"}}
MAX_REST = 128  # bytes of an Event from its summary field on that layouts match; longer: the general decoder
MAX_ROUNDS = 8  # matching rounds per group of rows (each decides at least one row); the rest: general decoder
MAX_LAYOUTS = 4096  # distinct layouts one round reads exactly; more: the round's mask fits few rows
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

    Varints of 1-8 bytes are decoded from one 8-byte word each: the first byte without a continuation
    bit is found by bit tricks and the 7-bit groups are packed in three shift steps; longer ones are
    read byte by byte. Needs 16 bytes of padding.
    """
    w = tfr.rows(buf, at, 8).view("<u8").ravel()
    stop = ~w & np.uint64(0x8080808080808080)  # bit 7 of each byte that ends the varint
    low = stop & (~stop + np.uint64(1))  # the first such byte's bit 7 alone: 2**(8j + 7) (0: none)
    keep = (low << np.uint64(1)) - np.uint64(1)  # bytes 0..j all ones (all 8 when j = 7 or none ends it)
    x = w & keep & np.uint64(0x7F7F7F7F7F7F7F7F)
    for width, lanes in ((8, 0x007F007F007F007F), (16, 0x00003FFF00003FFF), (32, 0x000000000FFFFFFF)):
        x = (x & np.uint64(lanes)) | ((x & np.uint64(lanes << width)) >> np.uint64(width - (width * 7) // 8))
    ones = (keep >> np.uint64(7)) & np.uint64(0x0101010101010101)  # one bit per byte kept
    nxt = at + ((ones * np.uint64(0x0101010101010101)) >> np.uint64(56)).astype(np.int64)  # at + j + 1
    val, ok = x.view(np.int64), (stop != 0) & (nxt <= end)
    long = np.flatnonzero(stop == 0)
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


def scalar_events(buf: np.ndarray, p: np.ndarray, e: np.ndarray) -> tuple[dict[str, np.ndarray], list[bytes]]:
    """The frames (payloads ``buf[p[k]:e[k]]``) that are single scalar Events, decoded.

    Returns:
        ``index`` (into ``p``) of each fast frame, its ``kind`` (``SIMPLE_VALUE``, ``DT_FLOAT``,
        ``DT_DOUBLE``), ``step`` (int64), ``wall`` (float64 s), ``value`` (float64: the float32 or
        float64 exactly), ``tag`` (int32 index into the list returned beside: each tag's bytes),
        ``plugin`` (bool: it carried ``scalars`` metadata).
    """
    k = np.flatnonzero((e - p >= 15) & (buf[p] == 0x09))
    p, e = _pick(p, k), _pick(e, k)
    i = p + 9
    has = buf[i] == 0x10  # a step field (absent: step 0); read for all rows, kept where present
    v, nxt, ok = _varints(buf, i + 1, e)
    step, i, keep = np.where(has, v, 0), np.where(has, nxt, i), ok | ~has
    m = layouts(buf, i, e - i, keep)
    f = np.flatnonzero(m.lid >= 0)
    kind, vat, plugin, tag = m.readings(_pick(m.lid, f))
    vat += _pick(i, f)
    p = _pick(p, f)
    with np.errstate(invalid="ignore"):  # a signalling NaN is quieted, as struct.unpack does
        value = tfr.f32(buf, vat).astype(np.float64)
        dbl = np.flatnonzero(kind == DT_DOUBLE)
        value[dbl] = tfr.f64(buf, vat[dbl])
        wall = tfr.f64(buf, p + 1)
    return {"index": _pick(k, f), "kind": kind, "step": _pick(step, f), "wall": wall, "value": value,
            "tag": tag, "plugin": plugin}, m.tags


def _pick(a: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """``a[idx]`` for sorted distinct indices ``idx``; ``a`` itself when they are all of its rows."""
    return a if len(idx) == len(a) else a[idx]


def summary_fields(b: bytes) -> tuple[int, int, int, int, bool] | None:
    """Exact reading of an Event's bytes from its ``summary`` field to its end; None: not one scalar value.

    ``summary`` (field 5) must run to the end and hold exactly one ``value`` (field 1, running to its
    end) whose ``tag`` (field 1) comes first and whose other fields :func:`value_fields` accepts.

    Returns:
        (tag offset, tag length, encoding, offset of the number, scalars metadata), offsets in ``b``.
    """
    end, i = len(b), 0
    for key in (0x2A, 0x0A):  # Summary { Value { ... } }, each running to the end
        if i >= end or b[i] != key:
            return None
        n, i = varint(b, i + 1, end)
        if i < 0 or i >= end or n != end - i:
            return None
    if b[i] != 0x0A:
        return None
    tn, t = varint(b, i + 1, end)
    if t < 0 or tn < 0 or tn > end - t:
        return None
    enc, vat, plugin = value_fields(b[t + tn:])
    return (t, tn, enc, t + tn + vat, plugin) if enc else None


def _care(length: int, nw: int, fields: tuple[int, int, int, int, bool] | None) -> np.ndarray:
    """uint64 words masking the bytes a layout fixes: all ``length`` bytes but the number (None: all)."""
    care = np.zeros(8 * nw, np.uint8)
    care[:length] = 0xFF
    if fields is not None:
        care[fields[3]:fields[3] + (8 if fields[2] == DT_DOUBLE else 4)] = 0
    return care.view("<u8")


def _hash(words: np.ndarray, care: np.ndarray) -> np.ndarray:
    """64-bit hash of every row of ``words`` (n, nw) under ``care`` (nw,): equal masked rows, equal hash."""
    h = np.full(len(words), words.shape[1], np.uint64) * _K1
    for w in range(words.shape[1]):
        h = (h ^ (words[:, w] & care[w])) * _K2
        h ^= h >> np.uint64(31)
    return h


def _codes(h: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(group of every row, first row of each group) for equal values of ``h``; groups in order of appearance."""
    import pyarrow as pa
    import pyarrow.compute as pc

    codes = pc.dictionary_encode(pa.Array.from_buffers(pa.uint64(), len(h), [None, pa.py_buffer(h)])).indices
    codes = np.frombuffer(codes.buffers()[1], np.int32, len(h), codes.offset * 4)
    first = np.empty(int(codes.max(initial=-1)) + 1, np.int64)
    first[codes[::-1]] = np.arange(len(codes) - 1, -1, -1)
    return codes, first


class Layouts:
    """What the rows of a window matched (:func:`layouts`): a layout id per row and each layout's reading.

    Attributes:
        lid: Per row, the layout id (int32; -1: the general decoder reads the row).
        tags: The tags' bytes, each once.
    """

    def __init__(self, n: int) -> None:
        self.lid = np.full(n, -1, np.int32)
        self.tags: list[bytes] = []
        self._index: dict[bytes, int] = {}
        self._readings: list[tuple[int, int, bool, int]] = []  # (kind, number offset from the row, plugin, tag)

    def add(self, fields: tuple[int, int, int, int, bool] | None, b: bytes) -> int:
        """Id of the layout read as ``fields`` (:func:`summary_fields`) from the bytes ``b``; -1 for None."""
        if fields is None:
            return -1
        tag = b[fields[0]:fields[0] + fields[1]]
        code = self._index.get(tag)
        if code is None:
            code = self._index[tag] = len(self.tags)
            self.tags.append(tag)
        self._readings.append((fields[2], fields[3], fields[4], code))
        return len(self._readings) - 1

    def readings(self, lid: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(kind int8, offset of the number from the row's start int64, plugin bool, tag int32) of layout ids."""
        cols = list(zip(*self._readings, strict=True)) or [(), (), (), ()]
        types = (np.int8, np.int64, bool, np.int32)
        kind, off, plugin, tag = (np.array(c, t) for c, t in zip(cols, types, strict=True))
        return kind[lid], off[lid], plugin[lid], tag[lid]


def _differs(words: np.ndarray, t: np.ndarray, care: np.ndarray) -> np.ndarray:
    """Per row of ``words`` (n, nw): does it differ from ``t`` under ``care`` (each (nw,) or (n, nw))?"""
    t, care = np.broadcast_to(t, words.shape), np.broadcast_to(care, words.shape)
    d = (words[:, 0] ^ t[:, 0]) & care[:, 0]
    for w in range(1, words.shape[1]):
        d |= (words[:, w] ^ t[:, w]) & care[:, w]
    return d != 0


def _round(words: np.ndarray, length: int, out: Layouts, idx: np.ndarray) -> np.ndarray:
    """One matching round over ``words`` (the pending rows' bytes; ``idx``: their rows).

    The first row is read exactly: every row whose bytes equal it outside its number takes its
    reading. The others are grouped by their bytes under the same mask (hashed: 500 tags of one
    length cost one round); each group's first row is read exactly and the rows equal to it outside
    its number take its reading. Returns the mask of rows decided (a row equal to an unreadable one
    is decided too: the general decoder reads it).
    """
    nw = words.shape[1]
    b = words[0].view(np.uint8)[:length].tobytes()
    first = summary_fields(b)
    care = _care(length, nw, first)
    done = ~_differs(words, words[0], care)
    rest = np.flatnonzero(~done)
    out.lid[idx if not len(rest) else idx[done]] = out.add(first, b)
    if not len(rest):
        return done
    sub = words[rest]
    codes, reps = _codes(_hash(sub, care))
    if len(reps) > MAX_LAYOUTS:  # the first row's mask fits few of the others: next round
        return done
    cares = np.empty((len(reps), nw), np.uint64)
    lids = np.empty(len(reps), np.int32)
    for c, row in enumerate(reps.tolist()):
        b = sub[row].view(np.uint8)[:length].tobytes()
        f = summary_fields(b)
        cares[c], lids[c] = _care(length, nw, f), out.add(f, b)
    same = ~_differs(sub, sub[reps[codes]], cares[codes])
    out.lid[idx[rest[same]]] = lids[codes[same]]
    done[rest[same]] = True
    return done


def layouts(buf: np.ndarray, r: np.ndarray, rl: np.ndarray, keep: np.ndarray) -> Layouts:
    """Match the bytes ``buf[r[k]:r[k]+rl[k]]`` (an Event from its ``summary`` field on) of every kept row.

    Rows are grouped by length and by the byte where a one-byte tag length would stand (a radix
    sort), then matched in at most :data:`MAX_ROUNDS` rounds (:func:`_round`); the rest are left to
    the general decoder. Needs 8 bytes of padding after the last row.
    """
    out = Layouts(len(r))
    sel = np.flatnonzero(keep & (rl >= 8) & (rl <= MAX_REST))
    if not len(sel):
        return out
    key = ((_pick(rl, sel) - 8) * 256 + buf[_pick(r, sel) + 5]).astype(np.int16)  # < 2**15 as rl <= MAX_REST
    order = np.argsort(key, kind="stable")
    sel, key = sel[order], key[order]
    for g in np.split(sel, np.flatnonzero(key[1:] != key[:-1]) + 1):
        length = int(rl[g[0]])
        words = tfr.rows(buf, r[g], 8 * ((length + 7) // 8)).view("<u8")
        for _ in range(MAX_ROUNDS):
            done = _round(words, length, out, g)
            if done.all():
                break
            g, words = g[~done], words[~done]
    return out
