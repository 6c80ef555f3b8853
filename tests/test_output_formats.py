"""Every output format of every command, through the real command line (click's runner, in process).

The format enum is one list for all commands (``forensics.cli._FORMATS``: the members of
:class:`reports.ReportFormat` plus the ``md`` alias); each (command, format) pair is run to stdout and to
``-o``: the payload goes once to stdout, the summary to stderr only when stdout is not the payload or
with ``--summary``; ``*.recovery_trial.json`` appears only beside an ``-o`` report. The diagnosis, the
comparison and the sweep are computed once per module (memoised) so the test exercises output handling,
not the analysis, again and again.
"""

from __future__ import annotations

import functools
import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from markdown_it import MarkdownIt

import forensics.api
import forensics.compare
import forensics.sweep
from forensics.cli import _FORMATS, main
from reports import ReportFormat, compare_report, sweep_report

SAMPLES = Path(__file__).resolve().parents[1] / "sample_logs"
COMMANDS = {
    "analyze": [str(SAMPLES / "lr_schedule_reset")],
    "compare": [str(SAMPLES / "proxy_target" / "proxy"), str(SAMPLES / "proxy_target" / "target")],
    "sweep": [str(SAMPLES / "sweep")],  # replaced by a four-run copy (two lrs, qk-layernorm off/on) below
}
SWEEP_RUNS = ("d32_qkln-off_lr1e-02", "d32_qkln-off_lr3e-02", "d32_qkln-on_lr1e-02", "d32_qkln-on_lr3e-02")
pytestmark = pytest.mark.skipif(not all(Path(a).is_dir() for v in COMMANDS.values() for a in v),
                                reason="sample runs missing")


@pytest.fixture(scope="module", autouse=True)
def memoised(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Compute each command's result once for the module (the CLI imports these names at call time)."""
    root = tmp_path_factory.mktemp("sweep")
    for name in SWEEP_RUNS:
        shutil.copytree(SAMPLES / "sweep" / name, root / name)
    COMMANDS["sweep"] = [str(root)]
    mp = pytest.MonkeyPatch()
    loaded: dict[str, object] = {}
    real_load = forensics.api.load

    def load(path: object, metric_map: object = None, **kw: object) -> object:  # dicts are not hashable
        key = repr((str(path), sorted((metric_map or {}).items()), sorted(kw.items(), key=str)))  # type: ignore[union-attr]
        if key not in loaded:
            loaded[key] = real_load(path, metric_map, **kw)  # type: ignore[arg-type]
        return loaded[key]

    mp.setattr(forensics.api, "load", load)
    analyses: dict[int, object] = {}
    real = forensics.api.analyze_run

    def analyze_run(run: object) -> object:  # RunData is not hashable: memoise by identity (load is cached)
        if id(run) not in analyses:
            analyses[id(run)] = (run, real(run))
        return analyses[id(run)][1]

    mp.setattr(forensics.api, "analyze_run", analyze_run)
    compare = functools.cache(forensics.compare.compare)  # by the two paths (the runs come from the cached load)
    mp.setattr(forensics.compare, "compare", lambda proxy, target, loaded=None: compare(proxy, target))
    sweep = functools.cache(forensics.sweep.sweep)
    mp.setattr(forensics.sweep, "sweep", lambda root, **options: sweep(root, **options))
    yield
    mp.undo()


def _run(*args: str) -> object:
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def test_one_format_enum_for_every_command() -> None:
    """The CLI's choices are the enum's members plus ``md``; compare and sweep render every member."""
    assert set(_FORMATS) == {f.value for f in ReportFormat} | {"md"}
    assert set(compare_report.FORMATS) == set(sweep_report.FORMATS) == {f.value for f in ReportFormat}
    for cmd in COMMANDS:
        choices = next(p for p in main.commands[cmd].params if p.name == "fmt").type.choices
        assert tuple(choices) == _FORMATS, cmd


def _check_payload(fmt: str, text: str) -> None:
    if fmt == "html":
        assert text.startswith("<!DOCTYPE html>") and text.rstrip().endswith("</html>")
    elif fmt == "json":
        assert isinstance(json.loads(text), dict)
    elif fmt in ("markdown", "md"):
        assert text.startswith("# ") and len(text.splitlines()) < 200
        tokens = MarkdownIt("commonmark").enable("table").parse(text)
        assert tokens and all(t.type != "html_block" for t in tokens)
    else:
        assert text.strip() and "\x1b[" not in text and "<" not in text.split("\n", 1)[0]


@pytest.mark.parametrize("fmt", _FORMATS)
@pytest.mark.parametrize("cmd", list(COMMANDS))
def test_every_format_to_stdout(cmd: str, fmt: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """To stdout: the payload once, nothing on stderr (html, which goes to a default file, gets the summary)."""
    monkeypatch.chdir(tmp_path)
    res = _run(cmd, *COMMANDS[cmd], "-f", fmt)
    assert res.exit_code in (0, 1), res.output
    if fmt == "html":
        written = list(tmp_path.glob("forensics-*.html"))
        assert len(written) == 1 and res.stdout == ""
        _check_payload(fmt, written[0].read_text())
        assert f"report written to {written[0].name}" in res.stderr
        assert not list(tmp_path.glob("*.recovery_trial.json")), "recovery_trial.json written without -o"
        return
    _check_payload(fmt, res.stdout)
    assert res.stderr == "", res.stderr
    assert not list(tmp_path.iterdir()), "files written although the payload went to stdout"


@pytest.mark.parametrize(("cmd", "fmt"), [(c, f) for c in COMMANDS for f in _FORMATS if f != "html" or c == "analyze"])
def test_every_format_to_a_file(cmd: str, fmt: str, tmp_path: Path) -> None:
    """With -o: the payload in the file, stdout empty, the summary and the path on stderr.

    (compare/sweep html to a file is the path their default ``forensics-*.html`` already takes above.)
    """
    out = tmp_path / "sub" / f"report.{fmt}"
    res = _run(cmd, *COMMANDS[cmd], "-f", fmt, "-o", str(out))
    assert res.exit_code in (0, 1), res.output
    assert res.stdout == ""
    _check_payload(fmt, out.read_text())
    assert f"report written to {out}" in res.stderr and len(res.stderr.splitlines()) >= 2
    trial = out.with_name("report.recovery_trial.json")
    assert trial.exists() == (cmd == "analyze"), "the machine-readable plan goes beside an analyze report"
    if cmd == "analyze":
        assert json.loads(trial.read_text())["resume_from"]["step"] == 300


@pytest.mark.parametrize("cmd", list(COMMANDS))
def test_summary_flag_adds_the_summary_to_stderr(cmd: str) -> None:
    """``--summary`` prints the summary on stderr even when stdout carries the payload."""
    res = _run(cmd, *COMMANDS[cmd], "-f", "json", "--summary")
    assert json.loads(res.stdout) and res.stderr.strip()


def test_text_once_and_verbose_lists_every_finding() -> None:
    """``analyze -f text``: the summary once (stdout), no colour when not a terminal; --verbose lists all."""
    res = _run("analyze", *COMMANDS["analyze"], "-f", "text")
    assert res.stdout.count("verdict:") == 1 and res.stderr == ""
    assert "resume from:   step 300" in res.stdout and "the checkpoint the faulty resume loaded" in res.stdout
    verbose = _run("analyze", *COMMANDS["analyze"], "-f", "text", "--verbose").stdout
    analysis = forensics.api.analyze_run(forensics.api.load(COMMANDS["analyze"][0]))
    assert verbose.count("evidence:") == len(analysis.findings)
    assert all(s.what in verbose for s in analysis.skipped) and "--verbose lists" not in verbose


def test_markdown_command_quotes_the_run_path(tmp_path) -> None:  # noqa: ANN001
    """The paste-ready ``forensics analyze PATH`` line of the Markdown report is shell-quoted (spaces, ``<``)."""
    import json
    import shlex

    from forensics.api import analyze_run, load
    from reports import render

    run = tmp_path / "sp ace" / "run <x>"
    run.mkdir(parents=True)
    (run / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "loss": 3 - s * 0.01}) + "\n"
                                               for s in range(100)))
    data = load(run)
    md = render(analyze_run(data), data, "markdown")
    line = next(x for x in md.splitlines() if x.startswith("Full report: run `"))
    cmd = line.split("`")[1]
    assert shlex.split(cmd)[2] == str(run) or shlex.split(cmd)[2].endswith("run <x>")
