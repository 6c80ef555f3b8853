"""Run discovery on hostile folders: symlink loops, unreadable files, a folder of 20,000 files (issue 8)."""

from __future__ import annotations

import importlib
import os
import time
from pathlib import Path

from forensics.errors import ParseError
from parsers import PARSER_MODULES

# -- discovery: symlink loops, unreadable files, many files ---------------------------------------------


def test_symlink_loops_and_unreadable(tmp_path: Path) -> None:
    """Symlink loops and unreadable files: discovery finishes, parsers do not crash."""
    from parsers.discover import load_run

    run = tmp_path / "run"
    (run / "sub").mkdir(parents=True)
    (run / "metrics.jsonl").write_text('{"step": 1, "loss": 2.0}\n{"step": 2, "loss": 1.0}\n')
    os.symlink(run, run / "sub" / "loop")
    os.symlink("self.log", run / "self.log")  # a link to itself (ELOOP)
    os.symlink("b.log", run / "a.log")
    os.symlink("a.log", run / "b.log")
    locked = run / "locked.log"
    locked.write_text("step 1 | loss 2.0\n")
    locked.chmod(0)
    try:
        rd = load_run(run)
    finally:
        locked.chmod(0o644)
    assert rd.metrics.height >= 2
    if os.geteuid() != 0:  # root reads anything
        assert any(s.what == "locked.log" for s in rd.skipped)
    for mod_name in PARSER_MODULES:  # reading a looping link: ParseError or OSError-free skip, never a crash
        mod = importlib.import_module(mod_name)
        assert mod.sniff(run / "self.log") in (True, False)
        try:
            mod.read(run / "self.log", run)
        except ParseError:
            pass


def test_twenty_thousand_files(tmp_path: Path) -> None:
    """Discovery over 20,000 files finishes quickly."""
    from parsers.discover import discover

    run = tmp_path / "run"
    for d in range(20):
        sub = run / f"shard_{d}"
        sub.mkdir(parents=True)
        for i in range(1000):
            (sub / f"sample_{i}.bin").write_bytes(b"x")
    (run / "shard_0" / "metrics.jsonl").write_text('{"step": 1, "loss": 2.0}\n')
    t0 = time.perf_counter()
    claims, _ = discover(run)
    seconds = time.perf_counter() - t0
    assert [p.name for p, _ in claims] == ["metrics.jsonl"]
    assert seconds < 20, seconds


