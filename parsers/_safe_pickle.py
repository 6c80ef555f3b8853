"""The pickle half of torch checkpoints: an allowlist unpickler and a bounded resolver (issue 16).

Unpickling runs whatever callables the pickle names, so :class:`Unpickler` is an allowlist: a
:class:`pickle.Unpickler` whose ``find_class`` returns harmless stand-ins for the tensor-rebuild
functions (``_rebuild_tensor_v2``/``_v3``, ``_rebuild_parameter``), the storage and dtype names,
``torch.Size`` and ``collections.OrderedDict``, and refuses every other global before anything is
called: a file whose pickle wants ``os.system`` (or any class of a training framework) is refused
with ``refused: pickle wants to import os.system`` and nothing runs (docs/formats.md#torch-zip: "never
unpickle untrusted data"; torch's own ``weights_only=True`` is the same idea with a larger list).

The C unpickler never sees bytes that were not bounded first: the opcodes are scanned in pure Python
(:func:`prescan`: every memo index below the opcode count and :data:`MAX_MEMO`, so a 10-byte memo bomb
cannot make it allocate gigabytes), and the object it returns may expand to at most :func:`max_nodes`
nodes (relative to the pickle's size) once shared references are walked path by path, counted memoised
by object identity. :func:`resolve` turns the rebuild records into :class:`parsers.tensors.TensorRef`
byte ranges, memoised by identity too, so a DAG of shared references (``L_i = [L_(i-1), L_(i-1)]``) is
resolved in linear time and stays shared.
"""

from __future__ import annotations

import io
import math
import pickle
import pickletools
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from forensics.model import Skip
from parsers._limits import TooLarge, expanded_size
from parsers.tensors import ITEMSIZE, CheckpointError, TensorRef

MAX_PICKLE_BYTES = 256 << 20
"""A ``data.pkl`` larger than this is refused (a pickle of tensor metadata is kilobytes)."""
MAX_MEMO = 1 << 24
"""Largest pickle memo index accepted (a state dict of 100k tensors uses ~1M memo slots)."""
MIN_NODES = 1_000_000
"""Nodes any pickle may expand to (shared references walked path by path), whatever its size."""
_STORAGES = {"FloatStorage": "F32", "DoubleStorage": "F64", "HalfStorage": "F16", "BFloat16Storage": "BF16",
             "LongStorage": "I64", "IntStorage": "I32", "ShortStorage": "I16", "CharStorage": "I8",
             "ByteStorage": "U8", "BoolStorage": "BOOL", "UntypedStorage": None}
_DTYPES = {"float32": "F32", "float": "F32", "float64": "F64", "double": "F64", "float16": "F16", "half": "F16",
           "bfloat16": "BF16", "int64": "I64", "long": "I64", "int32": "I32", "int": "I32", "int16": "I16",
           "int8": "I8", "uint8": "U8", "bool": "BOOL", "uint16": "U16", "uint32": "U32", "uint64": "U64",
           "float8_e4m3fn": "F8_E4M3", "float8_e5m2": "F8_E5M2", "float8_e4m3fnuz": "F8_E4M3FNUZ",
           "float8_e5m2fnuz": "F8_E5M2FNUZ", "float8_e8m0fnu": "F8_E8M0"}



@dataclass(frozen=True)
class Storage:
    """A storage the pickle names: its key (the zip member ``data/<key>``), dtype and element count."""

    key: str
    dtype: str | None  # None: UntypedStorage (bytes), the dtype comes with _rebuild_tensor_v3
    numel: int


@dataclass(frozen=True)
class _DType:
    code: str


class _Tensor:
    """What a tensor-rebuild call returns while unpickling: where its bytes are, nothing else."""

    __slots__ = ("storage", "offset", "shape", "stride", "dtype")

    def __init__(self, storage: Storage, offset: int, shape: tuple, stride: tuple, dtype: str | None) -> None:
        self.storage, self.offset, self.shape, self.stride = storage, int(offset), tuple(shape), tuple(stride)
        self.dtype = dtype or storage.dtype


def _rebuild_v2(storage: Storage, offset: int, size: tuple, stride: tuple, *_: Any) -> _Tensor:
    return _Tensor(storage, offset, size, stride, None)


def _rebuild_v3(storage: Storage, offset: int, size: tuple, stride: tuple, _rg: Any, _hooks: Any,
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
        self.storages: dict[str, Storage] = {}
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

    def persistent_load(self, pid: Any) -> Storage:
        """``('storage', <storage type>, key, location, numel)`` -> a storage record."""
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"
                and isinstance(pid[1], _StorageType) and isinstance(pid[4], int)):
            raise CheckpointError(f"refused: unknown persistent id {str(pid)[:80]}")
        st = Storage(str(pid[2]), pid[1].dtype, int(pid[4]))
        self.storages.setdefault(st.key, st)
        return st


class Missing(Exception):
    """A storage is not (completely) in the file: its tensors are left out, not the file."""



_MEMO_OPS = {"PUT", "BINPUT", "LONG_BINPUT"}


def prescan(raw: bytes) -> int:
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


def unpickle(raw: bytes) -> tuple[Any, dict[str, Storage]]:
    """Unpickle ``data.pkl`` with the allowlist; the object and its storages by key.

    Bounded (issue 16): opcodes are scanned first (:func:`prescan`), and the result may expand to
    at most :func:`max_nodes` nodes once shared references are walked path by path (counted
    memoised by identity: linear).

    Raises:
        CheckpointError: A refused global or persistent id, a memo bomb, a structure that expands past
            the node limit, or a malformed (e.g. cut) pickle.
    """
    prescan(raw)
    unp = Unpickler(io.BytesIO(raw))
    try:
        obj = unp.load()
    except CheckpointError:
        raise
    except Exception as exc:  # noqa: BLE001 - a malformed pickle is a skip, never a crash
        raise CheckpointError(f"malformed pickle: {type(exc).__name__}: {exc}") from None
    bounded(obj, len(raw))
    return obj, unp.storages


def bounded(obj: Any, nbytes: int) -> None:
    """Refuse an unpickled object that expands past :func:`max_nodes` of its pickle's size.

    Raises:
        CheckpointError: Too many nodes once shared references are walked, or nested too deep.
    """
    try:
        expanded_size(obj, max_nodes(nbytes), 64)
    except TooLarge as exc:
        raise CheckpointError(f"refused: pickle structure {exc} from {nbytes} bytes of pickle") from None


def storage_bytes(s: Storage) -> int:
    """Byte size of a storage (``numel * itemsize``; bytes for an untyped storage)."""
    return s.numel * (ITEMSIZE.get(s.dtype, 0) if s.dtype else 1)


def count_tensors(obj: Any, depth: int = 0) -> int:
    """Tensor records in an unpickled object (shared ones counted per path; at most 64 levels deep)."""
    if depth > 64:
        return 0
    if isinstance(obj, _Tensor):
        return 1
    if isinstance(obj, dict):
        return sum(count_tensors(v, depth + 1) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(count_tensors(v, depth + 1) for v in obj)
    return 0



_DROP = object()


def resolve(obj: Any, path: str, locate: Any, depth: int, where: str, lost: list[Skip], at: int,
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
        except Missing as exc:
            lost.append(Skip(f"{path}:{at}", f"tensor {where or '<root>'} not read: {exc}"))
            return _DROP
    if isinstance(obj, dict):
        out = OrderedDict() if isinstance(obj, OrderedDict) else {}
        for k, v in obj.items():
            r = resolve(v, path, locate, depth + 1, f"{where}.{k}" if where else str(k), lost, at, memo)
            if r is not _DROP:
                out[k] = r
        return out
    if isinstance(obj, (list, tuple)):
        vals = [resolve(v, path, locate, depth + 1, f"{where}[{i}]", lost, at, memo) for i, v in enumerate(obj)]
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
