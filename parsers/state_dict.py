"""What an unpickled checkpoint object holds, by role: model parameters, optimizer and scheduler state, counters.

Format-neutral: works on any object whose tensors are :class:`parsers.tensors.TensorRef` (what
:func:`parsers.torch_ckpt.read` returns; docs/formats.md#optimizer-state).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from parsers.tensors import CheckpointError, TensorRef, iter_blocks

OPTIM_ROLES = {"exp_avg": "exp_avg", "exp_avg_sq": "exp_avg_sq"}
"""Optimizer state keys with their own role; other per-parameter tensors get role ``other``."""


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

