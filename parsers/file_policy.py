"""The one file-access policy of every reader and side reader (issue 16).

A run folder is untrusted input. Before any file is opened it must pass :func:`why_not`:

- a **regular file** (``os.stat``, never opened to find out): no FIFO (opening blocks), no device
  (``/dev/zero`` never ends), no socket;
- nothing under ``/proc``, ``/sys`` or ``/dev`` (``/proc/kmsg`` and ``/proc/self/environ`` are
  "regular files" that never end or hold the environment), whatever symlink leads there;
- inside the run folder: a symlink that leads out of it is not followed unless the user asked for
  it (``--follow-symlinks``; :func:`follow_symlinks`, or ``FORENSICS_FOLLOW_SYMLINKS=1`` for worker
  processes).

:func:`scope` sets the run folder for the readers of one run (``parsers.discover.load_run`` does).
:func:`open_file` checks, opens with ``O_NONBLOCK`` (a file swapped for a FIFO after the check does
not block) and checks the opened descriptor again. :func:`read_bytes` / :func:`read_text` add a byte
budget. :func:`display` keeps names that are not valid UTF-8 (or carry lone surrogates or control
characters) by escaping them, so no writer crashes on them and no name forges an output line.
"""

from __future__ import annotations

import contextlib
import contextvars
import io
import os
import stat
import unicodedata
from collections.abc import Iterator
from pathlib import Path
from typing import IO

SYSTEM_TREES = ("/proc", "/sys", "/dev")
"""Trees never read, whatever symlink points there."""
OUTSIDE = "symlink leads out of the run folder: not followed (pass --follow-symlinks to read it)"
SYSTEM = "leads into {tree}: not read"

_ROOT: contextvars.ContextVar[str | None] = contextvars.ContextVar("forensics_run_root", default=None)
_FOLLOW: contextvars.ContextVar[bool | None] = contextvars.ContextVar("forensics_follow_symlinks", default=None)


class Refused(OSError):
    """A file the policy does not let a reader open (``strerror`` says why; ``filename`` names it)."""

    def __init__(self, path: str | os.PathLike[str], why: str) -> None:
        super().__init__(0, why, os.fspath(path))


def following() -> bool:
    """Whether symlinks out of the run folder are followed (``--follow-symlinks``)."""
    v = _FOLLOW.get()
    if v is None:
        return os.environ.get("FORENSICS_FOLLOW_SYMLINKS", "") not in ("", "0")
    return v


@contextlib.contextmanager
def follow_symlinks(on: bool | None = True) -> Iterator[None]:
    """Follow (or not) symlinks that lead out of the run folder, within this block (None: the environment decides)."""
    tok = _FOLLOW.set(on)
    try:
        yield
    finally:
        _FOLLOW.reset(tok)


@contextlib.contextmanager
def scope(root: str | os.PathLike[str]) -> Iterator[str]:
    """Readers in this block belong to the run folder ``root`` (its real path is what they may not leave)."""
    real = os.path.realpath(root)
    tok = _ROOT.set(real)
    try:
        yield real
    finally:
        _ROOT.reset(tok)


def _under(path: str, top: str) -> bool:
    return path == top or path.startswith(top.rstrip("/") + "/")


def why_not(path: str | os.PathLike[str], root: str | os.PathLike[str] | None = None, *,
            folder: bool = False) -> str | None:
    """Why ``path`` may not be read (``None``: it may). Never opens anything.

    Args:
        path: A file (or, with ``folder``, a folder to walk into).
        root: The run folder; default: the one of the current :func:`scope` (none: no containment check).
        folder: Accept a folder instead of a regular file.

    Returns:
        A reason for ``skipped`` (``"not a regular file (FIFO): not read"``, :data:`OUTSIDE`, ...) or ``None``.
    """
    p = os.fspath(path)
    link = os.path.islink(p)
    try:
        mode = os.stat(p).st_mode
    except FileNotFoundError:
        return "dangling symlink: target missing" if link else "no such file"
    except PermissionError:
        return "permission denied: not read"
    except OSError as exc:
        return f"cannot stat ({exc.strerror or exc}): not read"
    if folder and stat.S_ISDIR(mode):
        pass
    elif not stat.S_ISREG(mode):
        kind = ("folder" if stat.S_ISDIR(mode) else "FIFO" if stat.S_ISFIFO(mode) else "socket"
                if stat.S_ISSOCK(mode) else "device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "special file")
        return f"symlink to a {kind}: not read" if link else f"not a regular file ({kind}): not read"
    real = os.path.realpath(p)
    for tree in SYSTEM_TREES:
        if _under(real, tree):
            return SYSTEM.format(tree=tree)
    top = os.path.realpath(root) if root is not None else _ROOT.get()
    if top is not None and not following() and not _under(real, top):
        return OUTSIDE
    return None


def check(path: str | os.PathLike[str], root: str | os.PathLike[str] | None = None) -> None:
    """Raise :class:`Refused` when :func:`why_not` gives a reason."""
    why = why_not(path, root)
    if why:
        raise Refused(path, why)


def is_readable_file(path: str | os.PathLike[str], root: str | os.PathLike[str] | None = None) -> bool:
    """``Path.is_file()`` for side readers: a regular file the policy lets them open."""
    return why_not(path, root) is None


def open_file(path: str | os.PathLike[str], root: str | os.PathLike[str] | None = None) -> IO[bytes]:
    """Open a file for reading bytes after :func:`check`; the descriptor is checked again after opening.

    Raises:
        Refused: The policy does not allow the file (or it was swapped for something else).
        OSError: It cannot be opened.
    """
    check(path, root)
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise Refused(path, "not a regular file: not read")
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_bytes(path: str | os.PathLike[str], limit: int, root: str | os.PathLike[str] | None = None) -> bytes:
    """The whole file, if it is at most ``limit`` bytes.

    Raises:
        Refused: Not allowed by the policy, or larger than ``limit`` bytes (nothing is read then).
    """
    with open_file(path, root) as fh:
        size = os.fstat(fh.fileno()).st_size
        if size > limit:
            raise Refused(path, f"{size} bytes (limit {limit}): not read")
        data = fh.read(limit + 1)
    if len(data) > limit:
        raise Refused(path, f"more than {limit} bytes: not read")
    return data


def read_text(path: str | os.PathLike[str], limit: int, root: str | os.PathLike[str] | None = None,
              encoding: str = "utf-8-sig") -> str:
    """:func:`read_bytes` decoded (bad bytes replaced)."""
    return read_bytes(path, limit, root).decode(encoding, errors="replace")


def open_text(path: str | os.PathLike[str], root: str | os.PathLike[str] | None = None) -> IO[str]:
    """Open for reading text as the parsers do (UTF-8, BOM stripped, bad bytes replaced, no newline translation)."""
    return io.TextIOWrapper(open_file(path, root), encoding="utf-8-sig", errors="replace", newline="")


SPARSE_MIN_BYTES = 64 << 20
"""Files smaller than this are never checked for holes."""


def hole_bytes(path: str | os.PathLike[str]) -> int:
    """Bytes of ``path`` in holes (never written: read as zeros), via ``SEEK_DATA``/``SEEK_HOLE``; 0 if unknown."""
    seek_data, seek_hole = getattr(os, "SEEK_DATA", None), getattr(os, "SEEK_HOLE", None)
    if seek_data is None or seek_hole is None:
        return 0
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError:
        return 0
    try:
        size, pos, data = os.fstat(fd).st_size, 0, 0
        while pos < size:
            try:
                start = os.lseek(fd, pos, seek_data)
            except OSError:  # ENXIO: no data after pos
                break
            end = os.lseek(fd, start, seek_hole)
            data += end - start
            pos = end
        return size - data
    except OSError:
        return 0
    finally:
        os.close(fd)


def sparse_problem(path: str | os.PathLike[str]) -> str | None:
    """Why a binary log is not read: more than half of a file over :data:`SPARSE_MIN_BYTES` is holes.

    A writer never leaves holes in an event file or a W&B transaction log; a sparse file of a few
    GiB (``truncate -s 5G``) would otherwise cost time and memory in proportion to the size it claims.
    """
    try:
        size = os.stat(path).st_size
    except OSError:
        return None
    if size < SPARSE_MIN_BYTES:
        return None
    holes = hole_bytes(path)
    if 2 * holes > size:
        return f"sparse file: {holes} of its {size} bytes are holes (never written, read as zeros): not read"
    return None


def display(name: str) -> str:
    r"""A file name (or any text from a file) made safe to write anywhere, nothing lost.

    Bytes that were not UTF-8 (``surrogateescape``: U+DC80..U+DCFF) become ``\xNN``; other lone
    surrogates ``\uNNNN``; control characters (newline, ESC, DEL, C1) ``\xNN`` too; format characters
    (bidi overrides such as U+202E, zero-width marks) and line separators ``\uNNNN``, so a name shows as
    it is; a backslash stays as it is. The result is valid UTF-8 on one line.
    """
    if name.isprintable() and not any("\ud800" <= c <= "\udfff" for c in name):
        return name
    out = []
    for c in name:
        o = ord(c)
        if 0xDC80 <= o <= 0xDCFF:
            out.append(f"\\x{o - 0xDC00:02x}")
        elif 0xD800 <= o <= 0xDFFF:
            out.append(f"\\u{o:04x}")
        elif o < 0x20 or o == 0x7F or 0x80 <= o < 0xA0:
            out.append(f"\\x{o:02x}")
        elif unicodedata.category(c) in ("Cf", "Zl", "Zp"):  # bidi overrides, zero-width marks, line separators
            out.append(f"\\u{o:04x}")
        else:
            out.append(c)
    return "".join(out)


def no_surrogates(text: str) -> str:
    r"""``text`` with lone surrogates (a JSON ``"\ud800"``) escaped as ``\uXXXX``, everything else kept."""
    if not any("\ud800" <= c <= "\udfff" for c in text):
        return text
    return "".join(f"\\u{ord(c):04x}" if "\ud800" <= c <= "\udfff" else c for c in text)


def rel(path: str | os.PathLike[str], root: str | os.PathLike[str]) -> str:
    """``path`` relative to ``root`` in POSIX form, through :func:`display`."""
    p = Path(path)
    try:
        r = p.relative_to(root).as_posix()
    except ValueError:
        r = p.name
    return display(r)
