"""Run facts: what a run is, computed once from :class:`RunData` and passed to detectors, engine and planner.

Precision (and how it was inferred), launches (segments), the step unit, the failure step, the checkpoints
(and which are complete and finite), what the notes say failed or propose, world size and nodes. Nothing here
writes into the :class:`RunData` (STYLE.md item 14): :func:`run_facts` returns a frozen :class:`RunFacts`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

import numpy as np
import polars as pl

from forensics.model import RunData
from forensics.notes import read_notes

POW2_TOL = 1e-3
"""|log2(scale) - round(log2(scale))| below this is a power of two (NeMo prints 4 significant digits)."""

_SCALER_EVENT = re.compile(r"loss scale|fp16", re.I)
_CKPT_NAME = re.compile(r"(?:checkpoint|ckpt|step|iter|global_step)[-_]?(\d+)", re.I)
_CKPT_PATH = re.compile(r"\S*(?:checkpoint|ckpt|global_step)\S*\d\S*", re.I)
_CKPT_SUFFIXES = (".pt", ".bin", ".safetensors", ".ckpt", ".pth")
_WORLD_KEYS = ("world_size", "n_gpu", "num_processes", "data_parallel_size", "nnodes", "num_nodes", "gpus")
_NODE_KEYS = ("nnodes", "num_nodes", "nodes")
LATE_START = 1
"""A log whose first step is above this (and above :data:`MID_RUN_INTERVALS` logging intervals) starts mid-run."""
MID_RUN_INTERVALS = 2
"""...a first logged step within this many logging intervals of 0 is the first log of a fresh run (our choice)."""
_META_WALK_LIMIT = 20000
"""Objects of ``run.meta`` walked looking for device counts (a bound on hostile configurations)."""
_META_LIST_ITEMS = 200
"""Items of one list in ``run.meta`` walked looking for device counts (the same bound, per list; our choice)."""
EVENT_CHARS = 120
"""Characters of a loss-scaler event line quoted as the reason a run is fp16 (display; our choice)."""
FAILURE_TAIL_POINTS = 3
"""A non-finite loss or grad norm among a series' last three points is a failure even if the rest is finite (the
run stopped there; our choice)."""


@dataclass(frozen=True)
class Launch:
    """One launch of the training process: a global segment and its first and last logged steps."""

    segment: int
    first_step: int
    last_step: int


@dataclass(frozen=True)
class Checkpoint:
    """One checkpoint known for the run.

    Attributes:
        step: Its global step.
        path: Path relative to the run folder (or a description from a log event).
        read: Its tensors were read (then ``finite`` and ``complete`` are known).
        complete: False when files were missing or cut (from ``meta["checkpoints"]``).
        finite: True/False when read (every tensor finite), None when not read.
        tensors: Tensors read; ``nonfinite``: how many of them hold a NaN or an inf.
    """

    step: int
    path: str
    read: bool
    complete: bool
    finite: bool | None
    tensors: int = 0
    nonfinite: int = 0


@dataclass(frozen=True)
class RunFacts:
    """Facts about one run, computed once (:func:`run_facts`), read by detectors, engine and planner.

    Attributes:
        fp16: True/False when the precision is known to be fp16 or not; None when unknown.
        precision_why: How that was inferred (configuration, metric names, a dynamic loss scaler).
        launches: One :class:`Launch` per global segment, in segment order.
        first_step: First logged step (0 when nothing is logged); ``last_step`` likewise.
        step_unit: ``"epoch"`` when every source numbers its records by epoch, else ``"step"``.
        failure_step: First step of a persistent failure in the logged series (non-finite loss or grad
            norm for good, or a loss departure that never recovers), or None.
        listed_checkpoints: Checkpoints named in the folder or in log events (read or not).
        read_checkpoints: Checkpoints whose tensors were read, with their finiteness.
        failed_remedies: Remedy -> the notes lines that say it was tried and failed.
        ideas: Remedy -> the notes lines that propose it.
        world_size: The largest device count the configuration states, or None.
        nodes: The node count the configuration states, or None.
        framework: ``meta["framework"]`` (``hf-trainer``, ``megatron``...), or ``""``.
        folder_checkpoints: ``(step, path)`` of the checkpoints the folder listing names (walked once per run).
    """

    fp16: bool | None
    precision_why: str
    launches: tuple[Launch, ...]
    first_step: int
    last_step: int
    step_unit: str
    failure_step: int | None
    listed_checkpoints: tuple[Checkpoint, ...]
    read_checkpoints: tuple[Checkpoint, ...]
    failed_remedies: Mapping[str, tuple[str, ...]]
    ideas: Mapping[str, tuple[str, ...]]
    world_size: int | None
    nodes: int | None
    framework: str
    folder_checkpoints: tuple[tuple[int, str], ...] = ()
    log_interval: int = 1

    @property
    def starts_mid_run(self) -> bool:
        """The log starts well after step 0 (the run was itself resumed from a checkpoint).

        Above :data:`LATE_START` and above :data:`MID_RUN_INTERVALS` logging intervals: a run that logs
        every 5 steps and starts at step 5 started fresh.
        """
        return self.first_step > max(LATE_START, MID_RUN_INTERVALS * self.log_interval)


def run_facts(run: RunData, like: RunFacts | None = None) -> RunFacts:
    """Compute the facts of ``run`` once (reads series, events, meta and the folder listing; writes nothing).

    Args:
        run: The run (or a view of it, :meth:`RunData.view`).
        like: The facts of the whole run when ``run`` is a view of it: the folder listing is not walked again.
    """
    fp16, why = precision(run)
    failed, ideas = read_notes(run)
    steps = run.metrics.get_column("step") if run.metrics.height else None
    folder = like.folder_checkpoints if like is not None else _folder_checkpoints(run)
    return RunFacts(
        fp16=fp16, precision_why=why, launches=_launches(run),
        first_step=int(steps.min()) if steps is not None else 0,  # type: ignore[arg-type]
        last_step=int(steps.max()) if steps is not None else 0,  # type: ignore[arg-type]
        step_unit=_step_unit(run), failure_step=failure_step(run),
        listed_checkpoints=_listed_checkpoints(run, folder), read_checkpoints=tensor_checkpoints(run),
        failed_remedies=MappingProxyType({k: tuple(v) for k, v in failed.items()}),
        ideas=MappingProxyType({k: tuple(v) for k, v in ideas.items()}),
        world_size=_meta_count(run, _WORLD_KEYS), nodes=_meta_count(run, _NODE_KEYS),
        framework=str(run.meta.get("framework") or ""), folder_checkpoints=folder, log_interval=_log_interval(run),
    )


def precision(run: RunData) -> tuple[bool | None, str]:
    """The run's fp16-ness and how it was inferred: explicit configuration first, then the metrics' evidence.

    1. Metric names or meta that spell the precision (``fp16`` tags, ``precision: fp16``,
       ``bf16``/``bfloat16``, ``--fp16``), then the canonical config precision
       (:func:`forensics.config_diff.extract_config`): an explicit ``bf16``/``fp32``/``fp8`` wins over
       any inference below and answers False.
    2. Otherwise :func:`infer_fp16_from_metrics`: a dynamic fp16 loss scaler seen in the logs.

    Returns:
        ``(fp16, why)``: True/False when known, None when unknown; ``why`` one sentence.
    """
    blob = repr(run.meta).lower()
    names = " ".join(run.metric_names).lower()
    if "fp16" in names:
        return True, "a logged metric name spells fp16"
    if "'precision': 'fp16'" in blob or "float16" in blob.replace("bfloat16", ""):
        return True, "the configuration says fp16"
    if "bf16" in blob or "bfloat16" in blob:
        return False, "the configuration says bf16"
    if "'fp16': true" in blob or "fp16=true" in blob or "--fp16" in blob:
        return True, "the configuration sets fp16"
    from forensics.config_diff import extract_config  # noqa: PLC0415 - config_diff imports heavier modules

    declared = extract_config(run).get("precision")
    if declared == "fp16":
        return True, "the configuration's precision is fp16"
    if declared in ("bf16", "fp32", "fp8"):
        return False, f"the configuration's precision is {declared}"
    why = infer_fp16_from_metrics(run)
    return (True, why) if why else (None, "no configuration or loss scaler states the precision")


def infer_fp16_from_metrics(run: RunData) -> str | None:
    """Why the logs show a dynamic fp16 loss scaler at work, or None when they do not.

    Rule: dynamic loss scalers exist only for fp16 (bf16 and fp32 share fp32's exponent range and
    need none). Their scale is a power of two that moves by factors of two: PyTorch
    ``torch.amp.GradScaler`` (``init_scale=2**16``, ``growth_factor=2.0``, ``backoff_factor=0.5``),
    DeepSpeed ``DynamicLossScaler`` (``initial_scale_power=16``, scale factor 2, "Attempted loss
    scale: X, reducing to Y"), Megatron and fairseq ("overflow detected, setting loss scale to: X")
    alike (docs/detectors.md#loss-scalers and docs/detectors.md#ov01). Evidence, any one suffices:

    * a ``loss_scale`` series whose positive values are all powers of two, at least one > 1, that
      changes by a factor 2**k between two logged values, or that comes with skipped steps
      (``skipped_step`` > 0);
    * a ``loss_scale_change`` event, or an ``overflow_skip``/``error`` event that names the loss
      scale (DeepSpeed, fairseq, "Current loss scale already at minimum").

    Not evidence: a constant ``loss scale: 1.0`` (what Megatron prints in a bf16 run; docs/formats.md#bf16-loss-scale:
    "a constant, not a collapsed fp16 scale"), and a bare "OVERFLOW! Skipping step" or skipped
    iteration counter with no scale (bf16/fp32 DeepSpeed engines and Megatron print those too).
    """
    s = run.series("loss_scale")
    if s is not None and len(s) > 0:
        v = s.values[np.isfinite(s.values) & (s.values > 0)]  # fairseq prints tiny scales as 0
        if v.size and float(v.max()) > 1.0:
            e = np.log2(v)
            if bool(np.all(np.abs(e - np.round(e)) < POW2_TOL)):
                if bool(np.any(np.round(np.diff(e)) != 0)):
                    return (f"the logged loss scale moves by factors of 2 ({v[0]:g} .. {v.min():g}): a dynamic "
                            "fp16 loss scaler")
                sk = run.series("skipped_step")
                if sk is not None and float(np.nansum(sk.values)) > 0:
                    return f"a power-of-two loss scale ({v[0]:g}) with skipped steps: a dynamic fp16 loss scaler"
    if run.events.height:
        for row in run.events.filter(pl.col("kind").is_in(["loss_scale_change", "overflow_skip", "error"])
                                     ).iter_rows(named=True):
            msg = str(row["message"] or "")
            if row["kind"] == "loss_scale_change" or _SCALER_EVENT.search(msg):
                if row["kind"] == "error" and "minimum" not in msg.lower():
                    continue
                return f"a loss-scaler event: {msg[:EVENT_CHARS]}"
    return None


def failure_step(run: RunData) -> int | None:
    """First step of a persistent failure: non-finite loss/grad norm for good, or an unrecovered loss departure.

    A non-finite value counts when at least half of the rest of the series is non-finite too, or when it is
    among the last three points.
    """
    from forensics.signals import departures  # noqa: PLC0415 - the robust departure test

    best: int | None = None
    for m in ("loss", "grad_norm"):
        s = run.series(m)
        if s is None or len(s) == 0:
            continue
        bad = ~np.isfinite(s.values)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            if np.mean(~np.isfinite(s.values[i:])) >= 0.5 or i >= len(s) - FAILURE_TAIL_POINTS:
                st = int(s.steps[i])
                best = st if best is None else min(best, st)
    for d in departures(run, "loss"):
        if d.recovered_step is None:
            best = d.step if best is None else min(best, d.step)
            break
    return best


def _log_interval(run: RunData) -> int:
    """The median step gap of the loss (or lr) series: how often the run logs (1 when unknown)."""
    s = run.series("loss") or run.series("lr")
    if s is None or len(s) < 2:
        return 1
    return max(1, int(np.median(np.diff(s.steps))))


def _launches(run: RunData) -> tuple[Launch, ...]:
    if run.metrics.height == 0:
        return ()
    return tuple(Launch(int(s), int(lo), int(hi)) for s, lo, hi in run.segment_spans().iter_rows())


def _step_unit(run: RunData) -> str:
    """``"epoch"`` when the logs are numbered by epoch (e.g. ImageNet scripts), else ``"step"``."""
    units = {str(v.get("step_unit") or ("epoch" if (v.get("step_axis") or {}).get("kind") == "epoch" else None))
             for v in run.meta.get("by_source", {}).values() if isinstance(v, dict)}  # (the table readers' axis, U11)
    return "epoch" if units == {"epoch"} else "step"


def _incomplete(run: RunData, key: str) -> set[object]:
    return {c.get(key) for c in run.meta.get("checkpoints") or [] if not c.get("complete", True)}


def _folder_checkpoints(run: RunData) -> tuple[tuple[int, str], ...]:
    """(step, path) of the folder's checkpoint files and folders (``checkpoint-N``, ``step_N``...), first name wins."""
    found: dict[int, str] = {}
    root = Path(run.run)
    if root.is_dir():
        for p in sorted(root.rglob("*")):
            m = _CKPT_NAME.search(p.name)
            if m and (p.is_dir() or p.suffix in _CKPT_SUFFIXES):
                found.setdefault(int(m.group(1)), str(p.relative_to(root)))
    return tuple(found.items())


def _listed_checkpoints(run: RunData, folder: tuple[tuple[int, str], ...]) -> tuple[Checkpoint, ...]:
    """Checkpoints known from the folder listing and from log events, in step order."""
    found: dict[int, str] = dict(folder)
    if run.events.height:
        for row in run.events.iter_rows(named=True):
            if row["kind"] in ("checkpoint_saved", "checkpoint_loaded") and row["step"] is not None:
                m = _CKPT_PATH.search(str(row["message"] or ""))
                name = m.group(0).rstrip(".,;:)") if m else f"checkpoint {row['step']}"
                found.setdefault(int(row["step"]), f"{name} (global step {row['step']}, "
                                 f"{row['kind'].replace('_', ' ')} in {row['source']})")
    bad = _incomplete(run, "step")
    return tuple(Checkpoint(s, p, read=False, complete=s not in bad, finite=None) for s, p in sorted(found.items()))


def tensor_checkpoints(run: RunData) -> tuple[Checkpoint, ...]:
    """Checkpoints whose tensors were read, one per (step, checkpoint), with their non-finite tensor counts."""
    if run.tensors.height == 0:
        return ()
    bad_paths = _incomplete(run, "path")
    per = (run.tensors.filter(pl.col("step").is_not_null()).group_by("step", "checkpoint")
           .agg(pl.len().alias("n"), ((pl.col("n_nan") + pl.col("n_inf")) > 0).sum().alias("bad"))
           .sort("step", "checkpoint"))
    return tuple(Checkpoint(int(s), str(p), read=True, complete=p not in bad_paths, finite=not bad, tensors=int(n),
                            nonfinite=int(bad)) for s, p, n, bad in per.iter_rows())


def stated_world_size(run: RunData) -> int | None:
    """The largest device count the run's configuration states (world size, n_gpu, ...), or None if unstated."""
    return _meta_count(run, _WORLD_KEYS)


def _meta_count(run: RunData, keys: tuple[str, ...]) -> int | None:
    """The largest positive integer the configuration states under one of ``keys``, or None if unstated."""
    best: int | None = None
    stack: list[object] = [run.meta]
    seen = 0
    while stack and seen < _META_WALK_LIMIT:
        obj = stack.pop()
        seen += 1
        if isinstance(obj, dict):
            for k, v in obj.items():
                if isinstance(v, (dict, list, tuple)):
                    stack.append(v)
                elif str(k).lower().replace("-", "_").rsplit(".", 1)[-1] in keys:
                    try:
                        n = int(v)  # type: ignore[arg-type]
                    except (TypeError, ValueError):
                        continue
                    if n >= 1:
                        best = max(best or 0, n)
        elif isinstance(obj, (list, tuple)):
            stack.extend(obj[:_META_LIST_ITEMS])
    return best
