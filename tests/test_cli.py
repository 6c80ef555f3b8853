"""The command line: exit codes, one-line errors, payload on stdout, summary on stderr."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from forensics.cli import main

SAMPLES = Path(__file__).resolve().parents[1] / "sample_logs"


def _run(*args: str):  # noqa: ANN202
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


@pytest.mark.parametrize("kind", ["missing", "empty", "nologs", "file"])
def test_bad_input_exits_2_with_one_line(tmp_path: Path, kind: str) -> None:
    """A missing path, an empty folder, a folder without logs and a file all exit 2 naming the path."""
    target = tmp_path / "run"
    if kind == "empty":
        target.mkdir()
    elif kind == "nologs":
        target.mkdir()
        (target / "notes.md").write_text("nothing here\n")
        (target / "model.py").write_text("print(1)\n")
    elif kind == "file":
        target.write_text("hello\n")
    res = _run("analyze", str(target), "-f", "json")
    assert res.exit_code == 2
    err = res.stderr.strip().splitlines()
    assert len(err) == 1, err
    assert str(target) in err[0]
    assert "Traceback" not in res.output


def test_detectors_lists_registry() -> None:
    """`forensics detectors` names every detector code."""
    from forensics.detectors import DETECTORS

    res = _run("detectors")
    assert res.exit_code == 0
    for d in DETECTORS:
        assert d.code in res.output


def test_detectors_lists_every_default_and_requirement() -> None:
    """Each detector's line names every typed field with its default and what the detector needs (issue 14)."""
    import dataclasses

    from forensics.detectors import DETECTORS

    res = _run("detectors")
    lines = {line.split()[0]: line for line in res.output.splitlines() if line.strip()}
    for d in DETECTORS:
        line = lines[d.code]
        for f in dataclasses.fields(d):
            assert f"{f.name}={getattr(d, f.name)!r}" in line, (d.code, f.name)
        req = line.split("requires: ", 1)[1].split("  defaults: ", 1)[0]
        assert req and "docstring" not in req, (d.code, req)
        assert all(m in req for m in d.requires), (d.code, req)
        if not dataclasses.fields(d):
            assert "defaults: none" in line, line


@pytest.mark.skipif(not (SAMPLES / "healthy").is_dir(), reason="sample runs not generated")
def test_json_to_stdout_and_exit_codes() -> None:
    """JSON goes to stdout (parseable), the summary to stderr only with --summary; healthy exits 0, a fault 1."""
    res = _run("analyze", str(SAMPLES / "healthy"), "-f", "json")
    assert res.exit_code == 0, res.stderr
    assert json.loads(res.stdout)["verdict"] == "healthy"
    assert res.stderr == ""
    res = _run("analyze", str(SAMPLES / "healthy"), "-f", "json", "--summary")
    assert json.loads(res.stdout)["verdict"] == "healthy" and "HEALTHY" in res.stderr
    res = _run("analyze", str(SAMPLES / "lr_schedule_reset"), "-f", "json")
    assert res.exit_code == 1
    assert json.loads(res.stdout)["cause"] == "lr_schedule_reset"


@pytest.mark.skipif(not (SAMPLES / "healthy").is_dir(), reason="sample runs not generated")
def test_html_written_to_output(tmp_path: Path) -> None:
    """-o writes one self-contained HTML file."""
    out = tmp_path / "r.html"
    res = _run("analyze", str(SAMPLES / "data_batch"), "-o", str(out))
    assert res.exit_code == 1
    html = out.read_text()
    assert 'class="tf-plot"' in html and 'id="recovery"' in html


@pytest.mark.parametrize("where", ["a_file", "under_a_file"])
def test_ingest_into_a_file_is_one_line_exit_2(tmp_path: Path, where: str) -> None:
    """``ingest -o`` naming a file (or a folder under one) exits 2 with one line, no traceback."""
    (tmp_path / "f").write_text("x\n")
    out = tmp_path / "f" if where == "a_file" else tmp_path / "f" / "sub"
    res = _run("ingest", str(SAMPLES / "healthy"), "-o", str(out))
    assert res.exit_code == 2 and "Traceback" not in res.output
    assert len(res.stderr.strip().splitlines()) == 1 and str(tmp_path / "f") in res.stderr


def test_md_alias_and_dash_means_stdout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``-f md`` is markdown and ``-o -`` writes to stdout (no file named ``-``)."""
    monkeypatch.chdir(tmp_path)
    res = _run("analyze", str(SAMPLES / "healthy"), "-f", "md", "-o", "-")
    assert res.exit_code == 0 and res.stdout.startswith("# train-forensics")
    assert not (tmp_path / "-").exists()


def test_python_dash_m_runs_the_cli() -> None:
    """``python -m forensics.cli`` is the same command line (every command listed, serve and watch included)."""
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]))
    res = subprocess.run([sys.executable, "-m", "forensics.cli", "--help"], capture_output=True, text=True,
                         env=env, timeout=120)
    assert res.returncode == 0, res.stderr
    for command in ("analyze", "audit", "compare", "sweep", "serve", "watch", "ingest", "detectors"):
        assert f"  {command} " in res.stdout


def test_json_error_contract_holds_for_usage_errors_compare_and_sweep(tmp_path) -> None:
    """``-f json`` always prints one JSON error object, also for usage errors, compare and sweep.

    A bad option value (click's usage error), a missing compare target, a missing sweep root; without
    ``-f json`` a usage error stays click's usage text.
    """
    import json
    from pathlib import Path

    from click.testing import CliRunner

    from forensics.cli import main

    sample = str(Path(__file__).resolve().parents[1] / "sample_logs" / "lr_schedule_reset")
    runner = CliRunner()
    for argv, kind in ((["analyze", sample, "-f", "json", "--fail-on", "sometimes"], "usage"),
                       (["compare", sample, str(tmp_path / "none"), "-f", "json"], "input"),
                       (["sweep", str(tmp_path / "none"), "--format=json"], "input")):
        res = runner.invoke(main, argv)
        assert res.exit_code == 2, (argv, res.output)
        err = json.loads(res.stdout)["error"]
        assert err["kind"] == kind and err["message"], argv
    res = runner.invoke(main, ["analyze", sample, "--fail-on", "sometimes"])
    assert res.exit_code == 2 and "Usage:" in res.output and not res.stdout.lstrip().startswith("{")
