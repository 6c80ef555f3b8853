"""Reports of ``forensics sweep``: JSON (the DESIGN.md section 7 contract), Markdown and HTML.

The HTML report (``reports/templates/sweep.html.j2``, autoescaped, self-contained) shows the final loss
against the peak lr for every group on a log-x axis (diverged runs drawn at the initial loss with a
cross, as the LR-sensitivity formula counts them), the attention-logit max at the end against lr, a
table per group and the size trends.
"""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime
from typing import Any

from markupsafe import Markup

import forensics
from reports._common import dispatch, environment, fmt_num, md_cell, plain
from reports.escape import md_code, md_name, md_text, terminal_line

FORMATS = ("html", "json", "markdown", "text")
_COLORS = ("#1f5fa8", "#c62828", "#2e7d32", "#8e44ad", "#b9770e", "#00838f", "#ad1457", "#5d4037")


def group_label(key: dict[str, Any]) -> str:
    """``d_model=64, qk_layernorm=false`` (``all runs`` for an empty key)."""
    return ", ".join(f"{k}={fmt_num(v)}" for k, v in key.items()) or "all runs"


def render_json(result: dict[str, Any]) -> str:
    """The sweep result as strict JSON (non-finite floats as ``"NaN"``/``"Infinity"`` strings)."""
    return json.dumps(plain(result), indent=2, allow_nan=False, ensure_ascii=False) + "\n"


def render_markdown(result: dict[str, Any]) -> str:
    """Markdown: one summary table of the groups, one table of runs per group, the size trends."""
    lines = [f"# sweep: {md_code(result['root'])}", "",
             "| group | LR sensitivity | best lr | largest stable lr | runs |", "|---|---|---|---|---|"]
    for g in result["groups"]:
        lines.append(f"| {md_cell(group_label(g['key']))} | {fmt_num(g['lr_sensitivity'])} | {fmt_num(g['best_lr'])} "
                     f"| {fmt_num(g['largest_stable_lr'])} | {len(g['runs'])} |")
    lines += ["", "LR sensitivity = E_lr[min(L(lr), L0)] - min_lr L(lr) (Wortsman et al. 2023, arXiv 2309.14322, "
              "s2.2); L0 = loss at initialisation. Lower is flatter."]
    for g in result["groups"]:
        lines += ["", f"## {md_text(group_label(g['key']))}", "", "| lr | final loss | diverged | divergence step | "
                  "attn logit max (end) | log Z drift |", "|---|---|---|---|---|---|"]
        for r in g["runs"]:
            s = r["signatures"]
            lines.append(f"| {fmt_num(r['lr'])} | {fmt_num(r['final_loss'])} | {'yes' if r['diverged'] else 'no'} | "
                         f"{fmt_num(r['divergence_step'])} | {fmt_num(s.get('attn_logit_max_end'))} | "
                         f"{fmt_num(s.get('log_z_drift'))} |")
    if result.get("nesting"):
        nest = " > ".join(md_name(k) for k in result["nesting"])
        lines += ["", f"Grouped by: {nest} (as the folders nest them)."]
    if result.get("size_trends"):
        lines += ["", "## Size trends (log max of the signal vs log size, at a fixed lr)", "",
                  "| group | size | lr | signal | points | slope | predicted at target |",
                  "|---|---|---|---|---|---|---|"]
        for t in result["size_trends"]:
            pts = ", ".join(f"{d}: {fmt_num(v)}" for d, v in t["points"])
            pred = (f"{fmt_num(t['predicted'])} at {t.get('size_key', 'd_model')} {fmt_num(t.get('target_size'))}"
                    if t["predicted"] is not None else "-")
            lines.append(f"| {md_cell(group_label(t['key']))} | {t.get('size_key', 'd_model')} | {fmt_num(t['lr'])} | "
                         f"{md_cell(t['signal'])} | {pts} | {fmt_num(t['slope'])} | {pred} |")
    for p in result.get("size_predictions", []):
        meas = ", ".join(f"{k}: {fmt_num(v)}" for k, v in p["measured"].items())
        lines += ["", f"## Largest stable lr at {p['size_key']} {fmt_num(p['target_size'])} "
                  f"({md_cell(group_label(p['key']))})", "",
                  f"Measured: {meas}. Predicted: {fmt_num(p['predicted_largest_stable_lr'])}"
                  + (f" (range {fmt_num(p['interval'][0])} - {fmt_num(p['interval'][1])})" if p.get("interval") else "")
                  + f", method {p['method'] or '-'}."]
        if p.get("signal"):
            lines.append(md_text(p["signal"]["why"]) + ".")
        lines += [f"- {md_text(n)}" for n in p["notes"]]
    for n in result.get("notes", []):
        lines += ["", f"Note: {md_text(n)}"]
    for s in result.get("skipped", []):
        lines += [f"Skipped {md_code(s['what'])}: {md_text(s['reason'])}"]
    return "\n".join(lines) + "\n"


def _far_from_best(lr: float, best_lr: float | None) -> str:
    """Why a run that did not diverge is outside the stable band (Wortsman et al. 2023: a loss gap, not instability)."""
    if best_lr is not None and lr < best_lr:
        return "no divergence; the final loss is far from the best: too small an lr (under-trained), not unstable"
    return "no divergence, but the final loss is far from the best (outside the stable band)"


def render_text(result: dict[str, Any]) -> str:
    """The terminal summary: one line per group, then one line per run (plain text, no control character)."""
    lines = [f"sweep: {result['root']}"]
    for g in result["groups"]:
        lines.append(f"{group_label(g['key'])}: LR sensitivity {fmt_num(g['lr_sensitivity'])}, best lr "
                     f"{fmt_num(g['best_lr'])}, largest stable lr {fmt_num(g['largest_stable_lr'])}, "
                     f"{len(g['runs'])} runs")
        for r in g["runs"]:
            div = (f"diverged at step {fmt_num(r['divergence_step'])}" if r["diverged"] else "stable"
                   if r["lr"] in g.get("stable_lrs", ()) else _far_from_best(r["lr"], g.get("best_lr")))
            lines.append(f"  lr {fmt_num(r['lr'])}: final loss {fmt_num(r['final_loss'])}, {div}")
    for t in result.get("size_trends", []):
        pred = ""
        if t["predicted"] is not None:
            pred = f", predicted {fmt_num(t['predicted'])} at d_model {t['target_d_model']}"
        lines.append(f"size trend {group_label(t['key'])} lr {fmt_num(t['lr'])} {t['signal']}: slope "
                     f"{fmt_num(t['slope'])}{pred}")
    lines += [f"note: {n}" for n in result.get("notes", [])]
    lines += [f"skipped {s['what']}: {s['reason']}" for s in result.get("skipped", [])]
    return "\n".join(terminal_line(" ".join(ln.split()) if not ln.startswith("  ") else "  " + " ".join(ln.split()))
                     for ln in lines) + "\n"


def _chart(result: dict[str, Any], what: str, index: int) -> str | None:
    """Inline SVG: final loss (``"loss"``) or attention-logit max at the end (``"attn"``) against lr, per group."""
    import numpy as np

    from reports import charts as ch

    any_point = False
    with ch._style():  # noqa: SLF001 - the package's own chart style
        fig = ch._figure(9.5, 3.2)  # noqa: SLF001
        ax = fig.add_subplot()
        for i, g in enumerate(result["groups"]):
            color = _COLORS[i % len(_COLORS)]
            xs, ys, bad = [], [], []
            for r in g["runs"]:
                if what == "loss":
                    v = r["final_loss"]
                    if v is None or not math.isfinite(v):
                        bad.append(r["lr"])
                        continue
                else:
                    v = r["signatures"].get("attn_logit_max_end")
                    if v is None or not math.isfinite(v):
                        continue
                xs.append(r["lr"])
                ys.append(v)
            if xs:
                any_point = True
                order = np.argsort(xs)
                ax.plot(np.array(xs)[order], np.array(ys)[order], marker="o", ms=4, lw=1.2, color=color,
                        label=group_label(g["key"]))
                div = [(r["lr"], r["final_loss"]) for r in g["runs"] if r["diverged"] and r["final_loss"] is not None]
                if what == "loss" and div:
                    ax.scatter(*zip(*div, strict=True), marker="o", s=60, facecolors="none", edgecolors=color, zorder=5)
            if bad and what == "loss" and math.isfinite(g.get("initial_loss", float("nan"))):
                any_point = True
                ax.scatter(bad, [g["initial_loss"]] * len(bad), marker="x", s=40, color=color, zorder=5)
            if what == "loss" and g.get("largest_stable_lr"):
                ax.axvline(g["largest_stable_lr"], color=color, lw=0.8, ls=(0, (3, 3)))
        if not any_point:
            return None
        ax.set_xscale("log")
        if what == "attn":
            ax.set_yscale("log")
        ax.set_xlabel("peak learning rate", fontsize=8)
        ax.set_ylabel("final loss" if what == "loss" else "attn logit max (end)", fontsize=8)
        ax.legend(fontsize=7, frameon=False)
        return ch.to_svg(fig, f"sw{index}", "final loss against learning rate" if what == "loss" else
                         "attention logit max against learning rate")


def render_html(result: dict[str, Any], *, generated_at: datetime | None = None) -> str:
    """The self-contained HTML report."""
    charts = []
    for i, (what, title, caption) in enumerate((
        ("loss", "Final loss against peak lr", "mean of the last 5% of steps; a cross = non-finite run, drawn at "
         "the initial loss (as LR sensitivity counts it); a ring = diverged; dashed = largest stable lr"),
        ("attn", "Attention logit max at the end against peak lr", "instability signature: attention-logit growth "
         "(Wortsman et al. 2023 s3.1.1)"),
    )):
        svg = _chart(result, what, i)
        if svg is not None:
            charts.append({"id": f"chart-{what}", "title": title, "caption": caption, "svg": Markup(svg)})
    groups = [{**g, "label": group_label(g["key"])} for g in plain(result)["groups"]]
    view = {
        "r": plain(result), "groups": groups, "charts": charts, "version": forensics.__version__,
        "trends": [{**t, "label": group_label(t["key"])} for t in plain(result).get("size_trends", [])],
        "generated_at": (generated_at or datetime.now(UTC)).astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC"),
    }
    return environment(True).get_template("sweep.html.j2").render(**view)


def render(result: dict[str, Any], fmt: str) -> str:
    """Render a sweep result as ``html``, ``json``, ``markdown`` or ``text``.

    Raises:
        ValueError: an unknown format.
    """
    return dispatch(result, fmt, {"html": render_html, "json": render_json, "markdown": render_markdown,
                                  "text": render_text})
