"""Incremental ingestion: re-read only the records appended to a log since the last read.

A live run's logs grow at the end. :class:`IncrementalReader` keeps, per file, the byte offset just
after the last *complete* record it parsed, the tables parsed so far and the stitching state (local
segment and last step); on the next call it parses only the bytes from that offset up to the last
complete record boundary, with the file's own parser, and appends the rows. A live 1M-step run then
costs only its new lines per update (plus concatenating the Arrow tables already held).

Record boundaries (what "complete" means), per format:

- ``jsonl`` and ``textlog``: the last newline in the file; a half-written last line waits for the
  next call (never parsed, never reported as damage).
- ``tensorboard``: TFRecord framing (8-byte length, 4-byte length CRC, payload, 4-byte payload CRC):
  the end of the last frame that is wholly on disk. A length that cannot be a record (damage) makes
  the file fall back to a full read, so the parser's own resync and skip reporting apply.

The new piece is written to a private temporary file of the same name and handed to the format's
``read(path, root)``, unchanged; its local segments are then shifted so that they continue the file:
the piece continues the last segment unless one of its tags starts at or below that tag's last step
read (a rewind: a resume that went back), the rule the parsers apply inside a file.

Full re-reads (cached while the file's size and mtime stay the same): formats that are not
append-only (``trainer_state.json``, CSV exports, MLflow), W&B transaction logs (32 KiB LevelDB
blocks whose records span blocks), gzip files, text logs whose parser post-processes the whole file
(Megatron-LM: a missing ``lm loss`` is filled in at the end; placeholder columns are dropped only when
constant over the file), and any file that shrank, was replaced (new inode) or whose first bytes
changed.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import struct
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from forensics.model import ParseResult

APPEND_ONLY = ("jsonl", "textlog", "tensorboard")
"""Formats read from a byte offset (module docstring)."""
_HEAD_BYTES = 4096
_MAX_TFRECORD = 1 << 30  # a frame length above 1 GiB is damage, not a scalar event
_WHOLE_FILE_FRAMEWORKS = ("megatron",)


@dataclass
class FileState:
    """What is known about one file between calls.

    Attributes:
        fmt: The parser's format name.
        offset: Bytes consumed: the end of the last complete record parsed.
        size: The file size at the last call.
        mtime_ns: The mtime at the last call.
        inode: ``(st_dev, st_ino)`` at the first read (a replaced file starts over).
        head: Hash of the first bytes (a rewritten file starts over).
        metrics: Metric tables parsed so far (local segments already shifted).
        events: Event tables parsed so far.
        meta: The parser meta of the first read, updated by later pieces.
        skipped: Damage found so far.
        precision: The parser's precision.
        last_segment: Local segment of the last row read (-1 before any row).
        last_step: Step of the last row of the last segment.
        tag_last: Last step of each tag in the last segment (a piece rewinds when a tag goes back).
        incremental: False when the file is re-read in full on every change.
        full_reads: How many full reads were made (tests and metrics).
        piece_reads: How many appended pieces were parsed.
    """

    fmt: str
    offset: int = 0
    size: int = -1
    mtime_ns: int = -1
    inode: tuple[int, int] = (0, 0)
    head: str = ""
    metrics: list[pa.Table] = field(default_factory=list)
    events: list[pa.Table] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)
    skipped: list[Any] = field(default_factory=list)
    precision: str = "float64"
    last_segment: int = -1
    last_step: int | None = None
    tag_last: dict[str, int] = field(default_factory=dict)
    incremental: bool = True
    full_reads: int = 0
    piece_reads: int = 0


def _head(path: Path, n: int) -> str:
    with open(path, "rb") as fh:
        return hashlib.sha1(fh.read(min(n, _HEAD_BYTES))).hexdigest()


def line_boundary(path: Path, start: int, end: int) -> int:
    """The offset just after the last newline in ``path[start:end]`` (``start`` when there is none).

    Reads backwards in 64 KiB blocks, so a long record costs only its own bytes.
    """
    block = 1 << 16
    with open(path, "rb") as fh:
        pos = end
        while pos > start:
            lo = max(start, pos - block)
            fh.seek(lo)
            buf = fh.read(pos - lo)
            i = buf.rfind(b"\n")
            if i >= 0:
                return lo + i + 1
            pos = lo
    return start


def tfrecord_boundary(path: Path, start: int, end: int) -> int | None:
    """The end of the last TFRecord frame wholly inside ``path[start:end]``; None on a bad length.

    Frames: ``uint64 length | uint32 masked crc of length | payload | uint32 masked crc of payload``.
    """
    pos = start
    with open(path, "rb") as fh:
        while pos + 12 <= end:
            fh.seek(pos)
            hdr = fh.read(8)
            (length,) = struct.unpack("<Q", hdr)
            if length > _MAX_TFRECORD:
                return None
            nxt = pos + 12 + length + 4
            if nxt > end:
                break
            pos = nxt
    return pos


def _tag_steps(t: pa.Table, segment: int, how: str) -> dict[str, int]:
    """``{tag: min or max step}`` over the rows of one local segment."""
    part = t.filter(pc.equal(t.column("segment"), segment)).select(["tag", "step"])
    if part.num_rows == 0:
        return {}
    g = part.group_by("tag").aggregate([("step", how)])
    return dict(zip(g.column("tag").to_pylist(), g.column(f"step_{how}").to_pylist(), strict=True))


def _with_source(t: pa.Table, rel: str, shift: int) -> pa.Table:
    if t.num_rows == 0:
        return t
    i = t.schema.get_field_index("source")
    if i >= 0:
        t = t.set_column(i, t.schema.field(i), pa.array([rel] * t.num_rows, t.schema.field(i).type))
    j = t.schema.get_field_index("segment")
    if shift and j >= 0:
        f = t.schema.field(j)
        t = t.set_column(j, f, pc.add(t.column(j).cast(pa.int64()), shift).cast(f.type))
    return t


def _last(t: pa.Table) -> tuple[int, int | None]:
    """(last local segment, last step in it) of a metrics table with rows."""
    seg = pc.max(t.column("segment")).as_py()
    last = t.filter(pc.equal(t.column("segment"), seg))
    return int(seg), pc.max(last.column("step")).as_py()


class IncrementalReader:
    """A per-file reader for :func:`parsers.discover.load_run` that keeps state between calls.

    One instance follows one or many run folders (keys are absolute file paths). Not thread-safe:
    use one instance per worker.

    Example::

        reader = IncrementalReader()
        run = load_run(run_dir, reader=reader.read)   # first call: full reads
        ...                                           # the logs grow
        run = load_run(run_dir, reader=reader.read)   # only the appended records are parsed
    """

    def __init__(self, tmp_dir: str | Path | None = None) -> None:
        self.files: dict[str, FileState] = {}
        self._tmp = Path(tempfile.mkdtemp(prefix="forensics-incr-", dir=tmp_dir))

    def close(self) -> None:
        """Remove the private temporary folder."""
        shutil.rmtree(self._tmp, ignore_errors=True)

    def forget(self, prefix: str | Path) -> None:
        """Drop the state of every file under ``prefix`` (a run folder that vanished)."""
        p = str(Path(prefix).resolve())
        for k in [k for k in self.files if k == p or k.startswith(p + os.sep)]:
            del self.files[k]

    # -- the hook --------------------------------------------------------------------------------
    def read(self, path: Path, mod: Any, root: Path) -> ParseResult:
        """Read ``path`` with parser module ``mod``; only appended records when it can (module docstring).

        Raises:
            forensics.errors.ParseError: as the parser's ``read`` (a first read with nothing usable).
        """
        key = str(path.resolve())
        fmt = getattr(mod, "FORMAT", mod.__name__.rpartition(".")[2])
        rel = path.relative_to(root).as_posix()
        st = os.stat(path)
        fs = self.files.get(key)
        if fs is not None and fs.fmt == fmt and fs.size == st.st_size and fs.mtime_ns == st.st_mtime_ns:
            return self._result(fs, rel)
        inode = (st.st_dev, st.st_ino)
        if (fs is None or fs.fmt != fmt or not fs.incremental or inode != fs.inode or st.st_size < fs.offset
                or _head(path, fs.offset) != fs.head):
            return self._full(path, mod, root, key, fmt, rel, st)
        end = self._boundary(path, fmt, fs.offset, st.st_size)
        if end is None:
            return self._full(path, mod, root, key, fmt, rel, st)
        fs.size, fs.mtime_ns = st.st_size, st.st_mtime_ns
        if end > fs.offset:
            self._piece(path, mod, fs, rel, end)
        return self._result(fs, rel)

    # -- internals -------------------------------------------------------------------------------
    @staticmethod
    def _boundary(path: Path, fmt: str, start: int, end: int) -> int | None:
        if fmt == "tensorboard":
            return tfrecord_boundary(path, start, end)
        return line_boundary(path, start, end)

    def _full(self, path: Path, mod: Any, root: Path, key: str, fmt: str, rel: str,
              st: os.stat_result) -> ParseResult:
        self.files.pop(key, None)
        pr = mod.read(path, root)
        fs = FileState(fmt=fmt, size=st.st_size, mtime_ns=st.st_mtime_ns, inode=(st.st_dev, st.st_ino),
                       meta=dict(pr.meta), skipped=list(pr.skipped), precision=pr.precision)
        fs.metrics, fs.events = [pr.metrics], [pr.events]
        fs.full_reads = 1
        fs.incremental = (fmt in APPEND_ONLY and not path.name.lower().endswith(".gz")
                          and not (fmt == "textlog" and (pr.meta.get("framework") in _WHOLE_FILE_FRAMEWORKS
                                                         or "placeholder_metrics" in pr.meta)))
        if fs.incremental:
            end = self._boundary(path, fmt, 0, st.st_size)
            if end is None:
                fs.incremental = False
            else:
                fs.offset = end
                fs.head = _head(path, end)
        if pr.metrics.num_rows:
            fs.last_segment, fs.last_step = _last(pr.metrics)
            fs.tag_last = _tag_steps(pr.metrics, fs.last_segment, "max")
        self.files[key] = fs
        return self._result(fs, rel)

    def _piece(self, path: Path, mod: Any, fs: FileState, rel: str, end: int) -> None:
        folder = self._tmp / hashlib.sha1(str(path).encode()).hexdigest()[:16]
        folder.mkdir(exist_ok=True)
        tmp = folder / path.name
        with open(path, "rb") as src, open(tmp, "wb") as dst:
            src.seek(fs.offset)
            left = end - fs.offset
            while left > 0:
                buf = src.read(min(left, 1 << 20))
                if not buf:
                    break
                dst.write(buf)
                left -= len(buf)
        try:
            pr = mod.read(tmp, folder)
        except Exception:  # noqa: BLE001 - a piece with no usable record: nothing new (e.g. blank lines)
            pr = None
        finally:
            tmp.unlink(missing_ok=True)
        fs.offset = end
        fs.piece_reads += 1
        if pr is None:
            return
        shift = 0
        if fs.last_segment >= 0:
            first = _tag_steps(pr.metrics, 0, "min") if pr.metrics.num_rows else {}
            rewind = any(tag in fs.tag_last and step <= fs.tag_last[tag] for tag, step in first.items())
            shift = fs.last_segment + (1 if rewind else 0)
        if pr.metrics.num_rows:
            fs.metrics.append(_with_source(pr.metrics, rel, shift))
            seg, step = _last(pr.metrics)
            last_tags = _tag_steps(pr.metrics, seg, "max")
            if seg == 0 and shift == fs.last_segment:
                fs.tag_last.update(last_tags)
            else:
                fs.tag_last = last_tags
            fs.last_segment, fs.last_step = seg + shift, step
        if pr.events.num_rows:
            fs.events.append(_with_source(pr.events, rel, shift))
        for s in pr.skipped:
            fs.skipped.append(type(s)(s.what.replace(path.name, rel, 1) if s.what.startswith(path.name) else s.what,
                                      s.reason))
        for k, v in pr.meta.items():
            if k not in fs.meta:
                fs.meta[k] = v

    @staticmethod
    def _result(fs: FileState, rel: str) -> ParseResult:
        if len(fs.metrics) > 1:
            fs.metrics = [pa.concat_tables(fs.metrics, promote_options="permissive")]
        if len(fs.events) > 1:
            fs.events = [pa.concat_tables(fs.events, promote_options="permissive")]
        meta = dict(fs.meta)
        if fs.fmt == "textlog" or "segments" in meta:
            meta["segments"] = fs.last_segment + 1 if fs.last_segment >= 0 else meta.get("segments", 1)
        return ParseResult(format=fs.fmt, path=rel, metrics=fs.metrics[0], events=fs.events[0], meta=meta,
                           skipped=tuple(fs.skipped), precision=fs.precision)
