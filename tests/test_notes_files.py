"""Which Markdown files are the team's notes (forensics.notes.is_notes): never documentation copied into a run."""

from __future__ import annotations

import json
from pathlib import Path

from forensics.api import load
from forensics.notes import read_notes

_NOTE = "# attempts\n\n- lowered the lr to 1e-4: diverged again, same behaviour\n"


def _run(tmp: Path) -> Path:
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "loss": 3 - s * 0.01}) + "\n"
                                               for s in range(100)))
    return tmp


def test_notes_files_are_read(tmp_path: Path) -> None:
    """``notes.md`` and a dated logbook entry are notes: the failed remedy is found."""
    run = _run(tmp_path / "a")
    (run / "notes.md").write_text(_NOTE)
    (run / "logbook").mkdir()
    (run / "logbook" / "2022-01-05.md").write_text(_NOTE)
    assert "lower_lr" in read_notes(load(run))[0]


def test_a_code_snapshot_readme_or_changelog_is_not_notes(tmp_path: Path) -> None:
    """A README copied in with the code, a changelog and ``docs/`` are not read as the team's attempts.

    (At the top level or under ``code_snapshot/``, however many remedy words they hold.)
    """
    run = _run(tmp_path / "b")
    for rel in ("README.md", "code_snapshot/README.md", "CHANGELOG.md", "docs/" + "tuning.md", "src/notes.md"):
        (run / rel).parent.mkdir(parents=True, exist_ok=True)
        (run / rel).write_text(_NOTE)
    assert read_notes(load(run)) == ({}, {})
