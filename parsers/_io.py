"""Opening log files the same way in every parser: gzip-compressed copies read transparently.

Teams compress old logs (``train.log.gz``, ``history.csv.gz``); a parser sees the same lines
either way. A gzip stream cut short raises ``EOFError``/``OSError`` while reading, which the
parsers already treat as a truncated tail.
"""

from __future__ import annotations

import contextvars
import gzip
import io
import stat
import zlib
from pathlib import Path
from typing import IO, Any


def logical_name(path: Path) -> str:
    """The file name without a trailing ``.gz`` (``train.log.gz`` -> ``train.log``), lower-cased."""
    name = path.name.lower()
    return name[:-3] if name.endswith(".gz") else name


def logical_suffix(path: Path) -> str:
    """The suffix the content has: ``.log`` for ``train.log.gz``."""
    return Path(logical_name(path)).suffix


GZIP_MAGIC = b"\x1f\x8b"
NOT_GZIP = "not gzip data (bad magic bytes): not read"
"""Why a ``*.gz`` file whose first bytes are not the gzip magic is not read."""


def gzip_problem(path: Path) -> str | None:
    """:data:`NOT_GZIP` when ``path`` is named ``*.gz`` but does not start with the gzip magic, else None.

    Only regular files are opened (a FIFO or a device is never opened here); an empty file is not a
    problem (it reads as no lines); a file that cannot be opened is left to the caller (None).
    """
    if not path.name.lower().endswith(".gz"):
        return None
    try:
        if not stat.S_ISREG(path.stat().st_mode):
            return None
        with open(path, "rb") as fh:
            head = fh.read(2)
    except OSError:
        return None
    return None if not head or head == GZIP_MAGIC else NOT_GZIP


MAX_LINE_BYTES = 64 << 20
r"""A line (up to ``\n`` or ``\r``) longer than this is dropped as it streams, before a gzip stream expands it
in memory (a 1 MB ``.gz`` can hold one 1 GB line); real log lines are kilobytes, a tqdm bar ends in ``\r``."""


DROPPED: contextvars.ContextVar[list[tuple[str, int, int]] | None] = contextvars.ContextVar(
    "forensics_dropped_lines", default=None)
"""Where :class:`BoundedLines` reports ``(path, line, bytes)`` of each dropped line (``parsers.discover``
sets a list around each parser and lists them as skipped)."""


class BoundedLines(io.RawIOBase):
    r"""A byte stream that drops every line longer than ``max_line`` bytes (its newline is kept).

    Memory: one pending line of at most ``max_line`` bytes plus a 1 MiB read, whatever the input.
    ``dropped`` lists ``(line number, bytes)`` of the lines dropped (numbered by ``\n``).
    """

    _CHUNK = 1 << 20

    def __init__(self, raw: IO[bytes], max_line: int = MAX_LINE_BYTES, path: str = "", *,
                 keep_error: bool = False) -> None:
        super().__init__()
        self.raw, self.max_line, self.path = raw, max_line, path
        self.keep_error = keep_error  # a read error ends the stream and is kept in ``error`` instead of raised
        self._read = getattr(raw, "read1", raw.read)
        self.error: str | None = None
        self._sink = DROPPED.get()
        self.pending = bytearray()  # the current line, not yet known to end within max_line
        self.out = bytearray()  # bytes ready to hand out
        self.dropping = 0  # > 0: bytes of an overlong line dropped so far (until its end)
        self.eof = False
        self.lines = 0  # "\n" handed out so far
        self.dropped: list[tuple[int, int]] = []

    def readable(self) -> bool:
        return True

    def close(self) -> None:
        try:
            self.raw.close()
        finally:
            super().close()

    def readinto(self, b: Any) -> int:
        while not self.out and not self.eof:
            self._fill()
        n = min(len(b), len(self.out))
        b[:n] = self.out[:n]
        del self.out[:n]
        return n

    def _emit(self, data: bytes | bytearray) -> None:
        self.lines += data.count(b"\n")
        self.out += data

    def _drop(self, n: int) -> None:
        self.dropping += n

    def _note(self, line: int, n: int) -> None:
        self.dropped.append((line, n))
        if self._sink is not None and len(self._sink) < 1000:
            self._sink.append((self.path, line, n))

    def _fill(self) -> None:
        try:
            chunk = self._read(self._CHUNK)  # read1: a read that fails returns no bytes, so none are lost
        except (EOFError, OSError, zlib.error) as exc:  # a gzip stream cut short, a bad block
            if not self.keep_error:
                raise
            self.error, chunk = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__, b""
        if not chunk:
            self.eof = True
            if self.dropping:
                self._note(self.lines + 1, self.dropping)
                self.dropping = 0
            self._emit(self.pending)
            self.pending = bytearray()
            return
        last = max(chunk.rfind(b"\n"), chunk.rfind(b"\r"))
        if last < 0:  # no line end in this chunk: the current line goes on
            if self.dropping:
                self._drop(len(chunk))
            elif len(self.pending) + len(chunk) > self.max_line:
                self._drop(len(self.pending) + len(chunk))
                self.pending = bytearray()
            else:
                self.pending += chunk
            return
        first = min(i for i in (chunk.find(b"\n"), chunk.find(b"\r")) if i >= 0)
        if self.dropping or len(self.pending) + first > self.max_line:
            self._note(self.lines + 1, self.dropping + len(self.pending) + first)
            self.dropping, self.pending = 0, bytearray()
            self._emit(chunk[first:last + 1])  # the overlong line's end: its newline keeps the numbering
        else:
            self._emit(self.pending)
            self._emit(chunk[:last + 1])
            self.pending = bytearray()
        self.pending += chunk[last + 1:]


def open_binary(path: Path, *, bounded: bool = True, keep_error: bool = False) -> IO[bytes]:
    """Open for reading bytes, decompressing ``.gz`` files, through the file-access policy.

    Args:
        path: The file.
        bounded: Drop lines longer than :data:`MAX_LINE_BYTES` as they stream (:class:`BoundedLines`);
            a reader with its own line budget (``parsers.jsonl``) passes False.
        keep_error: (bounded only) a read error (a gzip stream cut short) ends the stream after every byte
            before it, and is kept for :func:`stream_error` instead of raised mid-read.

    Raises:
        OSError: :class:`parsers.file_policy.Refused` when the policy does not allow the file.
    """
    from parsers.file_policy import open_file

    fh: IO[bytes] = open_file(path)
    if path.name.lower().endswith(".gz"):
        gz = gzip.GzipFile(fileobj=fh, mode="rb")
        gz.myfileobj = fh  # closed with it (GzipFile closes only a file it opened itself)
        fh = gz  # type: ignore[assignment]
    if not bounded:
        return fh
    return io.BufferedReader(BoundedLines(fh, path=str(path), keep_error=keep_error))  # type: ignore[return-value]


def stream_error(fh: IO[Any]) -> str | None:
    """The read error that ended a stream of :func:`open_text` / :func:`open_binary` with ``keep_error``, or None."""
    raw = getattr(getattr(fh, "buffer", fh), "raw", None)
    return getattr(raw, "error", None)


MAX_TABLE_BYTES = 256 << 20
"""Bytes (after decompression) a whole-file table reader (CSV/TSV, JSON export, MLflow metric file) reads:
a real export of a million steps is well under it; a 1 MB gzip that expands to gigabytes of short rows
stops here, with a listed skip, instead of taking memory in proportion."""


def read_table_bytes(path: Path, limit: int = MAX_TABLE_BYTES) -> tuple[bytes, str | None]:
    """The bytes of a table file, at most ``limit`` (cut after its last whole line), and why it was cut.

    Returns:
        ``(data, None)`` for a file read whole; ``(data, reason)`` when it was longer than ``limit``.

    Raises:
        OSError: It cannot be opened (see :func:`open_binary`).
    """
    with open_binary(path) as fh:
        data = fh.read(limit + 1)
    if len(data) <= limit:
        return data, None
    cut = data.rfind(b"\n", 0, limit) + 1
    return data[:cut], f"more than {limit >> 20} MiB of table text: only the first {cut} bytes (whole lines) read"


def open_text(path: Path, *, keep_error: bool = False) -> IO[str]:
    """Open for reading text as the parsers do, decompressing ``.gz`` files, lines bounded (:func:`open_binary`).

    UTF-8 with the BOM stripped, bad bytes replaced, no newline translation; UTF-16 when the file starts with its
    byte-order mark (Windows PowerShell 5's ``python train.py > train.log``).
    """
    fh = open_binary(path, keep_error=keep_error)
    bom = fh.peek(2)[:2] if hasattr(fh, "peek") else b""
    encoding = "utf-16" if bom in (b"\xff\xfe", b"\xfe\xff") else "utf-8-sig"
    return io.TextIOWrapper(fh, encoding=encoding, errors="replace", newline="")


STEP_KEY: contextvars.ContextVar[str | None] = contextvars.ContextVar("forensics_step_key", default=None)
"""The step column the user named (``forensics.toml`` ``step_key``), set by :func:`parsers.discover.load_run`
while it reads a run; table readers prefer it to their rules."""
