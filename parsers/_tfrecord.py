"""Vectorised TFRecord framing for :mod:`parsers.tensorboard` (numpy; the file read in bounded windows).

A TensorBoard event file is a sequence of TFRecord frames
``uint64 length | uint32 masked_crc32c(length) | payload | uint32 masked_crc32c(payload)``
(``docs/formats.md#tensorboard``). :func:`walk` reads the file in windows of :data:`WINDOW` bytes
(one reused buffer: memory stays bounded whatever the file size, nothing is memory-mapped) and, per
window, finds the chain of frames with whole-array operations:

1. every offset whose bytes 3..7 are zero could start a header of a record under 16 MiB (the
   guess, a superset of the real headers, computed in cache-sized blocks); the chain is followed
   through the guess from the window's first frame, one exact header read in Python where a frame
   is missing from it;
2. the length CRCs of the chain are checked exactly: one ``crc32c`` call per distinct length;
3. the payload CRCs are checked in one running ``crc32c`` over a copy of the window (made in
   cache-sized blocks) where each stored CRC is replaced by ``unmask(stored) ^ crc32c(zeros(len))``
   (and each header's length CRC likewise, those being checked in step 2). CRC-32C is affine, so the
   copy's CRC equals that of as many zero bytes exactly when every record's CRC holds (an error
   in one record always shows; two bad records could only cancel with odds of 2**-32); a window
   that fails is checked again by chunks and then record by record, so each bad record is found.

The first frame whose framing is bad stops the chain; the caller's exact handler lists the damage
and resynchronises (:func:`resync`, also windowed). CRC-32C: ``crc32c`` (hardware), masked as in
TensorFlow's ``tensorflow/core/lib/hash/crc32c.h``: ``((c >> 15) | (c << 17)) + 0xA282EAD8``.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator
from typing import BinaryIO

import crc32c
import numpy as np

WINDOW = 4 << 20  # bytes read per window (the buffer is reused; a longer record grows it to fit; 4 MiB: its
# per-frame arrays stay near the CPU cache, measured faster than 32 MiB on the 1M-point benchmark)
SEARCH = 4 << 20  # bytes per step of a resynchronisation search (its temporaries: a few times this)
PAD = 16  # zero bytes after a window's data: fixed-width reads near its end stay inside the buffer
MAX_GUESS = 1 << 24  # records of at least this many bytes are never in the guess (an exact step reads them)
CHUNK = 1024  # records per sub-check when a window's aggregated payload CRC fails
GUESS_BLOCK = 1 << 17  # offsets per block of the header guess (its temporaries stay in the CPU cache)
CRC_BLOCK = 4096  # frames per block of the aggregated payload CRC check (its patched copy stays in the cache)
CRC_BYTES = 1 << 18  # ... and at most this many bytes per block, unless one frame is longer
SCRATCH = max(2 * GUESS_BLOCK + 32, CRC_BYTES)  # bytes of the scratch buffer both reuse
_HEADER = struct.Struct("<QI")
_ZEROS = bytes(1 << 20)
_zero_crc: dict[int, int] = {}


def mask(c: np.ndarray | int) -> np.ndarray | int:
    """TFRecord's masking of a CRC-32C (uint32 array or int)."""
    if isinstance(c, np.ndarray):
        c = c.astype(np.uint32)
        return ((c >> np.uint32(15)) | (c << np.uint32(17))) + np.uint32(0xA282EAD8)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def unmask(m: np.ndarray) -> np.ndarray:
    """Inverse of :func:`mask` (uint32 array)."""
    r = m.astype(np.uint32) - np.uint32(0xA282EAD8)
    return (r >> np.uint32(17)) | (r << np.uint32(15))


def zero_crc(n: int) -> int:
    """CRC-32C (unmasked) of ``n`` zero bytes (cached)."""
    c = _zero_crc.get(n)
    if c is None:
        c, left = 0, n
        while left:
            k = min(left, len(_ZEROS))
            c, left = crc32c.crc32c(memoryview(_ZEROS)[:k], c), left - k
        if len(_zero_crc) < 4096:
            _zero_crc[n] = c
    return c


def rows(buf: np.ndarray, at: np.ndarray, width: int) -> np.ndarray:
    """``buf[at[i]:at[i]+width]`` for every i, as a (len(at), width) uint8 array (needs ``width`` of padding).

    Gathered as one ``width``-byte item per row (a strided view of ``buf``, which must be contiguous).
    """
    view = np.ndarray((len(buf) - width + 1,), np.dtype((np.void, width)), buffer=buf, strides=(1,))
    return view[at].view(np.uint8).reshape(len(at), width)


def put_u32(buf: np.ndarray, at: np.ndarray, values: np.ndarray) -> None:
    """Write ``values`` (uint32, little-endian) at each offset of ``buf`` (contiguous; offsets 4+ bytes apart)."""
    view = np.ndarray((len(buf) - 3,), np.dtype((np.void, 4)), buffer=buf, strides=(1,))
    view[at] = values.astype("<u4").view(np.dtype((np.void, 4)))


def u32(buf: np.ndarray, at: np.ndarray) -> np.ndarray:
    """Little-endian uint32 at each offset."""
    return rows(buf, at, 4).view("<u4").ravel()


def f64(buf: np.ndarray, at: np.ndarray) -> np.ndarray:
    """Little-endian float64 at each offset."""
    return rows(buf, at, 8).view("<f8").ravel()


def f32(buf: np.ndarray, at: np.ndarray) -> np.ndarray:
    """Little-endian float32 at each offset."""
    return rows(buf, at, 4).view("<f4").ravel()


def _guess(buf: np.ndarray, n: int, scratch: np.ndarray | None = None) -> np.ndarray:
    """Offsets in ``[0, n - 12]`` that may start a header of a record under :data:`MAX_GUESS` bytes.

    Bytes 3..7 of such a header are zero; of a run of such offsets only the last is kept (a header's
    length bytes end where its CRC starts; when that CRC starts with a zero byte, an exact step reads it).
    Computed in blocks of :data:`GUESS_BLOCK` offsets, so that the temporaries stay in the CPU cache.
    """
    if n < 12:
        return np.empty(0, np.int64)
    m = n - 11
    width = min(GUESS_BLOCK, m) + 3
    scratch = np.empty(2 * width, np.uint8) if scratch is None or len(scratch) < 2 * width else scratch
    out = []
    for q0 in range(0, m, GUESS_BLOCK):
        k = min(GUESS_BLOCK, m - q0) + (q0 + GUESS_BLOCK < m)  # offsets q0 .. q0+k-1 (one more but at the end)
        two = np.bitwise_or(buf[q0 + 3:q0 + k + 5], buf[q0 + 4:q0 + k + 6], out=scratch[:k + 2])
        four = np.bitwise_or(two[:k], two[2:k + 2], out=scratch[width:width + k])  # bytes q+3 .. q+6
        np.bitwise_or(four, buf[q0 + 7:q0 + k + 7], out=four)
        zero = np.equal(four, 0, out=two[:k].view(bool))  # bytes q+3..q+7 are zero
        last = np.flatnonzero(np.greater(zero[:-1], zero[1:], out=four[:k - 1].view(bool)))  # ... and not at q+1
        out.append(last + q0)
        if q0 + GUESS_BLOCK >= m and zero[k - 1]:
            out.append(np.array([m - 1], np.int64))
    return np.concatenate(out)


def _pruned(g: np.ndarray, gnext: np.ndarray, n: int, rounds: int = 2) -> np.ndarray:
    """Mask of the guesses that the frame before them points at (or that start the window), ``rounds`` times."""
    keep = np.ones(len(g), bool)
    hit = np.zeros(n + 1, bool)
    for _ in range(rounds):
        hit[:] = False
        hit[np.minimum(gnext[keep], n)] = True
        hit[0] = True
        keep = hit[g]
    return keep


def _follow(buf: np.ndarray, n: int, eof: bool, check_crc: bool, max_record: int,
            scratch: np.ndarray | None = None) -> tuple[np.ndarray, int, bool]:
    """Frames from offset 0 of the window: (header offsets, where the chain stopped, stopped at damage).

    The chain stops at the window's end (a frame that does not fit: the next window starts there)
    or at a header that cannot be followed (``damage``; at the end of the file a frame cut short is
    damage too).
    """
    g = _guess(buf, n, scratch)
    glen = u32(buf, g).astype(np.int64)
    if max_record < MAX_GUESS:
        g, glen = g[glen <= max_record], glen[glen <= max_record]
    gnext = g + 16 + glen
    breaks = np.flatnonzero(gnext[:-1] != g[1:])
    if len(breaks) > len(g) // 64:  # many zero runs inside payloads: keep the guesses a frame points at
        keep = _pruned(g, gnext, n)
        g, gnext = g[keep], gnext[keep]
        breaks = np.flatnonzero(gnext[:-1] != g[1:])
    out: list[np.ndarray] = []
    pos = 0
    while pos < n:
        if n - pos < 12:
            return _cat(out), pos, eof
        i = int(np.searchsorted(g, pos))
        if i < len(g) and g[i] == pos:
            b = np.searchsorted(breaks, i)
            j = int(breaks[b]) if b < len(breaks) else len(g) - 1
            cut = int(np.searchsorted(gnext[i:j + 1], n, "right"))  # frames that end inside the window
            if cut:
                out.append(g[i:i + cut])
                pos = int(gnext[i + cut - 1])
            if cut < j - i + 1 or not cut:  # the next frame runs past the window
                return _cat(out), pos, eof and pos < n
            continue
        length, lcrc = _HEADER.unpack_from(buf, pos)
        if length > max_record or (check_crc and mask(crc32c.crc32c(buf[pos:pos + 8])) != lcrc):
            return _cat(out), pos, True
        if pos + 16 + length > n:
            return _cat(out), pos, eof
        out.append(np.array([pos], np.int64))
        pos += 16 + length
    return _cat(out), pos, False


def _cat(parts: list[np.ndarray]) -> np.ndarray:
    return np.concatenate(parts) if parts else np.empty(0, np.int64)


def _length_crc_ok(buf: np.ndarray, at: np.ndarray, length: np.ndarray, lcrc: np.ndarray | None = None,
                   ) -> np.ndarray:
    """Exact check of every header's length CRC (one ``crc32c`` call per distinct length)."""
    lcrc = u32(buf, at + 8) if lcrc is None else lcrc
    return lcrc == _per_length(length, lambda x: mask(crc32c.crc32c(struct.pack("<Q", x))))


def _per_length(length: np.ndarray, fn: Callable[[int], int]) -> np.ndarray:
    """``fn(length[i])`` for every i (uint32), ``fn`` called once per distinct length."""
    if int(length.max(initial=0)) < 1 << 16:
        uniq = np.flatnonzero(np.bincount(length))
        table = np.zeros(int(length.max(initial=0)) + 1, np.uint32)
        table[uniq] = [fn(int(x)) for x in uniq]
        return table[length]
    uniq, inv = np.unique(length, return_inverse=True)
    return np.array([fn(int(x)) for x in uniq], np.uint32)[inv]


def _payload_crc_ok(buf: np.ndarray, at: np.ndarray, length: np.ndarray, lcrc: np.ndarray | None = None,
                    scratch: np.ndarray | None = None) -> np.ndarray:
    """Per frame: does the payload CRC hold? Aggregated (module docstring), exact per frame on failure.

    The patched copy is made :data:`CRC_BLOCK` frames (at most :data:`CRC_BYTES` bytes, or one frame) at
    a time, so that it stays in the CPU cache; each block's CRC continues the previous one.
    """
    ok = np.ones(len(at), bool)
    if not len(at):
        return ok
    end = at + 16 + length
    trail = at + 12 + length
    fix = unmask(u32(buf, trail)) ^ _per_length(length, zero_crc)
    # the headers (their CRCs are checked exactly) contribute what the zero bytes they replace would
    fix_h = unmask(u32(buf, at + 8) if lcrc is None else lcrc) ^ np.uint32(zero_crc(8))
    crc, lo, hi, s = 0, int(at[0]), int(end[-1]), 0
    while s < len(at):
        e = max(s + 1, min(s + CRC_BLOCK, int(np.searchsorted(end, at[s] + CRC_BYTES, "right"))))
        a, b = int(at[s]), int(end[e - 1])
        if scratch is None or len(scratch) < b - a:
            scratch = np.empty(b - a, np.uint8)
        copy = scratch[:b - a]
        copy[:] = buf[a:b]
        put_u32(copy, trail[s:e] - a, fix[s:e])
        put_u32(copy, at[s:e] - a + 8, fix_h[s:e])
        crc, s = crc32c.crc32c(copy, crc), e
    if crc == zero_crc(hi - lo):
        return ok
    return _payload_crc_exact(buf, at, length, fix, fix_h, scratch)


def _payload_crc_exact(buf: np.ndarray, at: np.ndarray, length: np.ndarray, fix: np.ndarray, fix_h: np.ndarray,
                       scratch: np.ndarray | None) -> np.ndarray:
    """Per frame, after an aggregated check failed: chunks of :data:`CHUNK` frames, then frame by frame."""
    ok = np.ones(len(at), bool)
    for s in range(0, len(at), CHUNK):
        e = min(s + CHUNK, len(at))
        a, b = int(at[s]), int(at[e - 1] + 16 + length[e - 1])
        copy = np.array(buf[a:b])
        put_u32(copy, at[s:e] + 12 + length[s:e] - a, fix[s:e])
        put_u32(copy, at[s:e] - a + 8, fix_h[s:e])
        if crc32c.crc32c(copy) == zero_crc(b - a):
            continue
        for k in range(s, e):
            p, n = int(at[k]), int(length[k])
            ok[k] = mask(crc32c.crc32c(buf[p + 12:p + 12 + n])) == struct.unpack_from("<I", buf, p + 12 + n)[0]
    return ok


class Window:
    """One window of the file: ``buf[:n]`` holds bytes ``base..base+n``; its complete frames.

    Attributes:
        base: File offset of ``buf[0]``.
        buf: uint8 array (reused by the next window: copy out what must outlive the callback).
        at: Offsets (in ``buf``) of the frames' headers, int64.
        length: Their payload lengths, int64.
        ok: Their payload CRC holds (all True without CRC checks).
    """

    __slots__ = ("base", "buf", "at", "length", "ok")

    def __init__(self, base: int, buf: np.ndarray, at: np.ndarray, length: np.ndarray, ok: np.ndarray) -> None:
        self.base, self.buf, self.at, self.length, self.ok = base, buf, at, length, ok


def walk(fh: BinaryIO, size: int, check_crc: bool, max_record: int,
         on_damage: Callable[[int], int | None]) -> Iterator[Window]:
    """Yield the frames of the file window by window, in file order.

    Args:
        fh: The file, opened for binary reading.
        size: Its size in bytes.
        check_crc: Verify length and payload CRCs.
        max_record: Longest plausible payload (bytes); longer is damage.
        on_damage: Called with the file offset of a header that cannot be followed (bad length CRC,
            absurd length, a frame cut by the end of the file); returns where to resume, or None to stop.
    """
    buf = np.zeros(min(WINDOW, size) + PAD, np.uint8)
    scratch = np.empty(SCRATCH, np.uint8)  # reused by every window (no fresh pages to fault in)
    pos = 0
    while pos < size:
        n = min(size - pos, len(buf) - PAD)
        fh.seek(pos)
        n = fh.readinto(memoryview(buf)[:n]) or 0
        if n == 0:  # the file shrank while it was read
            return
        buf[n:n + PAD] = 0
        eof = pos + n >= size
        at, stop, damage = _follow(buf, n, eof, check_crc, max_record, scratch)
        if len(at):
            length = np.diff(at, append=stop) - 16  # the frames of a chain are contiguous
            if check_crc:
                lcrc = u32(buf, at + 8)
                good = _length_crc_ok(buf, at, length, lcrc)
                if not good.all():
                    first = int(np.argmin(good))
                    at, length, lcrc, stop, damage = at[:first], length[:first], lcrc[:first], int(at[first]), True
            ok = _payload_crc_ok(buf, at, length, lcrc, scratch) if check_crc else np.ones(len(at), bool)
            yield Window(pos, buf, at, length, ok)
        if damage:
            nxt = on_damage(pos + stop)
            if nxt is None:
                return
            pos = nxt
        elif stop == 0:  # one frame longer than the buffer: grow it to hold that frame
            length = _HEADER.unpack_from(buf, 0)[0]
            buf = np.zeros(16 + length + PAD, np.uint8)
        else:
            pos += stop


def resync(fh: BinaryIO, pos: int, size: int, max_record: int) -> int | None:
    """First offset >= ``pos`` whose 12-byte header has a valid length CRC and fits in the file.

    Windowed and vectorised (bounded memory); a header of 12 zero bytes is never valid, so a run of
    zeros yields candidates only where a non-zero byte enters the 12 bytes.
    """
    while pos + 12 <= size:
        fh.seek(pos)
        data = fh.read(min(SEARCH + 11, size - pos))
        n = len(data)
        if n < 12:
            return None
        buf = np.frombuffer(data, np.uint8)
        m = n - 11
        two = buf[:-1] | buf[1:]  # two[j]: bytes j..j+1
        four = two[:-2] | two[2:]  # j..j+3
        head = (four[:m] | four[4:m + 4]) | four[8:m + 8]  # j..j+11
        cand = np.flatnonzero((four[4:m + 4] == 0) & (head != 0))
        del two, head
        if len(cand):
            pad = np.frombuffer(data[int(cand[0]):int(cand[-1]) + 12] + bytes(PAD), np.uint8)
            rel = cand - cand[0]
            length = u32(pad, rel).astype(np.int64)
            fit = (length <= max_record) & (pos + cand + 16 + length <= size)
            cand, rel, length = cand[fit], rel[fit], length[fit]
            if len(cand):
                good = _length_crc_ok(pad, rel, length)
                if good.any():
                    return pos + int(cand[np.argmax(good)])
        pos += m
    return None


def all_zero(fh: BinaryIO, pos: int, size: int) -> bool:
    """True when every byte from ``pos`` to ``size`` is zero (read a window at a time)."""
    while pos < size:
        fh.seek(pos)
        data = fh.read(min(SEARCH, size - pos))
        if not data or data.strip(b"\x00"):
            return not data
        pos += len(data)
    return True
