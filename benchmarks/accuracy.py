"""Diagnosis accuracy over the labelled corpus and the acceptance cases.

Runs :func:`forensics.api.analyze` on every run of ``sample_logs/corpus`` (labels from
``sample_logs/corpus_labels.json``, written by ``sample_logs/make_corpus.py``) and on every case folder
of ``../shared/cases`` (or ``$FORENSICS_CASES``; labels from each ``expected.json``), then prints, for the
corpus, the cases and both together:

- cause accuracy (the found cause is the labelled one, or one of the case's ``acceptable_causes``;
  a healthy run counts as right when the verdict is ``healthy``),
- mechanism accuracy (over items with a labelled mechanism; acceptable alternatives count),
- onset-inside-window rate (over items with an onset window),
- false-alarm rate on healthy items (any verdict other than ``healthy``),
- verdict accuracy, and for cases the ``must_not`` and recovery checks of ``tests/test_cases.py``,

then the same per true cause, a confusion table (true cause x found cause) and the list of misses with
the expected and found diagnosis and the analyzer's summary line.

Usage::

    python benchmarks/accuracy.py [--corpus-only | --cases-only] [--labels PATH] [--cases DIR]

The exit status is always 0: this is a measurement, not a gate.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

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
        item.found = {
            "verdict": a.verdict, "cause": a.cause, "mechanism": a.mechanism, "confidence": a.confidence,
            "onset": a.onset["step"] if a.onset else None, "summary": a.summary,
            "hypotheses": [(h.cause, h.confidence) for h in a.hypotheses],
            "actions": a.recovery.actions_text() if a.recovery else "",
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


def _analyse_one(item: Item) -> dict[str, Any]:
    run_analysis(item)
    return item.found


def run_all(items: list[Item], jobs: int) -> None:
    """Analyse ``items`` with ``jobs`` worker processes (1: in this process)."""
    if jobs <= 1 or len(items) < 4:
        for item in items:
            run_analysis(item)
        return
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    # spawn, not fork: a forked child of a process whose polars/numba thread pools are running can deadlock
    with ProcessPoolExecutor(max_workers=jobs, mp_context=mp.get_context("spawn")) as pool:
        for item, found in zip(items, pool.map(_analyse_one, items, chunksize=4), strict=True):
            item.found = found


def _pct(values: list[bool | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return 100.0 * sum(vals) / len(vals) if vals else None


def _cell(values: list[bool | None]) -> str:
    vals = [v for v in values if v is not None]
    if not vals:
        return f"{'-':>12}"
    return f"{sum(vals):>4}/{len(vals):<4}{100 * sum(vals) / len(vals):3.0f}%"


def split_figures(items: list[Item]) -> dict[str, dict[str, float | None]]:
    """Cause accuracy, onset-in-window and false-alarm rates (percent) per split, over ``items``."""
    out: dict[str, dict[str, float | None]] = {}
    for split in ("tuning", "validation"):
        g = [i for i in items if i.split == split]
        out[split] = {"n": float(len(g)), "cause": _pct([i.cause_ok() for i in g]),
                      "onset": _pct([i.onset_ok() for i in g]), "false_alarm": _pct([i.false_alarm() for i in g]),
                      "ece": expected_calibration_error(g)}
    return out


def split_table(items: list[Item], by: str = "cause") -> list[str]:
    """Tuning and validation side by side, per true cause (or per injected kind), with the gap."""
    key = (lambda i: i.true_cause) if by == "cause" else (lambda i: i.fault_kind)
    lines = [f"== varied corpus: tuning vs validation, per {by}", ""]
    head = (f"{by:<24}" + "".join(f"{'tun. ' + m:>14}{'val. ' + m:>14}{'gap':>6}"
                                   for m in ("cause", "onset", "f.alarm")))
    lines += [head, "-" * len(head)]

    def row(name: str, group: list[Item]) -> str:
        t = [i for i in group if i.split == "tuning"]
        v = [i for i in group if i.split == "validation"]
        cells = ""
        for f in (Item.cause_ok, Item.onset_ok, Item.false_alarm):
            a, b = [f(i) for i in t], [f(i) for i in v]
            pa, pb = _pct(a), _pct(b)
            gap = f"{pa - pb:+5.0f}" if pa is not None and pb is not None else f"{'':>5}"
            cells += f"{_cell(a):>14}{_cell(b):>14}{gap:>6}"
        return f"{name:<24}{cells}"

    for k in sorted({key(i) for i in items}):
        lines.append(row(k, [i for i in items if key(i) == k]))
    lines += ["-" * len(head), row("ALL", items), ""]
    return lines


def _conf_right(item: Item) -> tuple[float, bool] | None:
    """(stated confidence in the top answer, whether the top answer is right)."""
    if "error" in item.found:
        return None
    return float(item.found["confidence"]), item.cause_ok()


def expected_calibration_error(items: list[Item], bins: int = 10) -> float | None:
    """ECE: sum over equal-width confidence bins of (bin share) x |accuracy - mean confidence|."""
    pts = [p for p in (_conf_right(i) for i in items) if p is not None]
    if not pts:
        return None
    total = 0.0
    for b in range(bins):
        lo, hi = b / bins, (b + 1) / bins
        grp = [(c, r) for c, r in pts if (lo <= c < hi) or (b == bins - 1 and c == 1.0)]
        if grp:
            acc = sum(r for _, r in grp) / len(grp)
            conf = sum(c for c, _ in grp) / len(grp)
            total += len(grp) / len(pts) * abs(acc - conf)
    return total


def reliability(items: list[Item], title: str, bins: int = 10) -> list[str]:
    """Reliability table (confidence bin: n, mean confidence, accuracy) and the ECE."""
    pts = [p for p in (_conf_right(i) for i in items) if p is not None]
    lines = [f"== reliability: {title} ({len(pts)} items)", "",
             f"{'confidence':<12}{'n':>5}{'mean conf':>11}{'right':>8}"]
    for b in range(bins):
        lo, hi = b / bins, (b + 1) / bins
        grp = [(c, r) for c, r in pts if (lo <= c < hi) or (b == bins - 1 and c == 1.0)]
        if grp:
            lines.append(f"[{lo:.1f}, {hi:.1f}){'':<2}{len(grp):>5}{sum(c for c, _ in grp) / len(grp):>11.2f}"
                         f"{sum(r for _, r in grp) / len(grp):>8.2f}")
    ece = expected_calibration_error(items, bins)
    lines += [f"expected calibration error: {ece:.3f}" if ece is not None else "expected calibration error: -", ""]
    return lines


# ----------------------------------------------------------------------------------------- printing


def _rate(values: list[bool | None]) -> str:
    vals = [v for v in values if v is not None]
    if not vals:
        return "    -    "
    return f"{sum(vals):>2}/{len(vals):<2} {100 * sum(vals) / len(vals):5.1f}%"


def summary_table(title: str, items: list[Item]) -> list[str]:
    """Overall and per-cause rates for ``items``."""
    lines = [f"== {title}: {len(items)} items", ""]
    head = f"{'true cause':<26}{'n':>3}  {'cause':<13}{'mechanism':<13}{'onset in win':<13}" \
           f"{'verdict':<13}{'false alarm':<13}"
    lines += [head, "-" * len(head)]

    def row(name: str, group: list[Item]) -> str:
        return (f"{name:<26}{len(group):>3}  {_rate([i.cause_ok() for i in group]):<13}"
                f"{_rate([i.mechanism_ok() for i in group]):<13}{_rate([i.onset_ok() for i in group]):<13}"
                f"{_rate([i.verdict_ok() for i in group]):<13}{_rate([i.false_alarm() for i in group]):<13}")

    for cause in sorted({i.true_cause for i in items}):
        lines.append(row(cause, [i for i in items if i.true_cause == cause]))
    lines += ["-" * len(head), row("ALL", items), ""]
    return lines


def confusion(items: list[Item]) -> list[str]:
    """True cause (rows) x found cause (columns)."""
    rows = sorted({i.true_cause for i in items})
    cols = sorted({i.found_cause for i in items} | set(rows))
    short = {c: c[:10] for c in cols}
    w = max(len(r) for r in rows) + 2
    lines = ["== confusion: true cause (rows) x found cause (columns)", ""]
    lines.append(" " * w + "".join(f"{short[c]:>11}" for c in cols))
    for r in rows:
        counts = [sum(1 for i in items if i.true_cause == r and i.found_cause == c) for c in cols]
        lines.append(f"{r:<{w}}" + "".join(f"{(n if n else '.'):>11}" for n in counts))
    lines.append("")
    return lines


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


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point; always returns 0."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--labels", type=Path, default=ROOT / "sample_logs" / "corpus_labels.json")
    p.add_argument("--cases", type=Path,
                   default=Path(os.environ.get("FORENSICS_CASES") or ROOT.parent / "shared" / "cases"))
    p.add_argument("--varied", type=Path, default=Path(os.environ.get("FORENSICS_VARIED_CORPUS", "/work/corpus15")),
                   help="a corpus written by sample_logs/make_varied_corpus.py (labels.json inside)")
    p.add_argument("--varied-only", action="store_true", help="only the varied corpus (tuning vs validation)")
    p.add_argument("--split", choices=("tuning", "validation"), help="only this part of the varied corpus")
    p.add_argument("--jobs", type=int, default=1, help="analyses run in parallel")
    p.add_argument("--dump", type=Path, help="write every varied item's label and finding to this JSON file")
    p.add_argument("--from-dump", type=Path,
                   help="read the findings from a --dump file instead of analysing (a raw dump is calibrated with "
                   "forensics/calibration.json unless FORENSICS_RAW_CONFIDENCE is set)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--corpus-only", action="store_true")
    g.add_argument("--cases-only", action="store_true")
    args = p.parse_args(argv)
    try:
        varied = [] if args.corpus_only or args.cases_only else varied_items(args.varied)
        if args.split:
            varied = [i for i in varied if i.split == args.split]
        if args.varied_only:
            if args.from_dump:
                from forensics.calibration import calibrate

                by = {r["run"]: r for r in json.loads(args.from_dump.read_text())}
                varied = [i for i in varied if i.name in by]
                for i in varied:
                    i.found = dict(by[i.name]["found"])
                    if by[i.name].get("raw") and "error" not in i.found:
                        i.found["confidence"] = calibrate(i.found["confidence"], i.found["verdict"], i.found["cause"])
            else:
                run_all(varied, args.jobs)
            out = [f"varied corpus {args.varied}: {len(varied)} runs"
                   + (" (raw, uncalibrated confidence)" if os.environ.get("FORENSICS_RAW_CONFIDENCE") else ""), ""]
            out += split_table(varied) + split_table(varied, by="kind")
            for part in ("tuning", "validation"):
                out += reliability([i for i in varied if i.split == part], f"varied corpus, {part}")
            out += misses(varied)
            print("\n".join(out))
            if args.dump:
                args.dump.write_text(json.dumps([{"run": i.name, "split": i.split, "kind": i.fault_kind,
                                                  "cause": i.cause, "window": i.window, "found": i.found,
                                                  "right": i.cause_ok(), "onset_ok": i.onset_ok(),
                                                  "raw": bool(os.environ.get("FORENSICS_RAW_CONFIDENCE"))}
                                                 for i in varied], indent=1, default=str))
            return 0
        corpus = [] if args.cases_only else corpus_items(args.labels)
        cases = [] if args.corpus_only else case_items(args.cases)
        if not corpus and not args.cases_only:
            print(f"no corpus labels at {args.labels} (run sample_logs/make_corpus.py)")
        if not cases and not args.corpus_only:
            print(f"no cases under {args.cases}")
        t0 = time.perf_counter()
        for item in corpus + cases:
            run_analysis(item)
        elapsed = time.perf_counter() - t0
        out: list[str] = []
        if corpus:
            out += summary_table("labelled corpus (sample_logs/corpus)", corpus)
        if cases:
            out += summary_table(f"cases ({args.cases})", cases)
            right = sum(1 for i in cases if not i.problems())
            out += [f"cases fully right (verdict, cause, mechanism, onset, must_not, recovery): "
                    f"{right}/{len(cases)}", ""]
        if corpus and cases:
            out += summary_table("corpus + cases", corpus + cases)
        everything = corpus + cases
        if everything:
            out += confusion(everything)
            out += misses(everything)
            slow = max(everything, key=lambda i: i.found["seconds"])
            out.append(f"{len(everything)} analyses in {elapsed:.1f} s "
                       f"(slowest {slow.name}: {slow.found['seconds']:.1f} s)")
        print("\n".join(out))
    except Exception:  # noqa: BLE001 - a measurement script reports, it never fails the caller
        traceback.print_exc()
    return 0


if __name__ == "__main__":
    sys.exit(main())
