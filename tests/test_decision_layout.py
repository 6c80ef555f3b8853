"""The deciding half is laid out like the detecting half (issue 14, STYLE.md items 14 and 15).

One planner module per cause, exhaustive over :class:`Cause`; the engine keys on registered detector codes
through named constants; every engine weight states its source; run facts are computed once and never written
into the run; findings are never mutated; the decision carries the main evidence the planner reads.
"""

from __future__ import annotations

import ast
import copy
import dataclasses
from pathlib import Path

import pytest

from forensics.api import load
from forensics.detectors import DETECTORS
from forensics.engine import WEIGHTS, codes, decide, decide_timeline, run_detectors
from forensics.engine.weights import sources
from forensics.facts import RunFacts, run_facts
from forensics.model import Cause
from forensics.recovery import PLANNERS

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "sample_logs"
PKG = ROOT / "forensics"
MINE = [*(PKG / "engine").glob("*.py"), *(PKG / "recovery").glob("*.py"), *(PKG / "config_diff").glob("*.py"),
        PKG / "facts.py", PKG / "api.py"]
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60


def test_planners_are_exhaustive_over_causes_one_module_each() -> None:
    """PLANNERS maps every Cause to the plan() of the module named after it (unknown: unknown.py)."""
    assert set(PLANNERS) == set(Cause)
    for cause, planner in PLANNERS.items():
        assert planner.__module__ == f"forensics.recovery.{cause.value}", cause
        assert (ROOT / "forensics" / "recovery" / f"{cause.value}.py").is_file()


def test_engine_codes_are_registered_and_its_own_findings_are_not() -> None:
    """Every detector code the engine names is a registered detector; the engine's own codes collide with none."""
    registered = {d.code for d in DETECTORS}
    assert set(codes.DETECTOR_CODES) <= registered, set(codes.DETECTOR_CODES) - registered
    assert not set(codes.ENGINE_FINDINGS) & registered
    for group in (codes.FAILURE_PRECURSORS, codes.CHAIN_FOLLOWERS, codes.GROWTH_LEADERS, codes.AT_RESUME_CODES):
        assert set(group) <= registered


def test_every_weight_has_a_source() -> None:
    """The engine's numbers live in one frozen dataclass, each field with where it comes from."""
    table = sources()
    assert table and all(src for _value, src in table.values()), table
    with pytest.raises(dataclasses.FrozenInstanceError):
        WEIGHTS.min_cause_conf = 0.1  # type: ignore[misc]


@pytest.mark.parametrize("path", MINE, ids=lambda p: str(p.relative_to(ROOT)))
def test_decision_modules_are_small(path: Path) -> None:
    """No module over 400 lines, no function over 60 lines in the deciding half."""
    src = path.read_text()
    assert len(src.splitlines()) <= MAX_MODULE_LINES
    funcs = [n for n in ast.walk(ast.parse(src)) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]
    long = [(n.name, n.end_lineno - n.lineno + 1) for n in funcs if n.end_lineno - n.lineno + 1 > MAX_FUNCTION_LINES]
    assert not long, long


def test_facts_are_computed_without_writing_into_the_run() -> None:
    """run_facts reads the run and returns a frozen RunFacts; the run's meta and cache keys are untouched by it."""
    run = load(SAMPLES / "overflow")
    meta = copy.deepcopy(run.meta)
    facts = run_facts(run)
    assert isinstance(facts, RunFacts) and facts.fp16 is True and facts.precision_why
    assert run.meta == meta
    assert not [k for k in run._cache if "fp16" in k]  # noqa: SLF001 - what the old is_fp16 wrote
    with pytest.raises(dataclasses.FrozenInstanceError):
        facts.fp16 = False  # type: ignore[misc]
    assert [launch.segment for launch in facts.launches] == sorted(run.segment_starts())


@pytest.mark.parametrize("sample", ["overflow", "update_scale_growth", "data_batch", "lr_schedule_reset"])
def test_the_engine_never_mutates_a_finding(sample: str) -> None:
    """The detectors' findings come out of the decision equal to what the detectors returned."""
    run = load(SAMPLES / sample)
    found, _ = run_detectors(run)
    before = copy.deepcopy(found)
    d = decide_timeline(run)
    assert found == before
    detector_made = [f for f in d.findings if f.code not in codes.ENGINE_FINDINGS]
    assert sorted(map(repr, detector_made)) == sorted(map(repr, before))  # repr: NaN evidence compares unequal


def test_the_decision_carries_the_main_evidence() -> None:
    """The evidence of the chosen cause's most confident finding comes with the decision (not built in api)."""
    d = decide(load(SAMPLES / "lr_schedule_reset"))
    assert d.cause == Cause.LR_SCHEDULE_RESET
    best = max((f for f in d.findings if f.cause == d.cause), key=lambda f: f.confidence)
    assert {k: v for k, v in d.main_evidence.items() if k != "growth_precursor"} == dict(best.evidence)
    assert d.facts is not None and d.facts.first_step == int(load(SAMPLES / "lr_schedule_reset").metrics["step"].min())
