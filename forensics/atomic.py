"""Atomic outputs: a report, a cache entry or a summary is whole or absent, never cut (issue 16).

Each file is written to a unique temporary file in the same folder (so concurrent audits never share
one and the rename stays on one file system), flushed and ``fsync``-ed, then renamed over the target
(``os.replace``, atomic on POSIX). A killed write leaves only a hidden ``.<name>.*.tmp`` file that no
reader takes for the output; a full disk raises an :class:`OSError` that names the output path.
"""

from __future__ import annotations

import contextlib
import os
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


@contextlib.contextmanager
def replacing(path: str | os.PathLike[str]) -> Iterator[Path]:
    """A temporary path beside ``path``, renamed over it when the block ends without an error.

    Raises:
        OSError: Writing or renaming failed; ``filename`` is ``path`` (the output), the temporary
            file is removed.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    os.close(fd)
    try:
        yield Path(tmp)
        os.chmod(tmp, _DEFAULT_MODE & ~_UMASK)  # mkstemp makes 0600; an output gets what open() would give
        os.replace(tmp, target)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise OSError(exc.errno, exc.strerror or str(exc), str(target)) from exc
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


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
