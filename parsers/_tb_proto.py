"""The general TensorBoard Event decoder (protobuf wire format, no generated classes) and the columns built.

Every Event payload that :mod:`parsers._tb_fast` does not read goes through :meth:`State.generic`:
scalars (``simple_value`` and one-element tensors of any numeric dtype), plugin metadata, hparams,
SessionLog STARTs, and counts of every other summary kind (``docs/formats.md#tensorboard``).
"""

from __future__ import annotations

import struct
from array import array
from typing import Any

import numpy as np

_S = struct.Struct
_U32, _U16, _F32, _F64, _F16 = _S("<I"), _S("<H"), _S("<f"), _S("<d"), _S("<e")
_START = 1  # SessionLog.START
_DTYPES = {1: ("DT_FLOAT", _F32), 2: ("DT_DOUBLE", _F64), 3: ("DT_INT32", _S("<i")), 4: ("DT_UINT8", _S("B")),
           5: ("DT_INT16", _S("<h")), 6: ("DT_INT8", _S("b")), 9: ("DT_INT64", _S("<q")),
           10: ("DT_BOOL", _S("<?")), 14: ("DT_BFLOAT16", _U16), 17: ("DT_UINT16", _S("<H")),
           19: ("DT_HALF", _U16), 22: ("DT_UINT32", _S("<I")), 23: ("DT_UINT64", _S("<Q"))}
PLUGIN_KIND = {"histograms": "histogram", "images": "image", "audio": "audio", "text": "text",
                "pr_curves": "pr_curve", "mesh": "mesh", "hparams": "hparams"}
_VALUE_KIND = ((3, "histogram"), (5, "histogram"), (4, "image"), (6, "audio"))


class Corrupt(Exception):
    """A payload that does not decode as an Event (its framing was fine)."""


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
            raise Corrupt("varint too long")


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
            raise Corrupt(f"unsupported wire type {wt}")
        n, i = _varint(b, i) if wt == 2 else (8 if wt == 1 else 4, i)
        if i + n > end:
            raise Corrupt("field runs past the end of its message")
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


class State:
    """Columns being built, per-tag memory (plugin names, encodings), SessionLog STARTs, meta.

    Each row keeps the byte offset of its record so both decoders' rows merge in file order; segments
    are cut at the end (``parsers.tensorboard._segments``).
    """

    def __init__(self, rel: str) -> None:
        self.rel, self.tags, self.tag_index = rel, [], {}
        self.plugin, self.encoding, self.non_scalar, self.meta = {}, {}, {}, {}
        self.starts: list[tuple[int, int]] = []  # (record offset, step) of each SessionLog START
        self.rec = 0  # byte offset of the record being decoded by :meth:`generic`
        self.encodings: dict[str, int] = {}  # encoding name -> id (col_enc); per tag: that of its first row
        self.col_rec, self.col_tag, self.col_step, self.col_enc = array("q"), array("i"), array("q"), array("i")
        self.col_val, self.col_wall = array("d"), array("d")
        self.fast: list[tuple[np.ndarray, ...]] = []  # vectorised batches: rec, tag id, step, value, wall, kind,
        # has_plugin, encoding id
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
            kind = PLUGIN_KIND.get(self.plugin[tag], "tensor")
        if kind is None and 8 in m:
            val, dtype = _tensor_scalar(p, m[8][-1][1], m[8][-1][2])
            if val is not None:
                self.add(tag, dtype, step, val, wall)
                return
            kind = "tensor"
        if kind is not None:
            self.non_scalar[kind] = self.non_scalar.get(kind, 0) + 1
