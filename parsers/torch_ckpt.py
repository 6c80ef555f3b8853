"""PyTorch zip checkpoints (``.pt``/``.bin``/``.pth``/``.ckpt``) read WITHOUT torch and without trusting them.

``torch.save`` (docs/formats.md#torch-zip) writes a zip archive ``<a>/data.pkl`` + ``<a>/data/<key>`` (raw
storage bytes, stored uncompressed and 64-byte aligned) + ``<a>/byteorder``. ``data.pkl`` is a pickle
whose tensors are ``torch._utils._rebuild_tensor_v2(storage, offset, size, stride, ...)`` calls over
persistent ids ``('storage', torch.FloatStorage, key, location, numel)``.

Unpickling runs whatever callables the pickle names, so the reader here is an allowlist: a
:class:`pickle.Unpickler` whose ``find_class`` returns harmless stand-ins for the tensor-rebuild
functions (``_rebuild_tensor_v2``/``_v3``, ``_rebuild_parameter``), the storage and dtype names,
``torch.Size`` and ``collections.OrderedDict``, and refuses every other global before anything is
called: a file whose pickle wants ``os.system`` (or any class of a training framework) is refused
with ``refused: pickle wants to import os.system`` and nothing runs (docs/formats.md#torch-zip: "never
unpickle untrusted data"; torch's own ``weights_only=True`` is the same idea with a larger list).
Tensors come back as :class:`parsers.safetensors_ckpt.TensorRef` byte ranges of the archive, streamed
later by the shared chunked reducer.

A save killed mid-write (or a full disk) leaves no central directory (docs/formats.md#torch-zip-partial),
and :mod:`zipfile` refuses such a file whole. :func:`read` then walks the local file headers
from byte 0 instead. torch 2.13 (miniz) writes every member stored, with general-purpose flag 0x808
(UTF-8 name, sizes in a data descriptor), CRC and sizes 0 in the local header, the 64-byte alignment
padding in a ``FB`` (0x4246) extra field, and a 16-byte descriptor ``PK 07 08, crc, csize, usize``
after the data; a member of 4 GiB or more, or one starting past 4 GiB, gets a ZIP64 (0x0001) extra
field in its local header (the uncompressed size and 0, or the header's offset; sizes still 0) and a
24-byte descriptor with 64-bit sizes (measured on a 4 GiB save). ``data.pkl`` is written first;
its end is found by searching for its descriptor (CRC-checked), and the byte size of each storage
(``numel * itemsize`` from the pickle) is then checked against the descriptor after it. Tensors whose
storage bytes are all in the file are kept exactly as in the intact file; the others are left out
and listed, and the result is flagged ``truncated`` so it is never taken for a checkpoint to resume
from. Local headers with their sizes filled in (other writers) are read as well. The same walk
reads a file whose central directory disagrees with its local headers (flipped bytes).

Also here: the structure of what was unpickled (:func:`classify`: model state dicts, optimizer state
dicts with their ``param_groups``, scheduler state dicts, step counters), recognised by their keys.
"""

from __future__ import annotations

import io
import math
import os
import pickle
import pickletools
import struct
import zipfile
import zlib
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from forensics.model import Skip
from parsers._limits import TooLarge, expanded_size
from parsers.safetensors_ckpt import ITEMSIZE, CheckpointError, TensorRef, iter_blocks

FORMAT = "torch_zip"
MAX_PICKLE_BYTES = 256 << 20
"""A ``data.pkl`` larger than this is refused (a pickle of tensor metadata is kilobytes)."""
MAX_MEMO = 1 << 24
"""Largest pickle memo index accepted (a state dict of 100k tensors uses ~1M memo slots)."""
MIN_NODES = 1_000_000
"""Nodes any pickle may expand to (shared references walked path by path), whatever its size."""
LEGACY_MAGIC = bytes.fromhex("1950a86a20f9469cfc6c")
_STORAGES = {"FloatStorage": "F32", "DoubleStorage": "F64", "HalfStorage": "F16", "BFloat16Storage": "BF16",
             "LongStorage": "I64", "IntStorage": "I32", "ShortStorage": "I16", "CharStorage": "I8",
             "ByteStorage": "U8", "BoolStorage": "BOOL", "UntypedStorage": None}
_DTYPES = {"float32": "F32", "float": "F32", "float64": "F64", "double": "F64", "float16": "F16", "half": "F16",
           "bfloat16": "BF16", "int64": "I64", "long": "I64", "int32": "I32", "int": "I32", "int16": "I16",
           "int8": "I8", "uint8": "U8", "bool": "BOOL", "uint16": "U16", "uint32": "U32", "uint64": "U64",
           "float8_e4m3fn": "F8_E4M3", "float8_e5m2": "F8_E5M2", "float8_e4m3fnuz": "F8_E4M3FNUZ",
           "float8_e5m2fnuz": "F8_E5M2FNUZ", "float8_e8m0fnu": "F8_E8M0"}
OPTIM_ROLES = {"exp_avg": "exp_avg", "exp_avg_sq": "exp_avg_sq"}
"""Optimizer state keys with their own role; other per-parameter tensors get role ``other``."""


@dataclass(frozen=True)
class _Storage:
    key: str
    dtype: str | None  # None: UntypedStorage (bytes), the dtype comes with _rebuild_tensor_v3
    numel: int


@dataclass(frozen=True)
class _DType:
    code: str


class _Tensor:
    """What a tensor-rebuild call returns while unpickling: where its bytes are, nothing else."""

    __slots__ = ("storage", "offset", "shape", "stride", "dtype")

    def __init__(self, storage: _Storage, offset: int, shape: tuple, stride: tuple, dtype: str | None) -> None:
        self.storage, self.offset, self.shape, self.stride = storage, int(offset), tuple(shape), tuple(stride)
        self.dtype = dtype or storage.dtype


def _rebuild_v2(storage: _Storage, offset: int, size: tuple, stride: tuple, *_: Any) -> _Tensor:
    return _Tensor(storage, offset, size, stride, None)


def _rebuild_v3(storage: _Storage, offset: int, size: tuple, stride: tuple, _rg: Any, _hooks: Any,
                dtype: _DType, *_: Any) -> _Tensor:
    return _Tensor(storage, offset, size, stride, dtype.code if isinstance(dtype, _DType) else None)


def _rebuild_parameter(data: Any, *_: Any) -> Any:
    return data


def _size(*args: Any) -> tuple:
    return tuple(args[0]) if args else ()


_ALLOWED: dict[tuple[str, str], Any] = {
    ("torch._utils", "_rebuild_tensor_v2"): _rebuild_v2,
    ("torch._utils", "_rebuild_tensor_v3"): _rebuild_v3,
    ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
    ("torch._utils", "_rebuild_parameter_with_state"): _rebuild_parameter,
    ("collections", "OrderedDict"): OrderedDict,
    ("torch", "Size"): _size,
}


class _StorageType:
    """The value ``find_class`` returns for ``torch.<X>Storage``: a marker carrying the storage dtype."""

    __slots__ = ("dtype",)

    def __init__(self, dtype: str | None) -> None:
        self.dtype = dtype


class Unpickler(pickle.Unpickler):
    """Allowlist unpickler: tensor-rebuild stand-ins, storage/dtype names, containers; nothing else.

    Raises:
        CheckpointError: From ``find_class`` for any other global (before it could be called) and
            from ``persistent_load`` for a persistent id that is not a torch storage.
    """

    def __init__(self, file: Any) -> None:
        super().__init__(file)
        self.storages: dict[str, _Storage] = {}
        """Every storage the pickle named, by key (their byte sizes locate a cut file's members)."""

    def find_class(self, module: str, name: str) -> Any:
        """The stand-in for an allowlisted global; refuses every other one."""
        if (module, name) in _ALLOWED:
            return _ALLOWED[(module, name)]
        if module in ("torch", "torch.storage") and name in _STORAGES:
            return _StorageType(_STORAGES[name])
        if module == "torch" and name in _DTYPES:
            return _DType(_DTYPES[name])
        raise CheckpointError(f"refused: pickle wants to import {module}.{name} (not a tensor or container; "
                              "nothing was run)")

    def persistent_load(self, pid: Any) -> _Storage:
        """``('storage', <storage type>, key, location, numel)`` -> a storage record."""
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"
                and isinstance(pid[1], _StorageType) and isinstance(pid[4], int)):
            raise CheckpointError(f"refused: unknown persistent id {str(pid)[:80]}")
        st = _Storage(str(pid[2]), pid[1].dtype, int(pid[4]))
        self.storages.setdefault(st.key, st)
        return st


_LOCAL, _CENTRAL, _DESCRIPTOR = b"PK\x03\x04", b"PK\x01\x02", b"PK\x07\x08"
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


class _Unusable(Exception):
    """The central directory is missing or disagrees with the local headers: walk the local headers."""


@dataclass(frozen=True)
class _Entry:
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


@dataclass
class Loaded:
    """What :func:`read` salvaged from one torch zip checkpoint.

    Attributes:
        obj: The saved object with every readable tensor as a :class:`TensorRef`; a tensor whose
            storage is missing or cut is left out (a dict key dropped, a list slot ``None``).
        skipped: One :class:`Skip` for the file when it is damaged (``what`` = ``"<path>:<offset>"``)
            and one per tensor left out (its key path, e.g. ``state.3.exp_avg``, in the reason).
        truncated: The file ends before its zip archive does (killed job, full disk): never a
            checkpoint to resume from.
        salvaged: The central directory was missing or unusable; members were found by walking the
            local file headers from the start of the file.
        size: File size in bytes (where a truncated file ends).
    """

    obj: Any
    skipped: list[Skip] = field(default_factory=list)
    truncated: bool = False
    salvaged: bool = False
    size: int = 0

    @property
    def complete(self) -> bool:
        """Nothing was missing, cut or salvaged: ``torch.load`` would read the file as it is."""
        return not (self.truncated or self.salvaged or self.skipped)


class _Salvage(NamedTuple):
    """How a walked file ended: the file-level note, the offset it names, and the walk's stop."""

    note: str
    at: int
    truncated: bool
    stop: str


class _Missing(Exception):
    """A storage is not (completely) in the file: its tensors are left out, not the file."""


def _pread(fh: Any, off: int, n: int) -> bytes:
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
    hdr = _pread(fh, pos, 30)
    if len(hdr) < 30 or hdr[:4] != _LOCAL:
        return None
    flag, method, crc, csz, usz, nl, el = struct.unpack("<2xHH4xIIIHH", hdr[4:30])
    rest = _pread(fh, pos + 30, nl + el)
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
    raw = _pread(fh, off, 28)
    forms = ((24, "<IQQ"), (16, "<III")) if zip64 else ((16, "<III"), (24, "<IQQ"))
    if fsize - off < forms[0][0] and _DESCRIPTOR.startswith(raw[:4]):
        return 0, None
    if raw[:4] != _DESCRIPTOR:
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
        chunk = _pread(fh, off + done, min(_SCAN_CHUNK, n - done))
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
        buf = _pread(fh, off, min(step, end - off))
        if not buf:
            break
        step = min(step * 4, _SCAN_CHUNK)  # small members (version, byteorder) cost one small read
        chunk, base = carry + buf, off - len(carry)
        i = chunk.find(_DESCRIPTOR)
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
            i = chunk.find(_DESCRIPTOR, i + 1)
        carry = chunk[-3:]
        off += len(buf)
    return None


class _Walk:
    """The members of a zip file found by walking its local file headers from byte 0.

    For a member written with a data descriptor (general-purpose flag bit 3, sizes 0 in the local
    header: what ``torch.save`` writes) the size comes from ``sizes`` (a storage's byte size, known
    from ``data.pkl``) checked against the descriptor after it, else from a search for the
    descriptor. Iterating yields :class:`_Entry` in file order; the walk ends at the central
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

    def __iter__(self) -> Iterator[_Entry]:
        pos, fh, fsize = 0, self.fh, self.fsize
        while True:
            sig = _pread(fh, pos, 4)
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
                    yield _Entry(loc.name, loc.data, want if want is not None else fsize - loc.data + 1, 0,
                                 loc.method, None, complete=False)
                    return self._end("eof", fsize)
                size, dlen, crc = found
            usize = size if stored or loc.flag & 0x8 else loc.usize
            if loc.data + size > fsize:
                yield _Entry(loc.name, loc.data, size, usize, loc.method, crc, complete=False)
                return self._end("eof", fsize)
            yield _Entry(loc.name, loc.data, size, usize, loc.method, crc)
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
        limit = MAX_PICKLE_BYTES if _pickle_name([loc.name]) else fsize - loc.data
        found = _search_descriptor(fh, loc.data, limit, fsize, stored, loc.zip64)
        if found is not None:
            return found
        return None if loc.data + limit + 24 >= fsize else "damage"


def _member_bytes(fh: Any, e: _Entry, limit: int) -> tuple[bytes, bool]:
    """The uncompressed bytes of a small member and whether they match its CRC-32 (True when unknown).

    Raises:
        CheckpointError: Larger than ``limit`` bytes (before anything is read), cut, an
            unsupported compression method, or a deflate stream that is corrupt or too large.
    """
    if e.size > limit:
        raise CheckpointError(f"{e.name} is {e.size} bytes (limit {limit}): refused")
    raw = _pread(fh, e.data, e.size)
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


def _central_entries(fh: Any, fsize: int) -> dict[str, _Entry]:
    """Members listed by the central directory, each checked against its local header and descriptor.

    Raises:
        _Unusable: No central directory, or one that does not agree with the local headers (a name,
            an offset, a size or a CRC that differs: flipped bytes).
    """
    try:
        zf = zipfile.ZipFile(fh)
    except OSError:
        raise
    except Exception as exc:  # noqa: BLE001 - BadZipFile, ValueError, EOFError, struct.error...: walk instead
        raise _Unusable(f"no readable zip central directory ({type(exc).__name__}: {exc})") from None
    out: dict[str, _Entry] = {}
    with zf:
        for info in zf.infolist():
            loc = _parse_local(fh, info.header_offset) if 0 <= info.header_offset < fsize else None
            if loc is None:
                raise _Unusable(f"central directory points to no local header for {info.orig_filename}")
            method, data, size = loc.method, loc.data, info.compress_size
            if loc.name != info.orig_filename or method != info.compress_type:
                raise _Unusable(f"central directory disagrees with the local header at byte {info.header_offset}")
            if data + size > fsize:
                raise _Unusable(f"central directory: {info.orig_filename} runs past the end of the file")
            if method == zipfile.ZIP_STORED and info.file_size != size:
                raise _Unusable(f"central directory: {info.orig_filename} is stored but its two sizes differ")
            if loc.flag & 0x8:
                d = _descriptor_at(fh, data + size, size, fsize, method == zipfile.ZIP_STORED, loc.zip64, info.CRC)
                if not (d and d[0]):
                    raise _Unusable(f"central directory: size or CRC of {info.orig_filename} disagrees with its "
                                    "data descriptor")
            elif loc.csize != size or loc.crc != info.CRC:
                raise _Unusable(f"central directory: size or CRC of {info.orig_filename} disagrees with its "
                                "local header")
            out[info.orig_filename] = _Entry(info.orig_filename, data, size, info.file_size, info.compress_type,
                                             info.CRC)
    return out


def _has_end_record(fh: Any, fsize: int) -> bool:
    """True when the file ends with a whole end-of-central-directory record (22 bytes and its comment)."""
    base = max(0, fsize - 65557)
    tail = _pread(fh, base, fsize - base)
    i = tail.rfind(b"PK\x05\x06")
    while i >= 0:
        if i + 22 <= len(tail) and i + 22 + struct.unpack_from("<H", tail, i + 20)[0] == len(tail):
            return True
        i = tail.rfind(b"PK\x05\x06", 0, i)
    return False


def _pickle_name(names: Any) -> str | None:
    return next((n for n in names if n.endswith("/data.pkl") or n == "data.pkl"), None)


_MEMO_OPS = {"PUT", "BINPUT", "LONG_BINPUT"}


def _prescan(raw: bytes) -> int:
    """Check a pickle's opcodes before the C unpickler sees them; the byte length of the first pickle.

    The C unpickler sizes its memo by the largest index a ``PUT`` names (``LONG_BINPUT 2**29`` in a
    10-byte pickle: an 8 GB memo), so every memo index must be below the number of opcodes
    (``pickle`` numbers them 0, 1, 2, ...). The scan is :func:`pickletools.genops`: pure Python,
    linear in the bytes, allocating nothing the pickle names.

    Raises:
        CheckpointError: A memo index at or past the opcode count, or bytes that are no pickle.
    """
    ops, end = 0, len(raw)
    try:
        for op, arg, pos in pickletools.genops(raw):
            ops += 1
            if op.name in _MEMO_OPS and (not isinstance(arg, int) or arg < 0 or arg >= MAX_MEMO):
                raise CheckpointError(f"refused: pickle memo index {arg} (limit {MAX_MEMO}); nothing was run")
            if op.name in _MEMO_OPS and arg > ops:
                raise CheckpointError(f"refused: pickle memo index {arg} after {ops} opcodes (a memo bomb); "
                                      "nothing was run")
            if op.name == "STOP":
                end = pos + 1
    except CheckpointError:
        raise
    except Exception as exc:  # noqa: BLE001 - genops raises ValueError and friends on bad bytes
        raise CheckpointError(f"malformed pickle: {type(exc).__name__}: {exc}") from None
    return end


def max_nodes(pickle_bytes: int) -> int:
    """Most nodes an unpickled checkpoint may expand to: :data:`MIN_NODES` or 4 per pickle byte."""
    return max(MIN_NODES, 4 * pickle_bytes)


def _unpickle(raw: bytes) -> tuple[Any, dict[str, _Storage]]:
    """Unpickle ``data.pkl`` with the allowlist; the object and its storages by key.

    Bounded (issue 16): opcodes are scanned first (:func:`_prescan`), and the result may expand to
    at most :func:`max_nodes` nodes once shared references are walked path by path (counted
    memoised by identity: linear).

    Raises:
        CheckpointError: A refused global or persistent id, a memo bomb, a structure that expands past
            the node limit, or a malformed (e.g. cut) pickle.
    """
    _prescan(raw)
    unp = Unpickler(io.BytesIO(raw))
    try:
        obj = unp.load()
    except CheckpointError:
        raise
    except Exception as exc:  # noqa: BLE001 - a malformed pickle is a skip, never a crash
        raise CheckpointError(f"malformed pickle: {type(exc).__name__}: {exc}") from None
    _bounded(obj, len(raw))
    return obj, unp.storages


def _bounded(obj: Any, nbytes: int) -> None:
    try:
        expanded_size(obj, max_nodes(nbytes), 64)
    except TooLarge as exc:
        raise CheckpointError(f"refused: pickle structure {exc} from {nbytes} bytes of pickle") from None


def _nbytes(s: _Storage) -> int:
    return s.numel * (ITEMSIZE.get(s.dtype, 0) if s.dtype else 1)


def read(path: str | Path) -> Loaded:
    """Read a torch zip checkpoint with the allowlist, keeping every complete tensor of a damaged file.

    An intact archive is read through its central directory (each member checked against its local
    header). When the central directory is missing (a save killed or a disk full mid-write) or
    disagrees with the local headers, the local file headers are walked from the start of the file
    instead: ``data.pkl`` (written first by ``torch.save``) is unpickled and each tensor whose storage
    ``data/<key>`` lies wholly in the file becomes a :class:`TensorRef` as in an intact file; a tensor
    whose storage is missing or cut is left out and listed.

    Args:
        path: A file written by ``torch.save`` (zip format, torch >= 1.6).

    Returns:
        A :class:`Loaded`: the object (dicts, lists, numbers, strings, tensors as :class:`TensorRef`
        byte ranges of the file), the skips, and ``truncated``/``salvaged`` flags.

    Raises:
        CheckpointError: A legacy (pre-1.6) or non-zip file, a big-endian archive, no ``data.pkl``,
            a ``data.pkl`` that is cut or larger than :data:`MAX_PICKLE_BYTES`, a malformed tensor
            record, or a pickle that wants any global outside the allowlist (``refused: pickle wants
            to import X``; nothing is executed).
    """
    path = str(path)
    try:
        with open(path, "rb") as fh:
            fsize = os.fstat(fh.fileno()).st_size
            head = fh.read(16)
            if not head.startswith(b"PK"):
                if LEGACY_MAGIC in head or head[:1] == b"\x80":
                    raise CheckpointError("legacy (pre-1.6, non-zip) torch.save format: not read (its "
                                          "tensors are not at known offsets); re-save it with torch>=1.6 "
                                          "(torch.load(..., weights_only=True) then torch.save) or convert "
                                          "it to safetensors")
                raise CheckpointError("not a torch zip checkpoint")
            try:
                entries = _central_entries(fh, fsize)
                pkl = _pickle_name(entries)
                if pkl is None:
                    raise _Unusable("no data.pkl in the central directory")
                raw, crc_ok = _member_bytes(fh, entries[pkl], MAX_PICKLE_BYTES)
                if not crc_ok:  # the central directory and the local header agree on it: the bytes are bad
                    raise CheckpointError(f"corrupt: {pkl} does not match its CRC-32 (flipped bytes?); nothing "
                                          "was read")
                obj, _ = _unpickle(raw)
                return _finish(fh, path, fsize, obj, pkl, entries, None)
            except _Unusable as exc:
                return _salvage(fh, path, fsize, str(exc))
    except OSError as exc:
        raise CheckpointError(f"unreadable: {exc.strerror or exc}") from None
    except (ValueError, EOFError, OverflowError, struct.error) as exc:
        raise CheckpointError(f"corrupt zip: {type(exc).__name__}: {exc}") from None


def _salvage(fh: Any, path: str, fsize: int, why: str) -> Loaded:
    """Walk the local headers of a file whose central directory is missing or unusable (see :func:`read`)."""
    sizes: dict[str, int] = {}
    walk = _Walk(fh, fsize, sizes)
    entries: dict[str, _Entry] = {}
    found: tuple[Any, str] | None = None
    for e in walk:
        entries.setdefault(e.name, e)
        if found is None and _pickle_name([e.name]) is not None:
            if e.complete:
                raw, crc_ok = _member_bytes(fh, e, MAX_PICKLE_BYTES)
                if not crc_ok:
                    raise CheckpointError(f"corrupt: {e.name} does not match its CRC-32; nothing was read")
                obj, storages = _unpickle(raw)
            elif (tail := _pickle_before_end(fh, e, fsize)) is not None:
                obj, storages = tail
            else:
                raise CheckpointError(f"incomplete save: data.pkl is cut (the file ends at byte {fsize}, inside "
                                      f"{e.name}): no tensor can be named; nothing was read")
            prefix = e.name[: -len("data.pkl")]
            sizes.update({f"{prefix}data/{k}": _nbytes(s) for k, s in storages.items()})
            found = (obj, e.name)
    if walk.stop == "central directory":
        truncated = not _has_end_record(fh, fsize)
    else:
        truncated = walk.stop == "eof"
    if found is None:
        if truncated:
            raise CheckpointError(f"incomplete save: the file ends at byte {fsize} before data.pkl "
                                  "(killed or disk full mid-save?); nothing was read")
        if walk.stop == "damage":
            raise CheckpointError(f"corrupt zip: {why}; no data.pkl before unreadable bytes at {walk.stop_at}")
        raise CheckpointError("zip archive without data.pkl (not a torch checkpoint)")
    obj, pkl = found
    if truncated:
        where = "inside" if walk.stop == "central directory" else "before"
        note = (f"incomplete save: the file ends at byte {fsize} {where} the zip central directory (killed or disk "
                "full mid-save?); never resume from it")
        at = fsize
    else:
        note = f"damaged zip: {why}; members found by walking the local headers"
        if walk.stop == "damage":
            note += f" up to unreadable bytes at {walk.stop_at}"
        at = walk.stop_at
    return _finish(fh, path, fsize, obj, pkl, entries, _Salvage(note, at, truncated, walk.stop))


def _pickle_before_end(fh: Any, e: _Entry, fsize: int) -> tuple[Any, dict[str, _Storage]] | None:
    """A whole stored ``data.pkl`` whose descriptor is cut, unpickled; ``None`` when the pickle itself is cut.

    Whole: the pickle ends (STOP) within the last 15 bytes of the file and only the start of a data
    descriptor follows it.

    Raises:
        CheckpointError: The pickle wants a global or persistent id outside the allowlist.
    """
    n = fsize - e.data
    if e.method != zipfile.ZIP_STORED or n > MAX_PICKLE_BYTES + 16:
        return None
    data = _pread(fh, e.data, n)
    try:
        _prescan(data)
    except CheckpointError as exc:
        if "refused" in exc.args[0]:
            raise
        return None  # cut inside the pickle
    bio = io.BytesIO(data)
    unp = Unpickler(bio)
    try:
        obj = unp.load()
    except CheckpointError:
        raise
    except Exception:  # noqa: BLE001 - cut inside the pickle
        return None
    _bounded(obj, n)
    rest = bio.read()
    return (obj, unp.storages) if len(rest) < 16 and _DESCRIPTOR.startswith(rest[:4]) else None


def _finish(fh: Any, path: str, fsize: int, obj: Any, pkl: str, entries: dict[str, _Entry],
            salvage: _Salvage | None) -> Loaded:
    """Check the byte order and turn tensors into refs; missing or cut storages drop their tensors."""
    prefix = pkl[: -len("data.pkl")]
    order = entries.get(prefix + "byteorder")
    if order is not None and order.complete:
        raw, _ = _member_bytes(fh, order, 64)
        if raw.strip() not in (b"", b"little"):
            raise CheckpointError("big-endian torch archive: not supported")
    cache: dict[str, tuple[int, str | None, int]] = {}

    def locate(key: str) -> tuple[int, str | None, int]:
        if key not in cache:
            e = entries.get(f"{prefix}data/{key}")
            if e is None:
                if salvage is None:  # not in the central directory: look for it in the local headers
                    raise _Unusable(f"storage data/{key} is not in the central directory")
                if salvage.stop == "eof":
                    raise _Missing(f"its storage data/{key} is missing: the file ends at byte {fsize} before it")
                if salvage.stop == "central directory":
                    raise _Missing(f"its storage data/{key} is missing from the archive")
                raise _Missing(f"its storage data/{key} was not found before unreadable bytes at {salvage.at}")
            if not e.complete:
                raise _Missing(f"its storage data/{key} is cut: it needs bytes {e.data}-{e.data + e.size}, the file "
                               f"ends at byte {fsize}")
            if e.method == zipfile.ZIP_STORED:
                cache[key] = (e.data, None, e.size)
            elif salvage is not None:
                raise _Missing(f"its storage data/{key} is compressed and the zip central directory is unusable")
            else:
                cache[key] = (0, e.name, e.usize)
        return cache[key]

    lost: list[Skip] = []
    at = fsize if salvage is None else salvage.at
    try:
        out = _resolve(obj, path, locate, 0, "", lost, at, {})
    except (TypeError, ValueError, OverflowError) as exc:
        raise CheckpointError(f"malformed tensor record: {type(exc).__name__}: {exc}") from None
    if salvage is None:
        return Loaded(out, lost, size=fsize)
    note, at, truncated, _stop = salvage
    n_all = _count_tensors(obj)
    head = Skip(f"{path}:{at}", f"{note}: {n_all - len(lost)} of {n_all} tensors read"
                + (f", {len(lost)} not (listed)" if lost else ""))
    return Loaded(out, [head, *lost], truncated=truncated, salvaged=True, size=fsize)


def _count_tensors(obj: Any, depth: int = 0) -> int:
    if depth > 64:
        return 0
    if isinstance(obj, _Tensor):
        return 1
    if isinstance(obj, dict):
        return sum(_count_tensors(v, depth + 1) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_count_tensors(v, depth + 1) for v in obj)
    return 0


def load(path: str | Path) -> Any:
    """Unpickle an intact torch zip checkpoint with the allowlist; tensors become :class:`TensorRef`.

    The strict form of :func:`read` (which keeps the complete tensors of a cut or damaged file):
    anything short of an intact archive is refused.

    Args:
        path: A file written by ``torch.save`` (zip format, torch >= 1.6).

    Returns:
        The saved object (dicts, lists, numbers, strings) with every tensor replaced by a
        :class:`TensorRef` (``name`` empty; contiguous views point into the archive; a
        non-contiguous view carries its ``stride`` and ``span``).

    Raises:
        CheckpointError: Everything :func:`read` raises, and a truncated or damaged file or a
            missing storage (the reason of the first :class:`Skip` :func:`read` gives).
    """
    got = read(path)
    if not got.complete:
        raise CheckpointError(got.skipped[0].reason if got.skipped else "damaged zip archive")
    return got.obj


_DROP = object()


def _resolve(obj: Any, path: str, locate: Any, depth: int, where: str, lost: list[Skip], at: int,
             memo: dict[int, Any]) -> Any:
    """Replace tensors by refs; a tensor whose storage is missing or cut becomes ``_DROP`` (and a Skip).

    Memoised by object identity: a shared object (a tied weight, a shared list) is resolved once and
    stays shared in the result (its missing tensors are listed once, under the first path).
    """
    if depth > 64:
        raise CheckpointError("refused: structure nested deeper than 64 levels")
    if isinstance(obj, (_Tensor, dict, list, tuple)):
        key = id(obj)
        if key not in memo:
            memo[key] = _resolve_one(obj, path, locate, depth, where, lost, at, memo)
        return memo[key]
    return obj


def _resolve_one(obj: Any, path: str, locate: Any, depth: int, where: str, lost: list[Skip], at: int,
                 memo: dict[int, Any]) -> Any:
    if isinstance(obj, _Tensor):
        try:
            return _to_ref(obj, path, locate)
        except _Missing as exc:
            lost.append(Skip(f"{path}:{at}", f"tensor {where or '<root>'} not read: {exc}"))
            return _DROP
    if isinstance(obj, dict):
        out = OrderedDict() if isinstance(obj, OrderedDict) else {}
        for k, v in obj.items():
            r = _resolve(v, path, locate, depth + 1, f"{where}.{k}" if where else str(k), lost, at, memo)
            if r is not _DROP:
                out[k] = r
        return out
    if isinstance(obj, (list, tuple)):
        vals = [_resolve(v, path, locate, depth + 1, f"{where}[{i}]", lost, at, memo) for i, v in enumerate(obj)]
        vals = [None if v is _DROP else v for v in vals]
        return vals if isinstance(obj, list) else tuple(vals)
    return obj


def _to_ref(t: _Tensor, path: str, locate: Any) -> TensorRef:
    if not all(isinstance(d, int) and d >= 0 for d in t.shape) or len(t.stride) != len(t.shape):
        raise CheckpointError(f"malformed tensor record over storage {t.storage.key}")
    if t.dtype is None or t.dtype not in ITEMSIZE:
        raise CheckpointError(f"tensor of unknown dtype {t.dtype} in storage {t.storage.key}")
    base, member, size = locate(t.storage.key)
    item = ITEMSIZE[t.dtype]
    numel = math.prod(t.shape)
    contiguous, expect = True, 1
    for dim, st in zip(reversed(t.shape), reversed(t.stride), strict=False):
        if dim != 1 and st != expect:
            contiguous = False
        expect *= dim
    if numel == 0:
        return TensorRef(path, "", t.dtype, t.shape, base + t.offset * item, member)
    last = t.offset + sum((d - 1) * s for d, s in zip(t.shape, t.stride, strict=False))
    if min(t.stride, default=0) < 0 or t.offset < 0 or (last + 1) * item > size:
        raise CheckpointError(f"tensor view out of range of storage {t.storage.key} ({size} bytes)")
    if contiguous:
        return TensorRef(path, "", t.dtype, t.shape, base + t.offset * item, member)
    span = (last + 1 - t.offset) * item
    return TensorRef(path, "", t.dtype, t.shape, base + t.offset * item, member, t.stride, span)


def scalar(value: Any) -> float | None:
    """A Python number, or the value of a 1-element :class:`TensorRef` (e.g. Adam's ``step``)."""
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, TensorRef) and value.numel == 1:
        try:
            return float(next(iter_blocks(value))[0])
        except (CheckpointError, StopIteration, OSError):
            return None
    return None


@dataclass
class Content:
    """What a checkpoint object holds, by role (see :func:`classify`).

    Attributes:
        params: ``(name, ref)`` of model state-dict tensors, in saved order.
        optimizers: Optimizer state dicts: ``{"where", "state": {idx: {key: value}}, "param_groups"}``.
        schedulers: Scheduler state dicts (``last_epoch``, ``_step_count``, ``base_lrs``, ``_last_lr``).
        counters: Top-level step counters (``step``, ``global_step``, ``iter_num``, ``iteration``, ``epoch``).
        other: ``(key path, ref)`` of every other tensor.
    """

    params: list[tuple[str, TensorRef]] = field(default_factory=list)
    optimizers: list[dict[str, Any]] = field(default_factory=list)
    schedulers: list[dict[str, Any]] = field(default_factory=list)
    counters: dict[str, float] = field(default_factory=dict)
    other: list[tuple[str, TensorRef]] = field(default_factory=list)


_MODEL_KEYS = {"model", "module", "state_dict", "model_state_dict", "model_state", "net", "network", "weights",
               "params"}
_COUNTERS = ("step", "global_step", "global_steps", "iter_num", "iteration", "epoch")
_SCHED_KEYS = ("last_epoch", "_step_count", "base_lrs", "_last_lr")


def _clean(name: str) -> str:
    for p in ("module.", "_orig_mod.", "model.module."):
        if name.startswith(p):
            name = name[len(p):]
    return name


def classify(obj: Any) -> Content:
    """Sort an unpickled checkpoint into model tensors, optimizer and scheduler state, counters.

    Recognised by keys: a dict with ``state`` and ``param_groups`` is an optimizer state dict
    (docs/formats.md#optimizer-state); one with ``last_epoch`` and ``base_lrs`` (or ``_step_count``) a scheduler;
    tensors at the top level or under ``model``/``module``/``state_dict``/... are model parameters
    (DDP ``module.`` and ``torch.compile`` ``_orig_mod.`` prefixes dropped); Lightning's
    ``optimizer_states`` and ``lr_schedulers`` lists are walked too. Any other tensor is ``other``.
    """
    c = Content()
    nested = isinstance(obj, dict) and any(str(k) in _MODEL_KEYS and isinstance(v, dict) for k, v in obj.items())
    _walk(obj, "", c, 0, None if nested else "")  # beside a "model" dict, loose tensors are not the model
    return c


def _walk(obj: Any, where: str, c: Content, depth: int, model: str | None) -> None:
    """``model``: name prefix when inside a model state dict, else None."""
    if depth > 8:
        return
    if isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            if isinstance(v, TensorRef):
                c.other.append((f"{where}[{i}]", v))
            else:
                _walk(v, f"{where}[{i}]", c, depth + 1, None)
        return
    if not isinstance(obj, dict):
        return
    keys = set(obj)
    if {"state", "param_groups"} <= keys and isinstance(obj.get("param_groups"), list):
        state = obj["state"] if isinstance(obj["state"], dict) else {}
        c.optimizers.append({"where": where, "state": state, "param_groups": obj["param_groups"]})
        return
    if "last_epoch" in keys and ("base_lrs" in keys or "_step_count" in keys):
        c.schedulers.append({k: obj[k] for k in _SCHED_KEYS if k in obj} | {"where": where})
        return
    for k, v in obj.items():
        key = str(k)
        path = f"{where}.{key}" if where else key
        if isinstance(v, TensorRef):
            if model is not None:
                c.params.append((_clean(model + key), v))
            else:
                c.other.append((path, v))
        elif isinstance(v, (dict, list, tuple)):
            if model is not None and depth > 0:
                sub: str | None = f"{model}{key}."
            else:
                sub = "" if depth == 0 and key in _MODEL_KEYS and isinstance(v, dict) else None
            _walk(v, path, c, depth + 1, sub)
        elif depth == 0 and key in _COUNTERS and isinstance(v, (int, float)) and not isinstance(v, bool):
            c.counters[key] = float(v)


def optimizer_tensors(opt: dict[str, Any]) -> Iterator[tuple[int, str, TensorRef]]:
    """``(param index, state key, ref)`` of every tensor in an optimizer state dict (``step`` excluded)."""
    for idx, st in opt["state"].items():
        if not isinstance(st, dict):
            continue
        for key, v in st.items():
            if isinstance(v, TensorRef) and key != "step":
                yield int(idx) if isinstance(idx, int) else -1, str(key), v


def sniff(path: Path) -> bool:
    """True for a file with a torch checkpoint suffix that starts like a zip archive."""
    try:
        with open(path, "rb") as fh:
            return path.suffix in (".pt", ".pth", ".bin", ".ckpt") and fh.read(4) == b"PK\x03\x04"
    except OSError:
        return False
