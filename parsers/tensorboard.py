"""TensorBoard event files (``events.out.tfevents.*``): our own TFRecord reader and protobuf decoder.

Lossless and damage-tolerant (``formats.md`` section 1): a truncated tail keeps every complete record, a
bad payload CRC skips one record, a bad length CRC resynchronises. Scalars: ``simple_value`` (float32)
and one-element tensors (float, double, half, bfloat16, ints); other summaries are only counted.
Framing: ``uint64 length | uint32 masked_crc32c(length) | payload | uint32 masked_crc32c(payload)``.
"""

from __future__ import annotations

import mmap
import re
import struct
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

FORMAT = "tensorboard"
CHECK_CRC = True  # module-wide default for the length and payload CRC checks (read(..., check_crc=None))
MAX_RECORD = 256 << 20  # a record length above this (bytes) is corrupt framing, never allocated

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
    return v - (1 << 64) if v >= 1 << 63 else v


def _varint_of(m: dict, fn: int) -> int:
    return _s64(next((a for wt, a, _ in reversed(m.get(fn, ())) if wt == 0), 0))


def _half(bits: int, dtype: int) -> float:  # bfloat16 (dtype 14) or float16 from its 16 raw bits
    bits &= 0xFFFF
    return _F32.unpack(_U32.pack(bits << 16))[0] if dtype == 14 else _F16.unpack(_U16.pack(bits))[0]


def _tensor_scalar(b: bytes, i: int, end: int) -> tuple[float | None, str, tuple | None]:
    """One-element numeric TensorProto -> (value or None, dtype name, (offset, width, Struct) or None)."""
    m = _msg(b, i, end)
    dtype = _varint_of(m, 1)
    name, fmt = _DTYPES.get(dtype, (f"DT_{dtype}", _U16))
    numel = 1
    for _, sa, se in m.get(2, ()):  # TensorShapeProto { repeated Dim dim=2 { int64 size=1 } }
        for _, da, de in _msg(b, sa, se).get(2, ()):
            numel *= _varint_of(_msg(b, da, de), 1)
    if numel != 1 or dtype not in _DTYPES:
        return None, name, None
    vals: list[float] = []
    where = None
    for fn, f in ((5, _F32), (6, _F64)):  # float_val, double_val (packed or not)
        for _, a, e in m.get(fn, ()):
            n = (e - a) // f.size
            vals.extend(struct.unpack_from(f"<{n}{f.format[-1]}", b, a))
            where = (a, f.size, f) if n == 1 else None
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
        return (_half(v, dtype), name, None) if dtype in (14, 19) else (float(v), name, (a, fmt.size, fmt))
    if len(vals) != 1:
        return None, name, None
    return float(vals[0]), name, where


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
    """Columns being built, per-tag memory (plugin names, fast-path templates), segments, meta."""

    def __init__(self, rel: str) -> None:
        self.rel, self.tags, self.tag_index, self.events = rel, [], {}, []  # events: (segment, step, message)
        self.plugin, self.encoding, self.non_scalar, self.meta = {}, {}, {}, {}
        self.templates: dict[bytes, tuple] = {}  # fast path: header + tag bytes -> how to read the value
        self.col_tag, self.col_step = array("i"), array("q")
        self.col_val, self.col_wall = array("d"), array("d")
        self.last: list[int] = []  # last step per tag id in the current local segment (_LOW: none yet)
        self.seg_starts = [0]  # row index at which each local segment starts

    def add(self, tag: str, encoding: str, step: int, value: float, wall: float) -> int:
        ti = self.tag_index.get(tag)
        if ti is None:
            ti = self.tag_index[tag] = len(self.tags)
            self.tags.append(tag)
            self.last.append(_LOW)
            self.encoding[tag] = encoding
        if step < self.last[ti]:
            self.new_segment()
        self.last[ti] = step
        self.col_tag.append(ti)
        self.col_step.append(step)
        self.col_val.append(value)
        self.col_wall.append(wall)
        return ti

    def new_segment(self) -> bool:
        """Start a new local segment if the current one has rows; True when one started."""
        self.last[:] = [_LOW] * len(self.last)
        if len(self.col_step) > self.seg_starts[-1]:
            self.seg_starts.append(len(self.col_step))
            return True
        return False

    def generic(self, p: bytes) -> None:
        """Decode one Event payload the general way (and register fast-path templates)."""
        m = _msg(p, 0, len(p))
        wall = next((_F64.unpack_from(p, a)[0] for wt, a, _ in m.get(1, ()) if wt == 1), 0.0)
        step = _varint_of(m, 2)
        if 3 in m:
            self.meta["file_version"] = _text(p, m, 3)
        for _, a, e in m.get(5, ()):
            self.summary(p, a, e, step, wall)
        for _, a, e in m.get(7, ()):  # SessionLog { status=1 }: START = the job (re)started here
            if _varint_of(_msg(p, a, e), 1) == _START:
                self.meta["session_starts"] = self.meta.get("session_starts", 0) + 1
                if self.new_segment():
                    self.events.append((len(self.seg_starts) - 1, step, "SessionLog START (resumed)"))
        for kind in ["graph"] * (len(m.get(4, ())) + len(m.get(9, ()))) + ["run_metadata"] * len(m.get(8, ())):
            self.non_scalar[kind] = self.non_scalar.get(kind, 0) + 1

    def summary(self, p: bytes, s: int, end: int, step: int, wall: float) -> None:
        """Decode a Summary; a lone fixed-width scalar registers a template keyed by its header + tag."""
        values = [self.value(p, a, e, step, wall) for wt, a, e in _msg(p, s, end).get(1, ()) if wt == 2]
        at = values[-1] if values else None
        if len(values) == 1 and at is not None and end - s >= 4 and p[s] == 0x0A and p[s + 2] == 0x0A \
                and p[s + 1] < 0x80 and p[s + 3] < 0x80 and s + 2 + p[s + 1] == end:
            ti, off, width, fmt = at
            tag_end = s + 4 + p[s + 3]
            self.templates[p[s:tag_end]] = (ti, off - s, width, fmt.unpack_from, p[tag_end:off],
                                            p[off + width:end])

    def value(self, p: bytes, i: int, end: int, step: int, wall: float) -> tuple | None:
        """Decode one Summary.Value; returns (tag id, offset, width, Struct) for a fixed-width scalar."""
        m = _msg(p, i, end)
        tag = _text(p, m, 1) or ""
        for _, a, e in m.get(9, ()):  # SummaryMetadata { plugin_data=1 { plugin_name=1, content=2 } }
            for _, pa_, pe in _msg(p, a, e).get(1, ()):
                pd = _msg(p, pa_, pe)
                name = _text(p, pd, 1) or self.plugin.get(tag, "")
                if tag in self.tag_index and name != self.plugin.get(tag, ""):  # fast paths are stale
                    self.templates.clear()
                self.plugin[tag] = name
                for _, ca, ce in pd.get(2, ()) if tag == "_hparams_/session_start_info" else ():
                    self.meta.setdefault("hparams", {}).update(_decode_hparams(p, ca, ce))
        if 2 in m and m[2][-1][0] == 5:  # simple_value (float32)
            a = m[2][-1][1]
            return self.add(tag, "simple_value", step, _F32.unpack_from(p, a)[0], wall), a, 4, _F32
        kind = next((k for fn, k in _VALUE_KIND if fn in m), None)
        if kind is None and 8 in m and self.plugin.get(tag, "") not in ("", "scalars"):
            kind = _PLUGIN_KIND.get(self.plugin[tag], "tensor")
        if kind is None and 8 in m:
            val, dtype, where = _tensor_scalar(p, m[8][-1][1], m[8][-1][2])
            if val is not None:
                ti = self.add(tag, dtype, step, val, wall)
                return None if where is None else (ti, *where)
            kind = "tensor"
        if kind is not None:
            self.non_scalar[kind] = self.non_scalar.get(kind, 0) + 1
        return None


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


def _scan(buf, size: int, st: _State, check_crc: bool, skipped: list[Skip]) -> int:
    """Walk the TFRecord frames of ``buf``, decoding each payload into ``st``; returns frames read."""
    crc, header, u32, f64 = crc32c.crc32c, _HEADER.unpack_from, _U32.unpack_from, _F64.unpack_from
    templates, last, new_segment, len_crcs = st.templates, st.last, st.new_segment, {}
    ap_tag, ap_step, ap_val, ap_wall = (st.col_tag.append, st.col_step.append, st.col_val.append,
                                        st.col_wall.append)
    pos, frames = 0, 0
    while pos < size:
        if size - pos < 12:  # a header cut short: truncated tail
            _bad_frame(buf, pos, size, 0, False, st, skipped)
            break
        length, lcrc = header(buf, pos)
        end = pos + 12 + length
        bad = check_crc and len_crcs.get(length) != lcrc and masked_crc32c(buf[pos:pos + 8]) != lcrc
        if check_crc and not bad:
            len_crcs[length] = lcrc
        if bad or length > MAX_RECORD or end + 4 > size:
            nxt = _bad_frame(buf, pos, size, length, bad, st, skipped)
            if nxt is None:
                break
            pos = nxt
            continue
        p = buf[pos + 12:end]
        if check_crc:
            c = crc(p)
            if ((((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF) != u32(buf, end)[0]:
                skipped.append(Skip(f"{st.rel}:{pos}", "bad payload CRC; record skipped"))
                st.meta["bad_payload_crc"] = st.meta.get("bad_payload_crc", 0) + 1
                pos = end + 4
                continue
        pos, frames = end + 4, frames + 1
        try:  # fast path: wall_time(1) [step(2)] summary(5) that matches a known single-scalar template
            if length > 14 and p[0] == 0x09:
                i, step = 9, 0
                if p[9] == 0x10:
                    x = p[10]
                    if x < 0x80:
                        step, i = x, 11
                    elif p[11] < 0x80:
                        step, i = (x & 0x7F) | (p[11] << 7), 12
                    else:
                        step, i = _varint(p, 10)
                        step = _s64(step)
                if i + 5 < length and p[i] == 0x2A and p[i + 1] < 0x80:
                    s = i + 2
                    n1 = p[s + 1]
                    if n1 + 2 == p[i + 1] and p[s] == 0x0A:
                        tag_end = s + 4 + p[s + 3]
                        t = templates.get(p[s:tag_end])
                        if t is not None:
                            ti, off, width, unpacker, mid, suf = t
                            o = s + off
                            if p[tag_end:o] == mid and p[o + width:s + 2 + n1] == suf:
                                if step < last[ti]:
                                    new_segment()
                                last[ti] = step
                                ap_tag(ti)
                                ap_step(step)
                                ap_val(unpacker(p, o)[0])
                                ap_wall(f64(p, 1)[0])
                                continue
            st.generic(p)
        except (_Corrupt, IndexError, struct.error, ValueError) as exc:
            skipped.append(Skip(f"{st.rel}:{end - 12 - length}", f"undecodable event ({exc}); skipped"))
    return frames


def _table(st: _State) -> pa.Table:
    n, starts = len(st.col_step), st.seg_starts
    idx, zeros = pa.array(st.col_tag, pa.int32()), pa.array(np.zeros(n, np.int32))
    seg = pa.array(np.repeat(np.arange(len(starts), dtype=np.int32), np.diff([*starts, n])), pa.int32())
    return pa.Table.from_arrays(
        [pc.take(pa.array([""]), zeros), seg, pa.array(st.col_step, pa.int64()),
         pc.take(pa.array([canonical_metric(t) for t in st.tags], pa.string()), idx),
         pa.array(st.col_val, pa.float64()), pa.array(st.col_wall, pa.float64()),
         pc.take(pa.array(st.tags, pa.string()), idx), pc.take(pa.array([st.rel]), zeros)],
        schema=METRICS_SCHEMA)


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
        if size == 0:
            skipped.append(Skip(rel, "empty event file (nothing was flushed)"))
        else:
            with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
                frames = _scan(mm, size, st, CHECK_CRC if check_crc is None else check_crc, skipped)
    except OSError as exc:
        raise ParseError(rel, f"unreadable: {exc.strerror or exc}") from None
    if size and frames == 0 and not st.meta.get("truncated") and not st.meta.get("bad_payload_crc"):
        raise ParseError(rel, f"not a TensorBoard event file: no valid record in {size} bytes")
    meta = {**st.meta, "records": frames, "scalar_rows": len(st.col_step), "encodings": dict(st.encoding),
            "plugins": dict(st.plugin), "non_scalar": dict(st.non_scalar)}
    f32 = {"simple_value", "DT_FLOAT", "DT_HALF", "DT_BFLOAT16"} & set(st.encoding.values())
    precision = "float32" if f32 or not st.encoding else "float64"
    events = pa.Table.from_pylist([{"run": "", "segment": g, "step": s, "kind": "restart", "message": m,
                                    "source": rel} for g, s, m in st.events], schema=EVENTS_SCHEMA)
    return ParseResult(format=FORMAT, path=rel, metrics=_table(st), events=events, meta=meta,
                       skipped=tuple(skipped), precision=precision)
