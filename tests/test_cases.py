"""Acceptance cases from ../shared/cases (rebuilt from public reports of real failures).

Each case folder's expected.json gives the diagnosis it should get. Cases the analyzer does
not solve yet are listed in KNOWN_FAILING with the reason (strict xfail: a fix makes the test
fail until the entry is removed, so the list cannot go stale).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from forensics.api import analyze

KNOWN_FAILING: dict[str, str] = {
}


def _case_dirs() -> list[Path]:
    root = Path(os.environ.get("FORENSICS_CASES") or Path(__file__).resolve().parents[2] / "shared" / "cases")
    if not root.is_dir():
        return []
    return sorted(p.parent for p in root.glob("*/expected.json"))


def _matches(text: str, alternatives: str) -> bool:
    low = text.lower()
    return any(a.lower() in low for a in alternatives.split("|"))


CASES = _case_dirs()


@pytest.mark.cases
@pytest.mark.skipif(not CASES, reason="../shared/cases not found beside the checkout")
@pytest.mark.parametrize("case", CASES, ids=[c.name.split("_")[0] for c in CASES] or None)
def test_case(case: Path, request: pytest.FixtureRequest) -> None:
    """The analysis of a case folder matches its expected.json."""
    cid = case.name.split("_")[0]
    if cid in KNOWN_FAILING:
        request.applymarker(pytest.mark.xfail(reason=KNOWN_FAILING[cid], strict=True))
    exp = json.loads((case / "expected.json").read_text())["expect"]
    a = analyze(case)
    problems = []
    if a.verdict != exp["verdict"]:
        problems.append(f"verdict {a.verdict} != {exp['verdict']}")
    ok_causes = {exp["cause"], *exp.get("acceptable_causes", [])}
    if a.cause not in ok_causes:
        problems.append(f"cause {a.cause} not in {sorted(map(str, ok_causes))}")
    if exp.get("onset_window"):
        lo, hi = exp["onset_window"]
        if a.onset is None or not lo <= a.onset["step"] <= hi:
            problems.append(f"onset {a.onset} not in [{lo}, {hi}]")
    for h in a.hypotheses:
        if h.cause in exp.get("must_not", []) and h.confidence >= 0.5:
            problems.append(f"asserts forbidden cause {h.cause} ({h.confidence:.2f})")
    actions = a.recovery.actions_text() if a.recovery else ""
    for entry in exp.get("recovery", []):
        if not _matches(actions, entry):
            problems.append(f"recovery lacks one of: {entry[:80]}")
    for entry in exp.get("recovery_must_not", []):
        if actions and _matches(actions, entry):
            problems.append(f"recovery contains forbidden: {entry[:80]}")
    assert not problems, f"{cid}: " + "; ".join(problems) + f" | summary: {a.summary}"
