"""Byte scans of a block for :mod:`parsers._jsonl_stage` (numpy and ``bytes`` methods, no Python loop per line).

:func:`_scan` finds the lines and those polars may read (one ``==`` and one ``flatnonzero`` over the
bytes, then a few gathers per line, ``memchr`` searches for the per-line tokens and an ASCII test);
:func:`_deep_lines` counts brackets only before a read that infers; :func:`_count` and
:func:`_key_counts` count ``:`` for the key check; :func:`_join` joins some lines of a block.
"""

from __future__ import annotations

import numpy as np

# lines polars cannot read exactly, by their first byte: NaN/Infinity (refused), lone surrogates (misread);
# a null polars reads as a missing key, which the key count then finds
_PER_LINE = ((b"N", (b"NaN",)), (b"I", (b"Infinity",)), (b"\\", (b"\\ud", b"\\uD")))
_LEAD_WALK = 64  # hits of a token's first byte walked one by one before the token itself is searched for
_MAX_BRACKETS = 64  # a line with more '{' and '[' goes per line: deep nesting crashes polars' reader (stack)


_LONG_LINE = 1024  # bytes: lines this long on average are found by a byte search per line (memchr)
_SAMPLE = 1 << 18  # bytes at the start of a block whose newlines estimate its line length
_FEW_LINES = 1024  # at most this many lines have their brackets counted one by one (else one numpy pass)
_PIECE = 1 << 18  # bytes compared at a time by the numpy passes (their bool output stays in the CPU cache)


def _newlines(buf: bytes, arr: np.ndarray, work: np.ndarray) -> np.ndarray:
    """int64 offsets of the newlines of ``buf`` (``arr``: its bytes; ``work``: bool[len(buf)]).

    Short lines: one numpy ``==`` and ``flatnonzero`` over the bytes; long ones (a wide trainer log of
    50+ metrics a line, :data:`_LONG_LINE`): one ``bytes.find`` per line, which skips most bytes
    at memchr speed (2.5x faster there, 1.6x slower on 250-byte lines). Lines that turn short after the
    sample (more than 4x the lines expected) send the rest of the block to numpy.
    """
    if buf.count(b"\n", 0, _SAMPLE) * _LONG_LINE > min(len(buf), _SAMPLE):
        return _newlines_from(arr, 0, work)
    out: list[int] = []
    add, find = out.append, buf.find
    at = find(b"\n")
    for _ in range(4 * len(buf) // _LONG_LINE + 16):
        if at < 0:
            break
        add(at)
        at = find(b"\n", at + 1)
    found = np.array(out, np.int64)
    return found if at < 0 else np.concatenate([found, _newlines_from(arr, at, work)])


def _newlines_from(arr: np.ndarray, start: int, work: np.ndarray) -> np.ndarray:
    """int64 offsets of the newlines in ``arr[start:]``, by numpy in pieces (the ``==`` output stays in cache)."""
    pieces = [np.flatnonzero(np.equal(arr[lo:lo + _PIECE], 10, out=work[:min(_PIECE, len(arr) - lo)])) + lo
              for lo in range(start, len(arr), _PIECE)]
    return np.concatenate(pieces) if pieces else np.zeros(0, np.int64)


def _scan(buf: bytes, work: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    r"""Find the lines of ``buf`` (which ends with ``b"\n"``) that polars may read.

    Returns:
        int64 ``starts`` and ``ends`` (the newline's offset) per line, bool ``plain`` (valid UTF-8, starts
        with ``{``, ends with ``}`` before an optional ``\r``, holds none of the per-line tokens).
        ``work`` is a bool work array as long as ``buf``. Nesting is checked only where polars infers a
        schema (:func:`_deep_lines`).
    """
    arr = np.frombuffer(buf, np.uint8)
    ends = _newlines(buf, arr, work)
    starts = np.empty_like(ends)
    starts[:1] = 0
    starts[1:] = ends[:-1] + 1
    last = arr[ends - 1]  # ends - 1 >= -1 (wraps to the last newline): masked by the length test
    cr = last == 13
    if cr.any():
        last = np.where(cr, arr[np.maximum(ends - 2, 0)], last)
    plain = (ends - starts - cr >= 2) & (arr[starts] == 0x7B) & (last == 0x7D)
    for lead, tokens in _PER_LINE:
        _token_lines(buf, ends, plain, lead, tokens)
    if not buf.isascii():
        try:
            buf.decode()
        except UnicodeDecodeError:  # polars refuses a block with invalid UTF-8: find the lines
            for li in np.unique(np.searchsorted(ends, np.flatnonzero(arr >= 0x80))).tolist():
                try:
                    buf[starts[li]:ends[li]].decode()
                except UnicodeDecodeError:
                    plain[li] = False
    return starts, ends, plain


def _deep_lines(buf: bytes, starts: np.ndarray, ends: np.ndarray, idx: np.ndarray, work: np.ndarray) -> np.ndarray:
    """Per line ``idx`` of ``buf`` (bool): it holds more than :data:`_MAX_BRACKETS` ``{`` and ``[``.

    polars overflows its stack (a segfault) when it infers the type of an object nested ~500 deep; read
    with a given schema it does not recurse into the values (a deep value is refused, or read as null
    and then left out by the key count). So only the lines of a read that infers are checked.
    ``work``: bool[len(buf)] (up to :data:`_FEW_LINES` lines are counted one by one).
    """
    if len(idx) <= _FEW_LINES:
        return np.array([buf.count(b"{", a, b) + buf.count(b"[", a, b) > _MAX_BRACKETS
                         for a, b in zip(starts[idx].tolist(), ends[idx].tolist(), strict=True)], bool)
    arr = np.frombuffer(buf, np.uint8)
    low = work[:len(arr)].view(np.uint8)
    np.bitwise_and(arr, 0xDF, out=low)  # x & 0xDF is 0x5B exactly for '[' (0x5B) and '{' (0x7B)
    at = np.flatnonzero(np.equal(low, 0x5B, out=low.view(bool)))
    per_line = np.bincount(np.searchsorted(ends, at), minlength=len(ends))
    return per_line[idx] > _MAX_BRACKETS


def _count(data: bytes, byte: int, work: np.ndarray) -> int:
    """How many times ``byte`` occurs in ``data`` (``work``: a bool work array).

    By pieces of :data:`_PIECE` bytes: the comparison's output stays in the CPU cache (1.5x faster
    than one pass over a 16 MiB block).
    """
    arr, total = np.frombuffer(data, np.uint8), 0
    for lo in range(0, len(arr), _PIECE):
        piece = arr[lo:lo + _PIECE]
        total += int(np.count_nonzero(np.equal(piece, byte, out=work[:len(piece)])))
    return total


def _token_lines(buf: bytes, ends: np.ndarray, plain: np.ndarray, lead: bytes, tokens: tuple[bytes, ...]) -> None:
    """Clear ``plain`` for the lines of ``buf`` (``ends``: newline offsets) holding one of ``tokens``.

    The tokens start with the byte ``lead``, which is rare in metric logs: its hits are walked with a byte
    search (memchr); after :data:`_LEAD_WALK` hits that start no token, each token is searched for instead.
    """
    at, misses = buf.find(lead), 0
    while at >= 0 and misses < _LEAD_WALK:
        if buf.startswith(tokens, at):
            li = int(np.searchsorted(ends, at))
            plain[li] = False
            at = int(ends[li])
        else:
            misses += 1
        at = buf.find(lead, at + 1)
    if at < 0:
        return
    for token in tokens:
        hit = buf.find(token, at)
        while hit >= 0:
            li = int(np.searchsorted(ends, hit))
            plain[li] = False
            hit = buf.find(token, int(ends[li]) + 1)


def _key_counts(buf: bytes, ends: np.ndarray, work: np.ndarray) -> np.ndarray:
    """int64 per line of ``buf``: how many keys it holds, or -1 where that cannot be told by bytes.

    A key ends with ``":`` unless whitespace comes between, so the count of ``":`` is at least the
    count of keys in a line where no ``"`` is followed by whitespace; such lines get -1 (``work``:
    bool[len(buf)]).
    """
    arr = np.frombuffer(buf, np.uint8)
    hit = work
    np.equal(arr, 0x3A, out=hit)
    colon = np.flatnonzero(hit)
    colon = colon[arr[colon - 1] == 0x22]  # a ':' at offset 0 looks at the last byte, a newline
    counts = np.diff(np.searchsorted(colon, ends), prepend=0)
    np.equal(arr, 0x20, out=hit)
    hit |= arr == 0x09
    hit |= arr == 0x0D
    space = np.flatnonzero(hit)
    space = space[arr[space - 1] == 0x22]
    counts[np.searchsorted(ends, space)] = -1
    return counts


def _join(buf: bytes, starts: np.ndarray, ends: np.ndarray, idx: np.ndarray) -> bytes:
    """The lines ``idx`` (sorted 0-based line indices) of ``buf``, each with its newline."""
    if len(idx) == len(ends):
        return buf
    cuts = np.flatnonzero(np.diff(idx) != 1)
    first, last = idx[np.r_[0, cuts + 1]], idx[np.r_[cuts, len(idx) - 1]]
    view = memoryview(buf)
    return b"".join([view[a:b] for a, b in zip(starts[first].tolist(), (ends[last] + 1).tolist(), strict=True)])
