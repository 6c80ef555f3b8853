"""Checkpoint forensics: the ``tensors`` and ``updates`` tables of DESIGN.md section 2, from a run folder.

A *checkpoint* is a folder or file whose name carries a step (``checkpoint-500/``, ``ckpt/step_200/``,
``global_step300/``, ``iter_0000100/``, ``step_400.safetensors``, ``epoch=0-step=100.ckpt``); files of
checkpoint types elsewhere form one checkpoint per folder whose step comes from ``trainer_state.json``
(``global_step``), a counter saved in a torch file (``step``, ``iter_num``...) or the optimizer's ``step``.
Inside: safetensors files (single or sharded, with ``*.index.json``), torch zip files (model,
``optimizer.pt``, ``scheduler.pt``, nanoGPT/Lightning bundles), torch.distributed (``*.distcp`` +
``.metadata``) and DeepSpeed ZeRO layouts (recognised and checked for completeness, not decoded).

Every file is read through the format readers' one contract (``read(path) -> parsers.tensors.Loaded``:
:mod:`parsers.safetensors_ckpt`, :mod:`parsers.torch_ckpt`); what an object holds by role comes from
:mod:`parsers.state_dict`, sharded/DCP/DeepSpeed completeness from :mod:`parsers.ckpt_layouts`. Every
tensor is streamed once in bounded memory (:func:`parsers.tensors.tensor_stats`); parameters are
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa

from forensics.model import Skip
from forensics.schema import TENSORS_SCHEMA, UPDATES_SCHEMA
from parsers import ckpt_layouts, file_policy, safetensors_ckpt, torch_ckpt
from parsers.state_dict import classify, jsonable, optimizer_entries
from parsers.tensors import CheckpointError, TensorRef, stats_many

SUFFIXES = (".safetensors", ".pt", ".pth", ".bin", ".ckpt", ".distcp")
_STEP = re.compile(r"(?:^|[^a-z])(?:global_step|checkpoint|ckpt|step|iter(?:ation)?)[-_=]?(\d+)(?![0-9a-z])", re.I)
_TRAILING = re.compile(r"^[a-z]+[-_](\d+)$", re.I)
_NOT_STATE = re.compile(r"^(training_args\.bin|rng_state.*\.pth)$")  # pickles of non-tensor objects: not read
_MASTER = re.compile(r"fp32_from|fp32_groups|fp32_flat|master", re.I)
ADAM_EPS_SHARE_KEEP = 0.05
"""Adam-epsilon shares below this are not kept in meta (the detector needs >= 0.5)."""
_KIND = {safetensors_ckpt.FORMAT: "safetensors", torch_ckpt.FORMAT: "torch"}
"""Reader FORMAT -> the name in a checkpoint's ``format`` meta."""


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



@dataclass
class _Found:
    """What the files of one checkpoint hold, gathered file by file by :func:`_load_unit`."""

    root: Path
    unit: _Unit
    skipped: list[Skip]
    params: list[tuple[str, TensorRef]] = field(default_factory=list)
    ordered: list[tuple[str, TensorRef]] = field(default_factory=list)  # torch files keep the saved order
    others: list[tuple[str, TensorRef]] = field(default_factory=list)
    optims: list[dict[str, Any]] = field(default_factory=list)
    counters: dict[str, float] = field(default_factory=dict)
    kinds: set[str] = field(default_factory=set)
    ds_model: list[int] = field(default_factory=list)
    ds_optim: list[tuple[int, int]] = field(default_factory=list)
    distcp: int = 0

    def problem(self, what: Path | str, why: str, incomplete: bool = True) -> None:
        """List a file (or a part of the checkpoint) not read, in ``skipped`` and the checkpoint's problems."""
        rel = what.relative_to(self.root).as_posix() if isinstance(what, Path) else what
        self.skipped.append(Skip(rel, why))
        self.unit.info["problems"].append(f"{Path(rel).name}: {why}")
        if incomplete:
            self.unit.info["complete"] = False


def _read_file(fd: _Found, f: Path) -> None:
    """Read one safetensors or torch file through the reader contract into ``fd``; its damage as problems."""
    reader = safetensors_ckpt if f.suffix == ".safetensors" else torch_ckpt
    try:
        got = reader.read(f)  # a cut or damaged file keeps its complete tensors (issue 8)
        c = classify(got.obj)
    except CheckpointError as exc:
        return fd.problem(f, str(exc))
    except OSError as exc:
        return fd.problem(f, f"unreadable: {exc.strerror or exc}")
    except Exception as exc:  # noqa: BLE001 - an odd structure is a skip, never a crash
        return fd.problem(f, f"not understood: {type(exc).__name__}: {exc}")
    rel, rest = f.relative_to(fd.root).as_posix(), got.skipped
    if got.damaged:
        head, *rest = got.skipped
        fd.problem(rel + head.what[len(str(f)):], head.reason)
    fd.skipped.extend(Skip(rel + s.what[len(str(f)):], s.reason) for s in rest)
    if got.truncated:  # the tensors inside the file are read; the checkpoint is not whole
        fd.unit.info["truncated"] = True
    fd.kinds.add(_KIND[reader.FORMAT])
    fd.params += c.params
    if reader is torch_ckpt:
        fd.ordered += c.params
    fd.others += c.other
    fd.optims += c.optimizers
    fd.counters.update(c.counters)
    for s in c.schedulers:
        fd.unit.info["scheduler"] = {k: jsonable(v) for k, v in s.items() if k != "where"}


def _read_any(fd: _Found, f: Path) -> None:
    """Route one file of a checkpoint: an index, a layout part only counted, or a state file to read."""
    if f.name.endswith(".index.json"):
        try:
            for p in ckpt_layouts.index_problems(f, fd.root):
                fd.problem(*p)
        except CheckpointError as exc:
            return fd.problem(f, str(exc))
        fd.kinds.add("sharded")
    elif f.suffix == ".distcp":
        fd.distcp += 1
    elif (m := ckpt_layouts.DS_OPTIM.match(f.name)) is not None:
        fd.ds_optim.append((int(m.group(1)), int(m.group(2))))
    else:
        if (m := ckpt_layouts.DS_MODEL.match(f.name)) is not None:
            fd.ds_model.append(int(m.group(1)))
        if f.suffix == ".bin" and not _zip_or_pickle(f):
            return None  # a data or tokenizer file (nanoGPT train.bin), not a checkpoint
        _read_file(fd, f)
    return None


def _load_unit(root: Path, u: _Unit, skipped: list[Skip]) -> None:
    """Read the structure of one checkpoint (headers and pickles, no tensor data) into ``u``."""
    folder = root / u.rel if (root / u.rel).is_dir() else (root / u.rel).parent
    info = u.info
    info.update(step=u.step, path=u.rel, step_source="name" if u.step is not None else None, complete=True,
                problems=[], files=sorted(p.name for p in u.files), bytes=sum(p.stat().st_size for p in u.files))
    fd = _Found(root, u, skipped)
    for f in sorted(u.files):
        if not _NOT_STATE.match(f.name):
            _read_any(fd, f)
    if fd.distcp:
        fd.kinds.add("dcp")
        for p in ckpt_layouts.dcp_problems(u.rel, folder, fd.distcp):
            fd.problem(*p)
    if fd.ds_optim or fd.ds_model:
        fd.kinds.add("deepspeed")
        for p in ckpt_layouts.deepspeed_problems(u.rel, fd.ds_model, fd.ds_optim):
            fd.problem(*p)
    info["format"] = "+".join(sorted(fd.kinds)) or "none"
    ts = _trainer_state_step(folder) if folder.is_dir() else None
    if ts is not None:
        info["trainer_state_step"] = ts
    seen: set[str] = set()
    params = [(n, r) for n, r in fd.params if not (n in seen or seen.add(n))]  # same tensor in .bin and .safetensors
    u.tensors += [(name, "param", ref, None) for name, ref in params]
    u.tensors += [(path, "master_param" if _MASTER.search(path) else "other", ref, None) for path, ref in fd.others]
    opt_steps: list[float] = []
    for n_opt, opt in enumerate(fd.optims):
        try:
            summary, steps, entries = optimizer_entries(opt, n_opt, fd.ordered or params, bool(fd.ordered))
        except Exception as exc:  # noqa: BLE001 - an odd optimizer dict is a problem, not a crash
            fd.problem(u.rel, f"optimizer state {opt.get('where') or ''} not understood: {type(exc).__name__}: {exc}")
            continue
        info.setdefault("optimizer", summary)
        opt_steps += steps
        u.tensors += entries
    if u.step is None:
        _step_from_contents(u, ts, fd.counters, opt_steps)


def _step_from_contents(u: _Unit, ts: int | None, counters: dict[str, float], opt_steps: list[float]) -> None:
    """A checkpoint without a step in its name: trainer_state.json, a saved counter, or the optimizer's step."""
    if ts is not None:
        u.step, u.info["step_source"] = ts, "trainer_state"
    elif (k := next((k for k in ("global_step", "global_steps", "step", "iter_num", "iteration")
                     if k in counters), None)) is not None:
        u.step, u.info["step_source"] = int(counters[k]), f"saved {k}"
    elif opt_steps:
        u.step, u.info["step_source"] = int(max(opt_steps)), "optimizer step"
    u.info["step"] = u.step


def _layer(name: str) -> str | None:
    parts = name.split(".")
    for i, p in enumerate(parts[:-1]):
        if p.isdigit():
            return ".".join(parts[: i + 1])
    return None


@dataclass
class _Base:
    """The checkpoint the next one's updates are measured from (its parameters with their norms)."""

    tensors: dict[str, tuple[TensorRef, float]] = field(default_factory=dict)
    step: int | None = None
    complete: bool = False


def _stream_unit(u: _Unit, run_name: str, base: _Base, rows: list[dict[str, Any]], upd: list[dict[str, Any]],
                 skipped: list[Skip]) -> dict[str, tuple[TensorRef, float]]:
    """Stream every tensor of ``u`` into ``rows`` (and its parameters' updates from ``base`` into ``upd``).

    Returns:
        The parameters read, by name, with their l2 norm (the next checkpoint's base).
    """
    cur: dict[str, tuple[TensorRef, float]] = {}
    finite, eps_rows = True, []
    newer = u.step is not None and base.step is not None and base.step < u.step
    prevs = [base.tensors.get(name) if role == "param" and newer else None for name, role, _, _ in u.tensors]
    results = stats_many([(ref, small, p[0] if p is not None and p[0].numel == ref.numel else None)
                          for (_, _, ref, small), p in zip(u.tensors, prevs, strict=True)])
    for (name, role, ref, small), p, st in zip(u.tensors, prevs, results, strict=True):
        if isinstance(st, Exception):
            skipped.append(Skip(f"{u.rel}:{name}", f"tensor not read: {st}"))
            u.info["complete"] = False
            continue
        dsq = st.pop("delta_sq", None)
        finite = finite and st["n_nan"] + st["n_inf"] == 0
        rows.append({"run": run_name, "step": u.step, "checkpoint": u.rel, "tensor": name, "role": role,
                     "dtype": ref.dtype, "shape": list(ref.shape), **{k: st[k] for k in (
                         "numel", "l2", "rms", "max_abs", "n_nan", "n_inf", "n_zero")}})
        if role == "param":
            cur[name] = (ref, st["l2"])
        if dsq is not None and p is not None:
            upd.append({"run": run_name, "step_from": base.step, "step_to": u.step, "tensor": name,
                        "delta_l2": math.sqrt(dsq) if dsq >= 0 else float("nan"), "weight_l2": p[1],
                        "partial": False})
        if small is not None and st.get("n_pos"):
            share = st["n_small"] / st["n_pos"]
            if share >= ADAM_EPS_SHARE_KEEP:
                eps_rows.append({"tensor": name, "share": round(share, 4), "numel": st["numel"],
                                 "eps_threshold": math.sqrt(small)})
    u.info.update(n_tensors=len(u.tensors), finite=finite if u.tensors else None, adam_eps=eps_rows)
    return cur


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
        Never raises for a bad checkpoint; memory stays at a few read buffers per worker (:mod:`parsers.tensors`).
    """
    root = Path(run_dir)
    units = find_checkpoints(root)
    skipped: list[Skip] = []
    if not units:
        empty = (pl.from_arrow(pa.Table.from_batches([], s)) for s in (TENSORS_SCHEMA, UPDATES_SCHEMA))  # (no pandas)
        return (*empty, [], skipped)  # type: ignore[return-value]
    for u in units:
        _load_unit(root, u, skipped)
    units = [u for u in units if u.tensors or u.info["problems"] or u.info["format"] != "none"]
    units.sort(key=lambda u: (u.step is None, u.step or 0, u.rel))
    rows: list[dict[str, Any]] = []
    upd: list[dict[str, Any]] = []
    base = _Base()
    for u in units:
        first_upd = len(upd)
        cur = _stream_unit(u, run_name, base, rows, upd, skipped)
        # layer/model sums only over whole models: both checkpoints complete, or the same parameters read in both
        # and all of them compared (a cut file or a missing shard leaves a subset, not comparable with other pairs)
        pair = {r["tensor"] for r in upd[first_upd:]}
        if not ((u.info["complete"] and base.complete) or set(cur) == set(base.tensors) == pair):
            for r in upd[first_upd:]:
                r["partial"] = True
        if cur and u.step is not None and (u.info["complete"] or not base.complete):  # a whole one stays the base
            base = _Base(cur, u.step, bool(u.info["complete"]))
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
