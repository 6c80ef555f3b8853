"""The labelled items of the accuracy benchmark (corpus runs, cases, varied-corpus runs) and their checks."""

from __future__ import annotations

import json
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HEALTHY = "healthy"  # the confusion table's name for "no cause" (cause None)


@dataclass
class Item:
    """One labelled run folder and, once analysed, what the analyzer found.

    Attributes:
        name: Run or case name.
        kind: ``corpus`` or ``case``.
        path: The run folder.
        verdict: Expected verdict.
        cause: Expected cause family (``None`` when healthy).
        causes_ok: Every cause accepted as the top cause.
        mechanism: Expected mechanism or ``None``.
        mechs_ok: Every mechanism accepted.
        window: Inclusive onset window or ``None``.
        must_not: Causes that must not be asserted with confidence >= 0.5.
        recovery: Case recovery concepts (``|`` alternatives), cases only.
        recovery_must_not: Forbidden recovery actions, cases only.
    """

    name: str
    kind: str
    path: Path
    verdict: str
    cause: str | None
    causes_ok: set[str | None]
    mechanism: str | None
    mechs_ok: set[str]
    window: tuple[int, int] | None
    must_not: list[str] = field(default_factory=list)
    recovery: list[str] = field(default_factory=list)
    recovery_must_not: list[str] = field(default_factory=list)
    found: dict[str, Any] = field(default_factory=dict)
    split: str = ""
    fault_kind: str = ""

    # ------------------------------------------------------------------ checks on the found diagnosis
    @property
    def true_cause(self) -> str:
        """Expected cause, ``healthy`` for none."""
        return self.cause or HEALTHY

    @property
    def found_cause(self) -> str:
        """Found cause, ``healthy`` for a healthy verdict, ``ERROR`` when the analysis raised."""
        if "error" in self.found:
            return "ERROR"
        if self.found["verdict"] == "healthy":
            return HEALTHY
        return self.found["cause"] or "none"

    def cause_ok(self) -> bool:
        """The top cause is right (for a healthy label: the verdict is healthy)."""
        if "error" in self.found:
            return False
        if self.cause is None:
            return self.found["verdict"] == "healthy"
        return self.found["verdict"] != "healthy" and self.found["cause"] in self.causes_ok

    def verdict_ok(self) -> bool:
        """The verdict is the labelled one."""
        return "error" not in self.found and self.found["verdict"] == self.verdict

    def mechanism_ok(self) -> bool | None:
        """Mechanism right, or ``None`` when no mechanism is labelled."""
        if self.mechanism is None:
            return None
        return "error" not in self.found and self.found["mechanism"] in self.mechs_ok

    def onset_ok(self) -> bool | None:
        """Onset inside the window, or ``None`` when there is no window."""
        if self.window is None:
            return None
        if "error" in self.found or self.found["onset"] is None:
            return False
        return self.window[0] <= self.found["onset"] <= self.window[1]

    def false_alarm(self) -> bool | None:
        """A healthy item got a non-healthy verdict; ``None`` for non-healthy items."""
        if self.verdict != "healthy":
            return None
        return "error" in self.found or self.found["verdict"] != "healthy"

    def forbidden(self) -> list[str]:
        """``must_not`` causes asserted with confidence >= 0.5."""
        return [f"{c}({p:.2f})" for c, p in self.found.get("hypotheses", []) if c in self.must_not and p >= 0.5]

    def recovery_problems(self) -> list[str]:
        """Recovery checks of tests/test_cases.py (cases only)."""
        actions = self.found.get("actions", "").lower()
        out = [f"lacks {e[:40]}" for e in self.recovery if not any(a.lower() in actions for a in e.split("|"))]
        out += [f"has {e[:40]}" for e in self.recovery_must_not
                if actions and any(a.lower() in actions for a in e.split("|"))]
        return out

    def problems(self) -> list[str]:
        """Every check that failed, as short phrases."""
        if "error" in self.found:
            return [f"analysis raised {self.found['error']}"]
        p = []
        if not self.verdict_ok():
            p.append(f"verdict {self.found['verdict']} != {self.verdict}")
        if not self.cause_ok():
            p.append(f"cause {self.found['cause']} not in {sorted(map(str, self.causes_ok))}")
        if self.mechanism_ok() is False:
            p.append(f"mechanism {self.found['mechanism']} not in {sorted(self.mechs_ok)}")
        if self.onset_ok() is False:
            p.append(f"onset {self.found['onset']} not in {list(self.window or ())}")
        if self.forbidden():
            p.append("asserts forbidden " + ", ".join(self.forbidden()))
        p += ["recovery " + r for r in self.recovery_problems()]
        return p


# ------------------------------------------------------------------------------------------ loading


def corpus_items(labels_path: Path) -> list[Item]:
    """Items of the labelled corpus (run folders beside the labels file, under ``corpus/``)."""
    if not labels_path.is_file():
        return []
    root = labels_path.parent / "corpus"
    items = []
    for r in json.loads(labels_path.read_text()):
        mech = r.get("mechanism")
        items.append(Item(
            name=r["run"], kind="corpus", path=root / r["run"], verdict=r["verdict"], cause=r["cause"],
            causes_ok={r["cause"]}, mechanism=mech, mechs_ok={mech, *r.get("acceptable_mechanisms", [])} - {None},
            window=tuple(r["onset_window"]) if r.get("onset_window") else None,  # type: ignore[arg-type]
        ))
    return items


def case_items(cases_root: Path) -> list[Item]:
    """Items of every case folder (``*/expected.json``) under ``cases_root``."""
    if not cases_root.is_dir():
        return []
    items = []
    for exp_path in sorted(cases_root.glob("*/expected.json")):
        e = json.loads(exp_path.read_text())["expect"]
        mech = e.get("mechanism")
        items.append(Item(
            name=exp_path.parent.name, kind="case", path=exp_path.parent, verdict=e["verdict"], cause=e["cause"],
            causes_ok={e["cause"], *e.get("acceptable_causes", [])}, mechanism=mech,
            mechs_ok={mech} - {None}, window=tuple(e["onset_window"]) if e.get("onset_window") else None,  # type: ignore[arg-type]
            must_not=list(e.get("must_not", [])), recovery=list(e.get("recovery", [])),
            recovery_must_not=list(e.get("recovery_must_not", [])),
        ))
    return items


def run_analysis(item: Item) -> None:
    """Analyse one item and store what was found (an exception is stored, not raised)."""
    from forensics.api import analyze

    t0 = time.perf_counter()
    try:
        a = analyze(item.path)
        cov = a.meta.get("coverage", {})
        item.found = {
            "verdict": a.verdict, "cause": a.cause, "mechanism": a.mechanism, "confidence": a.confidence,
            "onset": a.onset["step"] if a.onset else None, "summary": a.summary,
            "hypotheses": [(h.cause, h.confidence) for h in a.hypotheses],
            "actions": a.recovery.actions_text() if a.recovery else "",
            # the coverage: the cap of a fault's confidence, and the factor api.py applies to a healthy one
            "coverage": {k: cov[k] for k in ("share_evaluated", "cap", "cap_floor", "factor", "detector_share",
                                             "rivals_unchecked") if k in cov},
        }
    except Exception as exc:  # noqa: BLE001 - a crash is a miss, reported with its type
        item.found = {"error": f"{type(exc).__name__}: {exc}", "summary": traceback.format_exc(limit=1)}
    item.found["seconds"] = time.perf_counter() - t0


def varied_items(root: Path) -> list[Item]:
    """Items of a corpus written by ``sample_logs/make_varied_corpus.py`` (``ROOT/labels.json``).

    Each item carries its ``split`` (``tuning`` or ``validation``) and the injected ``fault_kind``.
    """
    path = root / "labels.json"
    if not path.is_file():
        return []
    items = []
    for r in json.loads(path.read_text()):
        mech = r.get("mechanism")
        items.append(Item(
            name=r["run"], kind="varied", path=root / r["run"], verdict=r["verdict"], cause=r["cause"],
            causes_ok={r["cause"]}, mechanism=mech, mechs_ok={mech, *r.get("acceptable_mechanisms", [])} - {None},
            window=tuple(r["onset_window"]) if r.get("onset_window") else None,  # type: ignore[arg-type]
            split=r["split"], fault_kind=r["kind"],
        ))
    return items


def misses(items: list[Item]) -> list[str]:
    """Every item with at least one failed check."""
    lines = ["== misses", ""]
    n = 0
    for i in items:
        p = i.problems()
        if not p:
            continue
        n += 1
        f = i.found
        exp = f"{i.verdict} / {i.cause} ({i.mechanism}) window {list(i.window) if i.window else None}"
        got = ("ERROR" if "error" in f else
               f"{f['verdict']} / {f['cause']} ({f['mechanism']}) onset {f['onset']} conf {f['confidence']:.2f}")
        lines += [f"- [{i.kind}] {i.name}", f"    expected: {exp}", f"    found:    {got}",
                  f"    problems: {'; '.join(p)}", f"    summary:  {f.get('summary', '').strip()}"]
    if n == 0:
        lines.append("(none)")
    lines.append("")
    return lines
