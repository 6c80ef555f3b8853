"""The detector contract (STYLE.md item 4).

One class per module, a stable code, a dotted name, the metrics it requires, typed defaults,
and ``detect(run) -> list[Finding]``.
"""

from __future__ import annotations

import inspect
from abc import ABC, abstractmethod
from dataclasses import dataclass, fields
from typing import ClassVar

import numpy as np

from forensics.model import Finding, RunData, Series


@dataclass(frozen=True)
class Detector(ABC):
    """Base class of every detector.

    Class attributes:
        code: Stable code, e.g. ``"SP01"``; unique across the registry.
        name: Dotted name, e.g. ``"loss.spike"``.
        requires: Canonical metrics of which at least one must be present (``requires_all``
            makes all of them mandatory). Events-only detectors set ``requires = ()``.
        uses_facts: ``missing`` and ``detect`` take the run's :class:`forensics.facts.RunFacts` as a second
            argument (computed once by the runner; ``None`` makes the detector compute them).
        needs: What a detector with its own ``missing`` looks for, in words (``forensics detectors`` prints it,
            :meth:`requirement`); empty: the first line of its ``missing`` docstring is printed instead.
    """

    code: ClassVar[str]
    name: ClassVar[str]
    requires: ClassVar[tuple[str, ...]] = ()
    requires_all: ClassVar[bool] = False
    uses_facts: ClassVar[bool] = False
    needs: ClassVar[str] = ""

    def missing(self, run: RunData, facts: object = None) -> str | None:
        """Why this detector cannot run on ``run`` (a skip reason), or ``None`` when it can."""
        if not self.requires:
            return None
        present = [m for m in self.requires if run.has(m)]
        if self.requires_all and len(present) < len(self.requires):
            return "needs metrics " + ", ".join(m for m in self.requires if m not in present)
        if not present:
            return "needs one of the metrics " + ", ".join(self.requires)
        return None

    def defaults(self) -> dict[str, object]:
        """Every threshold of this detector: its typed fields (``forensics detectors`` prints them)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def requirement(self) -> str:
        """What this detector needs to run, in words (``forensics detectors`` prints it).

        The declared ``requires`` metrics when there are any, else ``needs``, else the first line of the
        detector's own ``missing`` docstring, else that it runs on every run.
        """
        if self.requires:
            if len(self.requires) == 1:
                return self.requires[0]
            return ("all of " if self.requires_all else "one of ") + ", ".join(self.requires)
        if self.needs:
            return self.needs
        if type(self).missing is not Detector.missing:
            doc = (inspect.getdoc(type(self).missing) or "").split("\n\n")[0].replace("\n", " ").replace("``", "")
            doc = doc.rstrip(".")
            if doc.startswith("Skip reason when "):
                return "skipped when " + doc.removeprefix("Skip reason when ")
            return doc.removeprefix("Needs ") or "(see its missing())"
        return "nothing: runs on every run"

    @abstractmethod
    def detect(self, run: RunData) -> list[Finding]:
        """Return the findings on ``run`` (an empty list when nothing is anomalous)."""

    def finding(self, **kw: object) -> Finding:
        """A :class:`Finding` carrying this detector's code and name."""
        return Finding(code=self.code, name=self.name, **kw)  # type: ignore[arg-type]


def finite(series: Series) -> tuple[np.ndarray, np.ndarray]:
    """(steps, values) of the finite points of a series."""
    ok = np.isfinite(series.values)
    return series.steps[ok], series.values[ok]


def fmt(x: float) -> str:
    """A number for a message: 4 significant digits, NaN/inf spelt out."""
    if x is None:
        return "n/a"
    if not np.isfinite(x):
        return "NaN" if np.isnan(x) else ("inf" if x > 0 else "-inf")
    return f"{x:.4g}"


def segment_at(series: Series, step: int) -> int:
    """Segment of the series point at ``step`` (or of the nearest later point)."""
    idx = int(np.searchsorted(series.steps, step))
    idx = min(idx, len(series) - 1)
    return int(series.segments[idx]) if len(series) else 0


def checkpoint_segment(run: RunData, step: int) -> int:
    """Segment of the logged step nearest at or after ``step`` (0 when nothing is logged)."""
    for m in ("loss", "lr", "grad_norm"):
        s = run.series(m)
        if s is not None and len(s):
            return segment_at(s, step)
    return 0
