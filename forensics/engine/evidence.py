"""The findings of one timeline, indexed the way the rules need them (frozen: rules return a new one)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType

from forensics.engine import codes, keys
from forensics.engine.weights import WEIGHTS
from forensics.facts import RunFacts
from forensics.model import CAUSES, Cause, Finding, RunData

NEVER = 1 << 62
"""The "first step" of a family with no strong finding (later than any step)."""


def recovered(f: Finding) -> bool:
    """The departure came back by itself (its ``recovered_step`` is set)."""
    return f.evidence.get(keys.RECOVERED_STEP) is not None


def _before_any_finite(f: Finding) -> bool:
    """A non-finite loss with no finite loss before it (SP01 has no band to see it return to; NF01 judges it)."""
    base = f.evidence.get("trailing_median")
    return bool(f.evidence.get(keys.NONFINITE)) and isinstance(base, float) and not math.isfinite(base)


@dataclass(frozen=True)
class Evidence:
    """The findings of one timeline: by code, per cause family, whether and where the run failed.

    Attributes:
        run: The run (read-only). ``facts``: its :class:`RunFacts`.
        findings: Every finding in step order (the engine's own ones appended).
        families: Cause -> its findings (cause ``unknown`` and cause-less findings excluded).
        failed: A non-finite value for good, a divergence, an unrecovered spike or a stall was found.
        failure_step: The earliest of those, or None.
    """

    run: RunData
    facts: RunFacts
    findings: tuple[Finding, ...]
    by_code: Mapping[str, tuple[Finding, ...]]
    families: Mapping[Cause, tuple[Finding, ...]]
    failed: bool
    failure_step: int | None

    @classmethod
    def build(cls, run: RunData, facts: RunFacts, findings: list[Finding]) -> Evidence:
        """Index ``findings`` (sorted by step, then code)."""
        ordered = sorted(findings, key=lambda f: (f.step if f.step is not None else NEVER, f.code))
        by_code: dict[str, tuple[Finding, ...]] = {}
        for f in ordered:
            by_code[f.code] = (*by_code.get(f.code, ()), f)
        nf = [f for f in by_code.get(codes.NONFINITE, ()) if not recovered(f)]
        nf_back = bool(by_code.get(codes.NONFINITE)) and not nf  # NF01: finite for good afterwards
        unrecovered = [f for f in by_code.get(codes.LOSS_SPIKE, ()) if not recovered(f)
                       and not (nf_back and _before_any_finite(f))]
        marks = [f.step for f in nf + list(by_code.get(codes.DIVERGENCE, ())) + unrecovered if f.step is not None]
        families: dict[Cause, tuple[Finding, ...]] = {}
        for f in ordered:
            if f.cause and f.cause != Cause.UNKNOWN:
                c = Cause(f.cause) if f.cause in CAUSES else f.cause  # a cause no enum knows keeps its name
                families[c] = (*families.get(c, ()), f)  # type: ignore[index]
        failed = bool(nf or by_code.get(codes.DIVERGENCE) or unrecovered or by_code.get(codes.STALL))
        return cls(run, facts, tuple(ordered), MappingProxyType(by_code), MappingProxyType(families), failed,
                   min(marks) if marks else None)

    def get(self, code: str) -> tuple[Finding, ...]:
        """The findings of one detector code."""
        return self.by_code.get(code, ())

    def family(self, cause: str) -> tuple[Finding, ...]:
        """The findings that argue for ``cause``."""
        return self.families.get(cause, ())  # type: ignore[call-overload]

    def first_step(self, family: str) -> int:
        """Earliest step of a family's strong findings (:data:`NEVER` when it has none)."""
        return min((f.step for f in self.family(family)
                    if f.step is not None and f.confidence >= WEIGHTS.min_cause_conf), default=NEVER)

    def with_family(self, cause: Cause, *found: Finding, listed: bool = False,
                    seed: tuple[Finding, ...] | None = None) -> Evidence:
        """A copy with ``found`` added to the family of ``cause`` (and to ``findings`` when ``listed``).

        ``seed``: the family's findings when it is new (default: none).
        """
        fams = dict(self.families)
        start = fams[cause] if cause in fams else (seed or ())
        fams[cause] = (*start, *found)
        return replace(self, families=MappingProxyType(fams),
                       findings=(*self.findings, *found) if listed else self.findings)

    def with_families(self, families: Mapping[Cause, tuple[Finding, ...]]) -> Evidence:
        """A copy whose families are ``families`` (the findings stay listed)."""
        return replace(self, families=MappingProxyType(dict(families)))

    def with_findings(self, *found: Finding) -> Evidence:
        """A copy with the engine's own ``found`` appended to ``findings``."""
        return replace(self, findings=(*self.findings, *found))
