"""The HTML report: one self-contained file (inline CSS, inline BokehJS, no external requests).

Rendered with Jinja2 (autoescape, StrictUndefined) from ``reports/templates/report.html.j2``. The first
screen says what happened in one plain sentence, how sure and why, and what to do (checkpoint, first
trial as a paste-ready block, what would prove it worked); the jargon follows as labels with a
glossary. Charts are interactive BokehJS panels built in the page (see :mod:`reports.interactive`); every
finding row links to its chart at its step.

Entry point for every front end (CLI, audit, service): :func:`render_html` ``(analysis, run) -> str``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from markupsafe import Markup

import forensics
from forensics.model import Analysis, Severity
from reports._common import environment, flatten, key_evidence, pretty_json

if TYPE_CHECKING:
    from forensics.model import Finding, RunData
    from reports._plain import Consistent
    from reports.interactive import ChartSet

MAX_EXTRA_METRICS = 12
"""Metrics referenced by findings charted beyond :data:`reports.charts.DEFAULT_METRICS`."""
MAX_LAYER_GROUPS = 8
"""Per-layer metric groups charted at most."""

_SEVERITY_RANK = {s: i for i, s in enumerate(Severity)}  # Severity is declared lowest first


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
    """Which metrics get a full-run chart, an "around the onset" chart, and a per-layer heat map.

    Args:
        analysis: The engine's result.
        run: The run's data.

    Returns:
        ``(main, zoom, layers)``: metric names for full-run charts (defaults first, then those
        the findings reference), every series a finding on the causal chain used (loss first; see
        :func:`reports.interactive.chain_metrics`), and per-layer groups ``{base: [base/layer0, ...]}``.
    """
    from reports.chart_data import chain_metrics
    from reports.charts import DEFAULT_METRICS

    names = run.metric_names
    refs = referenced_metrics(analysis, names)
    main = [m for m in DEFAULT_METRICS if m in names]
    zoom = chain_metrics(analysis, run)
    groups: dict[str, list[str]] = {}
    for m in names:
        if "/" in m:
            groups.setdefault(m.partition("/")[0], []).append(m)
    groups = {b: ms for b, ms in groups.items() if per_layer(ms)}
    in_groups = {m for ms in groups.values() for m in ms}
    main += [m for m in refs if m not in in_groups and m not in main][:MAX_EXTRA_METRICS]  # loss parts too
    ref_bases = {m.partition("/")[0] for m in refs}
    order = sorted(groups, key=lambda b: (b not in ref_bases, b not in DEFAULT_METRICS, b))
    return main, zoom, {b: groups[b] for b in order[:MAX_LAYER_GROUPS]}


def per_layer(members: Sequence[str]) -> bool:
    """Whether ``base/<suffix>`` metrics are one series per layer or module (a heat map), not parts of a metric.

    A layer or module suffix carries an index or a module path (``layer3``, ``layers.0.mlp``, ``h/11``,
    ``enc.wo``); loss parts and unit-like names (``loss/loss_box_reg``, ``throughput/tokens_per_second``,
    ``epoch_avg/loss``) carry neither. At least two members, most of them so.
    """
    suffixes = [m.partition("/")[2] for m in members]
    layered = sum(1 for x in suffixes if any(c.isdigit() for c in x) or "." in x)
    return len(members) >= 2 and 2 * layered > len(members)


def build_charts(analysis: Analysis, run: RunData) -> ChartSet:
    """Build every chart's data of the report (drawn by BokehJS in the page; see :mod:`reports.interactive`).

    Args:
        analysis: The engine's result.
        run: The run's data.

    Returns:
        The :class:`~reports.interactive.ChartSet`.
    """
    from reports.interactive import build

    main, _, groups = chart_plan(analysis, run)
    main += [m for m in analysis_chain_extra(analysis, run) if m not in main]
    return build(analysis, run, main, groups)


def analysis_chain_extra(analysis: Analysis, run: RunData) -> list[str]:
    """Chain series without a full-run panel yet (a step-time finding gets a step-time panel)."""
    from reports.chart_data import chain_metrics

    return [m for m in chain_metrics(analysis, run) if "/" not in m]


def _target(f: Finding, names: list[str], panels: Mapping[str, str], zoom: Mapping[str, str]) -> str | None:
    """The chart a finding row links to: the panel of the first metric it used (main, then zoom)."""
    from reports._plain import finding_metrics

    used = sorted(finding_metrics(f, names), key=lambda m: (m == "loss", m))
    for m in used:
        if m in panels:
            return panels[m]
    for m in used:
        if m in zoom:
            return zoom[m]
    return panels.get("loss") or next(iter(panels.values()), None)


def _plan_view(analysis: Analysis, run: RunData | None, cons: Consistent) -> dict[str, Any] | None:
    from reports._plain import launch_blocks, proof, split_restore

    rec = analysis.recovery
    if rec is None:
        return None
    rf = dict(rec.resume_from)
    first = rec.trials[0] if rec.trials else None
    steps, _ = split_restore(rec.restore)
    return {
        "checkpoint": rf.get("checkpoint"), "step": rf.get("step"), "why": rf.get("why", ""),
        "restore": steps,
        "trial": None if first is None else {
            "name": first.name, "change": first.change, "steps": first.steps,
            "blocks": [b.__dict__ for b in launch_blocks(first.settings, rf)],
        },
        "proof": proof(analysis, cons)[:4],
        "more_trials": max(0, len(rec.trials) - 1),
        "met": sum(r.where == "success criterion" for r in cons.removed),
    }


def _view(analysis: Analysis, run: RunData | None, generated_at: datetime) -> dict[str, Any]:
    from reports._plain import (
        CALIBRATED,
        NOT_A_FAULT,
        RAW,
        certainty,
        chosen_hypothesis,
        consistent,
        glossary,
        headline,
    )

    cons = consistent(analysis, run)
    onset = dict(analysis.onset) if analysis.onset else None
    onset_findings = [f for f in analysis.findings if onset is not None and f.step == onset.get("step")]
    chartset = build_charts(analysis, run) if run is not None and run.metrics.height > 0 else None
    config: Mapping[str, Any] = analysis.meta
    config_from = "analysis"
    if not config and run is not None and run.meta:
        config, config_from = run.meta, "run"
    hyps = cons.hypotheses
    return {
        "run": str(analysis.run),
        "verdict": analysis.verdict,
        "cause": analysis.cause,
        "mechanism": analysis.mechanism,
        "confidence": analysis.confidence,
        "summary": analysis.summary,
        "step_note": (analysis.meta.get("step_axis") or {}).get("note"),
        "headline": headline(analysis, run),
        "certainty": certainty(analysis, hyps),
        "calibrated_words": CALIBRATED, "raw_words": RAW, "not_a_fault": NOT_A_FAULT,
        "chosen_raw": (lambda h: None if h is None else h.confidence)(chosen_hypothesis(analysis, hyps)),
        "labels": glossary([analysis.cause, analysis.mechanism]),
        "glossary": glossary([analysis.verdict, analysis.cause, analysis.mechanism,
                              *(x for h in hyps for x in (h.cause, h.mechanism)),
                              *(x for f in analysis.findings for x in (f.cause, f.mechanism))]),
        "plan": _plan_view(analysis, run, cons),
        "removed": [r.__dict__ for r in cons.removed],
        "onset": onset,
        "onset_findings": [{"code": f.code, "name": f.name, "message": f.message} for f in onset_findings],
        "findings": _findings_view(analysis, run, chartset, onset_findings),
        "hypotheses": [
            {"cause": h.cause, "mechanism": h.mechanism, "confidence": h.confidence,
             "support": list(h.support), "against": list(h.against)}
            for h in hyps
        ],
        "recovery": _recovery_view(analysis, cons),
        "sources": [{"path": s.path, "format": s.format, "records": s.records, "segments": s.segments}
                    for s in analysis.sources],
        "skipped": [{"what": s.what, "reason": s.reason} for s in analysis.skipped],
        "config": flatten(config),
        "config_from": config_from,
        "charts": _charts_view(chartset),
        "has_run": run is not None,
        "generated_at": generated_at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC"),
        "version": forensics.__version__,
        "schema_version": forensics.SCHEMA_VERSION,
    }


def _findings_view(analysis: Analysis, run: RunData | None, chartset: Any,
                   onset_findings: list[Finding]) -> list[dict[str, Any]]:
    """Every finding as the template shows it, with the chart panel and half-window its link zooms to."""
    names = run.metric_names if run is not None and run.metrics.height else []
    panels = {p.metric: p.id for p in chartset.main} if chartset else {}
    zpanels = {p.metric: p.id for p in chartset.zoom} if chartset else {}
    span = 1
    if run is not None and run.metrics.height:
        col = run.metrics.get_column("step")
        span = max(1, int(col.max()) - int(col.min()))  # type: ignore[arg-type]
    half = max(20, span // 50)
    if chartset is not None and chartset.window:
        half = max(10, (chartset.window[1] - chartset.window[0]) // 2)
    return [
        {
            "code": f.code, "name": f.name, "step": f.step, "segment": f.segment, "cause": f.cause,
            "mechanism": f.mechanism, "confidence": f.confidence, "severity": f.severity,
            "severity_rank": _SEVERITY_RANK.get(f.severity, 0), "message": f.message,
            "key_evidence": key_evidence(f.evidence), "evidence_json": pretty_json(f.evidence),
            "against": list(f.against), "at_onset": f in onset_findings,
            "chart": _target(f, names, panels, zpanels) if chartset and f.step is not None else None,
            "half": half,
        }
        for f in analysis.findings
    ]


def _recovery_view(analysis: Analysis, cons: Any) -> dict[str, Any] | None:
    """The recovery plan as the template shows it: resume point, restores, trials with launch blocks."""
    from reports._plain import launch_blocks

    rec = analysis.recovery
    if rec is None:
        return None
    rf = dict(rec.resume_from)
    return {
        "checkpoint": rf.get("checkpoint"), "step": rf.get("step"), "why": rf.get("why", ""),
        "resume_extra": {k: v for k, v in rf.items() if k not in ("checkpoint", "step", "why")},
        "restore": list(rec.restore),
        "trials": [{"name": t.name, "change": t.change, "steps": t.steps, "settings": dict(t.settings),
                    "blocks": [b.__dict__ for b in launch_blocks(t.settings, rf)]}
                   for t in rec.trials],
        "success_criteria": list(cons.success_criteria), "do_not": list(rec.do_not),
    }


def _charts_view(chartset: Any) -> dict[str, Any]:
    """The interactive charts' panels, BokehJS, the chart data and its script (empty without a run)."""
    if chartset is None:
        return {"main": [], "zoom": [], "layers": [], "constant": [], "zoom_constant": [], "window": None,
                "resources": "", "script": "", "chain": [], "overlay_names": [], "dropped": [], "starts": [],
                "n_starts": 0, "n_start_steps": 0, "unpanelled": ""}

    def panel(p: Any) -> dict[str, Any]:
        return {"id": p.id, "metric": p.metric, "title": p.title, "caption": p.caption, "div": Markup(p.div),
                "kind": p.kind, "log": p.log, "log_ok": p.log_ok, "log_note": p.log_note}

    return {
        "main": [panel(p) for p in chartset.main], "zoom": [panel(p) for p in chartset.zoom],
        "layers": [panel(p) for p in chartset.layers], "constant": chartset.constant,
        "zoom_constant": chartset.zoom_constant, "window": chartset.window,
        # BokehJS, and the chart data (JSON with every "<" escaped: reports.interactive.data_json) and its script
        "resources": Markup(chartset.resources), "script": Markup(chartset.script), "chain": chartset.chain,
        "overlay_names": list(chartset.config.get("overlay", [])), "dropped": chartset.dropped,
        "starts": chartset.starts, "n_starts": len(chartset.config.get("bounds", [])),
        "n_start_steps": len({b[1] for b in chartset.config.get("bounds", [])}), "unpanelled": chartset.unpanelled,
    }


def render_html(analysis: Analysis, run: RunData | None, *, generated_at: datetime | None = None) -> str:
    """Render the self-contained HTML report (the stable entry point the CLI, audit and service share).

    Args:
        analysis: The engine's result.
        run: The run's data for the charts, or ``None`` (the report then has no charts).
        generated_at: Timestamp written in the header (default: now, UTC).

    Returns:
        A complete HTML document.
    """
    view = _view(analysis, run, generated_at or datetime.now(UTC))
    return environment(True).get_template("report.html.j2").render(**view)
