"""The one entry point every front end uses: ``analyze(path) -> Analysis``.

The CLI, the audit and any service call this same function (DESIGN.md section 6).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from forensics.engine import decide
from forensics.model import Analysis, RunData
from forensics.recovery import plan


def load(path: str | Path, *, reader: Any = None) -> RunData:
    """Read a run folder into a :class:`RunData` (all parsers, discovery, segments).

    Args:
        path: The run folder.
        reader: Optional per-file reader for :func:`parsers.discover.load_run` (the service's
            :class:`parsers.incremental.IncrementalReader` ``.read``, which re-reads only appended records).

    Raises:
        forensics.errors.InputError: the path does not exist, is not a folder, holds no logs, or
            its logs hold no metric record that could be read.
    """
    from forensics.errors import InputError
    from parsers.discover import load_run

    run = load_run(path, reader=reader)
    if run.metrics.height == 0 and run.tensors.height == 0:
        n = len(run.sources)
        first = f"; first problem: {run.skipped[0].what}: {run.skipped[0].reason}" if run.skipped else ""
        raise InputError(path, f"no metric records could be read from {n} log file(s)"
                         + (" (" + ", ".join(s.path for s in run.sources[:3]) + ")" if n else "") + first)
    return run


def analyze_run(run: RunData) -> Analysis:
    """Diagnose an already loaded run."""
    d = decide(run)
    main_ev: dict[str, object] = {}
    if d.cause and d.cause != "unknown":
        fs = [f for f in d.findings if f.cause == d.cause]
        if fs:
            main_ev = dict(max(fs, key=lambda f: f.confidence).evidence)
        growth = [f for f in d.findings if f.cause == "update_scale_growth" and f.confidence >= 0.5]
        if d.cause != "update_scale_growth" and growth:
            main_ev["growth_precursor"] = {"code": growth[0].code, "mechanism": growth[0].mechanism,
                                           "step": growth[0].step}
    recovery = None
    if d.verdict in ("anomaly", "transient"):
        recovery = plan(run, d.cause, d.mechanism, d.onset["step"] if d.onset else None, main_ev,
                        transient=d.verdict == "transient")
    summary = _summary(d.verdict, d.cause, d.mechanism, d.confidence, d.onset, d.failure_step)
    meta = {k: v for k, v in run.meta.items() if k != "by_source"}
    return Analysis(
        run=str(run.run), verdict=d.verdict, cause=d.cause, mechanism=d.mechanism,  # type: ignore[arg-type]
        confidence=d.confidence, onset=d.onset, hypotheses=d.hypotheses, findings=d.findings, recovery=recovery,
        sources=tuple(run.sources), skipped=tuple(run.skipped) + d.skipped, summary=summary, meta=meta,
    )


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
    if verdict == "healthy":
        return "healthy: no anomalous step found."
    what = cause or "unknown"
    if mech:
        what += f" ({mech})"
    s = f"{verdict}: {what}, confidence {conf:.2f}"
    if onset:
        s += f"; onset at step {onset['step']} (segment {onset['segment']})"
    if failure is not None and onset and failure > onset["step"]:
        s += f"; the failure became visible at step {failure}"
    return s + "."
