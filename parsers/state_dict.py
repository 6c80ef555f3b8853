"""What an unpickled checkpoint object holds, by role: model parameters, optimizer and scheduler state, counters.

Format-neutral: works on any object whose tensors are :class:`parsers.tensors.TensorRef` (what
:func:`parsers.torch_ckpt.read` returns; docs/formats.md#optimizer-state).
"""

from __future__ import annotations

from collections import Counter
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


def _map_params(opt: dict[str, Any], params: list[tuple[str, TensorRef]], ordered: bool) -> tuple[dict[int, str], str]:
    """Optimizer param index -> parameter name, and how (``param_names``, ``order``, ``unique_shape``, ``none``)."""
    groups = [g for g in opt["param_groups"] if isinstance(g, dict)]
    ids = [i for g in groups for i in (g.get("params") or [])]
    names: dict[int, str] = {}
    for g in groups:
        pn, gi = g.get("param_names"), g.get("params")
        if isinstance(pn, list) and isinstance(gi, list) and len(pn) == len(gi):
            names.update({int(i): str(n) for i, n in zip(gi, pn, strict=True)})
    if ids and len(names) == len(ids):
        return names, "param_names"
    shapes = {i: r.shape for i, k, r in optimizer_tensors(opt) if k in ("exp_avg", "exp_avg_sq")}
    if ordered and len(groups) == 1 and params:
        k, out = 0, {}
        for i in ids:  # model.parameters() order is the state-dict order with buffers interleaved
            while k < len(params) and i in shapes and params[k][1].shape != shapes[i]:
                k += 1
            if k == len(params):
                break
            out[i], k = params[k][0], k + 1
        if len(out) == len(ids):
            return out, "order"
    by_shape = Counter(r.shape for _, r in params)
    opt_shape = Counter(shapes.values())
    first = {r.shape: n for n, r in params}
    out = {i: first[s] for i, s in shapes.items() if by_shape[s] == 1 and opt_shape[s] == 1}
    return out, "unique_shape" if out else "none"


def _group_of(opt: dict[str, Any], idx: int) -> dict[str, Any]:
    for g in opt["param_groups"]:
        if isinstance(g, dict) and idx in (g.get("params") or []):
            return g
    return {}


def jsonable(x: Any) -> Any:
    """``x`` with anything but numbers, strings, booleans, None and lists of them as ``str`` (for meta)."""
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    return x if isinstance(x, (int, float, str, bool)) or x is None else str(x)



Entry = tuple[str, str, TensorRef, float | None]
"""A tensor to read: ``(name, role, ref, small_below)``."""


def optimizer_entries(opt: dict[str, Any], n_opt: int, params: list[tuple[str, TensorRef]],
                      ordered: bool) -> tuple[dict[str, Any], list[float], list[Entry]]:
    """One optimizer state dict's summary, its steps and its tensors, named after their parameters.

    Args:
        opt: An optimizer state dict as :func:`classify` finds it (``state``, ``param_groups``).
        n_opt: Its index among the checkpoint's optimizers (names of the second on get ``opt<n>.``).
        params: The model's ``(name, ref)`` in saved order (or any order when ``ordered`` is False).
        ordered: ``params`` are in the order ``model.parameters()`` gave them (a torch state dict).

    Returns:
        ``({"step", "param_names", "param_groups"}, steps, [(name, role, ref, small_below)])``: the role is
        ``exp_avg``, ``exp_avg_sq`` or ``other`` (then the name ends in ``:<state key>``); ``small_below``
        is the Adam-epsilon threshold on ``v`` for ``exp_avg_sq`` (``(10 eps)^2 (1 - beta2^t)``), else None.
    """
    names, how = _map_params(opt, params, ordered)
    steps = [scalar(st.get("step")) for st in list(opt["state"].values())[:2048] if isinstance(st, dict)]
    steps = [s for s in steps if s is not None]
    groups = [{k: jsonable(g.get(k)) for k in ("lr", "betas", "eps", "weight_decay") if k in g}
              | {"n_params": len(g.get("params") or [])} for g in opt["param_groups"] if isinstance(g, dict)]
    summary = {"step": int(max(steps)) if steps else None, "param_names": how, "param_groups": groups[:16]}
    out: list[Entry] = []
    for idx, key, ref in optimizer_tensors(opt):
        base = names.get(idx, f"param{idx}") if n_opt == 0 else f"opt{n_opt}.{names.get(idx, f'param{idx}')}"
        role = OPTIM_ROLES.get(key, "other")
        small = None
        if role == "exp_avg_sq":
            g = _group_of(opt, idx)
            eps = float(g.get("eps", 1e-8) or 1e-8)
            beta2 = float((g.get("betas") or (0.9, 0.999))[1])
            t = scalar(opt["state"][idx].get("step")) if idx in opt["state"] else None
            small = (10 * eps) ** 2 * ((1 - beta2 ** t) if t else 1.0)
        out.append((base if role != "other" else f"{base}:{key}", role, ref, small))
    return summary, steps, out
