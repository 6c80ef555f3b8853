"""The varied corpus's figures: tuning vs validation per cause and kind, the reliability table and the ECE."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from benchmarks.accuracy_items import Item, run_analysis


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


def final_confidence(found: dict[str, Any]) -> float:
    """The confidence a RAW dump's item gets with today's calibration.json, coverage cap and healthy factor.

    A raw dump holds the engine's raw score, already multiplied by api.py's coverage factor when healthy.
    """
    from forensics.calibration import calibrate

    cov = found.get("coverage") or {}
    factor = float(cov.get("factor", 1.0)) if found["verdict"] == "healthy" else 1.0
    raw = float(found["confidence"]) / (factor or 1.0)
    share = {"share_evaluated": cov["share_evaluated"], "cap": cov["cap"]} if "cap" in cov else None
    return calibrate(raw, found["verdict"], found["cause"], share) * factor


def varied_main(varied: list[Item], args: Any) -> str:
    """The varied-corpus report (``accuracy.py --varied-only``); writes ``--dump`` when asked."""
    from benchmarks.accuracy_items import misses

    if args.from_dump:
        by = {r["run"]: r for r in json.loads(args.from_dump.read_text())}
        varied[:] = [i for i in varied if i.name in by]
        for i in varied:
            i.found = dict(by[i.name]["found"])
            if by[i.name].get("raw") and "error" not in i.found:
                i.found["confidence"] = final_confidence(i.found)
    else:
        run_all(varied, args.jobs)
    out = [f"varied corpus {args.varied}: {len(varied)} runs"
           + (" (raw, uncalibrated confidence)" if os.environ.get("FORENSICS_RAW_CONFIDENCE") else ""), ""]
    out += split_table(varied) + split_table(varied, by="kind")
    for part in ("tuning", "validation"):
        out += reliability([i for i in varied if i.split == part], f"varied corpus, {part}")
    out += misses(varied)
    if args.dump:
        Path(args.dump).write_text(json.dumps([{"run": i.name, "split": i.split, "kind": i.fault_kind,
                                                "cause": i.cause, "window": i.window, "found": i.found,
                                                "right": i.cause_ok(), "onset_ok": i.onset_ok(),
                                                "raw": bool(os.environ.get("FORENSICS_RAW_CONFIDENCE"))}
                                               for i in varied], indent=1, default=str))
    return "\n".join(out)

