"""The one entry point every front end uses: ``analyze(path) -> Analysis``.

The CLI, the audit and any service call this same function (DESIGN.md section 6).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from forensics.model import Analysis, Cause, RunData, Verdict
from parsers.file_policy import display


def load(path: str | Path, metric_map: dict[str, str] | None = None, *, reader: Any = None) -> RunData:
    """Read a run folder into a :class:`RunData` (all parsers, discovery, segments), objective resolved.

    ``meta["objective"]`` names the series taken as the training objective and why (``None``: none was
    found, the verdict will be ``inconclusive``); ``meta["names"]`` says what each raw name became and why.

    Args:
        path: The run folder.
        metric_map: ``{canonical: raw name}`` from ``--metric loss=COLUMN`` (wins over every rule).
        reader: Optional per-file reader for :func:`parsers.discover.load_run` (the service's
            :class:`parsers.incremental.IncrementalReader` ``.read``, which re-reads only appended records).

    Raises:
        forensics.errors.InputError: the path does not exist, is not a folder, holds no logs, or
            its logs hold no metric record that could be read.
    """
    from forensics.column_scan import no_huge_page_advice
    from forensics.errors import InputError
    from forensics.userconfig import find
    from parsers.discover import load_run

    no_huge_page_advice()

    user = find(path) if Path(path).expanduser().is_dir() else None
    run = load_run(path, ignore=user.ignore if user else (), step_key=user.step_key if user else None,
                   reader=reader)
    mapping = {**(user.aliases if user else {}), **(metric_map or {})}  # the command line wins
    if user and user.path:
        run.meta["user_config"] = user.as_meta()
    _resolve_objective(run, mapping)
    if run.metrics.height == 0 and run.tensors.height == 0:
        n = len(run.sources)
        first = f"; first problem: {run.skipped[0].what}: {run.skipped[0].reason}" if run.skipped else ""
        raise InputError(path, f"no metric records could be read from {n} log file(s)"
                         + (" (" + ", ".join(s.path for s in run.sources[:3]) + ")" if n else "") + first)
    return run


def _resolve_objective(run: RunData, metric_map: dict[str, str]) -> None:
    from forensics.objective import apply_user_map, per_step_counters, resolve

    metrics = run.metrics
    user: dict[str, str] = {}
    if metric_map and metrics.height:
        metrics, user = apply_user_map(metrics, metric_map)
    metrics, objective, names = resolve(metrics)
    metrics = per_step_counters(metrics, names)
    for raw, why in user.items():
        names[raw] = {"metric": next((c for c, r in metric_map.items() if r == raw), raw), "why": why}
    if metrics is not run.metrics:
        run.metrics = metrics
        run._cache.clear()
    run.meta["objective"] = objective
    run.meta["names"] = names
    run.meta["step_axis"] = _step_axis(run)


def _step_axis(run: RunData) -> dict[str, object] | None:
    """What the step counts, for the objective's source, with the column and the source it was read from.

    ``optimizer_step``, ``epoch``, ``episode`` (an RL script's ``Episode N/M``), ``micro_batch``, ``samples``,
    ``row_index`` or ``batch_within_epoch``.
    """
    obj = run.meta.get("objective")
    if not obj or run.metrics.height == 0:
        return None
    s = run.series(obj["metric"])
    if s is None:
        return None
    meta = (run.meta.get("by_source") or {}).get(s.source) or {}
    axis = meta.get("step_axis")
    if isinstance(axis, dict):
        return _with_note({**axis, "source": s.source})
    unit = str(meta.get("step_unit") or "")
    column = str(meta.get("step_key") or meta.get("step_source") or "step")
    kind = ("epoch" if unit == "epoch" else "batch_within_epoch" if unit.startswith("batch within")
            else "row_index" if column.startswith(("index", "line index")) else "optimizer_step")
    return _with_note({"column": column, "kind": kind, "source": s.source})


def _with_note(axis: dict[str, object]) -> dict[str, object]:
    """``axis`` with a ``note`` for the reports when the steps are row (entry) numbers, not logged steps."""
    if axis.get("kind") == "row_index":
        axis["note"] = (f"steps are row numbers: no step column found in {axis.get('source')} (the N-th record is "
                        "step N; the trainer's own step numbers may differ)")
    return axis


SKIPPED_INPUT_WEIGHT = 0.03
"""Each skipped or damaged input lowers a healthy verdict's confidence by this (our choice)..."""
SKIPPED_INPUTS_CAP = 0.15
"""...by at most this in all."""
SKIPPED_DETECTOR_WEIGHT = 0.02
"""Each detector that could not run lowers it by this (our choice)..."""
SKIPPED_DETECTORS_CAP = 0.2
"""...by at most this in all."""


def _coverage(run: RunData, skipped_detectors: int) -> tuple[float, list[str]]:
    """How much the verdict's confidence is lowered by what was not read or not evaluated, and why.

    Each skipped input lowers it by 0.03 (at most 0.15), each detector that could not run by 0.02 (at most
    0.2): a verdict over part of the evidence is weaker than over all of it. The weights are this project's
    choice (no published calibration), stated here so that a report can say them.
    """
    inputs = len(run.skipped)
    factor = (1.0 - min(SKIPPED_INPUTS_CAP, SKIPPED_INPUT_WEIGHT * inputs)
              - min(SKIPPED_DETECTORS_CAP, SKIPPED_DETECTOR_WEIGHT * skipped_detectors))
    notes = []
    if inputs:
        notes.append(f"{inputs} input(s) skipped or damaged")
    if skipped_detectors:
        notes.append(f"{skipped_detectors} detector(s) not evaluated (their metrics are missing)")
    return round(factor, 3), notes


def analyze_run(run: RunData) -> Analysis:
    """Diagnose an already loaded run.

    ``healthy`` needs the training objective (``meta["objective"]``); without it a healthy-looking run is
    ``inconclusive``, with what was found and how to map it in the summary. The confidence of a healthy or
    inconclusive verdict is lowered by the coverage (:func:`_coverage`), said in ``meta["coverage"]``.
    """
    from forensics.column_scan import no_huge_page_advice
    from forensics.engine import decide  # the detectors: not imported by `forensics ingest`
    from forensics.recovery import plan
    from forensics.too_few import too_few_loss_points

    no_huge_page_advice()

    if "objective" not in run.meta:
        _resolve_objective(run, {})
    d = decide(run)
    recovery = None
    if d.verdict in (Verdict.ANOMALY, Verdict.TRANSIENT):
        recovery = plan(run, d.cause, d.mechanism, d.onset["step"] if d.onset else None, dict(d.main_evidence),
                        transient=d.verdict == Verdict.TRANSIENT, facts=d.facts, findings=d.findings)
    verdict, confidence = d.verdict, d.confidence
    factor, notes = _coverage(run, len(d.skipped))
    objective = run.meta.get("objective")
    unjudged = bool(objective) and verdict == Verdict.HEALTHY and not run.has("loss")  # an eval-only objective
    inconclusive = verdict == Verdict.HEALTHY and (not objective or unjudged)
    short = too_few_loss_points(run) if verdict == Verdict.HEALTHY and not inconclusive else None
    if verdict == Verdict.HEALTHY:
        confidence = confidence * factor
    summary = _summary(d.verdict, d.cause, d.mechanism, d.confidence, d.onset, d.failure_step)
    if inconclusive:
        from forensics.objective import how_to_map

        verdict, confidence = Verdict.INCONCLUSIVE, 0.0
        summary = "inconclusive: " + (_unjudged(objective) if unjudged else how_to_map(run.metrics)) + "."
    elif short:
        verdict, confidence, summary = Verdict.INCONCLUSIVE, 0.0, f"inconclusive: {short}."
    elif notes and verdict == Verdict.HEALTHY:
        summary = summary.rstrip(".") + f" (confidence {confidence:.2f}: " + "; ".join(notes) + ")."
    note = (run.meta.get("step_axis") or {}).get("note")
    if note:
        summary = summary.rstrip() + f" Note: {note}."
    meta = {k: v for k, v in run.meta.items() if k != "by_source"}
    meta["coverage"] = {"factor": factor, "why": notes or ["everything found was read and every detector ran"],
                        **(d.coverage or {})}  # share_evaluated, cap, capped, note: forensics.calibration.coverage
    return Analysis(
        run=display(str(run.run)), verdict=verdict, cause=d.cause, mechanism=d.mechanism,  # type: ignore[arg-type]
        confidence=confidence, onset=d.onset, hypotheses=d.hypotheses, findings=d.findings, recovery=recovery,
        sources=tuple(run.sources), skipped=tuple(run.skipped) + d.skipped, summary=summary, meta=meta,
    )


def _unjudged(objective: dict) -> str:
    """Why a run whose only objective is an evaluation one is not called healthy (no detector judges it)."""
    tags = ", ".join(objective.get("tags") or [objective.get("metric", "?")])
    return (f"the only objective read is the evaluation objective {objective.get('metric')} ({tags}), which no "
            f"detector judges: no training loss was logged; if a logged series is the training loss, say so: "
            f"forensics analyze RUN --metric loss=COLUMN")


def analyze(path: str | Path) -> Analysis:
    """Read the run folder at ``path`` and diagnose it.

    Args:
        path: A run folder (TensorBoard events, JSONL, trainer_state.json, CSV exports, stdout logs).

    Returns:
        The :class:`Analysis`: verdict, cause, onset, evidence, recovery plan, sources, skips.

    Raises:
        forensics.errors.InputError: the path cannot be analysed at all.
    """
    return analyze_run(load(path))


def _summary(verdict: str, cause: str | None, mech: str | None, conf: float, onset: dict[str, int] | None,
             failure: int | None) -> str:
    if verdict == Verdict.HEALTHY:
        return "healthy: no anomalous step found."
    what = cause or Cause.UNKNOWN
    if mech:
        what += f" ({mech})"
    s = f"{verdict}: {what}, confidence {conf:.2f}"
    if onset:
        s += f"; onset at step {onset['step']} (segment {onset['segment']})"
    if failure is not None and onset and failure > onset["step"]:
        s += f"; the failure became visible at step {failure}"
    return s + "."
