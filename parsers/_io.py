"""Opening log files the same way in every parser: gzip-compressed copies read transparently.

Teams compress old logs (``train.log.gz``, ``history.csv.gz``); a parser sees the same lines
either way. A gzip stream cut short raises ``EOFError``/``OSError`` while reading, which the
parsers already treat as a truncated tail.
"""

from __future__ import annotations

import gzip
from pathlib import Path
from typing import IO


def logical_name(path: Path) -> str:
    """The file name without a trailing ``.gz`` (``train.log.gz`` -> ``train.log``), lower-cased."""
    name = path.name.lower()
    return name[:-3] if name.endswith(".gz") else name


def logical_suffix(path: Path) -> str:
    """The suffix the content has: ``.log`` for ``train.log.gz``."""
    return Path(logical_name(path)).suffix


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
