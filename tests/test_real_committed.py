"""The real published runs committed in ``tests/data/real/`` are read, their objective found, verdicts honest.

Each folder ``tests/data/real/<framework>/<run>/`` is one run copied byte for byte from a public repository
whose licence allows redistribution; ``README.md`` beside them gives each file's repository, commit, path,
licence, size and sha256, and ``labels.json`` what the source says (``verdict``: healthy / anomaly / unknown;
``objective``: the objective's name in the files or ``null``; ``objective_raw``: the raw names the reader's
objective must take). Per run:

- it is read without a traceback (a run with no training loss may be refused with a one-line
  :class:`~forensics.errors.InputError` naming the path);
- where the label names an objective, the reader's objective (``meta["objective"]``) is ``loss`` and takes the
  raw names: the name itself, a statistic of it (``Loss/loss/mean``) or, for a sum of parts, each part;
- a run labelled healthy never gets ``anomaly``; ``healthy`` is never given without an objective.

A run the reader fails today is marked ``xfail(strict=True)`` in ``XFAIL`` with the reason.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import pytest

from forensics.api import analyze_run, load
from forensics.errors import InputError
from forensics.model import RunData, Verdict

REAL = Path(__file__).parent / "data" / "real"
LABELS: dict[str, dict] = json.loads((REAL / "labels.json").read_text())
LIMIT_BYTES = 20 * 10**6  # the "under 20 MB"

# "<framework>/<run>" -> why today's code fails it (strict: a fix turns it into an unexpected pass)
XFAIL: dict[str, str] = {}  # none today (record_naive_baseline was, until NCCL start-up warnings stopped being errors)

_ROW = re.compile(r"^\| (?P<fw>[^|]+?) \| `(?P<run>[^`]+)` \| `(?P<file>[^`]+)` \| .*? \| (?P<bytes>\d+) \| "
                  r"`(?P<sha>[0-9a-f]{64})` \|")


def _readme_rows() -> dict[str, tuple[int, str]]:
    """``{"<framework>/<run>/<file>": (bytes, sha256)}`` from the README's files table."""
    rows = {}
    for line in (REAL / "README.md").read_text().splitlines():
        m = _ROW.match(line)
        if m:
            rows[f"{m['fw']}/{m['run']}/{m['file']}"] = (int(m["bytes"]), m["sha"])
    return rows


def _run_files() -> list[Path]:
    """Every file inside a run folder (``<framework>/<run>/...``), not the README, labels or licences."""
    return sorted(p for p in REAL.glob("*/*/**/*") if p.is_file() and p.relative_to(REAL).parts[0] != "LICENSES")


def test_files_are_byte_for_byte_with_provenance() -> None:
    """Each run file has a README row whose size and sha256 it matches, and each row has its file."""
    rows = _readme_rows()
    assert len(rows) >= 20, "the README's files table was not parsed"
    files = {p.relative_to(REAL).as_posix(): p for p in _run_files()}
    assert sorted(files) == sorted(rows), "files on disk and README rows differ"
    for rel, (size, sha) in rows.items():
        data = files[rel].read_bytes()
        assert len(data) == size, f"{rel}: {len(data)} bytes, README says {size}"
        assert hashlib.sha256(data).hexdigest() == sha, f"{rel}: sha256 differs from the README (not byte for byte)"


def test_folder_is_small_and_every_run_labelled_and_licensed() -> None:
    """Under 20 MB in all; each run folder has a label and its repository's licence text."""
    total = sum(p.stat().st_size for p in REAL.rglob("*") if p.is_file())
    assert total < LIMIT_BYTES, f"{REAL} holds {total} bytes (limit 20 MB)"
    runs = sorted({"/".join(p.relative_to(REAL).parts[:2]) for p in _run_files()})
    assert runs == sorted(LABELS), "run folders and labels.json differ"
    for key, lab in LABELS.items():
        assert lab["license"] in ("MIT", "BSD", "Apache-2.0"), f"{key}: licence {lab['license']}"
        text = REAL / "LICENSES" / (lab["repo"].replace("/", "__") + ".txt")
        assert text.is_file() and text.stat().st_size > 500, f"{key}: no licence text {text.name}"


def _takes(run: RunData, raw: str) -> bool:
    """Whether the objective takes the raw name: itself, a statistic of it, or a part of a summed objective."""
    tags = run.meta["objective"]["tags"]
    if any(t == raw or t.startswith(raw + "/") for t in tags):
        return True
    metric = (run.meta.get("names") or {}).get(raw, {}).get("metric", "")
    if not metric.startswith("loss/"):
        return False
    part = metric.removeprefix("loss/")
    terms = {x.strip() for t in tags if t.startswith("sum(") for x in t[4:-1].split("+")}
    return part in terms


def _params() -> list:
    return [pytest.param(key, marks=[pytest.mark.xfail(strict=True, reason=XFAIL[key])] if key in XFAIL else [],
                         id=key) for key in sorted(LABELS)]


@pytest.mark.parametrize("key", _params())
def test_committed_run(key: str) -> None:
    """Read without a traceback, objective found where the label names one, verdict never stronger than it."""
    lab = LABELS[key]
    path = REAL / key
    try:
        run = load(path)
    except InputError as e:
        assert lab["objective"] is None, f"{key} not read: {e}"
        assert str(path) in str(e) and "\n" not in str(e), f"{key}: the error must be one line naming the path"
        return
    assert run.metrics.height > 0, f"{key}: no metric record read"
    objective = run.meta.get("objective")
    if lab["objective"] is not None:
        assert objective is not None, f"{key}: no objective among {sorted(run.metric_names)[:20]}"
        assert objective["metric"] == "loss", f"{key}: objective {objective}"
        missing = [r for r in lab["objective_raw"] if not _takes(run, r)]
        assert not missing, f"{key}: the objective {objective['tags']} does not take {missing}"
    verdict = analyze_run(run).verdict
    if lab["verdict"] == Verdict.HEALTHY:
        assert verdict != Verdict.ANOMALY, f"{key}: labelled healthy by its source, called anomaly"
    if verdict == Verdict.HEALTHY:
        assert objective is not None, f"{key}: healthy without an objective"
