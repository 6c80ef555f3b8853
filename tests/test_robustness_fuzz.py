"""Property-based fuzzing (hypothesis) of every parser and of ``forensics analyze``, and ``--strict`` (issue 8)."""

from __future__ import annotations

import importlib
import json
import struct
import zlib
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs
from robustness_helpers import (
    FIGURES,
    _bases,
    _fuzz,
)

from forensics.errors import ParseError
from parsers import PARSER_MODULES
from parsers.tensorboard import masked_crc32c
from parsers.wandb_log import FIRST, FULL, LAST, MAGIC, MIDDLE

# -- property-based fuzzing --------------------------------------------------------------------------------

NAMES = {"parsers.tensorboard": "events.out.tfevents.1.host", "parsers.hf_trainer": "trainer_state.json",
         "parsers.wandb_run": "run-fuzz.wandb", "parsers.jsonl": "metrics.jsonl", "parsers.csv_metrics": "metrics.csv",
         "parsers.textlog": "train.log", "parsers.mlflow_store": "loss"}
_json_scalars = hs.one_of(hs.none(), hs.booleans(), hs.integers(-(1 << 70), 1 << 70), hs.floats(allow_nan=True),
                          hs.text(max_size=8), hs.sampled_from(["NaN", "Infinity", "-inf", "1e400", "step"]))
_json = hs.recursive(_json_scalars, lambda c: hs.lists(c, max_size=4) | hs.dictionaries(
    hs.sampled_from(["step", "loss", "lr", "_step", "iteration", "global_step", "log_history", "x", "wall_time",
                     "module", "time", "epoch"]) | hs.text(max_size=6), c, max_size=5), max_leaves=12)


def _jsonish(draw_lines: list, seps: list[str]) -> bytes:
    out = []
    for obj, sep in zip(draw_lines, seps, strict=False):
        text = json.dumps(obj, allow_nan=True) if not isinstance(obj, str) else obj
        out.append(text + sep)
    return "".join(out).encode("utf-8", "surrogatepass")




def _fuzz_read(mod_name: str, data: bytes, folder: Path) -> None:
    mod = importlib.import_module(mod_name)
    path = folder / NAMES[mod_name]
    path.write_bytes(data)
    FIGURES[(mod_name, "inputs")] += 1
    try:
        mod.sniff(path)
        mod.read(path, folder)
    except ParseError:
        pass
    except Exception:
        FIGURES[(mod_name, "crashes")] += 1
        raise


@pytest.mark.parametrize("mod_name", PARSER_MODULES)
def test_fuzz_random_bytes(mod_name: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    """Random bytes: only ParseError escapes a parser."""
    folder = tmp_path_factory.mktemp("fuzz")
    prefix = {"parsers.wandb_run": MAGIC, "parsers.mlflow_store": b"SQLite format 3\x00"}.get(mod_name, b"")

    @_fuzz
    @given(hs.binary(max_size=600), hs.booleans())
    def run(data: bytes, with_prefix: bool) -> None:
        _fuzz_read(mod_name, (prefix if with_prefix else b"") + data, folder)

    run()


@pytest.mark.parametrize("mod_name", PARSER_MODULES)
def test_fuzz_jsonish_text(mod_name: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    """Random JSON-ish lines: only ParseError escapes a parser."""
    folder = tmp_path_factory.mktemp("fuzz")

    @_fuzz
    @given(hs.lists(_json | hs.text(max_size=30), max_size=8),
           hs.lists(hs.sampled_from(["\n", "\r\n", "\r", "", ",", "\n\n"]), min_size=8, max_size=8))
    def run(objs: list, seps: list[str]) -> None:
        data = _jsonish(objs, seps)
        _fuzz_read(mod_name, data, folder)
        if mod_name == "parsers.hf_trainer":
            _fuzz_read(mod_name, json.dumps({"log_history": objs}, allow_nan=True).encode(), folder)
        if mod_name == "parsers.csv_metrics":
            _fuzz_read(mod_name, b"step,loss,lr\n" + data, folder)

    run()


def test_fuzz_tfrecord_frames(tmp_path: Path) -> None:
    """Valid framing (good CRCs) around random payloads: the protobuf decoder never crashes."""
    @_fuzz
    @given(hs.lists(hs.binary(max_size=80), min_size=1, max_size=6))
    def run(payloads: list[bytes]) -> None:
        out = b""
        for p in payloads:
            hdr = struct.pack("<Q", len(p))
            out += hdr + struct.pack("<I", masked_crc32c(hdr)) + p + struct.pack("<I", masked_crc32c(p))
        _fuzz_read("parsers.tensorboard", out, tmp_path)

    run()


def test_fuzz_wandb_chunks(tmp_path: Path) -> None:
    """Valid chunks (good CRCs) around random payloads: the record decoder never crashes."""
    @_fuzz
    @given(hs.lists(hs.tuples(hs.sampled_from([FULL, FIRST, MIDDLE, LAST]), hs.binary(max_size=60)), max_size=6))
    def run(chunks: list) -> None:
        out = MAGIC
        for typ, p in chunks:
            out += struct.pack("<IHB", zlib.crc32(bytes([typ]) + p), len(p), typ) + p
        _fuzz_read("parsers.wandb_run", out, tmp_path)

    run()


_CLI_FILES = ["metrics.jsonl", "train.log", "events.out.tfevents.1.h", "metrics.csv", "trainer_state.json",
              "run-x.wandb"]


def _cli(args: list[str]):  # noqa: ANN202
    from forensics.cli import main

    return CliRunner().invoke(main, args, catch_exceptions=False)


def _one_line_error(res, strict: bool) -> None:  # noqa: ANN001
    """Exit 2 is one line on stderr; with ``--strict`` after a completed analysis, the summary precedes it."""
    assert "Traceback" not in res.stderr
    if res.exit_code != 2:
        return
    lines = res.stderr.strip().splitlines()
    assert lines[-1].startswith("forensics:"), res.stderr
    if not (strict and "--strict:" in lines[-1]):
        assert len(lines) == 1, res.stderr


def test_fuzz_analyze_cli(tmp_path_factory: pytest.TempPathFactory) -> None:
    """``forensics analyze`` on a run folder with one fuzzed file: exit 0, 1 or 2; exit 2 is one line."""
    real = _bases(None)

    @settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(hs.integers(0, len(real) - 1), hs.lists(hs.tuples(hs.integers(0, 1 << 20), hs.integers(0, 255)),
                                                    max_size=4), hs.integers(0, 1 << 20), hs.binary(max_size=64))
    def run(which: int, flips: list, cut: int, tail: bytes) -> None:
        mod_name, name, data = real[which]
        bad = bytearray(data)
        for pos, val in flips:
            bad[pos % len(bad)] = val
        bad = bytes(bad[:len(bad) - cut % 200]) + tail
        folder = tmp_path_factory.mktemp("run")
        (folder / name).write_bytes(bad)
        FIGURES[("cli", "inputs")] += 1
        for strict in ([], ["--strict"]):
            res = _cli(["analyze", str(folder), "-f", "json", *strict])
            assert res.exit_code in (0, 1, 2, 3), res.output  # 3: inconclusive (no objective left)
            _one_line_error(res, strict=bool(strict))

    run()


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(hs.sampled_from(_CLI_FILES), hs.binary(max_size=300))
def test_fuzz_analyze_cli_random_bytes(name: str, data: bytes) -> None:
    """The analyze command over one random file: exit 0, 1, 2 or 3 (inconclusive), one-line errors."""
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        (Path(d) / name).write_bytes(data)
        res = _cli(["analyze", d, "-f", "json"])
    FIGURES[("cli", "inputs")] += 1
    assert res.exit_code in (0, 1, 2, 3)  # 3: inconclusive
    _one_line_error(res, strict=False)


def test_strict_turns_a_skip_into_exit_2(tmp_path: Path) -> None:
    """--strict: a damaged line or an unclaimed log makes the exit code 2."""
    run = tmp_path / "run"
    run.mkdir()
    lines = [json.dumps({"step": s, "loss": 2.0 - s / 100}) for s in range(60)]
    (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    assert _cli(["analyze", str(run), "-f", "json"]).exit_code == 0
    assert _cli(["analyze", str(run), "-f", "json", "--strict"]).exit_code == 0
    (run / "metrics.jsonl").write_text("\n".join(lines) + '\n{"step": 60, "lo')  # a torn last line
    assert _cli(["analyze", str(run), "-f", "json"]).exit_code == 0
    res = _cli(["analyze", str(run), "-f", "json", "--strict"])
    assert res.exit_code == 2 and "metrics.jsonl:61" in res.stderr
    (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    (run / "notes.log").write_bytes(b"\x00\x01binary")  # an unclaimed log-like file
    res = _cli(["analyze", str(run), "-f", "json", "--strict"])
    assert res.exit_code == 2 and len(res.stderr.strip().splitlines()) >= 1


