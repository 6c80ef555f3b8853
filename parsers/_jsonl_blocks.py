"""Blocks of whole lines from a JSONL stream (:mod:`parsers.jsonl`), with a bound on line length.

The stream is read into one reused buffer; a line longer than :data:`MAX_LINE_BYTES` is dropped as its
bytes arrive (so a gzip file holding one 1 GB line costs one buffer, not the line) and listed. A regular
uncompressed file is read block by block with ``os.pread`` up to the last newline of each block (one copy
of the bytes, not two) while its lines are short; its last block and any long line take the stream path.
"""

from __future__ import annotations

import io
import os
import stat
import zlib
from collections.abc import Generator, Iterator
from typing import IO

MAX_LINE_BYTES = 64 << 20
"""A line longer than this is not read (listed; its bytes are dropped as they arrive, so a gzip file
holding one 1 GB line costs one buffer, not the line): real JSONL records are kilobytes."""


def _skip_line(fh: IO[bytes], buf: bytearray) -> tuple[int, int, bool, str | None]:
    """Read on to the end of an overlong line, reusing ``buf``; its bytes are dropped as they arrive.

    Returns:
        ``(bytes dropped, bytes after the newline now at the start of buf, eof, read error)``.
    """
    dropped = 0
    while True:
        try:
            with memoryview(buf) as view:
                got = fh.readinto1(view)  # type: ignore[attr-defined]
        except (EOFError, OSError, zlib.error) as exc:
            return dropped, 0, True, str(exc) or type(exc).__name__
        if not got:
            return dropped, 0, True, None
        nl = buf.find(b"\n", 0, got)
        if nl < 0:
            dropped += got
            continue
        buf[:got - nl - 1] = buf[nl + 1:got]
        return dropped + nl + 1, got - nl - 1, False, None


_PREAD_TAIL = 1 << 16  # bytes at the end of a block searched for its last newline (pread path)


def _preads(fh: IO[bytes], size: int, first: int | None = None) -> Generator[tuple[bytes, bytes, None], None, int]:
    """The first blocks of whole lines of a regular uncompressed file, one ``os.pread`` each; returns how many.

    The blocks are yielded as :func:`_blocks` yields them; the first one holds about ``first`` bytes (else
    ``size``).

    Stops (with ``fh`` positioned after the last block yielded) before the file's last ``size`` bytes, at a
    block whose last :data:`_PREAD_TAIL` bytes (at most half the block) hold no newline, or when ``fh`` is
    no plain file.
    """
    if type(fh) is not io.BufferedReader or type(fh.raw) is not io.FileIO or size < 2:
        return 0
    want = min(first or size, size)
    window = min(_PREAD_TAIL, want // 2)
    try:
        fd, pos = fh.fileno(), fh.tell()
        end = os.fstat(fd)
    except OSError:
        return 0
    if not stat.S_ISREG(end.st_mode):
        return 0
    count = 0
    try:
        while want >= 2 and pos + want + size <= end.st_size:
            cut = os.pread(fd, window, pos + want - window).rfind(b"\n") + 1
            if not cut:
                break
            n = want - window + cut
            data = os.pread(fd, n, pos)
            if len(data) != n or data[-1:] != b"\n":  # the file changed under us: the stream path goes on
                break
            pos, count = pos + n, count + 1
            yield data, b"", None
            want, window = size, min(_PREAD_TAIL, size // 2)
    except OSError:
        pass
    fh.seek(pos)
    return count


def _blocks(fh: IO[bytes], size: int, long_lines: list[tuple[int, int]] | None = None,
            max_line: int | None = None, first: int | None = None) -> Iterator[tuple[bytes, bytes, str | None]]:
    r"""Read ``fh`` in blocks of whole lines (into one reused buffer; one copy per block).

    ``first``: about the bytes of the first block of a plain file (default ``size``; small: a pipeline starts soon).

    The buffer starts at 64 KiB and doubles up to ``size`` (small files stay cheap), and beyond it only
    for a line longer than ``size``, up to ``max_line`` (:data:`MAX_LINE_BYTES`): a longer line is read
    on and dropped as its bytes arrive (before a gzip stream expands it in memory), yielded as an empty
    line (line numbers stay right) and listed in ``long_lines`` as ``(block index, bytes)``: the
    dropped line is the first line of that block (the caller, which counts lines anyway, numbers it;
    counting here too cost a fifth of the read).

    Yields:
        ``(lines, tail, error)``: ``lines`` ends with ``b"\n"`` (or is empty); ``tail`` is non-empty only
        in the last block: the bytes after the last newline (a last line without one); ``error`` is the
        message of a read error (a gzip stream cut short) in the last block, else None.
    """
    yielded = yield from _preads(fh, size, first)  # blocks yielded so far
    buf = bytearray(min(size, 1 << 16))
    limit = size
    max_line = MAX_LINE_BYTES if max_line is None else max_line
    n = 0  # bytes held in buf (the first ones: the cut line of the last block)
    while True:
        error, eof = None, False
        try:
            while True:
                if n == len(buf):
                    if len(buf) >= limit:
                        break
                    buf += bytes(min(len(buf), limit - len(buf)))
                with memoryview(buf) as view:
                    got = fh.readinto1(view[n:])  # type: ignore[attr-defined]
                if not got:
                    eof = True
                    break
                n += got
        except (EOFError, OSError, zlib.error) as exc:
            error, eof = str(exc) or type(exc).__name__, True
        cut = buf.rfind(b"\n", 0, n) + 1
        if not eof and not cut and n >= max_line:
            dropped, rest, eof, error = _skip_line(fh, buf)
            if long_lines is not None:
                long_lines.append((yielded, n + dropped))
            if eof:
                yield b"", b"", error
                return
            yield b"\n", b"", None
            yielded, n, limit = yielded + 1, rest, size
            continue
        with memoryview(buf) as view:
            if eof:
                yield bytes(view[:cut]), bytes(view[cut:n]), error
                return
            if cut:
                yield bytes(view[:cut]), b"", None
                yielded += 1
                buf[:n - cut] = view[cut:n]
        n -= cut
        limit = size if cut else 2 * limit  # a line longer than the block: read on until it ends
