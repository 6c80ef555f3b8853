r"""Text damage that a crashed node or another platform leaves, for the text readers: NUL blocks and UTF-16.

A node that crashes or loses power after a file's size was updated but before its data reached the disk leaves
blocks of NUL bytes (ext4/XFS delayed allocation): at the end of the file (a NUL-filled tail) or, when later
writes did land, in the middle. The complete lines around them are still the log. Windows PowerShell 5's
``python train.py > train.log`` writes UTF-16 with a byte-order mark; the text inside is an ordinary log.
"""

from __future__ import annotations

import re

from forensics.model import Skip

UTF16_BOMS = (b"\xff\xfe", b"\xfe\xff")
"""The byte-order marks of UTF-16 (little-, big-endian); Python's ``utf-16`` codec reads either and drops it."""
_NULS = re.compile("\0+")
_TEXT_CONTROLS = frozenset(b"\t\n\r\x0c\x1b")
MIN_NUL_RUN = 16
"""A NUL region of a crashed writer is whole unwritten blocks (512 B and more); a text file with NUL runs no
shorter than this and only text bytes elsewhere is a damaged log, not a binary file (our choice: binary formats
scatter short NUL runs among non-text bytes)."""


def head_text(head: bytes) -> bytes | None:
    """The first bytes of a file as UTF-8 text for a sniffer, or ``None`` when they are not text.

    UTF-16 with a BOM is re-encoded as UTF-8; NUL runs of a crashed writer (:data:`MIN_NUL_RUN` or longer) are
    removed when every other byte is text; a head with any other NUL is binary (``None``).
    """
    if head[:2] in UTF16_BOMS:
        return head[: len(head) & ~1].decode("utf-16", errors="replace").encode("utf-8")
    if b"\0" not in head:
        return head
    runs = re.findall(rb"\0+", head)
    if any(len(r) < MIN_NUL_RUN for r in runs[:-1]) or (runs and len(runs[-1]) < MIN_NUL_RUN
                                                        and not head.endswith(runs[-1])):
        return None
    rest = re.sub(rb"\0+", b"", head)
    if not rest.strip() or any(b < 0x20 and b not in _TEXT_CONTROLS for b in rest):
        return None
    return rest


def drop_nuls(lines: list[str], lineno: int, rel: str, skipped: list[Skip]) -> list[str]:
    """``lines`` with NUL regions taken out, each listed in ``skipped``; one line out for each line in.

    A line holding NULs keeps what follows its last NUL run (a line written after the hole); text before a NUL run
    is a line cut by the hole and is dropped with it. Line numbers count from ``lineno``.
    """
    out = []
    for i, ln in enumerate(lines):
        if "\0" not in ln:
            out.append(ln)
            continue
        pieces = _NULS.split(ln)
        torn = "".join(pieces[:-1]).strip()
        n = ln.count("\0")
        what = "NUL-filled tail" if not pieces[-1].strip() else "NUL-filled block"
        why = f"{what} of {n} bytes (a crashed writer's unwritten data?)" + (
            f"; the cut line before it dropped: {torn[:80]!r}" if torn else "") + "; the complete lines are read"
        skipped.append(Skip(f"{rel}:{lineno + i}", why))
        out.append(pieces[-1])
    return out
