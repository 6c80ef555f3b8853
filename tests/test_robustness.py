"""Bad input never crashes a parser and never loses a complete record (issue 8).

Damaged-input suites built from small real files (``sample_logs/`` and, when present, the acceptance
cases): truncation at every byte offset, flipped bytes, garbage before and after, empty files, absurd
length fields, odd values where numbers belong, UTF-8 errors, BOM, CRLF, gzip copies, symlink loops,
a folder of 20,000 files. Each damaged read may raise only ``ParseError``; every complete record
before the damage comes back identical to the read of the undamaged prefix; the damage is a ``Skip``
naming the file and the byte offset or line. Then hypothesis fuzzing of every parser and of
``forensics analyze``, hostile checkpoints, and ``--strict``.

Figures (inputs tried, crashes, complete records lost) are printed by ``test_figures`` with ``-s``.
"""

from __future__ import annotations

import gzip
import importlib
import json
import math
import os
import pickle
import random
import struct
import sys
import time
import zipfile
import zlib
from collections import Counter
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs

from forensics.errors import ParseError
from parsers import PARSER_MODULES
from parsers import safetensors_ckpt as sc
from parsers import torch_ckpt as tc
from parsers.tensorboard import masked_crc32c
from parsers.wandb_log import BLOCK, FIRST, FULL, LAST, MAGIC, MIDDLE

SAMPLES = Path(__file__).resolve().parents[1] / "sample_logs"
WANDB = SAMPLES / "wandb_healthy" / "wandb" / "offline-run-20261129_182116-healthy0" / "run-healthy0.wandb"
MAX_EVERY_OFFSET = 1200  # files up to this size are cut at every byte offset; bigger ones at a dense sample
FIGURES: Counter = Counter()  # (parser, "inputs" | "crashes" | "lost") -> count, for the closing note

# -- base files: small real files, each cut at a record boundary ------------------------------------------


def _line_ends(data: bytes) -> list[int]:
    return [i + 1 for i, c in enumerate(data) if c == 0x0A]


def _tb_ends(data: bytes) -> list[int]:
    ends, pos = [], 0
    while pos + 12 <= len(data):
        (n,) = struct.unpack_from("<Q", data, pos)
        pos += 16 + n
        if pos > len(data):
            break
        ends.append(pos)
    return ends


def _wandb_ends(data: bytes) -> list[int]:
    """Offsets just after each complete record (FULL or LAST chunk), and the end of each block's padding."""
    ends, pos = [0, len(MAGIC)], len(MAGIC)
    while pos < len(data):
        left = BLOCK - pos % BLOCK
        if left < 7:
            pos += left
            continue
        if pos + 7 > len(data):
            break
        _, length, typ = struct.unpack_from("<IHB", data, pos)
        pos += 7 + length
        if pos > len(data):
            break
        if typ in (FULL, LAST):
            ends.append(pos)
    return ends


def _prefix(data: bytes, ends: list[int], limit: int) -> bytes:
    return data[:max(e for e in ends if e <= limit)]


def _first_tfevents(folder: Path) -> Path:
    return sorted(folder.glob("events.out.tfevents.*"))[0]


def _bases(cases: Path | None) -> list[tuple[str, str, bytes]]:
    """``(parser module, file name, bytes)``: small real files of every format."""
    jl = (SAMPLES / "healthy" / "metrics.jsonl").read_bytes()
    tl = (SAMPLES / "healthy" / "train.log").read_bytes()
    tb = _first_tfevents(SAMPLES / "healthy").read_bytes()
    wb = WANDB.read_bytes()
    out = [
        ("parsers.jsonl", "metrics.jsonl", _prefix(jl, _line_ends(jl), 1000)),
        ("parsers.textlog", "train.log", _prefix(tl, _line_ends(tl), 700)),
        ("parsers.tensorboard", "events.out.tfevents.1795976115.vm.1093.0", _prefix(tb, _tb_ends(tb), 1200)),
        ("parsers.wandb_run", "run-healthy0.wandb", _prefix(wb, _wandb_ends(wb), 6000)),
        ("parsers.mlflow_store", "loss", b"".join(  # an MLflow file-store metric file (docs/formats.md#mlflow)
            f"{1700000000000 + 1500 * s} {2.5 - s / 64:.17g} {10 * s}\n".encode() for s in range(12))
         + b"1700000020000 nan 120\n1700000021000 inf 130\n1700000022000 1.25\n"),
    ]
    if cases is not None:
        csv = (cases / "br16_shuffle_phase_shift" / "wandb_export" / "history.csv").read_bytes()
        hf = (cases / "br08_t5_fp16_ff_overflow" / "t5-base-summ" / "checkpoint-20" / "trainer_state.json")
        tl2 = (cases / "br03_multisteplr_resume" / "train.log").read_bytes()
        out += [("parsers.csv_metrics", "history.csv", _prefix(csv, _line_ends(csv), 900)),
                ("parsers.hf_trainer", "trainer_state.json", hf.read_bytes()),
                ("parsers.textlog", "train.log", tl2)]
    else:  # the same shapes, written here (the acceptance cases are not checked out)
        rows = "".join(f"{s},{s * 6.1:.1f},{1748912345 + s * 6.1:.3f},0.0003,{2.5 - s / 1e5:.6f},,1297434.9\n"
                       for s in range(180000, 180010))
        csv = ("_step,_runtime,_timestamp,optim/learning_rate,train/loss,eval/loss,throughput/tokens_per_second\n"
               + rows).encode()
        hist = [{"epoch": 0.01 * i, "grad_norm": 1.5 + i, "learning_rate": 5e-5, "loss": 3.2 - 0.1 * i,
                 "step": 10 * i} for i in range(1, 5)]
        hf = json.dumps({"global_step": 70, "log_history": hist, "max_steps": 100}, indent=2).encode()
        out += [("parsers.csv_metrics", "history.csv", csv), ("parsers.hf_trainer", "trainer_state.json", hf)]
    return out


def _cases(request: pytest.FixtureRequest) -> Path | None:
    try:
        return request.getfixturevalue("cases_dir")
    except pytest.skip.Exception:
        return None


# -- reading and comparing ----------------------------------------------------------------------------


def _rows(pr, with_segment: bool = True) -> Counter:  # noqa: ANN001
    """Multiset of metric rows; floats by their bits (NaN == NaN)."""
    t = pr.metrics
    cols = [t.column(c).to_pylist() for c in ("segment", "step", "metric", "tag", "value", "wall_time")]
    out: Counter = Counter()
    for seg, step, metric, tag, value, wall in zip(*cols, strict=True):
        key = (step, metric, tag, None if value is None else struct.pack("<d", value),
               None if wall is None else struct.pack("<d", wall))
        out[(seg, *key) if with_segment else key] += 1
    return out


def _read(mod_name: str, folder: Path, name: str, data: bytes):  # noqa: ANN202
    """Write ``data`` as ``folder/name`` and read it: the ParseResult, or None for a ParseError.

    Any other exception is counted as a crash and re-raised.
    """
    mod = importlib.import_module(mod_name)
    path = folder / name
    path.write_bytes(data)
    FIGURES[(mod_name, "inputs")] += 1
    try:
        return mod.read(path, folder)
    except ParseError:
        return None
    except Exception:
        FIGURES[(mod_name, "crashes")] += 1
        raise


def _ends_of(mod_name: str, data: bytes) -> list[int]:
    if mod_name == "parsers.tensorboard":
        return [0, *_tb_ends(data)]
    if mod_name == "parsers.wandb_run":
        return _wandb_ends(data)
    if mod_name == "parsers.hf_trainer":
        return [0, len(data)]  # one JSON document: complete only as a whole
    return [0, *_line_ends(data)]


def _where(skips, rel: str) -> list[int]:  # noqa: ANN001
    """The offsets/lines of the skips that name ``rel`` with a position."""
    out = []
    for s in skips:
        head, _, pos = s.what.rpartition(":")
        if head == rel and pos.isdigit():
            out.append(int(pos))
    return out


def _check_kept(mod_name: str, expected, got, what: str, with_segment: bool = True) -> None:  # noqa: ANN001
    """Every row of ``expected`` (the read of the clean part) is in ``got`` (the damaged read)."""
    if expected is None:
        return
    want = _rows(expected, with_segment)
    have = Counter() if got is None else _rows(got, with_segment)
    lost = want - have
    if lost:
        FIGURES[(mod_name, "lost")] += sum(lost.values())
    assert not lost, f"{mod_name} {what}: {sum(lost.values())} complete row(s) lost, e.g. {next(iter(lost))}"


def _offsets(n: int, rng: random.Random, dense: int = 200) -> list[int]:
    if n <= MAX_EVERY_OFFSET:
        return list(range(n + 1))
    return sorted({0, n, *rng.sample(range(n), dense)})


# -- the damaged-input suite ------------------------------------------------------------------------------


def test_every_parser_has_a_base_file(request: pytest.FixtureRequest) -> None:
    """Every parser of PARSER_MODULES gets a damaged-input suite."""
    mods = {m for m, _, _ in _bases(_cases(request))}
    assert set(PARSER_MODULES) <= mods


@pytest.fixture(params=range(8), ids=["jsonl", "textlog", "tensorboard", "wandb", "mlflow", "csv", "hf_trainer",
                                      "textlog2"])
def base(request: pytest.FixtureRequest) -> tuple[str, str, bytes]:
    """One small real file per parser: (module, file name, bytes)."""
    bases = _bases(_cases(request))
    if request.param >= len(bases):
        pytest.skip("acceptance cases not found")
    return bases[request.param]


def test_truncation_at_every_offset(base, tmp_path: Path) -> None:  # noqa: ANN001
    """Cut at every offset: complete records kept, nothing invented, the cut listed."""
    mod_name, name, data = base
    ends = _ends_of(mod_name, data)
    full = _read(mod_name, tmp_path, name, data)
    assert full is not None and full.metrics.num_rows > 0
    full_rows = _rows(full)
    rng = random.Random(8)
    cache: dict = {}
    for cut in _offsets(len(data), rng):
        clean = max(e for e in ends if e <= cut)
        if clean not in cache:
            cache[clean] = _read(mod_name, tmp_path, name, data[:clean]) if clean else None
        expected = cache[clean]
        got = _read(mod_name, tmp_path, name, data[:cut])
        _check_kept(mod_name, expected, got, f"cut at byte {cut}")
        if got is None:
            continue
        partial = data[clean:cut]
        invented = _rows(got) - full_rows
        if mod_name == "parsers.csv_metrics" and partial.count(b",") == data[:data.index(b"\n")].count(b","):
            # KNOWN (tests/test_parsers_csv.py::test_torn_last_line_and_bad_rows asserts it): an unterminated
            # last row with all its cells is read, its last cell as cut ("0.1" -> "0."); counted, not failed
            FIGURES[(mod_name, "torn_row_read")] += bool(invented)
            continue
        assert not invented, f"{mod_name} cut at {cut}: rows that are not in the file: {list(invented)[:2]}"
        if mod_name in ("parsers.tensorboard", "parsers.wandb_run") and partial.strip(b"\x00"):
            pos = _where(got.skipped, name)
            assert any(clean - 7 <= p <= cut for p in pos), f"{mod_name} cut at {cut}: damage not listed"
        elif mod_name in ("parsers.jsonl", "parsers.textlog", "parsers.csv_metrics",
                          "parsers.mlflow_store") and partial.strip():
            line = data[:cut].count(b"\n") + 1
            if mod_name == "parsers.csv_metrics" and line == 1:
                continue  # a cut header: no row to lose
            complete = mod_name == "parsers.jsonl" and _is_json_object(partial)
            assert complete or line in _where(got.skipped, name), \
                f"{mod_name} cut at {cut}: partial line {line} not listed ({got.skipped})"


def _is_json_object(b: bytes) -> bool:
    try:
        return isinstance(json.loads(b), dict)
    except ValueError:
        return False


def test_flipped_bytes(base, tmp_path: Path) -> None:  # noqa: ANN001
    """One byte flipped: the records before it are kept (and TensorBoard lists the damage)."""
    mod_name, name, data = base
    ends = _ends_of(mod_name, data)
    rng = random.Random(88)
    cache: dict = {}
    for pos in sorted(rng.sample(range(len(data)), min(len(data), 120))):
        for mask in (0xFF, 0x01):
            bad = bytearray(data)
            bad[pos] ^= mask
            clean = max(e for e in ends if e <= pos)
            if clean not in cache:
                cache[clean] = _read(mod_name, tmp_path, name, data[:clean]) if clean else None
            expected = cache[clean]
            got = _read(mod_name, tmp_path, name, bytes(bad))
            _check_kept(mod_name, expected, got, f"byte {pos} ^ {mask:#x}")
            if mod_name == "parsers.tensorboard" and got is not None:
                assert any(clean <= p <= pos for p in _where(got.skipped, name)), f"flip at {pos} not listed"


def test_garbage_around(base, tmp_path: Path) -> None:  # noqa: ANN001
    """Garbage appended keeps everything; garbage prepended too where the format resynchronises."""
    mod_name, name, data = base
    full = _read(mod_name, tmp_path, name, data)
    rng = random.Random(7)
    junk = [bytes(rng.randrange(256) for _ in range(n)) for n in (1, 7, 100, 5000)]
    for j in [*junk, b"\x00" * 4096, b"\n\n\n", data[: len(data) // 2]]:
        got = _read(mod_name, tmp_path, name, data + j)
        _check_kept(mod_name, full, got, f"{len(j)} bytes appended")
        if mod_name == "parsers.tensorboard" and j.strip(b"\x00"):
            assert min(_where(got.skipped, name)) >= len(data)
        got = _read(mod_name, tmp_path, name, j + data)
        if mod_name in ("parsers.jsonl", "parsers.textlog", "parsers.tensorboard") and not j.startswith(b"\0"):
            # formats that resynchronise keep every record after the damage (segments may shift)
            j2 = j if mod_name == "parsers.tensorboard" or j.endswith(b"\n") else j + b"\n"
            got = _read(mod_name, tmp_path, name, j2 + data)
            _check_kept(mod_name, full, got, f"{len(j2)} bytes prepended", with_segment=False)
            if mod_name == "parsers.tensorboard":
                assert _where(got.skipped, name)


def test_empty_and_blank(base, tmp_path: Path) -> None:  # noqa: ANN001
    """Empty, blank and zero-filled files: no rows and no crash."""
    mod_name, name, _ = base
    for data in (b"", b"\n", b"\r\n", b"\x00", b"\x00" * 100, b" \t\n" * 10):
        got = _read(mod_name, tmp_path, name, data)
        assert got is None or got.metrics.num_rows == 0


def test_bom_crlf_and_utf8_errors(base, tmp_path: Path) -> None:  # noqa: ANN001
    """A UTF-8 BOM, CRLF line ends and invalid UTF-8 lose no complete record."""
    mod_name, name, data = base
    if mod_name in ("parsers.tensorboard", "parsers.wandb_run"):
        pytest.skip("binary format: no BOM, line endings or text encoding")
    full = _read(mod_name, tmp_path, name, data)
    got = _read(mod_name, tmp_path, name, b"\xef\xbb\xbf" + data)
    _check_kept(mod_name, full, got, "UTF-8 BOM")
    got = _read(mod_name, tmp_path, name, data.replace(b"\n", b"\r\n"))
    _check_kept(mod_name, full, got, "CRLF")
    lines = data.split(b"\n")
    k = len(lines) // 2
    bad = b"\n".join([*lines[:k], lines[k][:5] + b"\xff\xfe\xc3\x28" + lines[k][5:], *lines[k + 1:]])
    clean = b"\n".join(lines[:k]) + b"\n"
    expected = _read(mod_name, tmp_path, name, clean) if mod_name != "parsers.hf_trainer" else None
    got = _read(mod_name, tmp_path, name, bad)
    _check_kept(mod_name, expected, got, "invalid UTF-8")
    if mod_name == "parsers.jsonl":
        assert k + 1 in _where(got.skipped, name)


def test_gzip_copy(base, tmp_path: Path) -> None:  # noqa: ANN001
    """A ``.gz`` copy of a text log is read like the original (only jsonl does it today: see GZIP_READ)."""
    mod_name, name, data = base
    if mod_name in ("parsers.tensorboard", "parsers.wandb_run", "parsers.hf_trainer"):
        pytest.skip("not a text log format")
    mod = importlib.import_module(mod_name)
    path = tmp_path / (name + ".gz")
    path.write_bytes(gzip.compress(data))
    GZIP_READ[mod_name] = bool(mod.sniff(path))
    if mod_name not in GZIP_SUPPORTED:
        return
    assert mod.sniff(path)
    full = _read(mod_name, tmp_path, name, data)
    got = mod.read(path, tmp_path)
    assert _rows(got) == _rows(full)
    path.write_bytes(gzip.compress(data)[:-20])  # a cut gzip stream: earlier lines kept, the cut listed
    got = mod.read(path, tmp_path)
    assert _where(got.skipped, name + ".gz")


GZIP_SUPPORTED = {"parsers.jsonl"}
GZIP_READ: dict[str, bool] = {}


# -- values where numbers belong, mixed types -----------------------------------------------------------


ODD = ["NaN", "-Infinity", "Infinity", "null", '"abc"', '"NaN"', '"1e400"', "1e400", "-1e400", "[1, 2]",
       '{"a": 1}', "true", '""', "123456789012345678901234567890"]


def test_jsonl_odd_values(tmp_path: Path) -> None:
    """NaN/null/Infinity/strings/lists where a number belongs: the other lines are kept."""
    lines = [json.dumps({"step": s, "loss": 1.0 + s}) for s in range(6)]
    for v in ODD:
        for key in ("loss", "step"):
            text = "\n".join(lines[:3] + [lines[3].replace(f'"{key}": {json.loads(lines[3])[key]}',
                                                            f'"{key}": {v}')] + lines[4:]) + "\n"
            got = _read("parsers.jsonl", tmp_path, "metrics.jsonl", text.encode())
            assert got is not None
            steps = got.metrics.column("step").to_pylist()
            assert {0, 1, 2, 4, 5} <= set(steps), (key, v)


def test_csv_odd_values(tmp_path: Path) -> None:
    """Odd cells in a value or the step column: the other rows are kept."""
    for v in ("nan", "NaN", "null", "abc", "", "inf", "-Infinity", "1e400", '"1,5"', "0x10"):
        text = "step,loss\n0,1.0\n1,2.0\n2," + v + "\n3,4.0\n"
        got = _read("parsers.csv_metrics", tmp_path, "metrics.csv", text.encode())
        assert got is not None and {0, 1, 3} <= set(got.metrics.column("step").to_pylist()), v
        text = "step,loss\n0,1.0\n1,2.0\n" + v + ",3.0\n3,4.0\n"
        got = _read("parsers.csv_metrics", tmp_path, "metrics.csv", text.encode())
        assert got is not None and {0, 1, 3} <= set(got.metrics.column("step").to_pylist()), v


def test_hf_trainer_odd_values(tmp_path: Path) -> None:
    """Odd values for loss or step in one log_history entry: the other entries are kept."""
    for v in ODD:
        for key in ("loss", "step"):
            hist = [{"loss": 1.0, "step": 1}, {"loss": 2.0, "step": 2}, "<odd>", {"loss": 4.0, "step": 4}]
            text = json.dumps({"log_history": hist}).replace('"<odd>"', '{{"{}": {}, "{}": 3}}'.format(
                key, v, "step" if key == "loss" else "loss"))
            got = _read("parsers.hf_trainer", tmp_path, "trainer_state.json", text.encode())
            assert got is not None and {1, 2, 4} <= set(got.metrics.column("step").to_pylist()), (key, v)


def test_textlog_odd_values(tmp_path: Path) -> None:
    """Odd numbers in one stdout line: the other lines are kept."""
    for v in ("nan", "NaN", "inf", "-inf", "abc", "", "1e400", "null", "None", "9" * 400):
        text = "".join(f"step {s} | loss {1.0 + s:.4f} | lr 1.0e-04\n" for s in range(3))
        text += f"step 3 | loss {v} | lr 1.0e-04\n" + "step 4 | loss 5.0000 | lr 1.0e-04\n"
        got = _read("parsers.textlog", tmp_path, "train.log", text.encode())
        assert got is not None and {0, 1, 2, 4} <= set(got.metrics.column("step").to_pylist()), v


def test_hf_trainer_cut_keeps_complete_entries(tmp_path: Path) -> None:
    """A cut trainer_state.json keeps the log_history entries before the cut; trailing bytes are ignored."""
    hist = [{"loss": 3.0 - i / 10, "learning_rate": 1e-4, "step": 10 * i} for i in range(1, 9)]
    text = json.dumps({"epoch": 1.0, "log_history": hist, "global_step": 80}, indent=2).encode()
    ends = [text.index(b"}", text.index(b'"step": %d' % h["step"])) + 1 for h in hist]
    for cut in range(text.index(b"log_history") + 20, len(text) - 1, 5):
        got = _read("parsers.hf_trainer", tmp_path, "trainer_state.json", text[:cut])
        whole = {h["step"] for h, e in zip(hist, ends, strict=True) if e <= cut}
        assert got is not None and whole <= set(got.metrics.column("step").to_pylist()), cut
        assert _where(got.skipped, "trainer_state.json")
    got = _read("parsers.hf_trainer", tmp_path, "trainer_state.json", text + b"\x00garbage")
    assert got.metrics.num_rows == 2 * len(hist) and _where(got.skipped, "trainer_state.json") == [len(text)]


def test_mixed_types_for_one_key(tmp_path: Path) -> None:
    """One key with numbers, text, null, bools, lists: numbers read, text reported."""
    vals = ["1.5", '"2.5"', "null", "true", '"x"', "[3]", '{"m": 4}', "NaN", "7"]
    text = "".join(json.dumps({"step": i}).replace("}", f', "loss": {v}}}') + "\n" for i, v in enumerate(vals))
    got = _read("parsers.jsonl", tmp_path, "metrics.jsonl", text.encode())
    assert got is not None
    loss = {s: v for s, m, v in zip(got.metrics.column("step").to_pylist(), got.metrics.column("metric").to_pylist(),
                                     got.metrics.column("value").to_pylist(), strict=True) if m == "loss"}
    assert loss[0] == 1.5 and loss[1] == 2.5 and loss[2] is None and loss[8] == 7.0 and math.isnan(loss[7])
    assert any("not numbers" in s.reason for s in got.skipped)  # the text "x" is reported as lost
    text = "step,loss\n0,1.5\n1,abc\n2,\n3,nan\n4,7\n"
    got = _read("parsers.csv_metrics", tmp_path, "metrics.csv", text.encode())
    assert got is not None and {0, 3, 4} <= set(got.metrics.column("step").to_pylist())


# -- absurd length fields ------------------------------------------------------------------------------


def test_tfrecord_absurd_length(tmp_path: Path) -> None:
    """A length field of 2**63 (bad or valid CRC): no allocation, records kept, resync."""
    import tracemalloc

    data = _bases(None)[2][2]
    name = "events.out.tfevents.1.x"
    ends = [0, *_tb_ends(data)]
    at = ends[len(ends) // 2]
    for fix_crc in (False, True):
        for length in (1 << 63, (1 << 64) - 1, 1 << 40, 256 << 20):
            hdr = struct.pack("<Q", length)
            crc = struct.pack("<I", masked_crc32c(hdr)) if fix_crc else data[at + 8:at + 12]
            bad = data[:at] + hdr + crc + data[at + 12:]
            tracemalloc.start()
            got = _read("parsers.tensorboard", tmp_path, name, bad)
            peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
            assert peak < 32 << 20, f"{peak} bytes allocated for a length field of {length}"
            expected = _read("parsers.tensorboard", tmp_path, name, data[:at])
            _check_kept("parsers.tensorboard", expected, got, f"length {length}")
            assert at in _where(got.skipped, name)
            after = _read("parsers.tensorboard", tmp_path, name, data[:12] + data[ends[ends.index(at) + 1]:])
            # records after the bad header are found again (resynchronisation)
            assert len(_rows(got, False) & _rows(after, False)) >= len(_rows(after, False)) - 4


def test_wandb_absurd_chunk_length(tmp_path: Path) -> None:
    """A W&B chunk length past its block: earlier records kept, damage listed."""
    data = _bases(None)[3][2]
    ends = _wandb_ends(data)
    at = ends[len(ends) // 2]
    for length in (0xFFFF, 0x8000, 0):
        bad = data[:at + 4] + struct.pack("<H", length) + data[at + 6:]
        got = _read("parsers.wandb_run", tmp_path, "run-x.wandb", bad)
        expected = _read("parsers.wandb_run", tmp_path, "run-x.wandb", data[:at])
        _check_kept("parsers.wandb_run", expected, got, f"chunk length {length}")
        assert at in _where(got.skipped, "run-x.wandb")


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


_fuzz = settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck), database=None)


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
            assert res.exit_code in (0, 1, 2), res.output
            _one_line_error(res, strict=bool(strict))

    run()


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(hs.sampled_from(_CLI_FILES), hs.binary(max_size=300))
def test_fuzz_analyze_cli_random_bytes(name: str, data: bytes) -> None:
    """The analyze command over one random file: exit 0, 1 or 2, one-line errors."""
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        (Path(d) / name).write_bytes(data)
        res = _cli(["analyze", d, "-f", "json"])
    FIGURES[("cli", "inputs")] += 1
    assert res.exit_code in (0, 1, 2)
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


# -- checkpoints -------------------------------------------------------------------------------------------


class _Evil:
    def __init__(self, fn, args) -> None:  # noqa: ANN001
        self.fn, self.args = fn, args

    def __reduce__(self):  # noqa: ANN204
        return self.fn, self.args


def _evil_pt(path: Path, payload: object) -> None:
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("archive/data.pkl", pickle.dumps({"model": payload}, protocol=2))
        zf.writestr("archive/byteorder", "little")
        zf.writestr("archive/version", "3\n")


def test_hostile_pickles_run_nothing(tmp_path: Path) -> None:
    """Pickles reducing to os.system, exec, eval, Popen, popen are refused; nothing runs."""
    import builtins
    import subprocess

    from parsers.checkpoints import read_checkpoints

    marker = tmp_path / "pwned"
    cmd = f"touch {marker}"
    payloads = {
        "os.system": _Evil(os.system, (cmd,)),
        "builtins.exec": _Evil(builtins.exec, (f"open({str(marker)!r}, 'w').close()",)),
        "builtins.eval": _Evil(builtins.eval, (f"open({str(marker)!r}, 'w')",)),
        "subprocess.Popen": _Evil(subprocess.Popen, (["touch", str(marker)],)),
        "os.popen": _Evil(os.popen, (cmd,)),
    }
    ck = tmp_path / "run" / "ckpt" / "step_10"
    ck.mkdir(parents=True)
    for label, obj in payloads.items():
        path = ck / f"{label.replace('.', '_')}.pt"
        _evil_pt(path, obj)
        with pytest.raises(sc.CheckpointError, match="refused"):
            tc.load(path)
        assert not marker.exists(), label
    _, _, info, skipped = _read_ckpts(read_checkpoints, tmp_path / "run")
    assert not marker.exists()
    refused = [s for s in skipped if "refused" in s.reason]
    assert len(refused) == len(payloads), skipped


def _read_ckpts(fn, run: Path):  # noqa: ANN001, ANN202
    out = fn(run, "run")
    tensors, updates, info = out[0], out[1], out[2]
    skipped = out[3] if len(out) > 3 else info
    return tensors, updates, info, skipped


def _safetensors(tensors: dict[str, tuple[str, list[int], list[int]]], buf: bytes, extra: bytes = b"") -> bytes:
    head = json.dumps({k: {"dtype": d, "shape": s, "data_offsets": o} for k, (d, s, o) in tensors.items()}).encode()
    return struct.pack("<Q", len(head)) + head + extra + buf


def test_hostile_safetensors_refused(tmp_path: Path) -> None:
    """Out-of-range offsets no truncation explains and absurd header sizes are refused without a big allocation.

    Offsets past the end that a cut explains (the tensors tile the buffer from 0, the file is shorter) are
    read as a truncated file: the cut tensor is listed, nothing is allocated for it.
    """
    import tracemalloc

    path = tmp_path / "model.safetensors"
    buf = b"\x00" * 16
    hostile = {
        "begin past end": _safetensors({"w": ("F32", [0], [40, 40])}, buf),
        "hole then past end": _safetensors({"a": ("F32", [2], [0, 8]), "b": ("F32", [4], [16, 32])}, buf),
        "gap at start": _safetensors({"w": ("F32", [8], [8, 40])}, buf),
        "negative": _safetensors({"w": ("F32", [1], [-4, 0])}, buf),
        "reversed": _safetensors({"w": ("F32", [1], [8, 4])}, buf),
        "huge size mismatch": _safetensors({"w": ("F32", [4], [0, 1 << 42])}, buf),
        "shape overflow": _safetensors({"w": ("F32", [1 << 62, 1 << 62], [0, 16])}, buf),
        "size mismatch": _safetensors({"w": ("F32", [3], [0, 16])}, buf),
        "overlap": _safetensors({"a": ("F32", [2], [0, 8]), "b": ("F32", [2], [4, 12])}, buf),
        "overlap past end": _safetensors({"a": ("F32", [4], [0, 16]), "b": ("F32", [4], [8, 24])}, buf),
        "float offsets": _safetensors({"w": ("F32", [4], [0.0, 16.0])}, buf),
        "header 2^63": struct.pack("<Q", 1 << 63) + b"{}",
        "header 2^64-1": struct.pack("<Q", (1 << 64) - 1) + b"{}",
        "header past end": struct.pack("<Q", 1000) + b"{}",
        "header 99MB past end": struct.pack("<Q", 99_000_000) + b"{}",
        "not json": struct.pack("<Q", 4) + b"{abc",
        "not utf-8": struct.pack("<Q", 4) + b"{\xff\xfe}",
        "short": b"\x01\x02",
    }
    cut = {  # read as truncated: (tensors kept, tensors cut)
        "end past buffer": (_safetensors({"w": ("F32", [8], [0, 32])}, buf), [], ["w"]),
        "huge offset": (_safetensors({"w": ("F32", [1 << 40], [0, 1 << 42])}, buf), [], ["w"]),
        "second cut": (_safetensors({"a": ("F32", [2], [0, 8]), "b": ("F32", [4], [8, 24])}, buf), ["a"], ["b"]),
        "empty past end": (_safetensors({"a": ("F32", [4], [0, 16]), "b": ("F32", [4], [16, 32]),
                                         "e": ("F32", [0], [32, 32])}, buf), ["a"], ["b", "e"]),
    }
    for label, data in [*hostile.items(), *((k, v[0]) for k, v in cut.items())]:
        path.write_bytes(data)
        FIGURES[("parsers.safetensors_ckpt", "inputs")] += 1
        tracemalloc.start()
        if label in hostile:
            with pytest.raises(sc.CheckpointError):
                sc.read_header(path)
        else:
            h = sc.parse_header(path)
            kept, lost = cut[label][1:]
            assert h.truncated and [r.name for r in h.tensors] == kept and list(h.cut) == lost, label
            assert all(sc.tensor_stats(r)["numel"] == r.numel > 0 for r in h.tensors)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert peak < 16 << 20, (label, peak)


def _ckpt_files() -> list[Path]:
    d = SAMPLES / "ckpt_nonfinite_state" / "ckpt" / "step_100"
    return [d / "model.safetensors", d / "scheduler.pt", d / "optimizer.pt"]


def _ckpt_read_counted(mod_name: str, path: Path) -> None:
    """Read a checkpoint, counting the input and any crash (only CheckpointError may escape)."""
    FIGURES[(mod_name, "inputs")] += 1
    try:
        _ckpt_read(path)
    except sc.CheckpointError:
        pass
    except Exception:
        FIGURES[(mod_name, "crashes")] += 1
        raise


def _ckpt_read(path: Path) -> list:
    """Everything the checkpoint readers give for one file: tensor statistics, or raise CheckpointError."""
    if path.suffix == ".safetensors":
        refs, _, _ = sc.read_header(path)
    else:
        c = tc.classify(tc.read(path).obj)  # a cut or damaged torch file keeps its complete tensors
        refs = [r for _, r in c.params + c.other] + [r for o in c.optimizers for _, _, r in tc.optimizer_tensors(o)]
    return [sc.tensor_stats(r) for r in refs]


@pytest.mark.parametrize("src", _ckpt_files(), ids=lambda p: p.name)
def test_damaged_checkpoints(src: Path, tmp_path: Path) -> None:
    """Cut, flipped, padded: only CheckpointError escapes; an undamaged prefix is never misread."""
    mod_name = "parsers.safetensors_ckpt" if src.suffix == ".safetensors" else "parsers.torch_ckpt"
    data = src.read_bytes()
    path = tmp_path / src.name
    rng = random.Random(6)
    damaged = [data[:k] for k in _offsets(len(data), rng, dense=150)]
    for pos in rng.sample(range(len(data)), 150):
        bad = bytearray(data)
        bad[pos] ^= 0xFF
        damaged.append(bytes(bad))
    damaged += [data + b"\x00" * 100, b"junk" + data, b"", gzip.compress(data)]
    for bad in damaged:
        path.write_bytes(bad)
        _ckpt_read_counted(mod_name, path)


def _torch_refs(obj: object, where: str = "") -> dict[str, sc.TensorRef]:
    out: dict[str, sc.TensorRef] = {}
    if isinstance(obj, dict):
        for k, v in obj.items():
            out.update(_torch_refs(v, f"{where}.{k}" if where else str(k)))
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            out.update(_torch_refs(v, f"{where}[{i}]"))
    elif isinstance(obj, sc.TensorRef):
        out[where] = obj
    return out


def test_cut_torch_checkpoint_keeps_complete_tensors(tmp_path: Path) -> None:
    """A cut .pt keeps every tensor whose storage is whole, equal to the intact file's; the rest listed."""
    src = _ckpt_files()[2]
    data = src.read_bytes()
    full = {k: sc.tensor_stats(r) for k, r in _torch_refs(tc.read(src).obj).items()}
    path = tmp_path / src.name
    rng = random.Random(7)
    kept_some = 0
    for cut in _offsets(len(data), rng, dense=60):
        path.write_bytes(data[:cut])
        FIGURES[("parsers.torch_ckpt", "inputs")] += 1
        try:
            got = tc.read(path)
        except sc.CheckpointError as exc:
            assert "data.pkl" in str(exc) or cut < 4, (cut, exc)  # only a cut data.pkl refuses the file
            continue
        kept = {k: sc.tensor_stats(r) for k, r in _torch_refs(got.obj).items()}
        assert set(kept) <= set(full) and all(kept[k] == full[k] for k in kept), cut
        lost = set(full) - set(kept)
        assert cut == len(data) or (got.truncated and f"{path}:{cut}" == got.skipped[0].what), cut
        assert len(got.skipped) == (0 if cut == len(data) else 1 + len(lost)), cut
        kept_some += bool(kept)
    assert kept_some


@pytest.mark.parametrize("mod_name", ["parsers.safetensors_ckpt", "parsers.torch_ckpt"])
def test_fuzz_checkpoints(mod_name: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    """Random bytes as checkpoints: only CheckpointError escapes."""
    folder = tmp_path_factory.mktemp("ck")
    head = b"PK\x03\x04" if mod_name == "parsers.torch_ckpt" else b""
    name = "model.pt" if mod_name == "parsers.torch_ckpt" else "model.safetensors"

    @_fuzz
    @given(hs.binary(max_size=400), hs.booleans())
    def run(data: bytes, hdr: bool) -> None:
        if mod_name == "parsers.safetensors_ckpt" and hdr:
            data = struct.pack("<Q", len(data)) + data
        path = folder / name
        path.write_bytes((head if hdr else b"") + data)
        _ckpt_read_counted(mod_name, path)

    run()


def test_figures() -> None:
    """The closing note's figures (run with ``-s``): inputs tried, crashes and complete rows lost per parser."""
    mods = sorted({m for m, _ in FIGURES})
    for m in mods:
        print(f"{m:28} inputs {FIGURES[(m, 'inputs')]:6}  crashes {FIGURES[(m, 'crashes')]}  "
              f"complete rows lost {FIGURES[(m, 'lost')]}", file=sys.stderr)
    if GZIP_READ:
        print(f"gzip copies recognised: {GZIP_READ}", file=sys.stderr)


def test_gzip_compressed_logs_read_transparently(tmp_path: Path) -> None:
    """A gzip-compressed text log and CSV give the same rows as the plain files."""
    import gzip
    import shutil

    from parsers import csv_metrics, textlog

    src = Path(__file__).resolve().parents[1] / "sample_logs" / "lr_schedule_reset" / "train.log"
    if not src.is_file():
        pytest.skip("sample run missing")
    plain = tmp_path / "train.log"
    shutil.copy(src, plain)
    packed = tmp_path / "train.log.gz"
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    assert textlog.sniff(packed)
    a, b = textlog.read(plain, tmp_path), textlog.read(packed, tmp_path)
    assert a.metrics.num_rows == b.metrics.num_rows > 0
    assert a.metrics.column("value").to_pylist() == b.metrics.column("value").to_pylist()
    csv_plain = tmp_path / "history.csv"
    csv_plain.write_text("_step,loss\n1,2.5\n2,2.4\n")
    csv_packed = tmp_path / "history.csv.gz"
    csv_packed.write_bytes(gzip.compress(csv_plain.read_bytes()))
    assert csv_metrics.sniff(csv_packed)
    assert csv_metrics.read(csv_packed, tmp_path).metrics.column("value").to_pylist() == [2.5, 2.4]
