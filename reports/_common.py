"""Helpers shared by the renderers: the Jinja environments and value formatting."""

from __future__ import annotations

import json
import math
import shlex
from collections.abc import Mapping, Sequence
from functools import cache
from pathlib import Path
from typing import Any

import jinja2
import numpy as np

TEMPLATES = Path(__file__).resolve().parent / "templates"


def plain(value: Any) -> Any:
    """Turn a value into plain JSON data; non-finite floats become ``"NaN"``, ``"Infinity"``, ``"-Infinity"``.

    Args:
        value: Anything found in evidence or meta (numpy scalars and arrays, tuples, mappings).

    Returns:
        An object made of dict/list/str/int/float/bool/None only, every float finite.
    """
    if value is None or isinstance(value, bool | str):
        return value
    if isinstance(value, np.generic):
        value = value.item()
        if value is None or isinstance(value, bool | str):
            return value
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        if math.isnan(value):
            return "NaN"
        if math.isinf(value):
            return "Infinity" if value > 0 else "-Infinity"
        return value
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, np.ndarray):
        return [plain(v) for v in value.tolist()]
    if isinstance(value, list | tuple | set | frozenset):
        items = sorted(value, key=str) if isinstance(value, set | frozenset) else value
        return [plain(v) for v in items]
    if hasattr(value, "to_dict"):
        return plain(value.to_dict())
    return str(value)


def fmt_num(value: Any, digits: int = 4) -> str:
    """Format a number for a person: ``4`` significant digits, ``NaN``/``inf`` spelled out."""
    if value is None:
        return "-"
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "NaN"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        if value == int(value) and abs(value) < 1e15:
            return str(int(value))
        return f"{value:.{digits}g}"
    return str(value)


def compact(value: Any, limit: int = 120) -> str:
    """One-line rendering of any value (mappings as ``k=v``, lists shortened), cut at ``limit`` chars."""
    if isinstance(value, Mapping):
        text = ", ".join(f"{k}={compact(v, limit)}" for k, v in value.items())
    elif isinstance(value, np.ndarray):
        return compact(value.tolist(), limit)
    elif isinstance(value, list | tuple):
        shown = [compact(v, limit) for v in value[:8]]
        more = f", +{len(value) - 8} more" if len(value) > 8 else ""
        text = "[" + ", ".join(shown) + more + "]"
    elif isinstance(value, str):
        text = value
    else:
        text = fmt_num(value)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"


def key_evidence(evidence: Mapping[str, Any], items: int = 5, limit: int = 160) -> str:
    """The first few evidence items as ``k=v; ...`` for a table cell."""
    parts = [f"{k}={compact(v, 60)}" for k, v in list(evidence.items())[:items]]
    if len(evidence) > items:
        parts.append(f"+{len(evidence) - items} more")
    return compact("; ".join(parts), limit)


def pretty_json(value: Any, limit: int = 4000) -> str:
    """Indented JSON of a value (for a collapsible block), cut at ``limit`` chars."""
    text = json.dumps(plain(value), indent=2, allow_nan=False)
    return text if len(text) <= limit else text[:limit] + "\n\u2026"


def oneline(value: Any) -> str:
    """Collapse whitespace (newlines included) to single spaces."""
    return " ".join(str(value).split())


def md_cell(value: Any) -> str:
    """Make a value safe inside a Markdown table cell (one line, CommonMark-safe, ``|`` escaped)."""
    from reports.escape import md_cell as cell

    return cell(oneline(value))


def fmt_conf(value: float | None) -> str:
    """Confidence as two decimals (``0.82``)."""
    return "-" if value is None else f"{float(value):.2f}"


def flatten(meta: Mapping[str, Any], prefix: str = "", depth: int = 3) -> list[tuple[str, str]]:
    """Flatten nested configuration into ``(dotted.key, compact value)`` rows, sorted by key."""
    rows: list[tuple[str, str]] = []
    for key, value in meta.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value and depth > 1:
            rows.extend(flatten(value, f"{name}.", depth - 1))
        else:
            rows.append((name, compact(value, 200)))
    return sorted(rows) if not prefix else rows


def onset_label(onset: Mapping[str, Any] | None) -> str:
    """``step 1234 (segment 1)`` or ``none``."""
    if not onset:
        return "none"
    seg = onset.get("segment")
    return f"step {onset.get('step')}" + ("" if seg is None else f" (segment {seg})")


def _html_finalize(value: Any) -> Any:
    from markupsafe import Markup

    from reports.escape import html_text

    if isinstance(value, str) and not isinstance(value, Markup):
        return html_text(value)
    return value


@cache
def environment(autoescape: bool) -> jinja2.Environment:
    """The Jinja environment over ``reports/templates`` (StrictUndefined; autoescape for HTML).

    Args:
        autoescape: True for HTML templates, False for Markdown.

    Returns:
        A cached environment with the formatting filters registered.
    """
    from reports import escape

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATES)),
        autoescape=autoescape,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        # HTML: every printed string shows bidi/invisible controls before autoescape (issue 16)
        finalize=_html_finalize if autoescape else None,
    )
    env.filters.update(
        num=fmt_num, compact=compact, conf=fmt_conf, oneline=oneline, md_cell=md_cell,
        key_evidence=key_evidence, pretty_json=pretty_json, onset_label=onset_label,
        md_text=escape.md_text, md_code=escape.md_code, shell=shlex.quote, code_spans=escape.html_code_spans,
    )
    return env


def dispatch(result: dict[str, Any], fmt: str, renderers: Mapping[str, Any]) -> str:
    """Render ``result`` with ``renderers[fmt]`` (a callable taking the result).

    Raises:
        ValueError: an unknown format.
    """
    if fmt not in renderers:
        raise ValueError(f"unknown format {fmt!r} (one of {', '.join(renderers)})")
    return str(renderers[fmt](result))


def layer_bins(layers: Sequence[Any], max_bins: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per-layer series binned on one step axis, for a heat map.

    Args:
        layers: Objects with ``steps`` (int, ascending) and ``values`` (float) arrays; empty ones are ignored
            for the axis.
        max_bins: At most this many step bins (one per step when the run is shorter).

    Returns:
        ``(edges, grid, bad, seen)``: ``edges`` (n_bins + 1,) step edges from the first step to the last + 1;
        ``grid`` (n_layers, n_bins) the max finite value per bin (``-inf`` where none); ``bad`` where a bin
        holds a NaN/inf; ``seen`` where a bin holds any point.
    """
    lo = min(int(s.steps[0]) for s in layers if s.steps.size)
    hi = max(int(s.steps[-1]) for s in layers if s.steps.size)
    nbins = max(1, min(max_bins, hi - lo + 1))
    edges = np.linspace(lo, hi + 1, nbins + 1)
    grid = np.full((len(layers), nbins), -np.inf)
    bad = np.zeros((len(layers), nbins), dtype=bool)
    seen = np.zeros((len(layers), nbins), dtype=bool)
    for i, s in enumerate(layers):
        b = np.clip(np.searchsorted(edges, s.steps, side="right") - 1, 0, nbins - 1)
        fin = np.isfinite(s.values)
        np.maximum.at(grid[i], b[fin], s.values[fin])
        bad[i, b[~fin]] = True
        seen[i, b] = True
    return edges, grid, bad, seen
