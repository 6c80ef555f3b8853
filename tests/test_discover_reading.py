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


def test_forensics_toml_aliases_ignore_step_key(tmp_path):
    """A forensics.toml above the run folder: aliases map the objective, ignore drops files, step_key picks."""
    run_dir = tmp_path / "runs" / "a"
    run_dir.mkdir(parents=True)
    (tmp_path / "runs" / "forensics.toml").write_text(
        'aliases = { loss = "objective" }\nstep_key = "tick"\nignore = ["old/*"]\n')
    (run_dir / "metrics.csv").write_text("step,tick,objective\n" + "".join(f"0,{i},{1 / (i + 1)}\n" for i in range(30)))
    (run_dir / "old").mkdir()
    (run_dir / "old" / "train.log").write_text("step 1 loss 9\n")
    run = load(run_dir)
    assert run.meta["objective"]["tags"] == ["objective"]
    assert sorted(run.metrics.filter(pl.col("metric") == "loss")["step"].to_list()) == list(range(30))
    assert ("old/train.log", "ignored (forensics.toml: ignore)") in [(s.what, s.reason) for s in run.skipped]
    assert run.meta["user_config"]["path"].endswith("forensics.toml")


def test_pyproject_tool_table_and_bad_toml(tmp_path):
    """``[tool.forensics]`` in a pyproject.toml is read; a broken forensics.toml is an input error naming it."""
    from forensics.errors import InputError

    (tmp_path / "pyproject.toml").write_text('[tool.forensics]\naliases = { loss = "objective" }\n')
    (tmp_path / "log.txt").write_text("".join(f"step {i} | objective {1 / (i + 1):.3f}\n" for i in range(40)))
    assert load(tmp_path).meta["objective"]["tags"] == ["objective"]
    (tmp_path / "forensics.toml").write_text("aliases = [")
    with pytest.raises(InputError, match="forensics.toml"):
        load(tmp_path)


def test_cli_json_error_object_and_inconclusive_exit(tmp_path):
    """``-f json`` prints one object on an input error (exit 2); an inconclusive verdict exits 3; ``--metric``."""
    import json

    from click.testing import CliRunner

    from forensics.cli import EXIT_INCONCLUSIVE, main

    r = CliRunner().invoke(main, ["analyze", str(tmp_path / "missing"), "-f", "json"])
    obj = json.loads(r.stdout)
    assert r.exit_code == 2 and set(obj) == {"schema_version", "error"}
    assert obj["error"]["kind"] == "input" and obj["error"]["path"].endswith("missing")
    (tmp_path / "log.txt").write_text("".join(f"step {i} | acc {i / 100:.2f}\n" for i in range(60)))
    r = CliRunner().invoke(main, ["analyze", str(tmp_path), "-f", "json"])
    assert r.exit_code == EXIT_INCONCLUSIVE and json.loads(r.stdout)["verdict"] == "inconclusive"
    r = CliRunner().invoke(main, ["analyze", str(tmp_path), "-f", "text"])  # the text says what to do too
    assert "what:" in r.stdout and "--metric loss=acc" in r.stdout.split("what:")[1].splitlines()[0]
    r = CliRunner().invoke(main, ["analyze", str(tmp_path), "-f", "json", "--metric", "loss=acc"])
    assert json.loads(r.stdout)["verdict"] != "inconclusive"
    r = CliRunner().invoke(main, ["analyze", str(tmp_path), "-f", "json", "--metric", "loss"])
    assert r.exit_code == 2 and json.loads(r.stdout)["error"]["kind"] == "usage"
    r = CliRunner().invoke(main, ["ingest", str(tmp_path), "-o", str(tmp_path / "out"), "--explain"])
    assert r.exit_code == 0 and "log.txt: read by textlog" in r.stdout and "objective: none found" in r.stdout


def test_running_total_counter_becomes_per_step(tmp_path):
    """``skipped: K`` printed as a running total is read as the per-step count, with why."""
    lines = [f"step {i} | loss {2 - i / 100:.3f} | skipped {i // 10}" for i in range(40)]
    (tmp_path / "train.log").write_text("\n".join(lines) + "\n")
    run = load(tmp_path)
    s = run.series("skipped_step")
    assert s is not None and s.values.sum() == 3 and set(s.values.tolist()) == {0.0, 1.0}
    assert "running total" in run.meta["names"]["skipped"]["why"]


def test_megatron_skipped_iterations_are_per_log_interval(tmp_path):
    """Megatron resets ``number of skipped iterations`` after every line: 1 on each of 31 lines is 31 skips."""
    lines = [f" iteration {i:8d}/ 100 | lm loss: {2 - i / 100:.6E} | loss scale: {2.0 ** (16 - max(0, i - 69)):.1f} "
             f"| number of skipped iterations: {1 if i >= 70 else 0:3d} | number of nan iterations:   0 |"
             for i in range(1, 101)]
    (tmp_path / "stdout.log").write_text("\n".join(lines) + "\n")
    run = load(tmp_path)
    s = run.series("skipped_step")
    assert s is not None and s.values.sum() == 31, s.values
    assert "running total" not in str(run.meta["names"].get("number of skipped iterations", ""))


def test_forensics_toml_is_read_under_the_file_policy(tmp_path):
    """A forensics.toml that is a link into /proc (endless, or the environment) is an input error, never read."""
    import os

    from forensics.errors import InputError
    from forensics.userconfig import find

    run = tmp_path / "run"
    run.mkdir()
    os.symlink("/proc/self/environ", run / "forensics.toml")
    with pytest.raises(InputError, match="not read"):
        find(run)
    (run / "forensics.toml").unlink()
    os.mkfifo(run / "forensics.toml")  # a FIFO is not a settings file: passed over, never opened
    assert find(run).path is None

