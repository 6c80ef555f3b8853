"""TensorBoard event files (``events.out.tfevents.*``): our own TFRecord reader and protobuf decoder.

Lossless and damage-tolerant (``docs/formats.md#tensorboard``): a truncated tail keeps every complete record, a
bad payload CRC skips one record, a bad length CRC resynchronises. Scalars: ``simple_value`` (float32)
and one-element tensors (float, double, half, bfloat16, ints); other summaries are only counted.
Framing: ``uint64 length | uint32 masked_crc32c(length) | payload | uint32 masked_crc32c(payload)``.

Two walks give the same result (``tests/test_parsers_tensorboard.py`` runs every test with each):
files of :data:`FAST_MIN_BYTES` or more are read in bounded windows with whole-array framing, CRC
checks and scalar decoding (:mod:`parsers._tfrecord`, :mod:`parsers._tb_fast`); smaller ones record by
record in Python. Both hand every other payload to the general decoder (:mod:`parsers._tb_proto`).
"""

from __future__ import annotations

import mmap
import re
import struct
from pathlib import Path

import crc32c
import numpy as np
import pyarrow as pa

from forensics.errors import ParseError
from forensics.model import ParseResult, Skip
from forensics.schema import EVENTS_SCHEMA, METRICS_COMPACT_SCHEMA, canonical_metric
from parsers import _tb_fast, _tfrecord, file_policy
from parsers._tb_proto import PLUGIN_KIND, Corrupt, State

FORMAT = "tensorboard"
CHECK_CRC = True  # module-wide default for the length and payload CRC checks (read(..., check_crc=None))
MAX_RECORD = 256 << 20  # a record length above this (bytes) is corrupt framing, never allocated
FAST_MIN_BYTES = 256 << 10  # files this size or larger are walked in vectorised windows (parsers/_tfrecord.py)

_HEADER, _U32 = struct.Struct("<QI"), struct.Struct("<I")
_NONZERO = re.compile(b"[^\x00]")


def masked_crc32c(data: bytes | memoryview) -> int:
    """LevelDB-masked CRC-32C of ``data``, as stored in TFRecord framing (uint32)."""
    c = crc32c.crc32c(data)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def sniff(path: Path) -> bool:
    """True when the file name contains ``tfevents`` (by name only; never raises)."""
    return "tfevents" in path.name


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


def _bad_frame(pos: int, size: int, length: int, len_bad: bool, st: State, skipped: list, resync, zeros,
               ) -> int | None:
    """Handle a header that cannot be followed; returns where to resume, or None to stop.

    ``resync(offset)`` finds the next valid header, ``zeros()`` says whether the rest of the file is zeros.
    """
    nxt = resync(pos + 1)
    if nxt is None and not len_bad and length <= MAX_RECORD:
        skipped.append(Skip(f"{st.rel}:{pos}", "truncated record at end of file (killed job?)"))
        st.meta["truncated"] = True
        return None
    stop = size if nxt is None else nxt
    why = "bad length CRC" if len_bad else f"absurd length {length}"
    tail = "no valid record after it" if nxt is None else f"resynchronised at byte {nxt}"
    msg = f"corrupt record framing ({why}): bytes {pos}-{stop} skipped ({stop - pos} bytes), {tail}"
    if nxt is None and zeros():
        msg = f"zero-filled tail: bytes {pos}-{size} ({size - pos} bytes) hold no record (node crash?)"
    skipped.append(Skip(f"{st.rel}:{pos}", msg))
    st.meta["damaged_bytes"] = st.meta.get("damaged_bytes", 0) + stop - pos
    return nxt


def _frame(head, check_crc: bool) -> tuple[int, bool]:
    """(payload length, length CRC bad) of a 12-byte frame header."""
    length, lcrc = _HEADER.unpack_from(head, 0)
    return length, check_crc and masked_crc32c(head[:8]) != lcrc


def _scan_python(buf, size: int, st: State, check_crc: bool, skipped: list[Skip]) -> int:
    """Walk the frames of ``buf`` (a memory map) decoding every payload in Python; returns frames read."""
    pos, frames = 0, 0
    resync = lambda p: _resync(buf, p, size)  # noqa: E731
    while pos < size:
        if size - pos < 12:  # a header cut short: truncated tail
            _bad_frame(pos, size, 0, False, st, skipped, resync, lambda: False)
            break
        length, bad = _frame(buf[pos:pos + 12], check_crc)
        end = pos + 12 + length
        if bad or length > MAX_RECORD or end + 4 > size:
            nxt = _bad_frame(pos, size, length, bad, st, skipped, resync,
                             lambda p=pos: not bytes(buf[p:size]).strip(b"\x00"))
            if nxt is None:
                break
            pos = nxt
            continue
        if check_crc and masked_crc32c(buf[pos + 12:end]) != _U32.unpack_from(buf, end)[0]:
            _bad_payload(pos, st, skipped)
        else:
            frames += 1
            _generic(bytes(buf[pos + 12:end]), pos, st, skipped)
        pos = end + 4
    return frames


def _bad_payload(pos: int, st: State, skipped: list[Skip]) -> None:
    skipped.append(Skip(f"{st.rel}:{pos}", "bad payload CRC; record skipped"))
    st.meta["bad_payload_crc"] = st.meta.get("bad_payload_crc", 0) + 1


def _generic(payload: bytes, pos: int, st: State, skipped: list[Skip]) -> None:
    """Decode the payload of the frame at file offset ``pos`` with the general decoder."""
    st.rec = pos
    rows = len(st.col_step)
    try:
        st.generic(payload)
    except (Corrupt, IndexError, struct.error, ValueError) as exc:
        for col in (st.col_rec, st.col_tag, st.col_step, st.col_val, st.col_wall, st.col_enc):  # no half rows
            del col[rows:]
        skipped.append(Skip(f"{st.rel}:{pos}", f"undecodable event ({exc}); skipped"))


def _scan_windows(fh, size: int, st: State, check_crc: bool, skipped: list[Skip]) -> int:
    """Walk the frames in bounded windows (:func:`parsers._tfrecord.walk`); returns frames read.

    Damage is handled as in the Python walk, reading the file through the same bounded windows.
    """
    def damage(pos: int) -> int | None:
        head = b""
        if size - pos >= 12:
            fh.seek(pos)
            head = fh.read(12)
        length, bad = _frame(head, check_crc) if len(head) == 12 else (0, False)
        return _bad_frame(pos, size, length, bad, st, skipped,
                          lambda p: _tfrecord.resync(fh, p, size, MAX_RECORD),
                          lambda: _tfrecord.all_zero(fh, pos, size))

    frames = 0
    for win in _tfrecord.walk(fh, size, check_crc, MAX_RECORD, damage):
        frames += int(win.ok.sum())
        _window(win, st, skipped)
    return frames


def _window(win: _tfrecord.Window, st: State, skipped: list[Skip]) -> None:
    """Decode one window: scalar Events vectorised into ``st.fast``, the rest by the general decoder, in order."""
    buf, base, good = win.buf, win.base, np.flatnonzero(win.ok)
    at, length = win.at[good], win.length[good]
    fast, tags = _tb_fast.scalar_events(buf, at + 12, at + 12 + length)
    rec = base + at[fast["index"]]
    generic = np.ones(len(at), bool)
    generic[fast["index"]] = False
    bad = np.flatnonzero(~win.ok)
    others = sorted([(int(base + win.at[k]), int(win.length[k]), True) for k in bad.tolist()]
                    + [(int(base + at[k]), int(length[k]), False) for k in np.flatnonzero(generic).tolist()])
    ids = np.array([st.tag_id(t.decode("utf-8", "replace")) for t in tags], np.int32)[fast["tag"]]
    # the general decoder reads plugin names as they stand at its record: replay fast rows' metadata in order
    meta_rec, meta_ids = rec[fast["plugin"]], ids[fast["plugin"]]
    done = 0
    for pos, n, crc_bad in [*others, (None, 0, False)]:
        upto = len(meta_rec) if pos is None else int(np.searchsorted(meta_rec, pos))
        for ti in np.flatnonzero(np.bincount(meta_ids[done:upto])).tolist():  # (np.unique imports numpy.ma)
            st.plugin[st.tags[ti]] = "scalars"
        done = upto
        if pos is not None and crc_bad:
            _bad_payload(pos, st, skipped)
        elif pos is not None:
            _generic(bytes(buf[pos - base + 12:pos - base + 12 + n]), pos, st, skipped)
    enc = np.zeros(4, np.int32)  # kind -> encoding id
    for k, name in ((_tb_fast.SIMPLE_VALUE, "simple_value"), (_tb_fast.DT_FLOAT, "DT_FLOAT"),
                    (_tb_fast.DT_DOUBLE, "DT_DOUBLE")):
        enc[k] = st.enc_id(name)
    kind = fast["kind"]
    st.fast.append((rec, ids, fast["step"], fast["value"], fast["wall"], kind, fast["plugin"], enc[kind]))


def _segments(rec: np.ndarray, tag: np.ndarray, step: np.ndarray, starts: list[tuple[int, int]],
              ) -> tuple[np.ndarray, list[tuple[int, int, str]]]:
    """Local segment of every row (rows in file order) and the restart events.

    TensorBoard's purge rule: a row whose step is below the previous step of the same tag in the
    current segment starts a new segment (the superseded rows stay, as their own segment); a SessionLog
    START starts one before the next row. Returns (segment per row, int32; [(segment, step, message)]).
    """
    n = len(step)
    order = np.argsort(tag.astype(np.int16) if tag.max(initial=0) < 1 << 15 else tag, kind="stable")  # int16: radix
    ts, ss = tag[order], step[order]  # rows of each tag together, in file order
    k = np.flatnonzero((ts[1:] == ts[:-1]) & (ss[1:] < ss[:-1])) + 1  # a step below the tag's previous one
    marks = sorted([(int(np.searchsorted(rec, r, "right")), 0, s) for r, s in starts]
                   + [(int(r), 1, int(p)) for r, p in zip(order[k].tolist(), order[k - 1].tolist(), strict=True)])
    bounds, events = [0], []
    for row, what, x in marks:
        if what == 0 and row > bounds[-1]:
            bounds.append(row)
            events.append((len(bounds) - 1, x, "SessionLog START (resumed)"))
        elif what == 1 and x >= bounds[-1]:
            bounds.append(row)
    return np.repeat(np.arange(len(bounds), dtype=np.int32), np.diff([*bounds, n])), events



def _not_scalars(st: State, rec: np.ndarray, ids: np.ndarray, kind: np.ndarray, has_plugin: np.ndarray,
                 ) -> np.ndarray:
    """Mask of fast tensor rows whose tag belonged to a non-scalar plugin at that point of the file.

    The general decoder counts a rank-0 tensor of, say, a custom plugin as that plugin's data, not a
    scalar, from the record whose metadata named the plugin on; this replays that rule for the rows of
    the vectorised walk (and counts them in ``non_scalar``).
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
            k = PLUGIN_KIND.get(name, "tensor")
            st.non_scalar[k] = st.non_scalar.get(k, 0) + 1
    return drop



_NUMPY = {pa.int32(): np.int32, pa.int64(): np.int64, pa.float64(): np.float64}


def _arrow(a: np.ndarray, typ: pa.DataType) -> pa.Array:
    """A numpy array as an Arrow array of ``typ``, no nulls (``pa.array`` would import pandas to check types)."""
    a = np.ascontiguousarray(a, _NUMPY[typ])
    return pa.Array.from_buffers(typ, len(a), [None, pa.py_buffer(a)])


def _strings(values: list[str]) -> pa.Array:
    """A list of str as an Arrow string array (without ``pa.array``: see :func:`_arrow`)."""
    data = [v.encode("utf-8") for v in values]
    offsets = np.zeros(len(data) + 1, np.int32)
    np.cumsum([len(d) for d in data], out=offsets[1:])
    return pa.Array.from_buffers(pa.string(), len(data), [None, pa.py_buffer(offsets), pa.py_buffer(b"".join(data))])


def _table(st: State) -> tuple[pa.Table, list[tuple[int, int, str]]]:
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
    first = np.full(len(st.tags), len(tag), np.int64)  # each tag's first row: its encoding is the tag's
    first[tag[::-1]] = np.arange(len(tag) - 1, -1, -1)
    names = list(st.encodings)
    st.encoding = {st.tags[t]: names[int(enc[r])] for r, t in sorted((int(r), t) for t, r in enumerate(first.tolist())
                                                                        if r < len(tag))}
    table = pa.Table.from_arrays(
        [_one_text("", len(step)), _arrow(seg, pa.int32()), _arrow(step, pa.int64()),
         _metric_text(st.tags, tag), _arrow(value, pa.float64()), _arrow(wall, pa.float64()),
         pa.DictionaryArray.from_arrays(_arrow(tag, pa.int32()), _strings(st.tags)), _one_text(st.rel, len(step))],
        schema=METRICS_COMPACT_SCHEMA)
    return table, events


def _one_text(value: str, n: int) -> pa.DictionaryArray:
    """``n`` rows of one string, dictionary-encoded (one byte a row; no 1M-row string column to build)."""
    zeros = pa.Array.from_buffers(pa.int8(), n, [None, pa.py_buffer(np.zeros(n, np.int8))])
    return pa.DictionaryArray.from_arrays(zeros, _strings([value]))


def _metric_text(tags: list[str], tag: np.ndarray) -> pa.DictionaryArray:
    """Each row's canonical metric name, dictionary-encoded (tags with one canonical name share its entry)."""
    names = [canonical_metric(t) for t in tags]
    unique = {m: None for m in names}
    if len(unique) < len(names):
        pos = {m: i for i, m in enumerate(unique)}
        tag = np.array([pos[m] for m in names], np.int32)[tag]
    return pa.DictionaryArray.from_arrays(_arrow(tag, pa.int32()), _strings(list(unique)))



def read(path: Path, root: Path, check_crc: bool | None = None) -> ParseResult:
    """Read every scalar of one TensorBoard event file, losslessly (streamed: memory bounded by the window).

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
    rel = file_policy.rel(path, root)
    st, skipped, frames = State(rel), [], 0
    try:
        size = path.stat().st_size
        sparse = file_policy.sparse_problem(path) if size else None
        if sparse:
            raise ParseError(rel, sparse)
        if size == 0:
            skipped.append(Skip(rel, "empty event file (nothing was flushed)"))
        else:
            check = CHECK_CRC if check_crc is None else check_crc
            with open(path, "rb") as fh:
                if size >= FAST_MIN_BYTES:  # bounded windows, whatever the size
                    frames = _scan_windows(fh, size, st, check, skipped)
                else:
                    with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
                        frames = _scan_python(mm, size, st, check, skipped)
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
                                    "source": rel} for g, s, m in restarts], schema=EVENTS_SCHEMA) if restarts \
        else pa.Table.from_batches([], schema=EVENTS_SCHEMA)  # (empty_table() would import pandas)
    return ParseResult(format=FORMAT, path=rel, metrics=table, events=events, meta=meta,
                       skipped=tuple(skipped), precision=precision)
