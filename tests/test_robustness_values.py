"""Odd values where numbers belong, mixed types for one key, absurd length fields (issue 8); the figures."""

from __future__ import annotations

import json
import math
import struct
import sys
from pathlib import Path

from robustness_helpers import (
    FIGURES,
    GZIP_READ,
    _bases,
    _check_kept,
    _read,
    _rows,
    _tb_ends,
    _wandb_ends,
    _where,
)

from parsers.tensorboard import masked_crc32c

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


def test_figures() -> None:
    """The closing note's figures (run with ``-s``): inputs tried, crashes and complete rows lost per parser."""
    mods = sorted({m for m, _ in FIGURES})
    for m in mods:
        print(f"{m:28} inputs {FIGURES[(m, 'inputs')]:6}  crashes {FIGURES[(m, 'crashes')]}  "
              f"complete rows lost {FIGURES[(m, 'lost')]}", file=sys.stderr)
    if GZIP_READ:
        print(f"gzip copies recognised: {GZIP_READ}", file=sys.stderr)

