"""Reports of ``forensics compare``: JSON (the DESIGN.md section 7 contract), Markdown and HTML.

The HTML report is one self-contained file rendered from ``reports/templates/compare.html.j2``
(autoescape, StrictUndefined): the differences, the ranked explanations, the trial, and one inline SVG
chart per aligned signal with the proxy and the target overlaid and the departure marked.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from markupsafe import Markup

import forensics
from reports._common import compact, dispatch, environment, fmt_conf, md_cell, plain
from reports.escape import md_code, md_name, md_text, terminal_line

if TYPE_CHECKING:
    from forensics.model import RunData
    from reports.charts import Chart

FORMATS = ("html", "json", "markdown", "text")
_PROXY, _TARGET, _DEPART = "#1f5fa8", "#c62828", "#b54708"


def render_json(result: dict[str, Any]) -> str:
    """The compare result as strict JSON (non-finite floats as ``"NaN"``/``"Infinity"`` strings)."""
    return json.dumps(plain(result), indent=2, allow_nan=False, ensure_ascii=False) + "\n"


def render_markdown(result: dict[str, Any]) -> str:
    """A ticket-ready Markdown summary: departure, differences, explanations, trial.

    Every text from the runs (paths, metric and setting names, values, sentences built from them) goes
    through :mod:`reports.escape` (paths as code spans, names through ``md_name``, prose through ``md_text``).
    """
    dep = result.get("departure")
    lines = [f"# compare: {md_code(result['proxy'])} (proxy) vs {md_code(result['target'])} (target)", ""]
    if dep:
        gap = dep.get("gap")
        extra = (f" (gap {gap:.3g}" + (f", target x{dep['ratio']:.3g} the proxy" if dep.get("ratio") else " nats")
                 + (f", at {dep['tokens']:.4g} tokens" if dep.get("tokens") is not None else "") + ")"
                 ) if isinstance(gap, float) else ""
        lines.append(f"**Departure:** {md_name(dep['signal'])} at step {dep['step']}{extra}")
    else:
        lines.append("**Departure:** none (the target stays inside the proxy's band on every aligned signal)")
    per = result.get("departures") or {}
    if per:
        lines.append("Per signal: " + ", ".join(f"{md_name(k)} {'step ' + str(v['step']) if v else '-'}"
                                                 for k, v in per.items()) + f" (aligned by {result.get('alignment')}).")
    lines += ["", "## Differences", ""]
    if result["differences"]:
        lines += ["| setting | proxy | target | matters | why |", "|---|---|---|---|---|"]
        for d in result["differences"]:
            lines.append(f"| {md_cell(d['setting'] + (' (from logs)' if d.get('source') == 'logs' else ''))} | "
                         f"{md_cell(compact(d['proxy']))} | "
                         f"{md_cell(compact(d['target']))} | {'yes' if d['matters'] else 'no'} | {md_cell(d['why'])} |")
    else:
        lines.append("No configuration difference found in the settings both runs record.")
    lines += ["", "## Explanations (ranked)", ""]
    for i, e in enumerate(result["explanations"][:6], 1):
        setting = md_name(e["setting"]) if e["setting"] else "(no recorded setting)"
        lines.append(f"{i}. **{setting}** - {md_name(e['mechanism'])}, confidence {fmt_conf(e['confidence'])}")
        lines += [f"   - for: {md_cell(x)}" for x in e["for"][:4]]
        lines += [f"   - against: {md_cell(x)}" for x in e["against"][:3]]
        if e.get("decided_by"):
            lines.append(f"   - decided by: {md_cell('; '.join(e['decided_by']))}")
    if not result["explanations"]:
        lines.append("None: no difference that matters and no finding in the target.")
    return "\n".join(lines + _markdown_tail(result)) + "\n"


def _markdown_tail(result: dict[str, Any]) -> list[str]:
    """Markdown after the explanations: peak lr or warm-up, the muP check, the trial, the target's analysis."""
    lines: list[str] = []
    ev = result.get("lr_evidence")
    if ev:
        lines += ["", "## Peak lr or warm-up", "",
                  f"{md_text(ev['why'])}. Points at: `{ev['decides']}` (from the {ev['source']})."]
        if ev.get("separate"):
            lines.append(f"What would separate them: {md_text(ev['separate'])}.")
    mc = result.get("mup_check")
    if mc:
        lines += ["", "## muP check", "", f"{md_text(mc['verdict'])}.", "", "| check | status | detail |",
                  "|---|---|---|"]
        lines += [f"| {md_cell(c['what'])} | {md_cell(c['status'])} | {md_cell(c['detail'])} |" for c in mc["checks"]]
        lines += ["", "Not verifiable from configs and logs: "
                  + md_text("; ".join(mc["not_verifiable"] + mc["also_not_verifiable"])) + "."]
    t = result.get("trial")
    lines += ["", "## Trial", ""]
    if t:
        lines += [f"**{md_text(t['name'])}** ({t['steps']} steps): {md_text(t['change'])}.",
                  f"Control: {md_text(t['control'])}."]
        lines += [f"- success: {md_text(c)}" for c in t["success_criteria"]]
    else:
        lines.append("No trial: no explanation names a setting to restore.")
    ta = result.get("target_analysis")
    if ta:
        lines += ["", f"Target's own analysis: {md_text(ta['summary'])}"]
    return lines


def render_text(result: dict[str, Any]) -> str:
    """The terminal summary: departure, the top explanations, the trial (plain lines, no control character)."""
    dep = result.get("departure")
    rows = [("proxy", str(result["proxy"])), ("target", str(result["target"])),
            ("departure", f"{dep['signal']} at step {dep['step']}" if dep else
             "none (the target stays inside the proxy's band on every aligned signal)")]
    for d in result["differences"][:5]:
        if d["matters"]:
            rows.append(("difference", f"{d['setting']}: {compact(d['proxy'])} -> {compact(d['target'])} ({d['why']})"))
    for i, e in enumerate(result["explanations"][:3], 1):
        rows.append((f"explanation {i}", f"{e['setting'] or '(no recorded setting)'}: {e['mechanism']}, "
                                          f"confidence {fmt_conf(e['confidence'])}"))
    if len(result["explanations"]) > 3:
        rows.append(("", f"(+{len(result['explanations']) - 3} more explanations: -f markdown or -f html lists them)"))
    t = result.get("trial")
    if t:
        rows.append(("trial", f"{t['name']} ({t['steps']} steps): {t['change']}"))
        rows.append(("control", str(t["control"])))
        rows += [("worked if", str(c)) for c in t["success_criteria"][:1]]
    ta = result.get("target_analysis")
    if ta:
        rows.append(("target alone", str(ta["summary"])))
    width = max(len(k) for k, _ in rows) + 1
    return "".join(f"{(k + ':') if k else '':<{width}} {terminal_line(' '.join(str(v).split()))}\n" for k, v in rows)


def overlay_charts(result: dict[str, Any], proxy: RunData, target: RunData) -> list[Chart]:
    """One chart per aligned signal: proxy and target over the step, the departures marked.

    Args:
        result: :func:`forensics.compare.compare`'s output.
        proxy: The proxy run.
        target: The target run.

    Returns:
        Charts in the order of ``result["departures"]`` (signals logged by both runs).
    """
    import numpy as np

    from reports import charts as ch

    dep = result.get("departure")
    out = []
    for i, (signal, own) in enumerate((result.get("departures") or {}).items()):
        ps, ts = proxy.series(signal), target.series(signal)
        if ps is None or ts is None:
            continue
        with ch._style():  # noqa: SLF001 - the package's own chart style
            fig = ch._figure(9.5, 2.4)  # noqa: SLF001
            ax = fig.add_subplot()
            for s, color, label in ((ps, _PROXY, "proxy"), (ts, _TARGET, "target")):
                idx = ch.minmax_indices(s.values)
                ys = np.where(np.isfinite(s.values[idx]), s.values[idx], np.nan)
                ax.plot(s.steps[idx], ys, lw=0.9, color=color, label=label, zorder=3)
            both = np.concatenate([ps.values, ts.values])
            if signal != "log_z" and ch._use_log(both):  # noqa: SLF001
                ax.set_yscale("log")
            trans = ax.get_xaxis_transform()
            if own:
                ax.axvline(own["step"], color=_DEPART, lw=1.0, ls=(0, (4, 3)), zorder=4)
                ax.text(own["step"], 1.0, f" {signal} departs {own['step']}", transform=trans, fontsize=8,
                        color=_DEPART, va="bottom")
            if dep and (not own or dep["step"] != own["step"]):
                ax.axvline(dep["step"], color="#667085", lw=0.9, ls=(0, (1, 2)), zorder=2)
                ax.text(dep["step"], 1.0, f" departure {dep['step']} ({dep['signal']})", transform=trans,
                        fontsize=7, color="#667085", va="bottom")
            ax.legend(loc="best", fontsize=7, frameon=False)
            ax.set_ylabel(signal, fontsize=8)
            ax.set_xlabel("step", fontsize=8)
            svg = ch.to_svg(fig, f"cmp{i}", f"{signal}: proxy vs target")
        caption = (f"{signal} of the target leaves the proxy's band at step {own['step']} (threshold "
                   f"{own['threshold']:.3g} {'nats' if signal == 'log_z' else 'in log ratio'})" if own else
                   f"{signal}: the target stays inside the proxy's band")
        out.append(ch.Chart(f"overlay-{signal}", f"{signal}: proxy vs target", caption, svg))
    return out


def render_html(result: dict[str, Any], proxy: RunData | None = None, target: RunData | None = None,
                *, generated_at: datetime | None = None) -> str:
    """The self-contained HTML report; the overlay charts are drawn only when the caller passes both runs.

    Args:
        result: :func:`forensics.compare.compare`'s output.
        proxy: The proxy run (its series are drawn); ``None``: no charts.
        target: The target run; ``None``: no charts.
        generated_at: The time written in the footer (default: now).
    """
    charts = []
    if proxy is not None and target is not None:
        charts = [{"id": c.id, "title": c.title, "caption": c.caption, "svg": Markup(c.svg)}
                  for c in overlay_charts(result, proxy, target)]
    view = {
        "r": plain(result), "charts": charts, "version": forensics.__version__,
        "generated_at": (generated_at or datetime.now(UTC)).astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC"),
    }
    return environment(True).get_template("compare.html.j2").render(**view)


def render(result: dict[str, Any], fmt: str, proxy: RunData | None = None, target: RunData | None = None) -> str:
    """Render a compare result as ``html``, ``json``, ``markdown`` or ``text``.

    Args:
        result: :func:`forensics.compare.compare`'s output.
        fmt: The format.
        proxy: The proxy run, for the HTML report's charts (the renderer reads nothing itself).
        target: The target run, likewise.

    Raises:
        ValueError: an unknown format.
    """
    if fmt == "html":
        return render_html(result, proxy, target)
    return dispatch(result, fmt, {"html": render_html, "json": render_json, "markdown": render_markdown,
                                  "text": render_text})
