"""``analyze`` of a folder that holds several runs names them and suggests ``audit`` (forensics.several_runs)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from forensics.api import load
from forensics.cli import main
from forensics.several_runs import separate_runs

SHARED = Path(__file__).resolve().parents[2] / "shared" / "realruns"


def _jsonl(path: Path, steps: range, slope: float = 0.01) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"step": s, "loss": 3.0 - s * slope}) + "\n" for s in steps))


def test_two_runs_from_step_zero_are_named(tmp_path: Path) -> None:
    """Two sweep points from step 0: both named on stderr, the report still written."""
    _jsonl(tmp_path / "lr1e-3" / "metrics.jsonl", range(100))
    _jsonl(tmp_path / "lr3e-3" / "metrics.jsonl", range(100), slope=0.02)
    assert separate_runs(tmp_path, load(tmp_path)) == ["lr1e-3", "lr3e-3"]
    res = CliRunner().invoke(main, ["analyze", str(tmp_path), "-f", "json", "-o", str(tmp_path / "r.json")])
    assert "holds 2 run folders that each start at the same step (lr1e-3, lr3e-3)" in res.stderr
    assert "forensics audit" in res.stderr
    assert json.loads((tmp_path / "r.json").read_text())["run"]  # the analysis itself is unchanged


def test_a_resume_in_a_new_folder_is_no_separate_run(tmp_path: Path) -> None:
    """A relaunch that continues from a checkpoint is a segment: no note."""
    _jsonl(tmp_path / "launch1" / "metrics.jsonl", range(100))
    _jsonl(tmp_path / "launch2" / "metrics.jsonl", range(80, 200))  # resumed from the step-80 checkpoint
    assert separate_runs(tmp_path, load(tmp_path)) == []
    res = CliRunner().invoke(main, ["analyze", str(tmp_path), "-f", "json", "-o", str(tmp_path / "r.json")])
    assert "run folders" not in res.stderr


def test_one_run_gives_nothing(tmp_path: Path) -> None:
    """A folder that is one run: no note."""
    _jsonl(tmp_path / "metrics.jsonl", range(100))
    assert separate_runs(tmp_path, load(tmp_path)) == []


def test_control_characters_in_folder_names_do_not_reach_the_terminal(tmp_path: Path) -> None:
    """Folder names are shown terminal-safe."""
    _jsonl(tmp_path / "a\x1b[2Jb" / "metrics.jsonl", range(50))
    _jsonl(tmp_path / "c" / "metrics.jsonl", range(50))
    res = CliRunner().invoke(main, ["analyze", str(tmp_path), "-f", "json", "-o", str(tmp_path / "r.json")])
    assert "run folders" in res.stderr and "\x1b" not in res.stderr


@pytest.mark.skipif(not (SHARED / "detectron2").is_dir(), reason="../shared/realruns/detectron2 absent")
def test_a_real_folder_of_records_is_named() -> None:
    """detectron2: two published training runs (balloon, medical_waste) in one folder."""
    folders = separate_runs(SHARED / "detectron2", load(SHARED / "detectron2"))
    assert len(folders) >= 2 and all((SHARED / "detectron2" / f).is_dir() for f in folders)
