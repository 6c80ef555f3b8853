"""PyTorch zip checkpoints (``.pt``/``.bin``/``.pth``/``.ckpt``) read WITHOUT torch and without trusting them.

A thin format reader of the :mod:`parsers.tensors` contract: :func:`read` returns a
:class:`parsers.tensors.Loaded` whose object is the unpickled structure with every tensor a
:class:`TensorRef` byte range of the archive.

``torch.save`` (docs/formats.md#torch-zip) writes a zip archive ``<a>/data.pkl`` + ``<a>/data/<key>`` (raw
storage bytes, stored uncompressed and 64-byte aligned) + ``<a>/byteorder``. ``data.pkl`` is a pickle
whose tensors are ``torch._utils._rebuild_tensor_v2(storage, offset, size, stride, ...)`` calls over
persistent ids ``('storage', torch.FloatStorage, key, location, numel)``. It is unpickled by the
allowlist unpickler of :mod:`parsers._safe_pickle` (nothing but tensor rebuilds and containers; a file
whose pickle wants ``os.system`` is refused and nothing runs; memo and node counts bounded first).

A save killed mid-write (or a full disk) leaves no central directory (docs/formats.md#torch-zip-partial),
and :mod:`zipfile` refuses such a file whole. :func:`read` then walks the local file headers from byte 0
instead (:mod:`parsers._torch_zip`: torch's data descriptors, ZIP64 fields, CRC-checked searches).
``data.pkl`` is written first; the byte size of each storage (``numel * itemsize`` from the pickle) is
then checked against the descriptor after it. Tensors whose storage bytes are all in the file are kept
exactly as in the intact file; the others are left out and listed, and the result is flagged
``truncated`` so it is never taken for a checkpoint to resume from. The same walk reads a file whose
central directory disagrees with its local headers (flipped bytes).

What the object holds by role (:func:`classify`, :func:`optimizer_tensors`, :func:`scalar`) is in
:mod:`parsers.state_dict`, re-exported here.
"""

from __future__ import annotations

import io
import os
import struct
import zipfile
from pathlib import Path
from typing import Any, NamedTuple

from forensics.model import Skip
from parsers._safe_pickle import (
    MAX_PICKLE_BYTES,
    Missing,
    Storage,
    Unpickler,
    bounded,
    count_tensors,
    max_nodes,
    prescan,
    resolve,
    storage_bytes,
    unpickle,
)
from parsers._torch_zip import (
    DESCRIPTOR,
    Entry,
    Unusable,
    Walk,
    central_entries,
    has_end_record,
    member_bytes,
    pickle_name,
    pread,
)
from parsers.state_dict import OPTIM_ROLES, Content, classify, optimizer_tensors, scalar
from parsers.tensors import CheckpointError, Loaded, TensorRef

__all__ = ["FORMAT", "OPTIM_ROLES", "CheckpointError", "Content", "Loaded", "TensorRef", "classify", "load",
           "max_nodes", "optimizer_tensors", "read", "scalar", "sniff"]

FORMAT = "torch_zip"
LEGACY_MAGIC = bytes.fromhex("1950a86a20f9469cfc6c")


class _Salvage(NamedTuple):
    """How a walked file ended: the file-level note, the offset it names, and the walk's stop."""

    note: str
    at: int
    truncated: bool
    stop: str


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
                entries = central_entries(fh, fsize)
                pkl = pickle_name(entries)
                if pkl is None:
                    raise Unusable("no data.pkl in the central directory")
                raw, crc_ok = member_bytes(fh, entries[pkl], MAX_PICKLE_BYTES)
                if not crc_ok:  # the central directory and the local header agree on it: the bytes are bad
                    raise CheckpointError(f"corrupt: {pkl} does not match its CRC-32 (flipped bytes?); nothing "
                                          "was read")
                obj, _ = unpickle(raw)
                return _finish(fh, path, fsize, obj, pkl, entries, None)
            except Unusable as exc:
                return _salvage(fh, path, fsize, str(exc))
    except OSError as exc:
        raise CheckpointError(f"unreadable: {exc.strerror or exc}") from None
    except (ValueError, EOFError, OverflowError, struct.error) as exc:
        raise CheckpointError(f"corrupt zip: {type(exc).__name__}: {exc}") from None


def _salvage(fh: Any, path: str, fsize: int, why: str) -> Loaded:
    """Walk the local headers of a file whose central directory is missing or unusable (see :func:`read`)."""
    sizes: dict[str, int] = {}
    walk = Walk(fh, fsize, sizes)
    entries: dict[str, Entry] = {}
    found: tuple[Any, str] | None = None
    for e in walk:
        entries.setdefault(e.name, e)
        if found is None and pickle_name([e.name]) is not None:
            if e.complete:
                raw, crc_ok = member_bytes(fh, e, MAX_PICKLE_BYTES)
                if not crc_ok:
                    raise CheckpointError(f"corrupt: {e.name} does not match its CRC-32; nothing was read")
                obj, storages = unpickle(raw)
            elif (tail := _pickle_before_end(fh, e, fsize)) is not None:
                obj, storages = tail
            else:
                raise CheckpointError(f"incomplete save: data.pkl is cut (the file ends at byte {fsize}, inside "
                                      f"{e.name}): no tensor can be named; nothing was read")
            prefix = e.name[: -len("data.pkl")]
            sizes.update({f"{prefix}data/{k}": storage_bytes(s) for k, s in storages.items()})
            found = (obj, e.name)
    if walk.stop == "central directory":
        truncated = not has_end_record(fh, fsize)
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


def _pickle_before_end(fh: Any, e: Entry, fsize: int) -> tuple[Any, dict[str, Storage]] | None:
    """A whole stored ``data.pkl`` whose descriptor is cut, unpickled; ``None`` when the pickle itself is cut.

    Whole: the pickle ends (STOP) within the last 15 bytes of the file and only the start of a data
    descriptor follows it.

    Raises:
        CheckpointError: The pickle wants a global or persistent id outside the allowlist.
    """
    n = fsize - e.data
    if e.method != zipfile.ZIP_STORED or n > MAX_PICKLE_BYTES + 16:
        return None
    data = pread(fh, e.data, n)
    try:
        prescan(data)
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
    bounded(obj, n)
    rest = bio.read()
    return (obj, unp.storages) if len(rest) < 16 and DESCRIPTOR.startswith(rest[:4]) else None


def _finish(fh: Any, path: str, fsize: int, obj: Any, pkl: str, entries: dict[str, Entry],
            salvage: _Salvage | None) -> Loaded:
    """Check the byte order and turn tensors into refs; missing or cut storages drop their tensors."""
    prefix = pkl[: -len("data.pkl")]
    order = entries.get(prefix + "byteorder")
    if order is not None and order.complete:
        raw, _ = member_bytes(fh, order, 64)
        if raw.strip() not in (b"", b"little"):
            raise CheckpointError("big-endian torch archive: not supported")
    cache: dict[str, tuple[int, str | None, int]] = {}

    def locate(key: str) -> tuple[int, str | None, int]:
        if key not in cache:
            e = entries.get(f"{prefix}data/{key}")
            if e is None:
                if salvage is None:  # not in the central directory: look for it in the local headers
                    raise Unusable(f"storage data/{key} is not in the central directory")
                if salvage.stop == "eof":
                    raise Missing(f"its storage data/{key} is missing: the file ends at byte {fsize} before it")
                if salvage.stop == "central directory":
                    raise Missing(f"its storage data/{key} is missing from the archive")
                raise Missing(f"its storage data/{key} was not found before unreadable bytes at {salvage.at}")
            if not e.complete:
                raise Missing(f"its storage data/{key} is cut: it needs bytes {e.data}-{e.data + e.size}, the file "
                               f"ends at byte {fsize}")
            if e.method == zipfile.ZIP_STORED:
                cache[key] = (e.data, None, e.size)
            elif salvage is not None:
                raise Missing(f"its storage data/{key} is compressed and the zip central directory is unusable")
            else:
                cache[key] = (0, e.name, e.usize)
        return cache[key]

    lost: list[Skip] = []
    at = fsize if salvage is None else salvage.at
    try:
        out = resolve(obj, path, locate, 0, "", lost, at, {})
    except (TypeError, ValueError, OverflowError) as exc:
        raise CheckpointError(f"malformed tensor record: {type(exc).__name__}: {exc}") from None
    if salvage is None:
        return Loaded(out, lost, size=fsize)
    note, at, truncated, _stop = salvage
    n_all = count_tensors(obj)
    head = Skip(f"{path}:{at}", f"{note}: {n_all - len(lost)} of {n_all} tensors read"
                + (f", {len(lost)} not (listed)" if lost else ""))
    return Loaded(out, [head, *lost], truncated=truncated, salvaged=True, size=fsize)



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



def sniff(path: Path) -> bool:
    """True for a file with a torch checkpoint suffix that starts like a zip archive."""
    try:
        with open(path, "rb") as fh:
            return path.suffix in (".pt", ".pth", ".bin", ".ckpt") and fh.read(4) == b"PK\x03\x04"
    except OSError:
        return False
