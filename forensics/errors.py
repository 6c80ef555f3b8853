"""The project's one error hierarchy.

Every message starts with the path it concerns, so the CLI can print it as one line.
"""

from __future__ import annotations

from pathlib import Path


class ForensicsError(Exception):
    """Base class of every error the project raises on purpose.

    Args:
        path: The file or folder the error concerns (may be ``None``).
        message: What went wrong, for a person, without the path.
    """

    def __init__(self, path: str | Path | None, message: str) -> None:
        self.path = None if path is None else str(path)
        self.message = message
        super().__init__(f"{self.path}: {message}" if self.path else message)


class InputError(ForensicsError):
    """The input cannot be analysed at all: missing path, empty folder, no logs (CLI exit 2)."""


class ParseError(ForensicsError):
    """A file could not be parsed; parsers raise it only when nothing in the file is usable."""
