"""Atomic outputs: a report, a cache entry or a summary is whole or absent, never cut (issue 16).

Each file is written to a unique temporary file in the same folder (so concurrent audits never share
one and the rename stays on one file system), flushed and ``fsync``-ed, then renamed over the target
(``os.replace``, atomic on POSIX). A killed write leaves only a hidden ``.<name>.*.tmp`` file that no
reader takes for the output; a full disk raises an :class:`OSError` that names the output path.
An output that is a symlink is written through it; one that is a device or a FIFO (``-o /dev/null``,
``-o /dev/stdout``) is written into, never replaced by a regular file.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

_DEFAULT_MODE = 0o666
"""The mode ``open()`` creates files with before the umask (reports are meant to be shared)."""


def _read_umask() -> int:
    """The process umask, read once at import, before any worker thread exists.

    POSIX reads it only by setting and restoring it; doing that later would race with threads creating files.
    """
    mask = os.umask(0)
    os.umask(mask)
    return mask


_UMASK = _read_umask()


def _target(path: str | os.PathLike[str]) -> tuple[Path, bool]:
    """``(where to write, atomically?)`` for an output path.

    A symlink is written through (the link kept, its target replaced), and an existing file that is not a
    regular file (``/dev/null``, ``/dev/stdout``, a FIFO) is written into, never renamed over (a rename would
    replace the device or the pipe with a regular file).
    """
    if str(path) == "":
        raise OSError(errno.EINVAL, "empty output path", "")
    target = Path(path)
    try:
        st = os.stat(target)  # follows symlinks
    except FileNotFoundError:
        return (Path(os.path.realpath(target)) if target.is_symlink() else target), True
    if not stat.S_ISREG(st.st_mode):
        if stat.S_ISDIR(st.st_mode):
            raise OSError(errno.EISDIR, "is a directory (give a file name)", str(target))
        return target, False
    return (Path(os.path.realpath(target)) if target.is_symlink() else target), True


@contextlib.contextmanager
def replacing(path: str | os.PathLike[str]) -> Iterator[Path]:
    """A temporary path beside ``path``, renamed over it when the block ends without an error.

    ``path`` may be a symlink (its target is replaced, the link kept) or an existing device or FIFO
    (``/dev/null``, ``/dev/stdout``): the finished temporary file is then copied into it, never renamed over it.

    Raises:
        OSError: Writing or renaming failed, or ``path`` is empty or a folder; ``filename`` is ``path`` (the
            output, never the temporary file), the temporary file is removed.
    """
    tmp = None
    try:
        target, atomic = _target(path)
        folder = target.parent if atomic else Path(tempfile.gettempdir())
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{target.name}.", suffix=".tmp")
        os.close(fd)
        yield Path(tmp)
        if atomic:
            os.chmod(tmp, _DEFAULT_MODE & ~_UMASK)  # mkstemp makes 0600; an output gets what open() would give
            os.replace(tmp, target)
        else:
            with open(tmp, "rb") as src, open(target, "wb") as dst:  # O_TRUNC is a no-op on a device or FIFO
                shutil.copyfileobj(src, dst, _COPY_CHUNK)
            os.unlink(tmp)
        tmp = None
    except OSError as exc:
        raise OSError(exc.errno, exc.strerror or str(exc), str(path)) from exc
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)


_COPY_CHUNK = 1 << 20
"""Bytes per write when copying a finished output into a device or FIFO."""


def write_text(path: str | os.PathLike[str], text: str, encoding: str = "utf-8") -> None:
    r"""Write ``text`` to ``path`` atomically (unencodable lone surrogates written as ``\udcff`` escapes).

    Raises:
        OSError: Naming ``path`` (a full disk, a read-only folder).
    """
    write_bytes(path, text.encode(encoding, errors="backslashreplace"))


def write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (see :func:`replacing`)."""
    with replacing(path) as tmp:
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())


def write_with(path: str | os.PathLike[str], writer: Callable[[Path], object]) -> None:
    """Let ``writer(tmp)`` write the file (e.g. ``pyarrow.parquet.write_table``), then rename it over ``path``."""
    with replacing(path) as tmp:
        writer(tmp)
