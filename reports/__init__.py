"""Renderers of an :class:`~forensics.model.Analysis`: HTML, JSON, Markdown and text.

One module per format, behind one enum (STYLE.md item 8). Imports stay light: the HTML renderer is
imported when used and never imports Bokeh (BokehJS draws the charts in the page), so ``import reports``
costs almost nothing.

Example::

    from reports import ReportFormat, render
    html = render(analysis, run, ReportFormat.html)
"""

from __future__ import annotations

from enum import StrEnum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from forensics.model import Analysis, RunData

__all__ = ["ReportFormat", "render"]


class ReportFormat(StrEnum):
    """The output formats of ``forensics analyze -f`` (a ``str`` enum: ``ReportFormat("json")`` works)."""

    html = "html"
    json = "json"
    markdown = "markdown"
    text = "text"


def render(
    analysis: Analysis,
    run: RunData | None,
    fmt: ReportFormat | str,
    *,
    html_path: str | None = None,
    color: bool = False,
    verbose: bool = False,
) -> str:
    """Render one analysis in one format.

    Args:
        analysis: The engine's result.
        run: The run's data: charts (HTML), the plain sentence and the consistency pass (HTML, Markdown,
            text). ``None`` draws no charts and keeps every success criterion.
        fmt: A :class:`ReportFormat` member or its value (``"html"``, ``"json"``, ...).
        html_path: Where the HTML report is (or will be) written; the Markdown report links it.
        color: Text format only: ANSI colours through rich (for a terminal).
        verbose: Text format only: every finding, trial, criterion and skipped item.

    Returns:
        The report as one string (a complete HTML document for ``html``).

    Raises:
        ValueError: When ``fmt`` is not a known format.
    """
    fmt = ReportFormat(fmt)
    if fmt is ReportFormat.html:
        from reports.html_report import render_html

        return render_html(analysis, run)
    if fmt is ReportFormat.json:
        from reports.json_report import render_json

        return render_json(analysis)
    if fmt is ReportFormat.markdown:
        from reports.markdown_report import render_markdown

        return render_markdown(analysis, html_path=html_path, run=run)
    from reports.text_report import render_text

    return render_text(analysis, color=color, run=run, verbose=verbose)
