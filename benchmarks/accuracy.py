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
import os
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.accuracy_items import (  # noqa: E402,F401 - re-exported for tests/test_varied_corpus.py
    HEALTHY,
    Item,
    case_items,
    corpus_items,
    misses,
    run_analysis,
    varied_items,
)
from benchmarks.accuracy_varied import (  # noqa: E402,F401
    expected_calibration_error,
    reliability,
    run_all,
    split_figures,
    split_table,
    varied_main,
)

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
            print(varied_main(varied, args))
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
