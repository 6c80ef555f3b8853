"""The detectors' thread pool (``forensics.engine.decide.POOL_ROWS``) decides exactly as one thread does.

Big runs (2M metric rows and more) run the facts and the detectors on a pool; these runs are small, so the
pool is forced on with ``POOL_ROWS = 0`` and the JSON report compared with the one-thread report of the same run.
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import pytest

from forensics import api
from forensics.detectors import DETECTORS
from forensics.detectors.base import Detector
from forensics.engine import decide as _decide  # noqa: F401 - imports forensics.engine.decide
from forensics.model import Finding, RunData
from reports.json_report import to_dict

ROOT = Path(__file__).resolve().parents[1]
DECIDE = sys.modules["forensics.engine.decide"]
BY_CODE = {d.code: d for d in DETECTORS}
SAMPLES = ["data_batch", "healthy", "lr_schedule_reset", "overflow", "update_scale_growth", "wandb_healthy",
           "ckpt_nonfinite_state", "corpus/databatch_s51_d32", "corpus/lrreset_s31_d48", "corpus/overflow_s41_d64"]


def _report(folder: Path) -> dict:
    report = to_dict(api.analyze_run(api.load(folder)))
    report["meta"].pop("seconds", None)
    return report


@pytest.mark.parametrize("name", SAMPLES)
def test_pool_gives_the_one_thread_report(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Verdict, cause, onset, findings (in order), hypotheses, recovery and skips equal, run by run."""
    folder = ROOT / "sample_logs" / name
    if not folder.is_dir():
        pytest.skip(f"{folder} is not in this checkout")
    one = _report(folder)
    monkeypatch.setattr(DECIDE, "POOL_ROWS", 0)
    monkeypatch.setattr(DECIDE, "POOL_THREADS", 4)
    monkeypatch.setattr(DECIDE.os, "sched_getaffinity", lambda _pid: {0, 1, 2, 3}, raising=False)
    assert _report(folder) == one


class _Crashing(Detector):
    code = "ZZ98"
    name = "test.crashing"
    requires = ("loss",)

    def detect(self, run: RunData) -> list[Finding]:
        raise ValueError("boom")


def test_pool_keeps_detector_order_and_crashes_as_skips(monkeypatch: pytest.MonkeyPatch) -> None:
    """On the pool too, a crashing detector is a Skip naming it, and findings keep the detectors' order."""
    run = api.load(ROOT / "sample_logs" / "data_batch")
    dets = (BY_CODE["SP01"], _Crashing(), BY_CODE["GN01"], BY_CODE["DB01"])
    want = DECIDE.run_detectors(run, dets)
    monkeypatch.setattr(DECIDE, "POOL_ROWS", 0)
    monkeypatch.setattr(DECIDE.os, "sched_getaffinity", lambda _pid: {0, 1}, raising=False)
    got = DECIDE.run_detectors(api.load(ROOT / "sample_logs" / "data_batch"), dets)
    assert [(f.code, f.step) for f in got[0]] == [(f.code, f.step) for f in want[0]]
    assert [s.what for s in got[1]] == ["ZZ98 test.crashing"]
    assert got[1] == want[1]


def test_cached_builds_once_under_threads() -> None:
    """``RunData.cached``: eight threads asking for one key at once get one object, built by one ``build()``."""
    run = api.load(ROOT / "sample_logs" / "healthy")
    calls: list[int] = []

    def build() -> object:
        calls.append(1)
        time.sleep(0.05)  # the others arrive while it is being built
        return object()

    got: list[object] = []
    threads = [threading.Thread(target=lambda: got.append(run.cached("__test__", build))) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1
    assert len({id(g) for g in got}) == 1 and len(got) == 8
