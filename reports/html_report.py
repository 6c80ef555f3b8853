"""The HTML report: one self-contained file (inline CSS and SVG charts, no external requests).

Rendered with Jinja2 (autoescape, StrictUndefined) from ``reports/templates/report.html.j2``.
Charts are drawn by matplotlib into inline SVG (see :mod:`reports.charts`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from markupsafe import Markup

import forensics
from forensics.model import Analysis
from reports._common import environment, flatten, key_evidence, pretty_json

if TYPE_CHECKING:
    from forensics.model import RunData, Series
    from reports.charts import Chart

MAX_EXTRA_METRICS = 12
"""Metrics referenced by findings charted beyond :data:`reports.charts.DEFAULT_METRICS`."""
MAX_LAYER_GROUPS = 8
"""Per-layer metric groups charted at most."""

_SEVERITY_RANK = {"info": 0, "low": 1, "medium": 2, "high": 3, "critical": 4}


def _strings(value: Any) -> Iterable[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, Mapping):
        for k, v in value.items():
            yield str(k)
            yield from _strings(v)
    elif isinstance(value, list | tuple | set | frozenset):
        for v in value:
            yield from _strings(v)


def referenced_metrics(analysis: Analysis, available: Iterable[str]) -> list[str]:
    """Metrics of the run that the findings mention (evidence keys/values, dotted detector names).

    Args:
        analysis: The engine's result.
        available: The run's metric names.

    Returns:
        Names found in ``available``, in first-mention order.
    """
    avail = set(available)
    out: dict[str, None] = {}
    for f in analysis.findings:
        tokens = list(_strings(f.evidence)) + f.name.split(".")
        for t in tokens:
            if t in avail:
                out.setdefault(t, None)
    return list(out)


def chart_plan(analysis: Analysis, run: RunData) -> tuple[list[str], list[str], dict[str, list[str]]]:
    """Which metrics get a full-run chart, an onset zoom, and a per-layer chart.

    Args:
        analysis: The engine's result.
        run: The run's data.

    Returns:
        ``(main, zoom, layers)``: metric names for full-run charts (defaults first, then those
        the findings reference), metric names for the onset zoom, and per-layer groups
        ``{base: [base/layer0, ...]}``.
    """
    from reports.charts import DEFAULT_METRICS, ZOOM_METRICS

    names = run.metric_names
    refs = referenced_metrics(analysis, names)
    main = [m for m in DEFAULT_METRICS if m in names]
    main += [m for m in refs if "/" not in m and m not in main][:MAX_EXTRA_METRICS]
    zoom = [m for m in ZOOM_METRICS if m in names] if analysis.onset else []
    groups: dict[str, list[str]] = {}
    for m in names:
        if "/" in m:
            groups.setdefault(m.partition("/")[0], []).append(m)
    ref_bases = {m.partition("/")[0] for m in refs}
    order = sorted(groups, key=lambda b: (b not in ref_bases, b not in DEFAULT_METRICS, b))
    return main, zoom, {b: groups[b] for b in order[:MAX_LAYER_GROUPS]}


def build_charts(analysis: Analysis, run: RunData) -> dict[str, list[Chart]]:
    """Draw every chart of the report.

    Args:
        analysis: The engine's result.
        run: The run's data.

    Returns:
        ``{"main": [...], "zoom": [...], "layers": [...]}`` lists of charts.
    """
    from reports import charts as ch

    marks = ch.marks_for(analysis.onset, run)
    main, zoom, groups = chart_plan(analysis, run)
    out: dict[str, list[Chart]] = {"main": [], "zoom": [], "layers": []}
    n = 0

    def usable(name: str) -> Series | None:
        s = run.series(name)
        return s if s is not None and len(s) > 0 else None

    for name in main:
        if (s := usable(name)) is not None:
            chart, _ = ch.metric_chart(s, marks, index=n)
            out["main"].append(chart)
            n += 1
    for name in zoom:
        if (s := usable(name)) is not None and (z := ch.zoom_chart(s, marks, index=n)) is not None:
            out["zoom"].append(z)
            n += 1
    for base, members in groups.items():
        layers = [s for m in members if (s := usable(m)) is not None]
        if layers:
            out["layers"].append(ch.layer_chart(base, layers, marks, index=n))
            n += 1
    seen: set[str] = set()
    for group in out.values():
        for i, c in enumerate(group):
            if c.id in seen:
                group[i] = type(c)(f"{c.id}-{len(seen)}", c.title, c.caption, c.svg)
            seen.add(group[i].id)
    return out


def _view(analysis: Analysis, run: RunData | None, generated_at: datetime) -> dict[str, Any]:
    onset = dict(analysis.onset) if analysis.onset else None
    onset_findings = [
        f for f in analysis.findings if onset is not None and f.step == onset.get("step")
    ]
    findings = [
        {
            "code": f.code, "name": f.name, "step": f.step, "segment": f.segment, "cause": f.cause,
            "mechanism": f.mechanism, "confidence": f.confidence, "severity": f.severity,
            "severity_rank": _SEVERITY_RANK.get(f.severity, 0), "message": f.message,
            "key_evidence": key_evidence(f.evidence), "evidence_json": pretty_json(f.evidence),
            "against": list(f.against), "at_onset": f in onset_findings,
        }
        for f in analysis.findings
    ]
    rec = analysis.recovery
    recovery = None
    if rec is not None:
        rf = dict(rec.resume_from)
        recovery = {
            "checkpoint": rf.get("checkpoint"), "step": rf.get("step"), "why": rf.get("why", ""),
            "resume_extra": {k: v for k, v in rf.items() if k not in ("checkpoint", "step", "why")},
            "restore": list(rec.restore),
            "trials": [{"name": t.name, "change": t.change, "steps": t.steps, "settings": dict(t.settings)}
                       for t in rec.trials],
            "success_criteria": list(rec.success_criteria), "do_not": list(rec.do_not),
        }
    config: Mapping[str, Any] = analysis.meta
    config_from = "analysis"
    if not config and run is not None and run.meta:
        config, config_from = run.meta, "run"
    charts: dict[str, list[Any]] = {"main": [], "zoom": [], "layers": []}
    if run is not None and run.metrics.height > 0:
        charts = {
            k: [{"id": c.id, "title": c.title, "caption": c.caption, "svg": Markup(c.svg)} for c in v]
            for k, v in build_charts(analysis, run).items()
        }
    return {
        "run": str(analysis.run),
        "verdict": analysis.verdict,
        "cause": analysis.cause,
        "mechanism": analysis.mechanism,
        "confidence": analysis.confidence,
        "summary": analysis.summary,
        "onset": onset,
        "onset_findings": [{"code": f.code, "name": f.name, "message": f.message} for f in onset_findings],
        "findings": findings,
        "hypotheses": [
            {"cause": h.cause, "mechanism": h.mechanism, "confidence": h.confidence,
             "support": list(h.support), "against": list(h.against)}
            for h in analysis.hypotheses
        ],
        "recovery": recovery,
        "sources": [{"path": s.path, "format": s.format, "records": s.records, "segments": s.segments}
                    for s in analysis.sources],
        "skipped": [{"what": s.what, "reason": s.reason} for s in analysis.skipped],
        "config": flatten(config),
        "config_from": config_from,
        "charts": charts,
        "has_run": run is not None,
        "generated_at": generated_at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC"),
        "version": forensics.__version__,
        "schema_version": forensics.SCHEMA_VERSION,
    }


def render_html(analysis: Analysis, run: RunData | None, *, generated_at: datetime | None = None) -> str:
    """Render the self-contained HTML report.

    Args:
        analysis: The engine's result.
        run: The run's data for the charts, or ``None`` (the report then has no charts).
        generated_at: Timestamp written in the header (default: now, UTC).

    Returns:
        A complete HTML document.
    """
    view = _view(analysis, run, generated_at or datetime.now(UTC))
    return environment(True).get_template("report.html.j2").render(**view)
