"""parsers.discover: walking, claiming, config files, errors, global segments, RunData."""

from __future__ import annotations

import json
import os
import sys
import types
from pathlib import Path

import pytest

from forensics.errors import InputError
from parsers import discover as disc
from parsers import jsonl, walk


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def _jsonl(path: Path, steps, wall0: float | None = None, **extra) -> Path:
    lines = []
    for i, s in enumerate(steps):
        rec = {"step": s, "loss": 1.0 / (s + 1), **extra}
        if wall0 is not None:
            rec["wall_time"] = wall0 + i
        lines.append(json.dumps(rec))
    return _write(path, "\n".join(lines) + "\n")


def _tb(folder: Path, steps, wall0: float, tag: str = "train/loss", hparams: bool = False) -> None:
    pytest.importorskip("torch")
    from torch.utils.tensorboard import SummaryWriter

    w = SummaryWriter(str(folder))
    for i, s in enumerate(steps):
        w.add_scalar(tag, float(s), s, walltime=wall0 + i)
    if hparams:
        w.add_hparams({"lr": 0.1}, {"hp/metric": 1.0})
    w.close()


def test_input_errors(tmp_path):
    """Missing path, a file, an empty folder, a folder without logs: one clear line each."""
    with pytest.raises(InputError, match="no such file or directory"):
        disc.load_run(tmp_path / "nope")
    f = _write(tmp_path / "metrics.jsonl", '{"step": 1, "loss": 1}\n')
    with pytest.raises(InputError, match="not a directory"):
        disc.load_run(f)
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="folder is empty"):
        disc.load_run(tmp_path / "empty")
    d = tmp_path / "nologs"
    _write(d / "notes.md", "# notes\n")
    _write(d / "config.yaml", "lr: 0.1\n")
    _write(d / ".git" / "x.jsonl", '{"step": 1, "loss": 1}\n')
    with pytest.raises(InputError, match="no training logs found") as exc:
        disc.load_run(d)
    assert str(exc.value).startswith(str(d.resolve()))
    with pytest.raises(InputError, match="no such file"):
        disc.discover(tmp_path / "nope")


def test_claims_configs_and_skips(tmp_path):
    """Logs are claimed; configs loaded; unknown log-like files listed; the rest ignored silently."""
    run = tmp_path / "run7"
    _jsonl(run / "metrics.jsonl", range(5))
    _write(run / "weird.csv", "a,b\n1,2\n")
    _write(run / "notes.md", "tried lr 3e-4\n")
    _write(run / "launch.sh", "torchrun train.py\n")
    (run / "model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ")
    _write(run / "config.yaml", "lr: 0.0003\nbetas: [0.9, 0.95]\nwhen: 2024-01-02\n")
    _write(run / "broken.yaml", "a: [1, 2\n")
    _write(run / "adapters" / "adapter_config.json", '{"r": 8, "lora_alpha": 16}')
    _write(run / "ds_config.json", '{"fp16": {"enabled": true}}')
    _write(run / "tokenizer.json", '{"model": {}}')
    _write(run / "expected.json", '{\n  "id": "x"\n}\n')
    _write(run / ".git" / "hidden.jsonl", '{"step": 1, "loss": 1}\n')
    _write(run / ".hydra" / "config.yaml", "model: {layers: 2}\n")
    os.symlink(run, run / "adapters" / "loop")  # a symlink loop must not hang the walk
    claims, skipped = disc.discover(run)
    assert [(p.name, m.FORMAT) for p, m in claims] == [("metrics.jsonl", "jsonl")]
    assert [(s.what, s.reason) for s in skipped] == [("weird.csv", "no parser recognised the format")]
    rd = disc.load_run(run)
    cf = rd.meta["config_files"]
    assert cf["config.yaml"] == {"lr": 0.0003, "betas": [0.9, 0.95], "when": "2024-01-02"}
    assert cf["adapters/adapter_config.json"] == {"r": 8, "lora_alpha": 16}
    assert cf["ds_config.json"] == {"fp16": {"enabled": True}}
    assert cf[".hydra/config.yaml"] == {"model": {"layers": 2}}
    assert cf["broken.yaml"] == "a: [1, 2\n"  # unparsable config kept as text
    assert "tokenizer.json" not in cf and "expected.json" not in cf
    assert rd.run == str(run) and set(rd.metrics.get_column("run").to_list()) == {"run7"}
    assert rd.meta["formats"] == ["jsonl"] and rd.meta["by_source"]["metrics.jsonl"]["step_key"] == "step"
    src_rows = [(s.path, s.format, s.records, s.segments) for s in rd.sources]
    assert src_rows == [("metrics.jsonl", "jsonl", 5, 1)]


def test_parser_failures_and_missing_modules(tmp_path, monkeypatch):
    """A parser that raises makes one Skip (no traceback); a module not written yet is left out."""
    boom = types.ModuleType("fake_boom_parser")
    boom.FORMAT = "boom"
    boom.sniff = lambda p: p.suffix == ".boom"

    def read(path, root):
        raise RuntimeError("kaboom")

    boom.read = read
    rude = types.ModuleType("fake_rude_parser")
    rude.FORMAT = "rude"
    rude.sniff = lambda p: 1 / 0  # sniff must never raise; if it does, the file is not its
    rude.read = read
    monkeypatch.setitem(sys.modules, "fake_boom_parser", boom)
    monkeypatch.setitem(sys.modules, "fake_rude_parser", rude)
    monkeypatch.setattr(walk, "PARSER_MODULES", ("fake_rude_parser", "parsers.not_written_yet",
                                                 "fake_boom_parser", "parsers.jsonl"))
    _write(tmp_path / "x.boom", "?")
    _jsonl(tmp_path / "m.jsonl", range(3))
    rd = disc.load_run(tmp_path)
    reasons = [(s.what, s.reason) for s in rd.skipped]
    assert ("x.boom", "the boom parser failed: RuntimeError: kaboom") in reasons
    assert rd.metrics.height == 3 and "parsers_unavailable" not in rd.meta
    (tmp_path / "m.jsonl").unlink()
    with pytest.raises(InputError, match="no readable training log.*kaboom"):
        disc.load_run(tmp_path)


def test_jsonl_files_rewind_and_continue(tmp_path):
    """Files of one folder in time order: a rewind opens a segment, a file continuing forward does not."""
    _jsonl(tmp_path / "logs" / "b_first.jsonl", range(0, 10), wall0=1.7e9)
    # resumed from step 5, then went back again inside the same file
    _jsonl(tmp_path / "logs" / "a_second.jsonl", [*range(5, 9), *range(3, 6)], wall0=1.7e9 + 100)
    _jsonl(tmp_path / "logs" / "c_third.jsonl", range(6, 9), wall0=1.7e9 + 200)  # continues forward
    _jsonl(tmp_path / "other" / "m.jsonl", range(0, 4))  # another folder: its own group
    rd = disc.load_run(tmp_path)
    segs = {s.path: sorted(set(rd.metrics.filter(rd.metrics["source"] == s.path)["segment"].to_list()))
            for s in rd.sources}
    assert segs == {"logs/b_first.jsonl": [0], "logs/a_second.jsonl": [1, 2], "logs/c_third.jsonl": [2],
                    "other/m.jsonl": [0]}
    s = rd.series("loss")
    assert s.steps.tolist() == list(range(0, 9)) and s.segments.tolist() == [0, 0, 0, 2, 2, 2, 2, 2, 2]
    assert rd.meta["source_groups"]["logs/b_first.jsonl"] == rd.meta["source_groups"]["logs/c_third.jsonl"]


def test_tensorboard_versions_are_one_group(tmp_path):
    """lightning_logs/version_K files of one job chain into segments; series follows the resume."""
    _tb(tmp_path / "lightning_logs" / "version_0", range(0, 10), wall0=1.7e9)
    _tb(tmp_path / "lightning_logs" / "version_1", range(5, 15), wall0=1.7e9 + 100, hparams=True)
    _tb(tmp_path / "lightning_logs" / "version_2", range(15, 20), wall0=1.7e9 + 200)
    rd = disc.load_run(tmp_path)
    main = [s for s in rd.sources if "version_" in s.path and s.path.count("/") == 2]
    assert [s.segments for s in main] == [1, 1, 1]
    assert rd.n_segments == 2 and rd.segment_starts() == {0: 0, 1: 5}
    s = rd.series("loss")
    assert s.steps.tolist() == list(range(20)) and s.segments.tolist() == [0] * 5 + [1] * 15
    side = [p for p, g in rd.meta["source_groups"].items() if g.startswith("tensorboard:")]
    assert len(side) == 1 and rd.meta["hparams"] == {"lr": 0.1}  # add_hparams' side file stays apart


def _lightning_csv(folder: Path, steps, loss0: float) -> None:
    """A Lightning ``CSVLogger`` file: ``epoch,step,train_loss`` plus an eval column left blank."""
    folder.mkdir(parents=True)
    rows = ["epoch,step,train_loss,val_loss"] + [f"0,{s},{loss0 - 0.01 * s:.4f}," for s in steps]
    (folder / "metrics.csv").write_text("\n".join(rows) + "\n")


def test_lightning_csv_versions_are_launches_of_one_run(tmp_path):
    """CSVLogger writes version_0/, version_1/ ... one per launch: one timeline, a segment per version.

    Before, each version folder was its own group and the effective series was version_0's alone,
    so a resumed process was never analysed.
    """
    _lightning_csv(tmp_path / "lightning_logs" / "version_0", range(0, 50, 5), 5.0)
    _lightning_csv(tmp_path / "lightning_logs" / "version_1", range(30, 80, 5), 4.7)  # resumed at step 30
    _lightning_csv(tmp_path / "lightning_logs" / "version_2", range(80, 100, 5), 4.2)  # continues forward
    _lightning_csv(tmp_path / "other" / "version_0", range(0, 10, 5), 9.0)  # another job: its own group
    rd = disc.load_run(tmp_path)
    g = rd.meta["source_groups"]
    assert g["lightning_logs/version_0/metrics.csv"] == g["lightning_logs/version_2/metrics.csv"]
    assert g["other/version_0/metrics.csv"] != g["lightning_logs/version_0/metrics.csv"]
    s = rd.series("loss")
    assert s.steps.tolist() == list(range(0, 100, 5))
    assert s.segments.tolist() == [0] * 6 + [1] * 10 + [2] * 4
    restarts = rd.events.filter(rd.events["kind"] == "restart")
    assert restarts.height >= 1 and "version_2" in " ".join(str(m) for m in restarts["message"].to_list())


def test_concurrent_tensorboard_writers_are_not_restarts(tmp_path):
    """Keras-style train/ and validation/ writers overlap in time: separate chains, no new segment."""
    _tb(tmp_path / "logs" / "train", range(10), wall0=1.7e9, tag="epoch_loss")
    _tb(tmp_path / "logs" / "validation", range(10), wall0=1.7e9 + 0.5, tag="epoch_loss")
    rd = disc.load_run(tmp_path)
    assert rd.n_segments == 1
    assert len(set(rd.meta["source_groups"].values())) == 2


def test_lightning_case(cases_dir):
    """br04: two version folders, two global segments, lr back at 1e-3 at step 500."""
    root = cases_dir / "br04_lightning_resume_explr"
    rd = disc.load_run(root)
    assert rd.n_segments == 2 and len(rd.sources) == 2
    s = rd.series("lr")
    i = s.steps.tolist().index(500)
    assert s.values[i] == pytest.approx(1e-3) and s.segments[i] == 1
    assert s.values[i - 1] == pytest.approx(0.9 ** 4 * 1e-3, rel=1e-5)
    assert rd.meta["config_files"]["lightning_logs/version_0/hparams.yaml"]["gamma"] == 0.9
    assert set(rd.metrics["run"].to_list()) == {"br04_lightning_resume_explr"}


def test_every_case_loads(cases_dir):
    """Every acceptance case folder loads: at least one source, no parser crash."""
    for d in sorted(p for p in cases_dir.iterdir() if p.is_dir()):
        rd = disc.load_run(d)
        assert rd.sources, d.name
        assert not [s for s in rd.skipped if "parser failed" in s.reason], d.name
        assert "expected.json" not in {s.what for s in rd.skipped}


def test_jsonl_claims_are_first_come(tmp_path):
    """trainer_state.json is never taken by the JSONL parser."""
    p = _write(tmp_path / "trainer_state.json", '{"global_step": 1, "log_history": []}\n')
    assert not jsonl.sniff(p)


def _special_run(tmp_path: Path, kind: str) -> tuple[Path, str, str]:
    """A run folder with a good ``metrics.jsonl`` next to one input that must not be read."""
    run = tmp_path / "run"
    _jsonl(run / "metrics.jsonl", range(5))
    if kind == "fifo":
        os.mkfifo(run / "train.log")
        return run, "train.log", "not a regular file (FIFO): not read"
    if kind == "device":
        os.symlink("/dev/zero", run / "events.out.tfevents.1.host")
        return run, "events.out.tfevents.1.host", "symlink to a device: not read"
    if kind == "dangling":
        os.symlink(run / "gone", run / "events.out.tfevents.2.host")
        return run, "events.out.tfevents.2.host", "dangling symlink: target missing"
    if kind == "notgzip":
        (run / "more.jsonl.gz").write_bytes(bytes(range(7, 200)))
        return run, "more.jsonl.gz", "not gzip data (bad magic bytes): not read"
    raise AssertionError(kind)


_SPECIAL = ["fifo", "device", "dangling", "notgzip"]


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs POSIX FIFOs and symlinks")
@pytest.mark.parametrize("kind", _SPECIAL)
def test_discover_lists_special_inputs_without_opening(tmp_path, kind, monkeypatch):
    """FIFO, symlink to a device, dangling symlink, non-gzip ``*.gz``: listed in skipped, never parsed."""
    run, name, why = _special_run(tmp_path, kind)
    real_open = open

    def guarded_open(file, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        assert not (kind in ("fifo", "device") and Path(str(file)).name == name), f"opened {name}"
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr("builtins.open", guarded_open)
    claims, skipped = disc.discover(run)
    assert [p.name for p, _ in claims] == ["metrics.jsonl"]
    assert [(s.what, s.reason) for s in skipped] == [(name, why)]
    rd = disc.load_run(run)
    assert rd.metrics.height == 5 and [s.path for s in rd.sources] == ["metrics.jsonl"]
    assert [(s.what, s.reason) for s in rd.skipped] == [(name, why)]


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs POSIX FIFOs and symlinks")
@pytest.mark.parametrize("kind", _SPECIAL)
def test_discover_strict_cli_exits_2_on_special_input(tmp_path, kind):
    """``analyze --strict`` exits 2 naming the input; a normal ``analyze`` still reads the good log."""
    from click.testing import CliRunner

    from forensics.cli import main

    run, name, why = _special_run(tmp_path, kind)
    res = CliRunner().invoke(main, ["analyze", str(run), "--strict"], catch_exceptions=False)
    assert res.exit_code == 2, res.output
    assert name in res.stderr and why in res.stderr
    res = CliRunner().invoke(main, ["analyze", str(run)], catch_exceptions=False)
    # the good log is read: its 5 loss points, too few to judge (inconclusive, exit 3; forensics/too_few.py)
    assert res.exit_code == 3 and "too few training-loss points (5)" in res.output, res.output


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs POSIX FIFOs")
def test_discover_only_special_input_names_it(tmp_path):
    """A folder whose only log is a FIFO: the error says what was not read, and nothing blocks."""
    run = tmp_path / "run"
    run.mkdir()
    os.mkfifo(run / "train.log")
    with pytest.raises(InputError, match=r"train\.log: not a regular file \(FIFO\): not read"):
        disc.load_run(run)


def test_discover_unreadable_file_chmod(tmp_path):
    """A file without read permission: "permission denied: not read", the parser is never called."""
    run = tmp_path / "run"
    _jsonl(run / "metrics.jsonl", range(5))
    bad = _jsonl(run / "eval" / "metrics.jsonl", range(3))
    bad.chmod(0)
    try:
        if os.access(bad, os.R_OK):
            pytest.skip("running as root (or with CAP_DAC_OVERRIDE): permission bits do not apply")
        claims, skipped = disc.discover(run)
        assert [p.relative_to(run).as_posix() for p, _ in claims] == ["metrics.jsonl"]
        assert [(s.what, s.reason) for s in skipped] == [("eval/metrics.jsonl", "permission denied: not read")]
        rd = disc.load_run(run)
        assert [(s.what, s.reason) for s in rd.skipped] == [("eval/metrics.jsonl", "permission denied: not read")]
    finally:
        bad.chmod(0o644)


def test_discover_unreadable_file_simulated(tmp_path, monkeypatch):
    """Same as the chmod test, with ``os.access`` saying no (runs as root too); --strict exits 2."""
    from click.testing import CliRunner

    from forensics.cli import main

    run = tmp_path / "run"
    _jsonl(run / "metrics.jsonl", range(5))
    bad = _jsonl(run / "eval" / "metrics.jsonl", range(3))
    real_access = os.access

    def access(p, mode, *a, **k):  # noqa: ANN001, ANN002, ANN003, ANN202
        return False if Path(p) == bad else real_access(p, mode, *a, **k)

    monkeypatch.setattr(os, "access", access)
    claims, skipped = disc.discover(run)
    assert [(s.what, s.reason) for s in skipped] == [("eval/metrics.jsonl", "permission denied: not read")]
    assert [p.relative_to(run).as_posix() for p, _ in claims] == ["metrics.jsonl"]
    rd = disc.load_run(run)
    assert [s.path for s in rd.sources] == ["metrics.jsonl"]
    assert [(s.what, s.reason) for s in rd.skipped] == [("eval/metrics.jsonl", "permission denied: not read")]
    res = CliRunner().invoke(main, ["analyze", str(run), "--strict"], catch_exceptions=False)
    assert res.exit_code == 2 and "permission denied: not read" in res.stderr, res.output
    res = CliRunner().invoke(main, ["analyze", str(run)], catch_exceptions=False)
    # the readable log is read: too few loss points to judge is inconclusive (exit 3, forensics/too_few.py)
    assert res.exit_code in (0, 1) or "too few training-loss points" in res.output, res.output


def test_fifo_and_device_named_like_checkpoints_are_never_opened(tmp_path: Path) -> None:
    """A FIFO ``model.pt`` and a ``/dev/zero`` link ``optimizer.pt`` are listed as skipped, never read."""
    import shutil

    run = tmp_path / "run"
    (run / "ckpt" / "step_10").mkdir(parents=True)
    shutil.copy(Path(__file__).resolve().parents[1] / "sample_logs" / "healthy" / "metrics.jsonl", run)
    os.mkfifo(run / "ckpt" / "step_10" / "model.pt")
    os.symlink("/dev/zero", run / "ckpt" / "step_10" / "optimizer.pt")
    got = disc.load_run(run)
    reasons = {s.what: s.reason for s in got.skipped}
    assert "FIFO" in reasons["ckpt/step_10/model.pt"] and "device" in reasons["ckpt/step_10/optimizer.pt"]
    assert got.metrics.height > 0
