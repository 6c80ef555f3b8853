"""The index page of ``forensics audit``: one sortable, filterable table of the runs (``OUT/index.html``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from reports._common import environment

OUTLIER_Z = 3.5
"""A cohort robust z at or beyond this is marked as an outlier (Iglewicz and Hoaglin's modified z cut-off)."""


def render_index(root: str, rows: Sequence[Mapping[str, Any]], counts: Mapping[str, int], *, generated: str) -> str:
    """The self-contained HTML index of an audit (autoescaped; the rows' text is data).

    Args:
        root: The audited root as given.
        rows: One summary row per run (the columns of :data:`forensics.audit.COLUMNS`).
        counts: Runs per verdict (``error`` for failed runs) and per baseline status.
        generated: When the audit ran, as shown in the page.

    Returns:
        The HTML document.
    """
    return environment(True).get_template("audit_index.html.j2").render(
        root=root, rows=rows, counts=dict(counts), generated=generated, outlier=OUTLIER_Z)
