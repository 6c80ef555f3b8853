"""Runs as people lay them out: launches in separate stdout files, Git LFS pointers, interleaved ranks."""

from __future__ import annotations

import polars as pl
import pytest

from forensics.api import analyze, load
from parsers.discover import LFS_POINTER, load_run


def test_launch_files_whose_steps_continue_are_segments(tmp_path):
    """Two stdout files, the second continuing the steps of the first: two segments and a restart event."""
    (tmp_path / "train_0.log").write_text("".join(f"step {i} | loss {3 - i / 100:.3f}\n" for i in range(50)))
    (tmp_path / "train_1.log").write_text("".join(f"step {i} | loss {3 - i / 100:.3f}\n" for i in range(50, 90)))
    run = load_run(tmp_path)
    segs = dict(run.metrics.group_by("source").agg(pl.col("segment").first()).iter_rows())
    assert segs == {"train_0.log": 0, "train_1.log": 1}
    restart = run.events.filter(run.events["kind"] == "restart")
    assert restart["step"].to_list() == [50] and "train_1.log" in restart["message"][0]


def test_lfs_pointer_is_named(tmp_path):
    """A Git LFS pointer in place of an event file is listed as one, not as an unknown format."""
    (tmp_path / "events.out.tfevents.1.host").write_text(
        "version https://git-lfs.github.com/spec/v1\noid sha256:" + "a" * 64 + "\nsize 12345\n")
    (tmp_path / "train.log").write_text("".join(f"step {i} loss {1 / (i + 1):.3f}\n" for i in range(20)))
    run = load_run(tmp_path)
    assert [(s.what, s.reason) for s in run.skipped] == [("events.out.tfevents.1.host", LFS_POINTER)]


def test_no_objective_is_inconclusive(tmp_path):
    """A run whose series hold no loss is inconclusive (never healthy), and says how to map one."""
    (tmp_path / "log.txt").write_text("".join(f"step {i} | acc {i / 100:.2f} | lr 1e-4\n" for i in range(100)))
    a = analyze(tmp_path)
    assert a.verdict == "inconclusive" and a.meta["objective"] is None
    assert "--metric loss=" in a.summary


def test_user_mapping_names_the_objective(tmp_path):
    """``--metric loss=acc`` makes the named series the objective, with why."""
    (tmp_path / "log.txt").write_text("".join(f"step {i} | acc {i / 100:.2f} | lr 1e-4\n" for i in range(100)))
    run = load(tmp_path, {"loss": "acc"})
    assert run.meta["objective"]["metric"] == "loss" and run.meta["objective"]["tags"] == ["acc"]
    assert "user mapping" in run.meta["names"]["acc"]["why"]


@pytest.mark.parametrize(("cols", "objective"), [
    ({"epoch": [0, 1, 2], "train/box_loss": [0.1, 0.09, 0.08], "train/cls_loss": [0.0, 0.0, 0.0]}, "sum(box)"),
    ({"step": [1, 2, 3], "total_loss": [2.0, 1.5, 1.2]}, "total_loss"),
    ({"step": [1, 2, 3], "loss": [0.0, 0.0, 0.0], "val_loss": [2.0, 1.9, 1.8]}, "val_loss"),
])
def test_objective_by_rule(tmp_path, cols, objective):
    """Components summed (constant-zero left out), a total read directly, a zero loss demoted."""
    names = list(cols)
    rows = zip(*cols.values(), strict=True)
    (tmp_path / "results.csv").write_text(",".join(f"{n:>15}" for n in names) + "\n"
                                          + "".join(",".join(f"{v:>15}" for v in r) + "\n" for r in rows))
    run = load(tmp_path)
    assert run.meta["objective"]["tags"] == [objective]
