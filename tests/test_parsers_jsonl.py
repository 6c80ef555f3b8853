"""parsers.jsonl: NaN/Infinity/null, nesting, mixed keys, damaged lines, resumes, step and time keys."""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path

import pytest

from parsers import jsonl


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def _rows(res) -> list[tuple[str, int, float | None, int]]:
    t = res.metrics
    return list(zip(t.column("tag").to_pylist(), t.column("step").to_pylist(), t.column("value").to_pylist(),
                    t.column("segment").to_pylist(), strict=True))


def test_sniff(tmp_path):
    """By extension, or by a JSON first line with a step key; never trainer_state.json."""
    assert jsonl.sniff(_write(tmp_path / "m.jsonl", "garbage\n"))
    assert jsonl.sniff(_write(tmp_path / "metrics.json", '\n{"step": 1, "loss": 2}\n'))
    assert jsonl.sniff(_write(tmp_path / "train.log", '{"iteration": 1, "loss": 2}\n'))
    assert not jsonl.sniff(_write(tmp_path / "train2.log", "iteration 1 | loss 2\n"))
    assert not jsonl.sniff(_write(tmp_path / "config.json", '{\n  "step": 1\n}\n'))
    assert not jsonl.sniff(_write(tmp_path / "trainer_state.json", '{"step": 1, "log_history": []}\n'))
    assert not jsonl.sniff(_write(tmp_path / "summary.json", '{"loss": 2}\n'))
    assert not jsonl.sniff(tmp_path / "missing.json")


def test_nan_infinity_null_and_types(tmp_path):
    """NaN and +-Infinity kept, null is null, bools 0/1, strings and lists ignored."""
    p = _write(tmp_path / "m.jsonl", "\n".join([
        '{"step": 1, "loss": NaN, "grad_norm": Infinity, "lr": -Infinity, "tokens": null}',
        '{"step": 2, "loss": 1.5, "overflow": true, "phase": "train", "hist": [1, 2], "note": ""}',
    ]) + "\n")
    res = jsonl.read(p, tmp_path)
    rows = {(t, s): v for t, s, v, _ in _rows(res)}
    assert math.isnan(rows[("loss", 1)])
    assert rows[("grad_norm", 1)] == math.inf and rows[("lr", 1)] == -math.inf
    assert rows[("tokens", 1)] is None  # JSON null stays null
    assert rows[("overflow", 2)] == 1.0 and rows[("loss", 2)] == 1.5
    assert ("phase", 2) not in rows and ("hist", 2) not in rows and ("step", 1) not in rows
    assert res.skipped == () and res.meta["step_key"] == "step"
    assert res.metrics.column("value").null_count == 1


def test_nested_and_mixed_keys(tmp_path):
    """Nested objects are flattened with '/'; keys may differ between lines; names are canonicalised."""
    p = _write(tmp_path / "m.jsonl", "\n".join([
        '{"step": 10, "train": {"loss": 2.0, "grad_norm": 1.0}, "optim": {"lr": 0.1, "groups": {"g0": 0.2}}}',
        '{"step": 10, "eval": {"loss": 2.5}}',
        '{"step": 20, "train": {"loss": 1.8}}',
    ]) + "\n")
    res = jsonl.read(p, tmp_path)
    t = res.metrics
    tags = t.column("tag").to_pylist()
    assert tags == ["train/loss", "train/grad_norm", "optim/lr", "optim/groups/g0", "eval/loss", "train/loss"]
    assert t.column("metric").to_pylist()[:3] == ["loss", "grad_norm", "lr"]
    assert t.column("metric").to_pylist()[4] == "eval_loss"
    assert set(t.column("segment").to_pylist()) == {0}  # a second line at the same step with new keys


def test_module_records_get_a_suffix(tmp_path):
    """Per-module debug records: the module name becomes a metric suffix."""
    p = _write(tmp_path / "debug.jsonl", "\n".join(
        json.dumps({"step": s, "module": m, "absmax_fp32": v, "fp16_finite": v < 65504})
        for s in (1, 2) for m, v in (("enc.wo", 46337.0 * s), ("dec.wo", 100.0))) + "\n")
    res = jsonl.read(p, tmp_path)
    rows = {(t, s): v for t, s, v, _ in _rows(res)}
    assert rows[("absmax_fp32/enc.wo", 2)] == 92674.0 and rows[("fp16_finite/enc.wo", 2)] == 0.0
    assert rows[("absmax_fp32/dec.wo", 1)] == 100.0
    assert set(res.metrics.column("segment").to_pylist()) == {0}
    assert "absmax_fp32/enc.wo" in res.metrics.column("metric").to_pylist()


def test_half_written_last_line_and_bad_middle_line(tmp_path):
    """The torn last line is dropped and reported; a bad line in the middle is skipped by number."""
    p = _write(tmp_path / "logs" / "m.jsonl",
               '{"step": 1, "loss": 3.0}\n{"step": 2, "loss": \n{"step": 3, "loss": 2.0}\n[1, 2]\n'
               '{"step": 4, "loss": 1.5}\n{"step": 5, "lo')
    res = jsonl.read(p, tmp_path)
    assert [(s, v) for _, s, v, _ in _rows(res)] == [(1, 3.0), (3, 2.0), (4, 1.5)]
    assert [s.what for s in res.skipped] == ["logs/m.jsonl:2", "logs/m.jsonl:4", "logs/m.jsonl:6"]
    assert "half-written" in res.skipped[2].reason and "not valid JSON" in res.skipped[0].reason
    assert res.meta["bad_lines"] == 2


def test_last_line_without_newline_but_complete_is_kept(tmp_path):
    """A complete last record without a trailing newline is a record, not damage."""
    p = _write(tmp_path / "m.jsonl", '{"step": 1, "loss": 3.0}\n{"step": 2, "loss": 2.0}')
    res = jsonl.read(p, tmp_path)
    assert len(_rows(res)) == 2 and res.skipped == ()


def test_appended_resume_starts_segments(tmp_path):
    """Steps going back, or the same metric again at the highest step, open a new local segment."""
    lines = [{"step": s, "loss": 1.0 / (s + 1)} for s in range(0, 10)]
    lines += [{"step": s, "loss": 2.0} for s in range(5, 8)]  # resumed from step 5
    lines += [{"step": 7, "loss": 3.0}]  # resumed exactly at the last step
    lines += [{"step": 7, "eval_loss": 3.0}, {"step": 8, "loss": 1.0}]
    res = jsonl.read(_write(tmp_path / "m.jsonl", "\n".join(map(json.dumps, lines)) + "\n"), tmp_path)
    segs = [g for _, _, _, g in _rows(res)]
    assert segs == [0] * 10 + [1] * 3 + [2, 2, 2]


def test_step_key_priority_and_running_index(tmp_path):
    """The first step key present is used; a file with no step key at all is numbered 0, 1, ..."""
    p = _write(tmp_path / "a.jsonl", '{"global_step": 5, "iteration": 9, "loss": 1}\n')
    res = jsonl.read(p, tmp_path)
    assert res.meta["step_key"] == "global_step"
    assert _rows(res) == [("iteration", 5, 9.0, 0), ("loss", 5, 1.0, 0)]
    res = jsonl.read(_write(tmp_path / "b.jsonl", '{"loss": 1}\n{"loss": 2}\n{"loss": 3}\n'), tmp_path)
    assert [s for _, s, _, _ in _rows(res)] == [0, 1, 2] and "line index" in res.meta["step_source"]
    p = _write(tmp_path / "c.jsonl", '{"loss": 1}\n{"step": 3, "loss": 2}\n{"note": 1}\n')
    res = jsonl.read(p, tmp_path)
    assert [s for _, s, _, _ in _rows(res)] == [3] and res.meta["lines_without_step"] == 2
    assert "without a step key" in res.skipped[0].reason


def test_wall_time_keys(tmp_path):
    """wall_time/time/timestamp/_timestamp as epoch seconds, milliseconds or ISO strings."""
    p = _write(tmp_path / "m.jsonl", "\n".join([
        '{"step": 1, "loss": 1, "_timestamp": 1700000000.5}',
        '{"step": 2, "loss": 1, "timestamp": 1700000001000}',
        '{"step": 3, "loss": 1, "time": "2023-11-14T22:13:22Z"}',
        '{"step": 4, "loss": 1, "time": 0.35}',
        '{"step": 5, "loss": 1}',
    ]) + "\n")
    res = jsonl.read(p, tmp_path)
    t = res.metrics.filter(res.metrics.column("tag").to_numpy(zero_copy_only=False) == "loss")
    assert t.column("wall_time").to_pylist() == [1700000000.5, 1700000001.0, 1700000002.0, None, None]
    assert "time" in res.metrics.column("tag").to_pylist()  # a small "time" is a step time, kept as metric


def test_gzip_and_truncated_gzip(tmp_path):
    """.jsonl.gz is read; a gzip stream cut short keeps what was decoded and reports it."""
    body = "".join(json.dumps({"step": s, "loss": s * 0.5}) + "\n" for s in range(2000)).encode()
    p = tmp_path / "m.jsonl.gz"
    p.write_bytes(gzip.compress(body))
    assert jsonl.sniff(p) and jsonl.read(p, tmp_path).metrics.num_rows == 2000
    p.write_bytes(gzip.compress(body)[:-40])
    res = jsonl.read(p, tmp_path)
    assert 0 < res.metrics.num_rows <= 2000 and any("abruptly" in s.reason for s in res.skipped)


def test_many_bad_lines_are_summarised(tmp_path):
    """Bad lines are listed one by one up to a limit, then summarised."""
    res = jsonl.read(_write(tmp_path / "m.jsonl", "oops\n" * 50 + '{"step": 1, "loss": 1}\n'), tmp_path)
    assert len(res.skipped) == 21 and "30 more" in res.skipped[-1].reason and res.meta["bad_lines"] == 50


def test_t5_debug_case(cases_dir):
    """br08's per-module absmax log reads as absmax_fp32/<module> with the NaN tail kept."""
    root = cases_dir / "br08_t5_fp16_ff_overflow"
    p = root / "t5-base-summ" / "debug_wo_absmax.jsonl"
    if not p.exists():
        pytest.skip("br08 debug log not present")
    res = jsonl.read(p, root)
    rows = [(t, s, v) for t, s, v, _ in _rows(res) if t.startswith("absmax_fp32/")]
    assert rows and all(t == "absmax_fp32/encoder.block.7.layer.1.DenseReluDense.wo" for t, _, _ in rows)
    assert math.isnan(rows[-1][2]) and res.skipped == ()


def test_bom_and_huge_numbers(tmp_path):
    """A UTF-8 BOM is accepted; an integer beyond float range reads as inf; a step beyond int64 is no step."""
    p = tmp_path / "train.log"
    huge_int, huge_step = b"9" * 400, b"1" + b"0" * 30
    bom = b"\xef\xbb\xbf"
    p.write_bytes(bom + b'{"step": 1, "tokens": ' + huge_int + b'}\n{"step": ' + huge_step + b', "x": 2}\n')
    assert jsonl.sniff(p)
    res = jsonl.read(p, tmp_path)
    assert _rows(res) == [("tokens", 1, math.inf, 0)] and res.meta["lines_without_step"] == 1
