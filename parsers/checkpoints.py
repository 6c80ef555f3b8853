"""Checkpoint forensics: the ``tensors`` and ``updates`` tables of DESIGN.md section 2, from a run folder.

A *checkpoint* is a folder or file whose name carries a step (``checkpoint-500/``, ``ckpt/step_200/``,
``global_step300/``, ``iter_0000100/``, ``step_400.safetensors``, ``epoch=0-step=100.ckpt``); files of
checkpoint types elsewhere form one checkpoint per folder whose step comes from ``trainer_state.json``
(``global_step``), a counter saved in a torch file (``step``, ``iter_num``...) or the optimizer's ``step``.
Inside: safetensors files (single or sharded, with ``*.index.json``), torch zip files (model,
``optimizer.pt``, ``scheduler.pt``, nanoGPT/Lightning bundles), torch.distributed (``*.distcp`` +
``.metadata``) and DeepSpeed ZeRO layouts (recognised and checked for completeness, not decoded).

Every tensor is streamed once in bounded memory (:mod:`parsers.safetensors_ckpt`); parameters are
streamed together with the same tensor of the previous checkpoint, so ``updates`` (``delta_l2 =
||W_to - W_from||``, ``weight_l2 = ||W_from||``, ``ratio``) costs one more pass and never a whole
checkpoint in memory. ``updates`` rows: one per tensor, one per layer (``tensor`` = ``"<prefix>.*"``,
e.g. ``blocks.0.*``: norms of the concatenated tensors whose name has that numbered prefix) and one
for the whole model (``tensor`` = ``"*"``). Optimizer tensors are named after their parameter when the
state dict's ``param_names`` (torch >= 2.6), the model's parameter order (one param group, a torch
state dict) or a shape unique to one parameter allow it, else ``param<i>``.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa

from forensics.model import Skip
from forensics.schema import TENSORS_SCHEMA, UPDATES_SCHEMA
from parsers import file_policy, torch_ckpt
from parsers.safetensors_ckpt import CheckpointError, TensorRef, parse_header, read_index, tensor_stats

SUFFIXES = (".safetensors", ".pt", ".pth", ".bin", ".ckpt", ".distcp")
_STEP = re.compile(r"(?:^|[^a-z])(?:global_step|checkpoint|ckpt|step|iter(?:ation)?)[-_=]?(\d+)(?![0-9a-z])", re.I)
_TRAILING = re.compile(r"^[a-z]+[-_](\d+)$", re.I)
_NOT_STATE = re.compile(r"^(training_args\.bin|rng_state.*\.pth)$")  # pickles of non-tensor objects: not read
_DS_MODEL = re.compile(r"^mp_rank_(\d+)_model_states\.pt$")
_DS_OPTIM = re.compile(r"^(?:bf16_)?zero_pp_rank_(\d+)_mp_rank_(\d+)_optim_states\.pt$")
_MASTER = re.compile(r"fp32_from|fp32_groups|fp32_flat|master", re.I)
_MAX_LISTED = 20
"""Missing shards listed one by one; the rest in one entry."""
ADAM_EPS_SHARE_KEEP = 0.05
"""Adam-epsilon shares below this are not kept in meta (the detector needs >= 0.5)."""


@dataclass
class _Unit:
    rel: str
    step: int | None
    files: list[Path] = field(default_factory=list)
    tensors: list[tuple[str, str, TensorRef, float | None]] = field(default_factory=list)  # name, role, ref, small
    info: dict[str, Any] = field(default_factory=dict)


def find_checkpoints(root: Path) -> list[_Unit]:
    """Group the checkpoint files under ``root`` into checkpoints (cheap: names only, no reads)."""
    units: dict[str, _Unit] = {}
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d != "__pycache__")
        for fname in sorted(files):
            low = fname.lower()
            if not (low.endswith(SUFFIXES) or low.endswith(".index.json")) or fname.startswith("."):
                continue
            path = Path(folder, fname)
            if file_policy.why_not(path, root) is not None:  # FIFO, device, dangling or outside link: never
                continue  # opened (discovery lists it)
            parts = path.relative_to(root).parts
            unit, step = parts[:-1], None
            for i in range(len(parts) - 1, -1, -1):
                name = Path(parts[i]).stem if i == len(parts) - 1 else parts[i]
                m = _STEP.search(name) or (_TRAILING.match(name) if i == len(parts) - 1 else None)
                if m:
                    unit, step = parts[: i + 1], int(m.group(1))
                    break
            rel = "/".join(unit) or "."
            units.setdefault(rel, _Unit(rel, step)).files.append(path)
    return list(units.values())


def _zip_or_pickle(path: Path) -> bool:
    try:
        with file_policy.open_file(path) as fh:
            head = fh.read(4)
    except OSError:
        return True  # let the reader report it
    return head.startswith(b"PK") or head[:1] == b"\x80"


def _trainer_state_step(folder: Path) -> int | None:
    try:
        st = json.loads(file_policy.read_text(folder / "trainer_state.json", 64 << 20))
        return int(st["global_step"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


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
    shapes = {i: r.shape for i, k, r in torch_ckpt.optimizer_tensors(opt) if k in ("exp_avg", "exp_avg_sq")}
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


def _num(x: Any) -> Any:
    if isinstance(x, (list, tuple)):
        return [_num(v) for v in x]
    return x if isinstance(x, (int, float, str, bool)) or x is None else str(x)


def _load_unit(root: Path, u: _Unit, skipped: list[Skip]) -> None:
    """Read the structure of one checkpoint (headers and pickles, no tensor data) into ``u``."""
    folder = root / u.rel if (root / u.rel).is_dir() else (root / u.rel).parent
    info = u.info
    info.update(step=u.step, path=u.rel, step_source="name" if u.step is not None else None, complete=True,
                problems=[], files=sorted(p.name for p in u.files), bytes=sum(p.stat().st_size for p in u.files))
    params: list[tuple[str, TensorRef]] = []
    others: list[tuple[str, TensorRef]] = []
    optims: list[dict[str, Any]] = []
    counters: dict[str, float] = {}
    torch_params: list[tuple[str, TensorRef]] = []  # in saved order (safetensors files do not keep it)
    kinds: set[str] = set()
    ds_model, ds_optim, distcp = [], [], 0

    def problem(what: Path | str, why: str, incomplete: bool = True) -> None:
        rel = what.relative_to(root).as_posix() if isinstance(what, Path) else what
        skipped.append(Skip(rel, why))
        info["problems"].append(f"{Path(rel).name}: {why}")
        if incomplete:
            info["complete"] = False

    for f in sorted(u.files):
        if _NOT_STATE.match(f.name):
            continue
        if f.name.endswith(".index.json"):
            try:
                wmap, missing = read_index(f)
            except CheckpointError as exc:
                problem(f, str(exc))
                continue
            by_shard: dict[str, list[str]] = {}
            for t, s in wmap.items():  # one pass: a crafted index naming 40k missing shards stays linear
                by_shard.setdefault(s, []).append(t)
            for shard in missing[:_MAX_LISTED]:
                lost = by_shard[shard]
                problem(f"{f.parent.relative_to(root).as_posix()}/{file_policy.display(shard)}",
                        f"shard listed in {f.name} is missing: {len(lost)} tensors not read "
                        f"({', '.join(lost[:3])}{', ...' if len(lost) > 3 else ''})")
            if len(missing) > _MAX_LISTED:
                rest = sum(len(by_shard[s]) for s in missing[_MAX_LISTED:])
                problem(f.relative_to(root).as_posix(), f"{len(missing) - _MAX_LISTED} more shards listed in "
                        f"{f.name} are missing: {rest} more tensors not read")
            kinds.add("sharded")
            continue
        if f.suffix == ".distcp":
            distcp += 1
            continue
        if (m := _DS_OPTIM.match(f.name)) is not None:
            ds_optim.append((int(m.group(1)), int(m.group(2))))
            continue
        if (m := _DS_MODEL.match(f.name)) is not None:
            ds_model.append(int(m.group(1)))
        if f.suffix == ".bin" and not _zip_or_pickle(f):
            continue  # a data or tokenizer file (nanoGPT train.bin), not a checkpoint
        try:
            if f.suffix == ".safetensors":
                h = parse_header(f)
                rel = f.relative_to(root).as_posix()
                skipped.extend(Skip(rel + s.what[len(str(f)):], s.reason) for s in h.skipped)
                if h.truncated:  # the tensors inside the file are read; the checkpoint is not whole
                    info["complete"], info["truncated"] = False, True
                    info["problems"].append(
                        f"{f.name}: truncated at byte {h.file_bytes} of {h.declared_bytes}: {len(h.cut)} tensors cut "
                        f"({', '.join(h.cut[:3])}{', ...' if len(h.cut) > 3 else ''}), {len(h.tensors)} read; "
                        "never resume from it")
                params += [(r.name, r) for r in h.tensors]
                kinds.add("safetensors")
                continue
            got = torch_ckpt.read(f)  # a cut or damaged file keeps its complete tensors (issue 8)
            if got.skipped:
                problem(f.relative_to(root).as_posix() + got.skipped[0].what[len(str(f)):], got.skipped[0].reason)
                skipped.extend(Skip(f.relative_to(root).as_posix() + s.what[len(str(f)):], s.reason)
                               for s in got.skipped[1:])
                info["complete"] = False
            if got.truncated:
                info["truncated"] = True
            c = torch_ckpt.classify(got.obj)
        except CheckpointError as exc:
            problem(f, str(exc))
            continue
        except OSError as exc:
            problem(f, f"unreadable: {exc.strerror or exc}")
            continue
        except Exception as exc:  # noqa: BLE001 - an odd structure is a skip, never a crash
            problem(f, f"not understood: {type(exc).__name__}: {exc}")
            continue
        kinds.add("torch")
        params += c.params
        torch_params += c.params
        others += c.other
        optims += c.optimizers
        counters.update(c.counters)
        for s in c.schedulers:
            info["scheduler"] = {k: _num(v) for k, v in s.items() if k != "where"}
    if distcp:
        kinds.add("dcp")
        if not (folder / ".metadata").is_file():
            problem(u.rel, "incomplete torch.distributed checkpoint: no .metadata (the save did not finish); "
                    "never resume from it")
        else:
            problem(u.rel, f"torch.distributed checkpoint ({distcp} .distcp files): complete, tensors not decoded "
                    "(its .metadata is a pickle of torch classes)", incomplete=False)
    if ds_optim or ds_model:
        kinds.add("deepspeed")
        dp = sorted({d for d, _ in ds_optim})
        mps = sorted({m for _, m in ds_optim} | set(ds_model))
        gaps = [f"mp_rank_{m:02d}_model_states.pt" for m in mps if m not in ds_model]
        gaps += [f"zero_pp_rank_{d}_mp_rank_{m:02d}_optim_states.pt" for m in mps
                 for d in range(max(dp, default=-1) + 1) if (d, m) not in ds_optim]
        for g in gaps:
            problem(f"{u.rel}/{g}", "DeepSpeed checkpoint file missing (incomplete save or lost rank)")
        if ds_optim:
            problem(u.rel, f"DeepSpeed ZeRO optimizer state: {len(dp)} data-parallel x {len(mps)} model-parallel "
                    "partitions (flat fp32 partitions, not decoded)", incomplete=False)
    info["format"] = "+".join(sorted(kinds)) or "none"
    ts = _trainer_state_step(folder) if folder.is_dir() else None
    if ts is not None:
        info["trainer_state_step"] = ts
    seen: set[str] = set()
    params = [(n, r) for n, r in params if not (n in seen or seen.add(n))]  # same tensor in .bin and .safetensors
    for name, ref in params:
        u.tensors.append((name, "param", ref, None))
    for path, ref in others:
        u.tensors.append((path, "master_param" if _MASTER.search(path) else "other", ref, None))
    opt_steps: list[float] = []
    for n_opt, opt in enumerate(optims):
        try:
            _add_optimizer(u, info, opt, n_opt, torch_params or params, bool(torch_params), opt_steps)
        except Exception as exc:  # noqa: BLE001 - an odd optimizer dict is a problem, not a crash
            problem(u.rel, f"optimizer state {opt.get('where') or ''} not understood: {type(exc).__name__}: {exc}")
    if u.step is None:
        if ts is not None:
            u.step, info["step_source"] = ts, "trainer_state"
        elif (k := next((k for k in ("global_step", "global_steps", "step", "iter_num", "iteration")
                         if k in counters), None)) is not None:
            u.step, info["step_source"] = int(counters[k]), f"saved {k}"
        elif opt_steps:
            u.step, info["step_source"] = int(max(opt_steps)), "optimizer step"
        info["step"] = u.step


def _add_optimizer(u: _Unit, info: dict[str, Any], opt: dict[str, Any], n_opt: int,
                   params: list[tuple[str, TensorRef]], ordered: bool, opt_steps: list[float]) -> None:
    """Add one optimizer state dict's tensors to ``u`` and its step and param_groups to ``info``."""
    names, how = _map_params(opt, params, ordered)
    steps = [torch_ckpt.scalar(st.get("step")) for st in list(opt["state"].values())[:2048] if isinstance(st, dict)]
    steps = [s for s in steps if s is not None]
    opt_steps += steps
    groups = [{k: _num(g.get(k)) for k in ("lr", "betas", "eps", "weight_decay") if k in g}
              | {"n_params": len(g.get("params") or [])} for g in opt["param_groups"] if isinstance(g, dict)]
    info.setdefault("optimizer", {"step": int(max(steps)) if steps else None, "param_names": how,
                                  "param_groups": groups[:16]})
    for idx, key, ref in torch_ckpt.optimizer_tensors(opt):
        base = names.get(idx, f"param{idx}") if n_opt == 0 else f"opt{n_opt}.{names.get(idx, f'param{idx}')}"
        role = torch_ckpt.OPTIM_ROLES.get(key, "other")
        small = None
        if role == "exp_avg_sq":
            g = _group_of(opt, idx)
            eps = float(g.get("eps", 1e-8) or 1e-8)
            beta2 = float((g.get("betas") or (0.9, 0.999))[1])
            t = torch_ckpt.scalar(opt["state"][idx].get("step")) if idx in opt["state"] else None
            small = (10 * eps) ** 2 * ((1 - beta2 ** t) if t else 1.0)
        u.tensors.append((base if role != "other" else f"{base}:{key}", role, ref, small))


def _layer(name: str) -> str | None:
    parts = name.split(".")
    for i, p in enumerate(parts[:-1]):
        if p.isdigit():
            return ".".join(parts[: i + 1])
    return None


def _stream(ref: TensorRef, prev: TensorRef | None, small: float | None) -> tuple[dict[str, Any], float | None]:
    """Statistics of ``ref`` and, when ``prev`` is given, ``||ref - prev||^2`` in the same pass."""
    st = tensor_stats(ref, small, prev if prev is not None and prev.numel == ref.numel else None)
    return st, st.pop("delta_sq", None)


def read_checkpoints(run_dir: str | Path, run_name: str) -> tuple[pl.DataFrame, pl.DataFrame, list[dict[str, Any]],
                                                                   list[Skip]]:
    """Read every checkpoint of a run folder into the ``tensors`` and ``updates`` tables.

    Args:
        run_dir: The run folder.
        run_name: Value of the ``run`` column.

    Returns:
        ``(tensors, updates, meta, skipped)``: polars tables with :data:`forensics.schema.TENSORS_SCHEMA`
        and :data:`forensics.schema.UPDATES_SCHEMA` (empty when the folder has no checkpoint); ``meta``
        is one dict per checkpoint in step order (``step``, ``path``, ``step_source``, ``format``,
        ``files``, ``bytes``, ``complete``, ``finite`` (every tensor read has no NaN/inf), ``problems``,
        ``n_tensors``, ``optimizer`` {``step``, ``param_groups``, ``param_names``}, ``scheduler``
        {``last_epoch``, ``_step_count``, ``base_lrs``, ``_last_lr``}, ``trainer_state_step``, ``truncated``
        (only when a torch or safetensors file was cut short: ``complete`` is then False too),
        ``adam_eps`` [{``tensor``, ``share``, ``eps_threshold``}]: exp_avg_sq tensors whose share of
        positive coordinates with sqrt(v_hat) <= 10 eps is at least 5%); ``skipped`` lists files and
        tensors not read (refused pickles, truncated files, missing shards, undecoded layouts).
        Never raises for a bad checkpoint; memory stays at a few chunk buffers (4 MiB each).
    """
    root = Path(run_dir)
    units = find_checkpoints(root)
    skipped: list[Skip] = []
    if not units:
        return (pl.from_arrow(TENSORS_SCHEMA.empty_table()), pl.from_arrow(UPDATES_SCHEMA.empty_table()),  # type: ignore[return-value]
                [], skipped)
    for u in units:
        _load_unit(root, u, skipped)
    units = [u for u in units if u.tensors or u.info["problems"] or u.info["format"] != "none"]
    units.sort(key=lambda u: (u.step is None, u.step or 0, u.rel))
    rows: list[dict[str, Any]] = []
    upd: list[dict[str, Any]] = []
    prev: dict[str, tuple[TensorRef, float]] = {}
    prev_step: int | None = None
    prev_complete, prev_names = False, set()
    for u in units:
        cur: dict[str, tuple[TensorRef, float]] = {}
        first_upd = len(upd)
        finite, eps_rows = True, []
        for name, role, ref, small in u.tensors:
            p = prev.get(name) if role == "param" and u.step is not None and prev_step is not None \
                and prev_step < u.step else None
            try:
                st, dsq = _stream(ref, p[0] if p else None, small)
            except (CheckpointError, OSError, ValueError) as exc:
                skipped.append(Skip(f"{u.rel}:{name}", f"tensor not read: {exc}"))
                u.info["complete"] = False
                continue
            finite = finite and st["n_nan"] + st["n_inf"] == 0
            rows.append({"run": run_name, "step": u.step, "checkpoint": u.rel, "tensor": name, "role": role,
                         "dtype": ref.dtype, "shape": list(ref.shape), **{k: st[k] for k in (
                             "numel", "l2", "rms", "max_abs", "n_nan", "n_inf", "n_zero")}})
            if role == "param":
                cur[name] = (ref, st["l2"])
            if dsq is not None and p is not None:
                upd.append({"run": run_name, "step_from": prev_step, "step_to": u.step, "tensor": name,
                            "delta_l2": math.sqrt(dsq) if dsq >= 0 else float("nan"), "weight_l2": p[1],
                            "partial": False})
            if small is not None and st.get("n_pos"):
                share = st["n_small"] / st["n_pos"]
                if share >= ADAM_EPS_SHARE_KEEP:
                    eps_rows.append({"tensor": name, "share": round(share, 4), "numel": st["numel"],
                                     "eps_threshold": math.sqrt(small)})
        u.info.update(n_tensors=len(u.tensors), finite=finite if u.tensors else None, adam_eps=eps_rows)
        # layer/model sums only over whole models: both checkpoints complete, or the same parameters read in both
        # and all of them compared (a cut file or a missing shard leaves a subset, not comparable with other pairs)
        pair = {r["tensor"] for r in upd[first_upd:]}
        if not ((u.info["complete"] and prev_complete) or set(cur) == prev_names == pair):
            for r in upd[first_upd:]:
                r["partial"] = True
        if cur and u.step is not None and (u.info["complete"] or not prev_complete):  # a whole one stays the base
            prev, prev_step, prev_complete, prev_names = cur, u.step, bool(u.info["complete"]), set(cur)
    tensors = pl.from_arrow(pa.Table.from_pylist(rows, schema=TENSORS_SCHEMA))
    return tensors, _updates_table(upd), [u.info for u in units], skipped  # type: ignore[return-value]


def _updates_table(upd: list[dict[str, Any]]) -> pl.DataFrame:
    """Per-tensor rows plus per-layer (``<prefix>.*``) and whole-model (``*``) rows.

    Rows flagged ``partial`` (a pair of checkpoints of which one is incomplete) give per-tensor rows only:
    a layer or model norm over the tensors that happened to be read would not be comparable.
    """
    if not upd:
        return pl.from_arrow(UPDATES_SCHEMA.empty_table())  # type: ignore[return-value]
    t = pl.DataFrame(upd)
    whole = t.filter(~pl.col("partial"))
    keyed = whole.with_columns(pl.col("tensor").map_elements(_layer, return_dtype=pl.String).alias("layer"))
    sq = [(pl.col("delta_l2") ** 2).sum().sqrt().alias("delta_l2"), (pl.col("weight_l2") ** 2).sum().sqrt()
          .alias("weight_l2")]
    layers = (keyed.filter(pl.col("layer").is_not_null()).group_by("run", "step_from", "step_to", "layer").agg(*sq)
              .with_columns((pl.col("layer") + ".*").alias("tensor")).drop("layer"))
    total = whole.group_by("run", "step_from", "step_to").agg(*sq).with_columns(pl.lit("*").alias("tensor"))
    cols = ["run", "step_from", "step_to", "tensor", "delta_l2", "weight_l2"]
    out = pl.concat([t.select(cols), layers.select(cols), total.select(cols)])
    out = out.with_columns(pl.when(pl.col("weight_l2") > 0).then(pl.col("delta_l2") / pl.col("weight_l2"))
                           .otherwise(float("nan")).alias("ratio")).sort("step_from", "step_to", "tensor")
    return pl.from_arrow(out.to_arrow().cast(UPDATES_SCHEMA))  # type: ignore[return-value]
