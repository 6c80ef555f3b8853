"""TensorBoard event files (``events.out.tfevents.*``): our own TFRecord reader and protobuf decoder.

Lossless and damage-tolerant (``docs/formats.md#tensorboard``): a truncated tail keeps every complete record, a
bad payload CRC skips one record, a bad length CRC resynchronises. Scalars: ``simple_value`` (float32)
and one-element tensors (float, double, half, bfloat16, ints); other summaries are only counted.
Framing: ``uint64 length | uint32 masked_crc32c(length) | payload | uint32 masked_crc32c(payload)``.
"""

from __future__ import annotations

import mmap
import re
import struct
import sys
from array import array
from pathlib import Path
from typing import Any

import crc32c
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from forensics.errors import ParseError
from forensics.model import ParseResult, Skip
from forensics.schema import EVENTS_SCHEMA, METRICS_SCHEMA, canonical_metric
from parsers import file_policy

FORMAT = "tensorboard"
CHECK_CRC = True  # module-wide default for the length and payload CRC checks (read(..., check_crc=None))
MAX_RECORD = 256 << 20  # a record length above this (bytes) is corrupt framing, never allocated
FAST_MIN_BYTES = 1 << 20  # files this size or larger are walked by the compiled scan (parsers/_tfrecord.py) ...
FAST_MIN_BYTES_LOADED = 0  # ... or any size once it is loaded (loading numba costs ~1 s, ~16 us/record in Python)
BATCH = 1 << 18  # frames per compiled-scan call (bounds the batch arrays: ~14 MB)

_S = struct.Struct
_HEADER, _U32, _U16, _F32, _F64, _F16 = _S("<QI"), _S("<I"), _S("<H"), _S("<f"), _S("<d"), _S("<e")
_NONZERO = re.compile(b"[^\x00]")
_START, _LOW = 1, -(1 << 63)  # SessionLog.START; "no step yet"
_DTYPES = {1: ("DT_FLOAT", _F32), 2: ("DT_DOUBLE", _F64), 3: ("DT_INT32", _S("<i")), 4: ("DT_UINT8", _S("B")),
           5: ("DT_INT16", _S("<h")), 6: ("DT_INT8", _S("b")), 9: ("DT_INT64", _S("<q")),
           10: ("DT_BOOL", _S("<?")), 14: ("DT_BFLOAT16", _U16), 17: ("DT_UINT16", _S("<H")),
           19: ("DT_HALF", _U16), 22: ("DT_UINT32", _S("<I")), 23: ("DT_UINT64", _S("<Q"))}
_PLUGIN_KIND = {"histograms": "histogram", "images": "image", "audio": "audio", "text": "text",
                "pr_curves": "pr_curve", "mesh": "mesh", "hparams": "hparams"}
_VALUE_KIND = ((3, "histogram"), (5, "histogram"), (4, "image"), (6, "audio"))


class _Corrupt(Exception):
    """A payload that does not decode as an Event (its framing was fine)."""


def masked_crc32c(data: bytes | memoryview) -> int:
    """LevelDB-masked CRC-32C of ``data``, as stored in TFRecord framing (uint32)."""
    c = crc32c.crc32c(data)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def sniff(path: Path) -> bool:
    """True when the file name contains ``tfevents`` (by name only; never raises)."""
    return "tfevents" in path.name


def _varint(b: bytes, i: int) -> tuple[int, int]:
    val, shift = 0, 0
    while True:
        x = b[i]
        i += 1
        val |= (x & 0x7F) << shift
        if x < 0x80:
            return val, i
        shift += 7
        if shift > 63:
            raise _Corrupt("varint too long")


def _msg(b: bytes, i: int, end: int) -> dict[int, list[tuple[int, int, int]]]:
    """Fields of the message ``b[i:end]``: number -> [(wire type, a, e)]; a varint's value is ``a``."""
    out: dict[int, list[tuple[int, int, int]]] = {}
    while i < end:
        key, i = _varint(b, i)
        wt = key & 7
        if wt == 0:
            v, i = _varint(b, i)
            out.setdefault(key >> 3, []).append((0, v, i))
            continue
        if wt not in (1, 2, 5):
            raise _Corrupt(f"unsupported wire type {wt}")
        n, i = _varint(b, i) if wt == 2 else (8 if wt == 1 else 4, i)
        if i + n > end:
            raise _Corrupt("field runs past the end of its message")
        out.setdefault(key >> 3, []).append((wt, i, i + n))
        i += n
    return out


def _text(b: bytes, m: dict, fn: int) -> str | None:
    hits = [(a, e) for wt, a, e in m.get(fn, ()) if wt == 2]
    return b[hits[-1][0]:hits[-1][1]].decode("utf-8", "replace") if hits else None


def _s64(v: int) -> int:
    """A varint as int64: protobuf keeps its low 64 bits (a 10-byte varint can carry 70)."""
    v &= (1 << 64) - 1
    return v - (1 << 64) if v >= 1 << 63 else v


def _varint_of(m: dict, fn: int) -> int:
    return _s64(next((a for wt, a, _ in reversed(m.get(fn, ())) if wt == 0), 0))


def _half(bits: int, dtype: int) -> float:  # bfloat16 (dtype 14) or float16 from its 16 raw bits
    bits &= 0xFFFF
    return _F32.unpack(_U32.pack(bits << 16))[0] if dtype == 14 else _F16.unpack(_U16.pack(bits))[0]


def _tensor_scalar(b: bytes, i: int, end: int) -> tuple[float | None, str]:
    """One-element numeric TensorProto -> (value or None, dtype name)."""
    m = _msg(b, i, end)
    dtype = _varint_of(m, 1)
    name, fmt = _DTYPES.get(dtype, (f"DT_{dtype}", _U16))
    numel = 1
    for _, sa, se in m.get(2, ()):  # TensorShapeProto { repeated Dim dim=2 { int64 size=1 } }
        for _, da, de in _msg(b, sa, se).get(2, ()):
            numel *= _varint_of(_msg(b, da, de), 1)
    if numel != 1 or dtype not in _DTYPES:
        return None, name
    vals: list[float] = []
    for fn, f in ((5, _F32), (6, _F64)):  # float_val, double_val (packed or not)
        for _, a, e in m.get(fn, ()):
            vals.extend(struct.unpack_from(f"<{(e - a) // f.size}{f.format[-1]}", b, a))
    for fn in (7, 10, 11, 13, 16, 17):  # int_val, int64_val, bool_val, half_val, uint32_val, uint64_val
        for wt, a, e in m.get(fn, ()):
            raw = [a] if wt == 0 else []
            while wt == 2 and a < e:
                v, a = _varint(b, a)
                raw.append(v)
            vals.extend(_half(v, dtype) if fn == 13 else _s64(v) if fn in (7, 10) else v for v in raw)
    content = [(a, e) for wt, a, e in m.get(4, ()) if wt == 2]  # tensor_content: raw little-endian
    if content and not vals and fmt.size == content[-1][1] - content[-1][0]:
        a = content[-1][0]
        v = fmt.unpack_from(b, a)[0]
        return (_half(v, dtype) if dtype in (14, 19) else float(v)), name
    if len(vals) != 1:
        return None, name
    return float(vals[0]), name


def _decode_hparams(b: bytes, i: int, end: int) -> dict[str, Any]:
    """HParamsPluginData.session_start_info(3).hparams(1), a map<string, protobuf.Value>, as a dict."""
    out: dict[str, Any] = {}
    for _, a, e in _msg(b, i, end).get(3, ()):
        for _, sa, se in _msg(b, a, e).get(1, ()):
            entry = _msg(b, sa, se)
            for _, va, ve in entry.get(2, ()) or [(2, 0, 0)]:
                v = _msg(b, va, ve)  # Value: number_value=2 (double), string_value=3, bool_value=4
                out[_text(b, entry, 1) or ""] = (_F64.unpack_from(b, v[2][-1][1])[0] if 2 in v else _text(
                    b, v, 3) if 3 in v else bool(v[4][-1][1]) if 4 in v else None)
    return out


class _State:
    """Columns being built, per-tag memory (plugin names, encodings), SessionLog STARTs, meta.

    Each row keeps the byte offset of its record so both decoders' rows merge in file order; segments
    are cut at the end (:func:`_segments`).
    """

    def __init__(self, rel: str) -> None:
        self.rel, self.tags, self.tag_index = rel, [], {}
        self.plugin, self.encoding, self.non_scalar, self.meta = {}, {}, {}, {}
        self.starts: list[tuple[int, int]] = []  # (record offset, step) of each SessionLog START
        self.rec = 0  # byte offset of the record being decoded by :meth:`generic`
        self.encodings: dict[str, int] = {}  # encoding name -> id (col_enc); per tag: that of its first row
        self.col_rec, self.col_tag, self.col_step, self.col_enc = array("q"), array("i"), array("q"), array("i")
        self.col_val, self.col_wall = array("d"), array("d")
        self.fast: list[tuple[np.ndarray, ...]] = []  # compiled-scan batches: rec, tag id, step, value, wall, kind,
        # has_plugin
        self.plugin_log: list[tuple[int, str, str]] = []  # (record offset, tag, plugin name) as metadata arrives

    def tag_id(self, tag: str) -> int:
        """Id of ``tag`` (registered if new)."""
        ti = self.tag_index.get(tag)
        if ti is None:
            ti = self.tag_index[tag] = len(self.tags)
            self.tags.append(tag)
        return ti

    def enc_id(self, encoding: str) -> int:
        """Id of an encoding name (``simple_value``, ``DT_FLOAT``, ...)."""
        return self.encodings.setdefault(encoding, len(self.encodings))

    def add(self, tag: str, encoding: str, step: int, value: float, wall: float) -> None:
        self.col_rec.append(self.rec)
        self.col_enc.append(self.enc_id(encoding))
        self.col_tag.append(self.tag_id(tag))
        self.col_step.append(step)
        self.col_val.append(value)
        self.col_wall.append(wall)

    def generic(self, p: bytes) -> None:
        """Decode one Event payload the general way."""
        m = _msg(p, 0, len(p))
        wall = next((_F64.unpack_from(p, a)[0] for wt, a, _ in m.get(1, ()) if wt == 1), 0.0)
        step = _varint_of(m, 2)
        if 3 in m:
            self.meta["file_version"] = _text(p, m, 3)
        for _, a, e in m.get(5, ()):
            for wt, va, ve in _msg(p, a, e).get(1, ()):
                if wt == 2:
                    self.value(p, va, ve, step, wall)
        for _, a, e in m.get(7, ()):  # SessionLog { status=1 }: START = the job (re)started here
            if _varint_of(_msg(p, a, e), 1) == _START:
                self.meta["session_starts"] = self.meta.get("session_starts", 0) + 1
                self.starts.append((self.rec, step))
        for kind in ["graph"] * (len(m.get(4, ())) + len(m.get(9, ()))) + ["run_metadata"] * len(m.get(8, ())):
            self.non_scalar[kind] = self.non_scalar.get(kind, 0) + 1

    def value(self, p: bytes, i: int, end: int, step: int, wall: float) -> None:
        """Decode one Summary.Value: a scalar becomes a row, anything else is counted by kind."""
        m = _msg(p, i, end)
        tag = _text(p, m, 1) or ""
        for _, a, e in m.get(9, ()):  # SummaryMetadata { plugin_data=1 { plugin_name=1, content=2 } }
            for _, pa_, pe in _msg(p, a, e).get(1, ()):
                pd = _msg(p, pa_, pe)
                self.plugin[tag] = _text(p, pd, 1) or self.plugin.get(tag, "")
                self.plugin_log.append((self.rec, tag, self.plugin[tag]))
                for _, ca, ce in pd.get(2, ()) if tag == "_hparams_/session_start_info" else ():
                    self.meta.setdefault("hparams", {}).update(_decode_hparams(p, ca, ce))
        if 2 in m and m[2][-1][0] == 5:  # simple_value (float32)
            self.add(tag, "simple_value", step, _F32.unpack_from(p, m[2][-1][1])[0], wall)
            return
        kind = next((k for fn, k in _VALUE_KIND if fn in m), None)
        if kind is None and 8 in m and self.plugin.get(tag, "") not in ("", "scalars"):
            kind = _PLUGIN_KIND.get(self.plugin[tag], "tensor")
        if kind is None and 8 in m:
            val, dtype = _tensor_scalar(p, m[8][-1][1], m[8][-1][2])
            if val is not None:
                self.add(tag, dtype, step, val, wall)
                return
            kind = "tensor"
        if kind is not None:
            self.non_scalar[kind] = self.non_scalar.get(kind, 0) + 1


def _resync(buf, pos: int, size: int) -> int | None:
    """First offset >= ``pos`` whose 12-byte header has a valid length CRC and fits in the file."""
    while pos + 12 <= size:
        if not buf[pos:pos + 12].strip(b"\x00"):  # no valid header is all zeros: jump over zero runs
            nz = _NONZERO.search(buf, pos + 12)
            pos = max(pos + 1, (nz.start() if nz else size) - 11)
            continue
        length, lcrc = _HEADER.unpack_from(buf, pos)
        if length <= MAX_RECORD and pos + 16 + length <= size and masked_crc32c(buf[pos:pos + 8]) == lcrc:
            return pos
        pos += 1
    return None


def _bad_frame(buf, pos: int, size: int, length: int, len_bad: bool, st: _State, skipped: list) -> int | None:
    """Handle a header that cannot be followed; returns where to resume, or None to stop."""
    nxt = _resync(buf, pos + 1, size)
    if nxt is None and not len_bad and length <= MAX_RECORD:
        skipped.append(Skip(f"{st.rel}:{pos}", "truncated record at end of file (killed job?)"))
        st.meta["truncated"] = True
        return None
    stop = size if nxt is None else nxt
    why = "bad length CRC" if len_bad else f"absurd length {length}"
    tail = "no valid record after it" if nxt is None else f"resynchronised at byte {nxt}"
    msg = f"corrupt record framing ({why}): bytes {pos}-{stop} skipped ({stop - pos} bytes), {tail}"
    if nxt is None and not bytes(buf[pos:size]).strip(b"\x00"):
        msg = f"zero-filled tail: bytes {pos}-{size} ({size - pos} bytes) hold no record (node crash?)"
    skipped.append(Skip(f"{st.rel}:{pos}", msg))
    st.meta["damaged_bytes"] = st.meta.get("damaged_bytes", 0) + stop - pos
    return nxt


def _frame(buf, pos: int, size: int, check_crc: bool) -> tuple[int, bool]:
    """(payload length, length CRC bad) of the frame header at ``pos`` (needs 12 bytes there)."""
    length, lcrc = _HEADER.unpack_from(buf, pos)
    return length, check_crc and masked_crc32c(buf[pos:pos + 8]) != lcrc


def _scan_python(buf, size: int, st: _State, check_crc: bool, skipped: list[Skip]) -> int:
    """Walk the frames of ``buf`` decoding every payload in Python; returns frames read."""
    pos, frames = 0, 0
    while pos < size:
        if size - pos < 12:  # a header cut short: truncated tail
            _bad_frame(buf, pos, size, 0, False, st, skipped)
            break
        length, bad = _frame(buf, pos, size, check_crc)
        end = pos + 12 + length
        if bad or length > MAX_RECORD or end + 4 > size:
            nxt = _bad_frame(buf, pos, size, length, bad, st, skipped)
            if nxt is None:
                break
            pos = nxt
            continue
        if check_crc and masked_crc32c(buf[pos + 12:end]) != _U32.unpack_from(buf, end)[0]:
            _bad_payload(pos, st, skipped)
        else:
            frames += 1
            _generic(buf, pos, end, st, skipped)
        pos = end + 4
    return frames


def _bad_payload(pos: int, st: _State, skipped: list[Skip]) -> None:
    skipped.append(Skip(f"{st.rel}:{pos}", "bad payload CRC; record skipped"))
    st.meta["bad_payload_crc"] = st.meta.get("bad_payload_crc", 0) + 1


def _generic(buf, pos: int, end: int, st: _State, skipped: list[Skip]) -> None:
    """Decode the payload of the frame at ``pos`` (ending at ``end``) with the general decoder."""
    st.rec = pos
    rows = len(st.col_step)
    try:
        st.generic(bytes(buf[pos + 12:end]))
    except (_Corrupt, IndexError, struct.error, ValueError) as exc:
        for col in (st.col_rec, st.col_tag, st.col_step, st.col_val, st.col_wall, st.col_enc):  # no half rows
            del col[rows:]
        skipped.append(Skip(f"{st.rel}:{pos}", f"undecodable event ({exc}); skipped"))


def _scan_compiled(mm, size: int, st: _State, check_crc: bool, skipped: list[Skip], kernel) -> int:
    """Walk the frames with the compiled scan (:mod:`parsers._tfrecord`); returns frames read.

    Fast frames come back as column batches and are interned here (tags by hash, verified byte for
    byte); generic frames go through :meth:`_State.generic`; damage is handled as in the Python walk.
    """
    buf = np.frombuffer(mm, np.uint8)
    f32 = np.ndarray((max(size - 3, 0),), "<f4", buffer=mm, strides=(1,))  # unaligned views: element i at byte i
    f64 = np.ndarray((max(size - 7, 0),), "<f8", buffer=mm, strides=(1,))
    cap = max(1, min(BATCH, size // 16 + 1))
    out = (np.empty(cap, np.int64), np.empty(cap, np.int8), np.empty(cap, np.int64), np.empty(cap, np.int64),
           np.empty(cap, np.int64), np.empty(cap, np.int64), np.empty(cap, np.int64), np.empty(cap, np.uint64),
           np.empty(cap, np.bool_))
    pos, frames = 0, 0
    while True:
        n, pos, why = kernel.scan(buf, pos, check_crc, MAX_RECORD, kernel.TABLES, *out)
        frames += n
        _fast_batch(mm, buf, f32, f64, st, [a[:n] for a in out], kernel, skipped)
        if why == kernel.FULL:
            continue
        if why == kernel.DONE:
            return frames
        if why == kernel.BAD_PAYLOAD_CRC:
            _bad_payload(pos, st, skipped)
            pos += 16 + _HEADER.unpack_from(mm, pos)[0]
            continue
        length, bad = _frame(mm, pos, size, check_crc) if size - pos >= 12 else (0, False)
        nxt = _bad_frame(mm, pos, size, length, bad, st, skipped)
        if nxt is None:
            return frames
        pos = nxt


def _fast_batch(mm, buf: np.ndarray, f32: np.ndarray, f64: np.ndarray, st: _State, cols: list[np.ndarray],
                kernel, skipped: list[Skip]) -> None:
    """Intern one batch of the compiled scan: fast rows to ``st.fast``, generic frames decoded in order."""
    rec, kind, step, wall_at, value_at, tag_at, tag_len, tag_hash, has_plugin = cols
    fast = kind != kernel.GENERIC
    generic = rec[~fast].tolist()
    if not fast.any():
        for pos in generic:
            _generic(mm, pos, pos + 12 + _HEADER.unpack_from(mm, pos)[0], st, skipped)
        return
    rec, kind, step, tag_at, tag_len = rec[fast], kind[fast], step[fast], tag_at[fast], tag_len[fast]
    hashes, first, inverse = np.unique(tag_hash[fast], return_index=True, return_inverse=True)
    ref_at, ref_len = tag_at[first][inverse], tag_len[first][inverse]
    if np.array_equal(tag_len, ref_len) and kernel.same_bytes(buf, tag_at, ref_at, tag_len):
        ids = np.array([st.tag_id(bytes(mm[a:a + n]).decode("utf-8", "replace"))
                        for a, n in zip(tag_at[first].tolist(), tag_len[first].tolist(), strict=True)],
                       np.int32)[inverse]
    else:  # a 64-bit hash collision between two tags: intern row by row
        ids = np.array([st.tag_id(bytes(mm[a:a + n]).decode("utf-8", "replace"))
                        for a, n in zip(tag_at.tolist(), tag_len.tolist(), strict=True)], np.int32)
    # the general decoder reads plugin names as they stand at its record: replay fast rows' metadata in order
    meta_rec, meta_ids = rec[has_plugin[fast]], ids[has_plugin[fast]]
    done = 0
    for pos in [*generic, None]:
        upto = len(meta_rec) if pos is None else int(np.searchsorted(meta_rec, pos))
        for ti in np.unique(meta_ids[done:upto]).tolist():
            st.plugin[st.tags[ti]] = "scalars"
        done = upto
        if pos is not None:
            _generic(mm, pos, pos + 12 + _HEADER.unpack_from(mm, pos)[0], st, skipped)
    enc = np.zeros(4, np.int32)  # kernel kind -> encoding id
    for k, name in ((kernel.SIMPLE_VALUE, "simple_value"), (kernel.DT_FLOAT, "DT_FLOAT"),
                    (kernel.DT_DOUBLE, "DT_DOUBLE")):
        enc[k] = st.enc_id(name)
    with np.errstate(invalid="ignore"):  # a signalling NaN is quieted, as struct.unpack does in the Python walk
        value = np.where(kind == kernel.DT_DOUBLE, f64[np.minimum(value_at[fast], len(f64) - 1)],
                         f32[value_at[fast]].astype(np.float64))
    st.fast.append((rec, ids, step, value, f64[wall_at[fast]], kind, has_plugin[fast], enc[kind]))


def _segments(rec: np.ndarray, tag: np.ndarray, step: np.ndarray, starts: list[tuple[int, int]],
              ) -> tuple[np.ndarray, list[tuple[int, int, str]]]:
    """Local segment of every row (rows in file order) and the restart events.

    TensorBoard's purge rule: a row whose step is below the previous step of the same tag in the
    current segment starts a new segment (the superseded rows stay, as their own segment); a SessionLog
    START starts one before the next row. Returns (segment per row, int32; [(segment, step, message)]).
    """
    n = len(step)
    order = np.argsort(tag, kind="stable")
    prev = np.full(n, -1, np.int64)
    same = tag[order[1:]] == tag[order[:-1]]
    prev[order[1:][same]] = order[:-1][same]
    cand = np.nonzero((prev >= 0) & (step < step[np.maximum(prev, 0)]))[0]
    marks = sorted([(int(np.searchsorted(rec, r, "right")), 0, s) for r, s in starts]
                   + [(int(r), 1, int(prev[r])) for r in cand])
    bounds, events = [0], []
    for row, what, x in marks:
        if what == 0 and row > bounds[-1]:
            bounds.append(row)
            events.append((len(bounds) - 1, x, "SessionLog START (resumed)"))
        elif what == 1 and x >= bounds[-1]:
            bounds.append(row)
    return np.repeat(np.arange(len(bounds), dtype=np.int32), np.diff([*bounds, n])), events


def _scan(mm, size: int, st: _State, check_crc: bool, skipped: list[Skip]) -> int:
    """Walk every frame: the compiled scan for files of :data:`FAST_MIN_BYTES` or more, else Python.

    Both walks give the same result (tests/test_parsers_tensorboard.py runs every test with each).
    """
    loaded = "parsers._tfrecord" in sys.modules
    kernel = _kernel() if size >= (FAST_MIN_BYTES_LOADED if loaded else FAST_MIN_BYTES) else None
    if kernel is None:
        return _scan_python(mm, size, st, check_crc, skipped)
    return _scan_compiled(mm, size, st, check_crc, skipped, kernel)


def _kernel():  # noqa: ANN202 - the module, imported on first use (numba's import costs ~0.5 s)
    try:
        from parsers import _tfrecord
    except ImportError:  # pragma: no cover - numba is a dependency; the Python walk reads the same
        return None
    return _tfrecord


def _not_scalars(st: _State, rec: np.ndarray, ids: np.ndarray, kind: np.ndarray, has_plugin: np.ndarray,
                 ) -> np.ndarray:
    """Mask of fast tensor rows whose tag belonged to a non-scalar plugin at that point of the file.

    The general decoder counts a rank-0 tensor of, say, a custom plugin as that plugin's data, not a
    scalar, from the record whose metadata named the plugin on; this replays that rule for the rows of
    the compiled scan (and counts them in ``non_scalar``).
    """
    drop = np.zeros(len(rec), bool)
    for tag in {t for _, t, name in st.plugin_log if name not in ("", "scalars")}:
        ti = st.tag_index.get(tag)
        mine = (ids == ti) & (kind >= 2) if ti is not None else None
        if mine is None or not mine.any():
            continue
        log = sorted([(r, name) for r, t, name in st.plugin_log if t == tag]
                     + [(int(r), "scalars") for r in rec[(ids == ti) & has_plugin].tolist()])
        at = np.searchsorted(np.array([r for r, _ in log], np.int64), rec[mine], "right") - 1
        names = np.array(["", *(name for _, name in log)], object)[at + 1]
        bad = ~np.isin(names, ["", "scalars"])
        drop[np.nonzero(mine)[0][bad]] = True
        for name in names[bad].tolist():
            k = _PLUGIN_KIND.get(name, "tensor")
            st.non_scalar[k] = st.non_scalar.get(k, 0) + 1
    return drop


def _table(st: _State) -> tuple[pa.Table, list[tuple[int, int, str]]]:
    """The metrics table (rows in file order) and the restart events, from both decoders' rows."""
    cols = [np.frombuffer(c, t) if len(c) else np.empty(0, t) for c, t in
            ((st.col_rec, np.int64), (st.col_tag, np.int32), (st.col_step, np.int64), (st.col_val, np.float64),
             (st.col_wall, np.float64), (st.col_enc, np.int32))]
    if st.fast:
        rec, ids, step, value, wall, kind, has_plugin, enc = (np.concatenate(c) for c in zip(*st.fast, strict=True))
        drop = _not_scalars(st, rec, ids, kind, has_plugin)
        fast = [rec, ids, step, value, wall, enc]
        fast = [f[~drop] for f in fast] if drop.any() else fast
        cols = [np.concatenate([c, f]) for c, f in zip(cols, fast, strict=True)] if len(st.col_rec) else fast
        if len(st.col_rec):
            order = np.argsort(cols[0], kind="stable")
            cols = [c[order] for c in cols]
    rec, tag, step, value, wall, enc = cols
    seg, events = _segments(rec, tag, step, st.starts)
    tags, first = np.unique(tag, return_index=True)  # each tag's encoding: that of its first row
    names = list(st.encodings)
    st.encoding = {st.tags[t]: names[e] for _, t, e in sorted(zip(first.tolist(), tags.tolist(),
                                                                    enc[first].tolist(), strict=True))}
    idx, zeros = pa.array(tag, pa.int32()), pa.array(np.zeros(len(step), np.int32))
    table = pa.Table.from_arrays(
        [pc.take(pa.array([""]), zeros), pa.array(seg, pa.int32()), pa.array(step, pa.int64()),
         pc.take(pa.array([canonical_metric(t) for t in st.tags], pa.string()), idx),
         pa.array(value, pa.float64()), pa.array(wall, pa.float64()),
         pc.take(pa.array(st.tags, pa.string()), idx), pc.take(pa.array([st.rel]), zeros)],
        schema=METRICS_SCHEMA)
    return table, events


def read(path: Path, root: Path, check_crc: bool | None = None) -> ParseResult:
    """Read every scalar of one TensorBoard event file, losslessly (memory-mapped, streamed).

    Args:
        path: The ``events.out.tfevents.*`` file.
        root: The run folder; ``source`` columns and ``Skip.what`` are relative to it.
        check_crc: Verify the length and payload CRC-32C of every record (default :data:`CHECK_CRC`).
            Without it, framing damage is found only through absurd lengths.

    Returns:
        One metrics row per scalar event (``value`` float64 = the logged float32/float64 exactly,
        ``wall_time`` s since epoch, local ``segment``: a new one at a per-tag step rewind or a
        SessionLog START); a ``restart`` event per START that split the file; ``meta``
        (``file_version``, ``records``, ``scalar_rows``, ``encodings``/``plugins`` per tag,
        ``non_scalar`` counts, ``hparams``, ``session_starts``, ``truncated``, ``damaged_bytes``);
        ``skipped`` entries ``"<rel>:<byte offset>"`` for damage.

    Raises:
        ParseError: The file is not empty but holds no TFRecord frame at all.
    """
    rel = path.relative_to(root).as_posix() if path.is_relative_to(root) else path.name
    st, skipped, frames = _State(rel), [], 0
    try:
        size = path.stat().st_size
        sparse = file_policy.sparse_problem(path) if size else None
        if sparse:
            raise ParseError(rel, sparse)
        if size == 0:
            skipped.append(Skip(rel, "empty event file (nothing was flushed)"))
        else:
            with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
                frames = _scan(mm, size, st, CHECK_CRC if check_crc is None else check_crc, skipped)
    except OSError as exc:
        raise ParseError(rel, f"unreadable: {exc.strerror or exc}") from None
    if size and frames == 0 and not st.meta.get("truncated") and not st.meta.get("bad_payload_crc"):
        raise ParseError(rel, f"not a TensorBoard event file: no valid record in {size} bytes")
    table, restarts = _table(st)
    meta = {**st.meta, "records": frames, "scalar_rows": table.num_rows, "encodings": dict(st.encoding),
            "plugins": dict(st.plugin), "non_scalar": dict(st.non_scalar)}
    f32 = {"simple_value", "DT_FLOAT", "DT_HALF", "DT_BFLOAT16"} & set(st.encoding.values())
    precision = "float32" if f32 or not st.encoding else "float64"
    events = pa.Table.from_pylist([{"run": "", "segment": g, "step": s, "kind": "restart", "message": m,
                                    "source": rel} for g, s, m in restarts], schema=EVENTS_SCHEMA)
    return ParseResult(format=FORMAT, path=rel, metrics=table, events=events, meta=meta,
                       skipped=tuple(skipped), precision=precision)
