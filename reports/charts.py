"""Static charts of the compare and sweep reports: matplotlib figures rendered to inline SVG.

The analyze report's charts are interactive (:mod:`reports.interactive`). Display only: long series are
reduced to the min and max of each of :data:`BUCKETS` buckets, with full resolution kept around the onset
(:mod:`reports.downsample`). Detection never sees these arrays. matplotlib is imported inside the
functions (``import reports`` stays light); figures are built with :class:`matplotlib.figure.Figure`
directly, so no pyplot global state is touched.
"""

from __future__ import annotations

__all__ = ["BUCKETS", "MAX_FULL_RES", "MAX_MARKERS", "Chart", "display_indices", "minmax_indices", "to_svg",
           "zoom_window"]

import io
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from reports.downsample import BUCKETS, MAX_FULL_RES, MAX_MARKERS, display_indices, minmax_indices, zoom_window

if TYPE_CHECKING:
    from matplotlib.figure import Figure



DEFAULT_METRICS = ("loss", "lr", "grad_norm", "loss_scale", "update_ratio", "attn_logit_max", "log_z")

_RC = {
    "svg.fonttype": "none",
    "svg.hashsalt": "train-forensics",
    "font.family": "sans-serif",
    "font.sans-serif": ["DejaVu Sans", "Verdana", "Arial", "Helvetica"],
    "font.size": 9,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.edgecolor": "#888888",
    "axes.grid": True,
    "grid.color": "#e6e6e6",
    "grid.linewidth": 0.6,
    "xtick.color": "#444444",
    "ytick.color": "#444444",
    "path.simplify": True,
    "text.parse_math": False,  # names from run folders are text, never mathtext ("attn/$\\x$": issue 16)
}


_LOCK = threading.Lock()


@contextmanager
def _style() -> Iterator[None]:
    """Chart rc settings; serialised, since rcParams are process-global (safe under a threaded service)."""
    import matplotlib

    with _LOCK, matplotlib.rc_context(_RC):
        yield


@dataclass(frozen=True)
class Chart:
    """One rendered chart.

    Attributes:
        id: Stable element id (``chart-loss``, ``zoom-grad_norm``, ``layers-attn_logit_max``).
        title: Caption title.
        caption: One line on what is drawn (downsampling, markers).
        svg: The ``<svg>`` element, ids prefixed so several charts can share a page.
    """

    id: str
    title: str
    caption: str
    svg: str


# ----------------------------------------------------------------------------------- drawing


def _figure(width: float, height: float) -> Figure:
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), layout="constrained")


_ID_RE = re.compile(r'(\bid="|href="#|url\(#)([^")]+)')


def to_svg(fig: Figure, prefix: str, label: str = "") -> str:
    """Serialise a figure to an inline ``<svg>`` element (no XML header, no metadata, ids prefixed).

    Args:
        fig: The figure.
        prefix: Unique prefix for every id inside (several SVGs share one HTML document).
        label: ``aria-label`` text (escaped here).

    Returns:
        The SVG markup.
    """
    buf = io.StringIO()
    fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": None})
    text = buf.getvalue()
    text = text[text.index("<svg"):]
    text = re.sub(r"<metadata>.*?</metadata>\s*", "", text, flags=re.S)
    text = _ID_RE.sub(lambda m: f"{m.group(1)}{prefix}-{m.group(2)}", text)
    # inline SVG in HTML5 needs no namespace declarations (the parser knows svg and xlink:href)
    end = text.index(">") + 1
    text = re.sub(r'\s+xmlns(?::xlink)?="[^"]*"', "", text[:end], count=2) + text[end:]
    text = _visible_controls(text)  # a bidi override in a metric name must not reorder the chart's text
    esc = label.replace("&", "&amp;").replace('"', "&quot;").replace("<", "&lt;").replace(">", "&gt;")
    esc = _visible_controls(esc)
    text = re.sub(
        r'^<svg([^>]*?) width="[^"]*" height="[^"]*"',
        lambda m: f'<svg{m.group(1)} role="img" aria-label="{esc}"',
        text, count=1,
    )
    return text.strip()


def _visible_controls(text: str) -> str:
    """Bidi and invisible format characters shown as ``&lt;U+202E&gt;`` (XML-safe; see :mod:`reports.escape`)."""
    if text.isascii():
        return text
    from reports.escape import INVISIBLE

    return "".join(f"&lt;U+{ord(c):04X}&gt;" if ord(c) in INVISIBLE else c for c in text)


def _use_log(values: np.ndarray) -> bool:
    fin = values[np.isfinite(values)]
    return bool(fin.size) and float(fin.min()) > 0 and float(fin.max()) / float(fin.min()) > 100.0


