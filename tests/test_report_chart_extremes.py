"""The HTML report's chart data with extreme finite values, non-finite series and failing panels.

Every float the page's JSON holds must be plain JSON (no NaN/inf: ``json.dumps(allow_nan=False)``); a panel whose
data cannot be made is left out with a note, and the rest of the report is written.
"""

from __future__ import annotations

import base64
import gzip
import json
import re
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from forensics.api import analyze_run, load
from reports import ReportFormat, render


def _run(tmp_path: Path, rows: list[dict[str, Any]]) -> Path:
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return run


def _html(run_dir: Path) -> str:
    run = load(run_dir)
    return render(analyze_run(run), run, ReportFormat.html)


def _spec(html: str) -> dict[str, Any]:
    m = re.search(r'<script type="application/json" id="tf-charts">(.*?)</script>', html, re.S)
    assert m, "no chart data in the page"
    return json.loads(m.group(1), parse_constant=lambda c: pytest.fail(f"non-JSON constant {c}"))


def _loss(step: int) -> float:
    return 3.0 - step / 300


@pytest.mark.parametrize("huge", [1e200, 1e300, 1.7e308])
def test_a_series_spanning_the_float64_range_gives_finite_chart_data(tmp_path: Path, huge: float) -> None:
    """grad_norm 1e-200 then ``huge`` (QA s7 F1: the log padding overflowed to inf and the report died)."""
    rows = [{"step": s, "loss": _loss(s), "grad_norm": 1e-200 if s < 150 else huge} for s in range(1, 201)]
    spec = _spec(_html(_run(tmp_path, rows)))
    ranges = [p["logRange"] for p in spec["panels"] if p["metric"] == "grad_norm"]
    assert ranges
    for lo, hi in ranges:
        assert 0 < lo <= 1e-200 and huge <= hi < np.inf


def test_a_huge_layer_gives_finite_chart_data(tmp_path: Path) -> None:
    """One layer at 1e300, the others 1..8: the heat map and any line panel of it stay finite JSON."""
    rows = [{"step": s, "loss": _loss(s), **{f"attn_logit_max/layer{i}": (1e300 if i == 3 and s > 100 else i + 1.0)
                                            for i in range(8)}} for s in range(1, 201)]
    spec = _spec(_html(_run(tmp_path, rows)))
    assert any(p["kind"] == "heat" for p in spec["panels"])


def test_a_panel_that_cannot_be_made_is_dropped_with_a_note(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A panel whose data fails is left out with a note in the page; the other panels and the report remain."""
    from reports.figures import FigureBuilder

    real = FigureBuilder.line_panel

    def failing(self: FigureBuilder, s: Any, pid: str, x_range: str, **kw: Any) -> bool:
        if s.metric == "grad_norm":
            self.panels.append({"id": pid, "metric": s.metric, "junk": float("inf")})
            raise ValueError("Out of range float values are not JSON compliant")
        return real(self, s, pid, x_range, **kw)

    monkeypatch.setattr(FigureBuilder, "line_panel", failing)
    rows = [{"step": s, "loss": _loss(s), "grad_norm": 1.0 + s % 7} for s in range(1, 201)]
    html = _html(_run(tmp_path, rows))
    spec = _spec(html)
    assert [p["metric"] for p in spec["panels"]] and all(p["metric"] != "grad_norm" for p in spec["panels"])
    assert "grad_norm: chart not drawn (ValueError" in html
    assert 'id="chart-loss"' in html and 'id="chart-grad_norm"' not in html


def test_values_beyond_float32_keep_their_smoothed_line_and_print_no_warning(tmp_path: Path) -> None:
    """Loss ~1e300 and lr ~1e-300: the smoothed line is encoded as float64, finite and non-zero; no RuntimeWarning."""
    rows = [{"step": s, "loss": 1e300 * (1 + s / 100), "lr": 1e-300 * (1 + s / 50)} for s in range(1, 201)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        spec = _spec(_html(_run(tmp_path, rows)))
    for metric, lo, hi in (("loss", 1e299, 1e301), ("lr", 1e-301, 1e-298)):
        src = spec["sources"][metric]
        ys = np.frombuffer(gzip.decompress(base64.b64decode(src["ys"])), dtype="<f8" if src.get("ysF64") else "<f4")
        fin = ys[np.isfinite(ys)]
        assert fin.size > 150 and lo < fin.min() and fin.max() < hi, metric
