"""PyTorch zip checkpoints (``.pt``/``.bin``/``.pth``/``.ckpt``) read WITHOUT torch and without trusting them.

``torch.save`` (formats.md 6.2) writes a zip archive ``<a>/data.pkl`` + ``<a>/data/<key>`` (raw
storage bytes, stored uncompressed and 64-byte aligned) + ``<a>/byteorder``. ``data.pkl`` is a pickle
whose tensors are ``torch._utils._rebuild_tensor_v2(storage, offset, size, stride, ...)`` calls over
persistent ids ``('storage', torch.FloatStorage, key, location, numel)``.

Unpickling runs whatever callables the pickle names, so the reader here is an allowlist: a
:class:`pickle.Unpickler` whose ``find_class`` returns harmless stand-ins for the tensor-rebuild
functions (``_rebuild_tensor_v2``/``_v3``, ``_rebuild_parameter``), the storage and dtype names,
``torch.Size`` and ``collections.OrderedDict``, and refuses every other global before anything is
called: a file whose pickle wants ``os.system`` (or any class of a training framework) is refused
with ``refused: pickle wants to import os.system`` and nothing runs (formats.md 6.2: "never
unpickle untrusted data"; torch's own ``weights_only=True`` is the same idea with a larger list).
Tensors come back as :class:`parsers.safetensors_ckpt.TensorRef` byte ranges of the archive, streamed
later by the shared chunked reducer.

Also here: the structure of what was unpickled (:func:`classify`: model state dicts, optimizer state
dicts with their ``param_groups``, scheduler state dicts, step counters), recognised by their keys.
"""

from __future__ import annotations

import io
import math
import pickle
import struct
import zipfile
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from parsers.safetensors_ckpt import ITEMSIZE, CheckpointError, TensorRef, iter_blocks

FORMAT = "torch_zip"
MAX_PICKLE_BYTES = 256 << 20
"""A ``data.pkl`` larger than this is refused (a pickle of tensor metadata is kilobytes)."""
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
        return _Storage(str(pid[2]), pid[1].dtype, int(pid[4]))


def _data_offset(path: str, info: zipfile.ZipInfo) -> int:
    """Absolute offset of a stored member's data (after its local header, whose extra field may differ)."""
    with open(path, "rb") as fh:
        fh.seek(info.header_offset)
        hdr = fh.read(30)
    if len(hdr) < 30 or hdr[:4] != b"PK\x03\x04":
        raise CheckpointError(f"corrupt zip: no local header for {info.filename}")
    name_len, extra_len = struct.unpack("<HH", hdr[26:30])
    return info.header_offset + 30 + name_len + extra_len


def load(path: str | Path) -> Any:
    """Unpickle a torch zip checkpoint with the allowlist; tensors become :class:`TensorRef`.

    Args:
        path: A file written by ``torch.save`` (zip format, torch >= 1.6).

    Returns:
        The saved object (dicts, lists, numbers, strings) with every tensor replaced by a
        :class:`TensorRef` (``name`` empty; contiguous views point into the archive; a
        non-contiguous view carries its ``stride`` and ``span``).

    Raises:
        CheckpointError: A legacy (pre-1.6) or truncated file (no zip central directory), a
            big-endian archive, a missing storage, or a pickle that wants any global outside the
            allowlist (``refused: pickle wants to import X``; nothing is executed).
    """
    path = str(path)
    try:
        with open(path, "rb") as fh:
            head = fh.read(16)
        if not head.startswith(b"PK"):
            if LEGACY_MAGIC in head or head[:1] == b"\x80":
                raise CheckpointError("legacy (pre-1.6, non-zip) torch format: not read without torch "
                                      "(install torch and re-save it, or convert it to safetensors)")
            raise CheckpointError("not a torch zip checkpoint")
        zf = zipfile.ZipFile(path)
    except zipfile.BadZipFile:
        raise CheckpointError("incomplete save: the zip has no central directory (killed or disk full "
                              "mid-save?)") from None
    except OSError as exc:
        raise CheckpointError(f"unreadable: {exc.strerror or exc}") from None
    except (ValueError, EOFError) as exc:  # e.g. a member name that is not UTF-8 although flagged so
        raise CheckpointError(f"corrupt zip directory: {type(exc).__name__}: {exc}") from None
    with zf:
        infos = {i.filename: i for i in zf.infolist()}
        pkl = next((n for n in infos if n.endswith("/data.pkl") or n == "data.pkl"), None)
        if pkl is None:
            raise CheckpointError("zip archive without data.pkl (not a torch checkpoint)")
        prefix = pkl[: -len("data.pkl")]
        order = infos.get(prefix + "byteorder")
        try:
            little = order is None or zf.read(order).strip() in (b"", b"little")
        except (zipfile.BadZipFile, OSError, ValueError, EOFError) as exc:
            raise CheckpointError(f"corrupt zip member {order.filename}: {exc}") from None
        if not little:
            raise CheckpointError("big-endian torch archive: not supported")
        if infos[pkl].file_size > MAX_PICKLE_BYTES:
            raise CheckpointError(f"data.pkl is {infos[pkl].file_size} bytes (limit {MAX_PICKLE_BYTES}): refused")
        try:
            obj = Unpickler(io.BytesIO(zf.read(pkl))).load()
        except CheckpointError:
            raise
        except Exception as exc:  # noqa: BLE001 - a malformed pickle is a skip, never a crash
            raise CheckpointError(f"malformed pickle: {type(exc).__name__}: {exc}") from None
        cache: dict[str, tuple[int, str | None, int]] = {}

        def locate(key: str) -> tuple[int, str | None, int]:
            if key not in cache:
                info = infos.get(f"{prefix}data/{key}")
                if info is None:
                    raise CheckpointError(f"storage data/{key} missing from the archive (incomplete save)")
                if info.compress_type == zipfile.ZIP_STORED:
                    cache[key] = (_data_offset(path, info), None, info.file_size)
                else:
                    cache[key] = (0, info.filename, info.file_size)
            return cache[key]

        try:
            return _resolve(obj, path, locate, 0)
        except (TypeError, ValueError, OverflowError) as exc:
            raise CheckpointError(f"malformed tensor record: {type(exc).__name__}: {exc}") from None


def _resolve(obj: Any, path: str, locate: Any, depth: int) -> Any:
    if depth > 64:
        raise CheckpointError("refused: structure nested deeper than 64 levels")
    if isinstance(obj, _Tensor):
        return _to_ref(obj, path, locate)
    if isinstance(obj, dict):
        out = OrderedDict() if isinstance(obj, OrderedDict) else {}
        for k, v in obj.items():
            out[k] = _resolve(v, path, locate, depth + 1)
        return out
    if isinstance(obj, (list, tuple)):
        vals = [_resolve(v, path, locate, depth + 1) for v in obj]
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
    (formats.md 6.3); one with ``last_epoch`` and ``base_lrs`` (or ``_step_count``) a scheduler;
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
