"""Opening log files the same way in every parser: gzip-compressed copies read transparently.

Teams compress old logs (``train.log.gz``, ``history.csv.gz``); a parser sees the same lines
either way. A gzip stream cut short raises ``EOFError``/``OSError`` while reading, which the
parsers already treat as a truncated tail.
"""

from __future__ import annotations

import contextvars
import gzip
import stat
from pathlib import Path
from typing import IO


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


def open_binary(path: Path) -> IO[bytes]:
    """Open for reading bytes, decompressing ``.gz`` files."""
    if path.name.lower().endswith(".gz"):
        return gzip.open(path, "rb")  # type: ignore[return-value]
    return open(path, "rb")  # noqa: SIM115 - the caller closes it


def open_text(path: Path) -> IO[str]:
    """Open for reading text as the parsers do, decompressing ``.gz`` files.

    UTF-8 with the BOM stripped, bad bytes replaced, no newline translation.
    """
    if path.name.lower().endswith(".gz"):
        return gzip.open(path, "rt", encoding="utf-8-sig", errors="replace", newline="")  # type: ignore[return-value]
    return open(path, encoding="utf-8-sig", errors="replace", newline="")  # noqa: SIM115 - the caller closes it


STEP_KEY: contextvars.ContextVar[str | None] = contextvars.ContextVar("forensics_step_key", default=None)
"""The step column the user named (``forensics.toml`` ``step_key``), set by :func:`parsers.discover.load_run`
while it reads a run; table readers prefer it to their rules."""
