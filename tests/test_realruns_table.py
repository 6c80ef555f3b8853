"""benchmarks/realruns_table.py: run discovery, labels, per-framework counts, and one real subprocess run."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("realruns_table", ROOT / "benchmarks" / "realruns_table.py")
rt = importlib.util.module_from_spec(_spec)
sys.modules["realruns_table"] = rt
_spec.loader.exec_module(rt)


def _mk(p: Path) -> Path:
    p.mkdir(parents=True)
    (p / "log.txt").write_text("x\n")
    return p


def test_discover_both_layouts_and_labels(tmp_path: Path) -> None:
    """framework/run roots and split/framework/run roots are found, labels matched by relative path."""
    flat = tmp_path / "realruns"
    _mk(flat / "fw_a" / "r1")
    _mk(flat / "fw_a" / "r2")
    (flat / "labels.json").write_text(json.dumps({"fw_a/r1": {"verdict": "healthy", "objective": "loss"}}))
    split = tmp_path / "corpus"
    _mk(split / "tune" / "fw_b" / "r3")
    _mk(split / "holdout" / "fw_c" / "r4")
    (split / "tools").mkdir()
    (split / "labels.json").write_text(json.dumps({"holdout/fw_c/r4": {"verdict": "anomaly", "objective": None}}))
    runs = rt.discover([flat, split, tmp_path / "missing"])
    got = {(r.corpus, r.split, r.framework, r.name, r.label, r.label_objective) for r in runs}
    assert got == {
        ("realruns", "-", "fw_a", "r1", "healthy", "loss"),
        ("realruns", "-", "fw_a", "r2", None, None),
        ("corpus", "tune", "fw_b", "r3", None, None),
        ("corpus", "holdout", "fw_c", "r4", "anomaly", None),
    }
    # a split folder given directly keeps its split and finds the labels one level up
    only = rt.discover([split / "holdout"])
    assert [(r.split, r.framework, r.label) for r in only] == [("holdout", "fw_c", "anomaly")]


def test_summary_counts() -> None:
    """Per-framework rows and totals: read, objective among labelled ones, healthy-labelled called anomaly."""
    def row(fw: str, **kw: object) -> rt.Row:
        r = rt.Row("c", "tune", fw, "r", "p", kw.pop("label", None), kw.pop("lab_obj", None))
        for k, v in kw.items():
            setattr(r, k, v)
        return r

    rows = [
        row("a", read=True, objective=True, verdict="healthy", label="healthy", lab_obj="loss"),
        row("a", read=True, objective=False, verdict="healthy"),
        row("a", read=True, objective=True, verdict="anomaly", label="healthy", lab_obj="loss"),
        row("b", read=False, verdict="error", lab_obj="loss"),
    ]
    table = {r["framework"]: r for r in rt.summarize(rows)}
    a = table["a"]
    assert (a["runs"], a["read"], a["objective"], a["lab.obj"], a["obj/lab.obj"]) == (3, 3, 2, 2, 2)
    assert (a["healthy"], a["anomaly"], a["lab.healthy"], a["h->anomaly"], a["healthy w/o loss"]) == (2, 1, 2, 1, 1)
    total = table["all (2 frameworks)"]
    assert (total["runs"], total["read"], total["error"], total["lab.obj"], total["obj/lab.obj"]) == (4, 3, 1, 3, 2)
    md = rt.render(rt.summarize(rows), rt.COLS, markdown=True)
    assert md.splitlines()[0].startswith("| corpus | split | framework | runs | read | objective |")


def test_measure_one_run_in_a_subprocess(tmp_path: Path) -> None:
    """A small JSONL run through `forensics analyze` and `forensics ingest`: read, loss found, verdict given."""
    run = tmp_path / "real" / "jsonl" / "smoke"
    run.mkdir(parents=True)
    lines = [{"step": s, "train_loss": 4.0 / (1 + 0.01 * s), "lr": 1e-3} for s in range(0, 400, 10)]
    (run / "train_log.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    (r,) = rt.discover([tmp_path / "real"])
    row = rt.measure(r, timeout=120, ingest=True)
    assert row.exit in (0, 1), row.error
    assert row.read and row.records > 0
    assert row.objective and "loss" in row.metrics
    assert row.verdict in rt.VERDICTS[:4]
