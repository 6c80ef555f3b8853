"""The JSON report: the machine contract of DESIGN.md section 7.

Stable top-level keys: ``schema_version``, ``run``, ``verdict``, ``cause``, ``mechanism``,
``confidence``, ``onset``, ``hypotheses``, ``findings``, ``recovery``, ``sources``, ``skipped``.
Extra keys: ``summary`` (one paragraph) and ``meta`` (configuration found in the run).
The shape is pinned by ``reports/schema/analysis.schema.json``.

Non-finite floats (in evidence, meta, anywhere) are written as the strings ``"NaN"``,
``"Infinity"`` and ``"-Infinity"`` so the output is strict JSON and nothing is lost.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from forensics import SCHEMA_VERSION
from forensics.model import Analysis
from reports._common import plain

SCHEMA_PATH = Path(__file__).resolve().parent / "schema" / "analysis.schema.json"
"""The JSON Schema (draft 2020-12) of :func:`to_dict`'s output."""


def _onset(onset: Any) -> dict[str, int] | None:
    if not onset:
        return None
    return {"step": int(onset["step"]), "segment": int(onset.get("segment", 0) or 0)}


def to_dict(analysis: Analysis) -> dict[str, Any]:
    """The JSON object of DESIGN.md section 7 for one analysis.

    Args:
        analysis: The engine's result.

    Returns:
        Plain JSON data (every float finite; non-finite values as ``"NaN"``/``"Infinity"``/
        ``"-Infinity"`` strings).
    """
    out: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "run": str(analysis.run),
        "verdict": analysis.verdict,
        "cause": analysis.cause,
        "mechanism": analysis.mechanism,
        "confidence": round(float(analysis.confidence), 3),
        "onset": _onset(analysis.onset),
        "hypotheses": [h.to_dict() for h in analysis.hypotheses],
        "findings": [f.to_dict() for f in analysis.findings],
        "recovery": None if analysis.recovery is None else analysis.recovery.to_dict(),
        "sources": [
            {"path": s.path, "format": s.format, "records": int(s.records), "segments": int(s.segments)}
            for s in analysis.sources
        ],
        "skipped": [{"what": s.what, "reason": s.reason} for s in analysis.skipped],
        "summary": analysis.summary,
        "meta": {**dict(analysis.meta), "confidence_kinds": _confidence_kinds(analysis)},
    }
    return plain(out)


def _confidence_kinds(analysis: Analysis) -> dict[str, Any]:
    """What each ``confidence`` of the report is (user test F34: a 0.96 run confidence beside a 0.55 cause).

    ``confidence``: calibrated; ``hypotheses[].confidence``: raw scores; ``chosen_raw``: the chosen cause's raw score.
    """
    from reports._plain import CALIBRATED, RAW, chosen_hypothesis

    chosen = chosen_hypothesis(analysis)
    return {"confidence": CALIBRATED, "hypotheses": RAW,
            "findings": "each detector's own confidence in its finding",
            "chosen_raw": None if chosen is None else round(float(chosen.confidence), 3)}


def render_json(analysis: Analysis) -> str:
    """The JSON report as text (indent 2, strict JSON, ends with a newline).

    Args:
        analysis: The engine's result.

    Returns:
        The serialised :func:`to_dict` object.
    """
    return json.dumps(to_dict(analysis), indent=2, allow_nan=False, ensure_ascii=False) + "\n"


def load_schema() -> dict[str, Any]:
    """The JSON Schema of the report (for validation by tests, the audit, a service)."""
    return json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))
