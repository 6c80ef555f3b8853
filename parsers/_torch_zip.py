"""The zip layer of torch checkpoints: members by the central directory, or by walking the local headers.

When the central directory is missing or unusable, members are found by walking the local file headers
from byte 0 (docs/formats.md#torch-zip-partial).

Used by :mod:`parsers.torch_ckpt` only. Every read is bounded: a data descriptor is searched for in
:data:`_SCAN_CHUNK` pieces, small members (``data.pkl``, ``byteorder``) are read up to a limit given by the
caller, deflate streams are inflated up to that limit.
"""

from __future__ import annotations

import struct
import zipfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple

from parsers._safe_pickle import MAX_PICKLE_BYTES
from parsers.tensors import CheckpointError

_LOCAL, _CENTRAL, DESCRIPTOR = b"PK\x03\x04", b"PK\x01\x02", b"PK\x07\x08"
_END_SIGS = (_CENTRAL, b"PK\x05\x06", b"PK\x06\x06")  # central directory, end records (ZIP64 too)
_U32 = 0xFFFFFFFF
_SCAN_CHUNK = 1 << 20
"""Bytes per read while searching for a data descriptor (the memory bound of the search)."""
_CRC_CHECK_MAX = 64 << 20
"""A data descriptor found by searching is accepted only if the CRC-32 of the bytes before it matches,
when those bytes are at most this many (larger entries: the size field alone)."""
_MAX_CRC_CHECKS = 8
"""Look-alike descriptors (right signature, size and what follows, wrong CRC) checked per member before
the search gives up: only a crafted file has any, and each check re-reads the member."""


class Unusable(Exception):
    """The central directory is missing or disagrees with the local headers: walk the local headers."""


@dataclass(frozen=True)
class Entry:
    """One zip member as found on disk.

    Attributes:
        name: Member name (``archive/data/0``).
        data: Absolute offset of its first data byte.
        size: Stored (compressed) bytes; for a cut member, the size it should have had.
        usize: Uncompressed bytes (``size`` when unknown).
        method: Compression method (0 stored, 8 deflated).
        crc: CRC-32 of the uncompressed bytes, when known.
        complete: Every stored byte is in the file.
    """

    name: str
    data: int
    size: int
    usize: int
    method: int
    crc: int | None
    complete: bool = True



def pread(fh: Any, off: int, n: int) -> bytes:
    """Up to ``n`` bytes of ``fh`` from offset ``off``."""
    fh.seek(off)
    return fh.read(n)


class _Local(NamedTuple):
    """A parsed local file header (sizes from its ZIP64 extra field where the 32-bit fields say 0xFFFFFFFF)."""

    flag: int
    method: int
    crc: int
    csize: int
    usize: int
    name: str
    data: int  # absolute offset of the member's first data byte
    zip64: bool  # a ZIP64 extra field is present: a data descriptor has 64-bit sizes


def _parse_local(fh: Any, pos: int) -> _Local | None:
    """The local file header at ``pos``, or ``None`` when there is none or the end of the file cuts it."""
    hdr = pread(fh, pos, 30)
    if len(hdr) < 30 or hdr[:4] != _LOCAL:
        return None
    flag, method, crc, csz, usz, nl, el = struct.unpack("<2xHH4xIIIHH", hdr[4:30])
    rest = pread(fh, pos + 30, nl + el)
    if len(rest) < nl + el:
        return None
    z64 = _zip64_values(rest[nl:])
    if z64 is not None:  # the 64-bit values come in this order, each only if its 32-bit field is 0xFFFFFFFF
        vals = iter(z64)
        if usz == _U32:
            usz = next(vals, usz)
        if csz == _U32:
            csz = next(vals, csz)
    return _Local(flag, method, crc, csz, usz, _decode_name(rest[:nl], flag), pos + 30 + nl + el, z64 is not None)


def _zip64_values(extra: bytes) -> list[int] | None:
    """The 64-bit values of a ZIP64 extended-information extra field (``0x0001``), or ``None``."""
    i = 0
    while i + 4 <= len(extra):
        hid, n = struct.unpack_from("<HH", extra, i)
        if hid == 1:
            body = extra[i + 4: i + 4 + n]
            return [struct.unpack_from("<Q", body, k)[0] for k in range(0, len(body) - 7, 8)]
        i += 4 + n
    return None


def _decode_name(raw: bytes, flag: int) -> str:
    return raw.decode("utf-8" if flag & 0x800 else "cp437", errors="replace")


_NEXT_SIGS = (_LOCAL, *_END_SIGS, b"PK\x06\x07", b"PK\x06\x08", b"PK\x05\x05")


def _descriptor_at(fh: Any, off: int, size: int, fsize: int, stored: bool, zip64: bool,
                   crc: int | None = None) -> tuple[int, int | None] | None:
    """The data descriptor at ``off`` of a member of ``size`` stored bytes, if it is there.

    Both forms are tried, the ZIP64 one (24 bytes, 64-bit sizes) first when the local header has a
    ZIP64 extra field: signature, CRC (when ``crc`` is given), compressed size ``size`` (and the
    uncompressed size too for a stored member), and a zip signature (or the end of the file) after it.

    Returns:
        ``(descriptor length, its crc)``; ``(0, None)`` when the file ends at ``off`` or inside what
        can still be that descriptor (the data before it are whole, the file is cut); ``None``
        when there is no such descriptor.
    """
    raw = pread(fh, off, 28)
    forms = ((24, "<IQQ"), (16, "<III")) if zip64 else ((16, "<III"), (24, "<IQQ"))
    if fsize - off < forms[0][0] and DESCRIPTOR.startswith(raw[:4]):
        return 0, None
    if raw[:4] != DESCRIPTOR:
        return None
    for n, fmt in forms:
        if len(raw) < n:
            continue
        rcrc, csz, usz = struct.unpack_from(fmt, raw, 4)
        nxt = raw[n:n + 4]
        follows = nxt in _NEXT_SIGS or (off + n + len(nxt) == fsize and len(nxt) < 4
                                        and any(s.startswith(nxt) for s in _NEXT_SIGS))
        if csz == size and (usz == size or not stored) and (crc is None or rcrc == crc) and follows:
            return n, rcrc
    return None


def _crc(fh: Any, off: int, n: int) -> int:
    value, done = 0, 0
    while done < n:
        chunk = pread(fh, off + done, min(_SCAN_CHUNK, n - done))
        if not chunk:
            break
        value, done = zlib.crc32(chunk, value), done + len(chunk)
    return value


def _search_descriptor(fh: Any, data: int, limit: int, fsize: int, stored: bool,
                       zip64: bool) -> tuple[int, int, int | None] | None:
    """Find the data descriptor of a member whose data start at ``data`` and whose size is unknown.

    A ``PK 07 08`` at ``j`` is the descriptor when :func:`_descriptor_at` accepts it for
    ``j - data`` bytes and, for at most :data:`_CRC_CHECK_MAX` bytes, its CRC-32 matches them.
    Reads 4 KiB first, then larger pieces up to :data:`_SCAN_CHUNK` bytes, whatever ``limit`` is.

    Args:
        fh: The open file.
        data: Offset of the member's first data byte.
        limit: Largest member size searched for, in bytes.
        fsize: File size in bytes.
        stored: The member is stored (its two sizes are equal).
        zip64: Its local header has a ZIP64 extra field.

    Returns:
        ``(size, descriptor length, crc)``, or ``None`` when no descriptor is found within ``limit``.
    """
    off, carry, step, crc_checks = data, b"", 4096, 0
    end = min(fsize, data + limit + 24)
    while off < end:
        buf = pread(fh, off, min(step, end - off))
        if not buf:
            break
        step = min(step * 4, _SCAN_CHUNK)  # small members (version, byteorder) cost one small read
        chunk, base = carry + buf, off - len(carry)
        i = chunk.find(DESCRIPTOR)
        while i >= 0:
            j = base + i
            d = _descriptor_at(fh, j, j - data, fsize, stored, zip64)
            if d is not None and d[0]:
                if j - data > _CRC_CHECK_MAX:
                    return j - data, d[0], d[1]
                crc_checks += 1
                if _crc(fh, data, j - data) == d[1]:
                    return j - data, d[0], d[1]
                if crc_checks >= _MAX_CRC_CHECKS:
                    return None  # crafted look-alike descriptors: give up rather than re-read the file
            i = chunk.find(DESCRIPTOR, i + 1)
        carry = chunk[-3:]
        off += len(buf)
    return None


class Walk:
    """The members of a zip file found by walking its local file headers from byte 0.

    For a member written with a data descriptor (general-purpose flag bit 3, sizes 0 in the local
    header: what ``torch.save`` writes) the size comes from ``sizes`` (a storage's byte size, known
    from ``data.pkl``) checked against the descriptor after it, else from a search for the
    descriptor. Iterating yields :class:`Entry` in file order; the walk ends at the central
    directory (``stop == "central directory"``), at the end of the file (``"eof"``: a cut member is
    yielded with ``complete=False``) or at bytes that are no local header, or a member whose end is
    not found (``"damage"``), with ``stop_at`` the offset.

    Args:
        fh: The open file.
        fsize: File size in bytes.
        sizes: Member name -> expected stored size in bytes, filled while walking (by the caller).
    """

    def __init__(self, fh: Any, fsize: int, sizes: dict[str, int]) -> None:
        self.fh, self.fsize, self.sizes = fh, fsize, sizes
        self.stop, self.stop_at = "", 0

    def _end(self, why: str, at: int) -> None:
        self.stop, self.stop_at = why, at

    def __iter__(self) -> Iterator[Entry]:
        pos, fh, fsize = 0, self.fh, self.fsize
        while True:
            sig = pread(fh, pos, 4)
            if sig in _END_SIGS:
                return self._end("central directory", pos)
            if len(sig) == 4 and sig != _LOCAL:
                return self._end("damage", pos)
            loc = _parse_local(fh, pos)
            if loc is None:  # a local header (or the start of one) that the end of the file cuts
                return self._end("eof", pos)
            stored = loc.method == zipfile.ZIP_STORED
            size, dlen, crc = loc.csize, 0, loc.crc
            if loc.flag & 0x8:  # sizes and CRC follow the data, in a descriptor
                found = self._sized(loc)
                if found == "damage":
                    return self._end("damage", loc.data)
                if found is None:
                    want = self.sizes.get(loc.name) if stored else None
                    yield Entry(loc.name, loc.data, want if want is not None else fsize - loc.data + 1, 0,
                                 loc.method, None, complete=False)
                    return self._end("eof", fsize)
                size, dlen, crc = found
            usize = size if stored or loc.flag & 0x8 else loc.usize
            if loc.data + size > fsize:
                yield Entry(loc.name, loc.data, size, usize, loc.method, crc, complete=False)
                return self._end("eof", fsize)
            yield Entry(loc.name, loc.data, size, usize, loc.method, crc)
            if loc.flag & 0x8 and dlen == 0:
                return self._end("eof", fsize)  # cut at or inside this member's descriptor
            pos = loc.data + size + dlen

    def _sized(self, loc: _Local) -> tuple[int, int, int | None] | str | None:
        """``(size, descriptor length, crc)`` of a member written with a data descriptor.

        Returns:
            The size, with descriptor length 0 (crc ``None``) when the file ends at or inside the
            descriptor; ``None`` when the member runs past the end of the file (cut); ``"damage"``
            when its end is not found although the file goes on.
        """
        fh, fsize, stored = self.fh, self.fsize, loc.method == zipfile.ZIP_STORED
        want = self.sizes.get(loc.name) if stored else None
        for guess in dict.fromkeys(g for g in (want, loc.csize or None) if g is not None):
            if loc.data + guess <= fsize:
                d = _descriptor_at(fh, loc.data + guess, guess, fsize, stored, loc.zip64)
                if d is not None:
                    return guess, d[0], d[1]
        if want is not None and loc.data + want > fsize:
            return None  # a storage the end of the file cuts
        limit = MAX_PICKLE_BYTES if pickle_name([loc.name]) else fsize - loc.data
        found = _search_descriptor(fh, loc.data, limit, fsize, stored, loc.zip64)
        if found is not None:
            return found
        return None if loc.data + limit + 24 >= fsize else "damage"


def member_bytes(fh: Any, e: Entry, limit: int) -> tuple[bytes, bool]:
    """The uncompressed bytes of a small member and whether they match its CRC-32 (True when unknown).

    Raises:
        CheckpointError: Larger than ``limit`` bytes (before anything is read), cut, an
            unsupported compression method, or a deflate stream that is corrupt or too large.
    """
    if e.size > limit:
        raise CheckpointError(f"{e.name} is {e.size} bytes (limit {limit}): refused")
    raw = pread(fh, e.data, e.size)
    if len(raw) < e.size:
        raise CheckpointError(f"{e.name} is cut at byte {e.data + len(raw)}")
    if e.method == zipfile.ZIP_STORED:
        out = raw
    elif e.method == zipfile.ZIP_DEFLATED:
        dec = zlib.decompressobj(-15)
        try:
            out = dec.decompress(raw, limit + 1)
        except zlib.error as exc:
            raise CheckpointError(f"{e.name}: corrupt deflate stream ({exc})") from None
        if len(out) > limit:
            raise CheckpointError(f"{e.name} inflates past {limit} bytes: refused")
    else:
        raise CheckpointError(f"{e.name}: zip compression method {e.method} not supported")
    return out, e.crc is None or zlib.crc32(out) == e.crc


def central_entries(fh: Any, fsize: int) -> dict[str, Entry]:
    """Members listed by the central directory, each checked against its local header and descriptor.

    Raises:
        Unusable: No central directory, or one that does not agree with the local headers (a name,
            an offset, a size or a CRC that differs: flipped bytes).
    """
    try:
        zf = zipfile.ZipFile(fh)
    except OSError:
        raise
    except Exception as exc:  # noqa: BLE001 - BadZipFile, ValueError, EOFError, struct.error...: walk instead
        raise Unusable(f"no readable zip central directory ({type(exc).__name__}: {exc})") from None
    out: dict[str, Entry] = {}
    with zf:
        for info in zf.infolist():
            loc = _parse_local(fh, info.header_offset) if 0 <= info.header_offset < fsize else None
            if loc is None:
                raise Unusable(f"central directory points to no local header for {info.orig_filename}")
            method, data, size = loc.method, loc.data, info.compress_size
            if loc.name != info.orig_filename or method != info.compress_type:
                raise Unusable(f"central directory disagrees with the local header at byte {info.header_offset}")
            if data + size > fsize:
                raise Unusable(f"central directory: {info.orig_filename} runs past the end of the file")
            if method == zipfile.ZIP_STORED and info.file_size != size:
                raise Unusable(f"central directory: {info.orig_filename} is stored but its two sizes differ")
            if loc.flag & 0x8:
                d = _descriptor_at(fh, data + size, size, fsize, method == zipfile.ZIP_STORED, loc.zip64, info.CRC)
                if not (d and d[0]):
                    raise Unusable(f"central directory: size or CRC of {info.orig_filename} disagrees with its "
                                    "data descriptor")
            elif loc.csize != size or loc.crc != info.CRC:
                raise Unusable(f"central directory: size or CRC of {info.orig_filename} disagrees with its "
                                "local header")
            out[info.orig_filename] = Entry(info.orig_filename, data, size, info.file_size, info.compress_type,
                                             info.CRC)
    return out


def has_end_record(fh: Any, fsize: int) -> bool:
    """True when the file ends with a whole end-of-central-directory record (22 bytes and its comment)."""
    base = max(0, fsize - 65557)
    tail = pread(fh, base, fsize - base)
    i = tail.rfind(b"PK\x05\x06")
    while i >= 0:
        if i + 22 <= len(tail) and i + 22 + struct.unpack_from("<H", tail, i + 20)[0] == len(tail):
            return True
        i = tail.rfind(b"PK\x05\x06", 0, i)
    return False


def pickle_name(names: Any) -> str | None:
    """The first member name whose last component is ``data.pkl``, or None."""
    return next((n for n in names if n.endswith("/data.pkl") or n == "data.pkl"), None)

