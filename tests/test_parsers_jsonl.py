"""parsers.jsonl: NaN/Infinity/null, nesting, mixed keys, damaged lines, resumes, step and time keys."""

from __future__ import annotations

import gzip
import json
import math
import random
from pathlib import Path

import numpy as np
import pyarrow.compute as pc
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as hs

from parsers import _jsonl_segments, jsonl


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
    assert jsonl.sniff(_write(tmp_path / "metrics.json", '\n{"step": 1, "loss": 2}\n{"step": 2, "loss": 1}\n'))
    assert not jsonl.sniff(_write(tmp_path / "final.json", '{"step": 1, "loss": 2}\n'))  # one object: a summary
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


# -- the polars fast path ("auto") against the per-line path ("python") --------------------------------


def _table_rows(res) -> list[tuple]:
    """Every metrics row as a tuple, NaN replaced by a marker so that rows compare equal."""
    cols = res.metrics.to_pydict()
    return [tuple("NaN" if isinstance(v, float) and math.isnan(v) else v for v in row)
            for row in zip(*cols.values(), strict=True)]


def _assert_same(fast, slow) -> None:
    """Same table (schema, rows in order), same damage, same meta but for the engine's own counters."""
    assert fast.metrics.schema == slow.metrics.schema
    assert _table_rows(fast) == _table_rows(slow)
    assert fast.skipped == slow.skipped
    drop = {"engine", "python_lines"}
    assert {k: v for k, v in fast.meta.items() if k not in drop} == {
        k: v for k, v in slow.meta.items() if k not in drop}


MIXED = [
    '{"step": 0, "loss": NaN, "grad_norm": Infinity, "lr": -Infinity, "tokens": null}',
    '{"step": 1, "train": {"loss": 2.5, "acc": {"top1": 0.5}}, "loss_scale": 65536, "overflow": true}',
    '{"step": 2, "loss": "3.5", "phase": "train", "note": ""}',
    '{"step": 3, "loss": [1, 2], "hist": {"bins": [1, 2]}}',
    '{"step": 4, "loss": {"m": 4}}',
    'garbage',
    '{"step": 5, "loss": 1e400, "big": 123456789012345678901234567890, "neg": -0.0}',
    '{"step": 6, "a": 1, "b": 2, "a": 3}',
    '{"step": 7, "module": "enc.wo", "absmax": 46337.5}',
    '{"step": 5, "loss": 2.0}',
    '{"step": "8", "loss": 1.0, "s": "\\ud800"}',
    '{"step": 9.0, "loss": 1.0, "_timestamp": 1700000000.5, "_runtime": 10}',
    '{"step": 10, "loss": 1.0, "_runtime": 12.25}',
    '{"step" : 11, "loss" : 0.5}',
    '{"step": 12, "loss": 0.25, "time": "2023-11-14T22:13:22Z", "x/y": 1, "x": {"y": 2}}',
    '{"step": 13, "loss": 7, "step_time": 0.35, "time": 0.35, "eval": {"loss": 3.0}}',
    '[1, 2]',
    '{"step": 13, "loss": 7}',
    '{"global_step": 14, "loss": 9007199254740993, "lr": 1.5e-07}',
]


def _mixed_file(path: Path, repeats: int, crlf: bool = False) -> Path:
    """MIXED lines spread among plain trainer lines, with a torn last line."""
    lines = []
    for r in range(repeats):
        base = 100 * r
        lines += [json.dumps({"step": base + 20 + i, "loss": 1.0 / (i + 1), "lr": 3e-4, "grad_norm": 0.5 * i,
                              "loss_scale": 65536.0, "tokens": 4096 * i, "train": {"loss": 2.0, "ppl": 7.5}})
                  for i in range(60)]
        lines += MIXED
    end = "\r\n" if crlf else "\n"
    path.write_bytes(("\ufeff" + end.join(lines) + end + '{"step": 99999, "lo').encode())
    return path


@pytest.mark.parametrize("chunk", [1 << 20, 4096, 700])
@pytest.mark.parametrize("crlf", [False, True])
def test_fast_path_equals_per_line_path(tmp_path, chunk, crlf):
    """NaN/Infinity/null/nested/mixed-type/garbage/torn lines: both engines give the same table."""
    p = _mixed_file(tmp_path / "m.jsonl", 8, crlf)
    fast = jsonl.read(p, tmp_path, engine="auto", chunk_bytes=chunk)
    slow = jsonl.read(p, tmp_path, engine="python", chunk_bytes=chunk)
    _assert_same(fast, slow)
    lines = p.read_bytes().count(b"\n") + 1
    assert slow.meta["python_lines"] == lines
    assert fast.meta["python_lines"] < lines / 2  # most lines went through polars
    assert any("half-written" in s.reason for s in fast.skipped)
    assert fast.metrics.column("value").null_count == slow.metrics.column("value").null_count > 0
    if chunk == 1 << 20:
        _assert_same(fast, jsonl.read(p, tmp_path, engine="auto", chunk_bytes=700))  # blocks do not matter


def test_values_kept_exactly_by_the_fast_path(tmp_path):
    """The values polars reads are the per-line path's: ints exact, floats as logged, dup keys last wins."""
    lines = [json.dumps({"step": s, "loss": 1.0 / 3 + s, "tokens": (1 << 53) + s, "flag": s % 2 == 0})
             for s in range(300)]
    lines += ['{"step": 300, "a": 1, "a": 2}', '{"step": 301, "late": 5, "loss": 0.1}']
    p = _write(tmp_path / "m.jsonl", "\n".join(lines) + "\n")
    fast = jsonl.read(p, tmp_path)
    _assert_same(fast, jsonl.read(p, tmp_path, engine="python"))
    rows = {(t, s): v for t, s, v, _ in _rows(fast)}
    assert rows[("loss", 7)] == 1.0 / 3 + 7 and rows[("tokens", 7)] == float((1 << 53) + 7)
    assert rows[("flag", 4)] == 1.0 and rows[("a", 300)] == 2.0 and rows[("late", 301)] == 5.0
    assert fast.meta["python_lines"] <= 2


def test_runtime_is_wall_time_not_a_metric(tmp_path):
    """W&B ``_runtime`` never becomes a row; run start + _runtime is the wall time of a line without one."""
    p = _write(tmp_path / "m.jsonl", "\n".join([
        '{"_step": 0, "loss": 3.0, "_runtime": 1.5}',
        '{"_step": 1, "loss": 2.0, "_timestamp": 1700000010.0, "_runtime": 10.0}',
        '{"_step": 2, "loss": 1.0, "_runtime": 12.5, "_wandb": {"runtime": 12}}',
    ]) + "\n")
    for engine in jsonl.ENGINES:
        res = jsonl.read(p, tmp_path, engine=engine)
        assert res.metrics.column("tag").to_pylist() == ["loss"] * 3
        assert res.metrics.column("wall_time").to_pylist() == [None, 1700000010.0, 1700000012.5]
        assert res.meta["run_start"] == 1700000000.0 and "_runtime" in res.meta["runtime_key"]


def test_types_that_change_between_blocks(tmp_path):
    """A key that turns from int to float, or from a label to a number, in a later block reads the same."""
    lines = [json.dumps({"step": s, "scale": 65536, "phase": "warmup", "eval": {"n": 1}}) for s in range(200)]
    lines += [json.dumps({"step": s, "scale": 0.5 * s, "phase": s, "eval": {"n": 2.5, "m": True}})
              for s in range(200, 400)]
    p = _write(tmp_path / "m.jsonl", "\n".join(lines) + "\n")
    fast = jsonl.read(p, tmp_path, chunk_bytes=2000)
    _assert_same(fast, jsonl.read(p, tmp_path, engine="python"))
    rows = {(t, s): v for t, s, v, _ in _rows(fast)}
    assert rows[("scale", 10)] == 65536.0 and rows[("scale", 300)] == 150.0 and rows[("phase", 300)] == 300.0
    assert rows[("eval/m", 399)] == 1.0 and ("phase", 10) not in rows


def test_gzip_engines_agree(tmp_path):
    """A .jsonl.gz, whole or cut short, reads the same through both engines."""
    body = _mixed_file(tmp_path / "m.jsonl", 4).read_bytes()
    p = tmp_path / "m.jsonl.gz"
    for data in (gzip.compress(body), gzip.compress(body)[:-30]):
        p.write_bytes(data)
        fast = jsonl.read(p, tmp_path, chunk_bytes=1000)
        _assert_same(fast, jsonl.read(p, tmp_path, engine="python"))
        assert fast.metrics.num_rows > 0


def test_unknown_engine_is_refused(tmp_path):
    """A typo in the engine name is an error, not a silent default."""
    with pytest.raises(ValueError, match="engine"):
        jsonl.read(_write(tmp_path / "m.jsonl", '{"step": 1}\n'), tmp_path, engine="fast")


def _segments_reference(records: list[tuple[int, list[str]]]) -> list[int]:
    """The sequential segment rule, one record at a time (records: (step, tags) with >= 1 tag)."""
    out, seg, top, at_top = [], 0, None, set()
    for step, tags in records:
        if top is not None and (step < top or (step == top and at_top & set(tags))):
            seg, top, at_top = seg + 1, None, set()
        if top is None or step > top:
            top, at_top = step, set()
        at_top |= set(tags)
        out += [seg] * len(tags)
    return out


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(hs.lists(hs.tuples(hs.integers(0, 4), hs.lists(hs.sampled_from("abcd"), min_size=1, max_size=3, unique=True)),
                max_size=30),
       hs.lists(hs.integers(1, 8), max_size=6))
def test_segments_match_the_sequential_rule(records, cuts):
    """The vectorised segmenter, fed block by block, equals the one-record-at-a-time rule."""
    seg = _jsonl_segments._Segmenter()
    got, i = [], 0
    for size in [*cuts, len(records)]:
        part = records[i:i + size]
        i += len(part)
        if part:
            steps = np.array([s for s, _ in part], np.int64)
            counts = np.array([len(t) for _, t in part], np.int64)
            tags = np.array([ord(c) for _, t in part for c in t], np.int32)
            got += seg(steps, counts, tags).tolist()
    assert got == _segments_reference(records)


_KEYS = hs.sampled_from(["step", "global_step", "loss", "lr", "train", "module", "time", "_timestamp", "_runtime",
                         "x/y", "x", "", "a"])
_SCALARS = hs.one_of(
    hs.none(), hs.booleans(), hs.integers(-(1 << 70), 1 << 70), hs.integers(0, 9),
    hs.floats(allow_nan=True, allow_infinity=True), hs.floats(1e8, 2e12), hs.text(max_size=5),
    hs.sampled_from(["4.5", "NaN", " 7 ", "1_0", "true", "[1]", "\x1c5", "2023-11-14T22:13:22Z", "enc.wo", "-3"]),
    hs.lists(hs.integers(0, 3), max_size=2))
_VALUES = hs.recursive(_SCALARS, lambda c: hs.dictionaries(_KEYS, c, max_size=3), max_leaves=6)
_RECORDS = hs.builds(lambda s, rest: {"step": s, **rest} if s is not None else rest,
                     hs.one_of(hs.none(), hs.integers(0, 6), hs.sampled_from([2.0, "3", 1e30])),
                     hs.dictionaries(_KEYS, _VALUES, max_size=5))


def _dup(pair: tuple[dict, dict]) -> str:
    a, b = (json.dumps(x) for x in pair)
    return a[:-1] + ", " + b[1:] if len(a) > 2 and len(b) > 2 else a


_FINITE = hs.floats(allow_nan=False, allow_infinity=False)
_PLAIN = hs.fixed_dictionaries(  # what polars reads: one type per key, keys that come and go, nesting
    {"step": hs.integers(0, 6)},
    optional={"loss": _FINITE, "lr": _FINITE | hs.integers(0, 3), "tokens": hs.integers(-(1 << 62), 1 << 62),
              "flag": hs.booleans(), "module": hs.sampled_from(["enc.wo", "dec", ""]),
              "train": hs.fixed_dictionaries({}, optional={"loss": _FINITE, "acc": hs.integers(0, 9)}),
              "_timestamp": hs.floats(1e8, 2e12), "_runtime": hs.floats(0, 1e4), "x/y": hs.integers(0, 9),
              "x": hs.fixed_dictionaries({}, optional={"y": hs.integers(0, 9)}),
              "time": hs.just("2023-11-14T22:13:22Z")})
_LINES = hs.one_of(
    _PLAIN.map(json.dumps), _PLAIN.map(json.dumps), _PLAIN.map(json.dumps), _PLAIN.map(json.dumps),
    _RECORDS.map(json.dumps), _RECORDS.map(json.dumps),
    _RECORDS.map(lambda r: json.dumps(r, separators=(",", ":"))),
    _RECORDS.map(lambda r: json.dumps(r, separators=(", ", " : "))),
    hs.tuples(_RECORDS, _RECORDS).map(_dup),
    hs.sampled_from(["", "  ", "garbage", "[1, 2]", "{", '{"step": 1, "loss": ', "null", "{}", '{"step": 1} x',
                     '{"step": 2, "s": "\\ud800"}', '{"step": 2, "loss": 1e999}']),
)


@settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(hs.lists(_LINES, max_size=40), hs.sampled_from(["\n", "\r\n"]), hs.booleans(),
       hs.sampled_from([64, 333, 1 << 20]), hs.binary(max_size=6))
@example(['{"train": {"global_step": 0}}'], "\n", False, 64, b"")  # a nested step key only (found by this test)
def test_engines_agree_on_generated_lines(tmp_path_factory, lines, end, torn, chunk, junk):
    """Property: on any mix of lines both engines give the same table, damage and meta."""
    body = end.join(lines).encode() + (b"" if torn else end.encode())
    if junk:
        body += b"\n" + junk + b"\n"
    p = tmp_path_factory.mktemp("eq") / "m.jsonl"
    p.write_bytes(body * 3)  # repeated: steps go back, keys come back
    _assert_same(jsonl.read(p, p.parent, chunk_bytes=chunk), jsonl.read(p, p.parent, engine="python"))


_SPECIAL = hs.sampled_from(['{"step": 3, "loss": NaN, "lr": Infinity}', '{"step": 4, "loss": null}', "garbage", "",
                            '{"step": 5, "loss": 1.5, "loss": 2.5}', '{"step": 2, "tokens": 99999999999999999999999}',
                            '{"step" : 1, "lr" : 0.5}', '{"step": 6, "loss": "2.5"}', '{"step": 1, "module": 7}'])


@settings(max_examples=80, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(hs.lists(_PLAIN.map(json.dumps) | _PLAIN.map(json.dumps) | _PLAIN.map(json.dumps) | _SPECIAL, max_size=60),
       hs.sampled_from([200, 1500, 1 << 20]))
def test_engines_agree_on_mostly_plain_lines(tmp_path_factory, lines, chunk):
    """Property: trainer-like lines with a few special ones; most go through polars, the table is the same."""
    p = tmp_path_factory.mktemp("plain") / "m.jsonl"
    p.write_bytes(("\n".join(lines) + "\n").encode() * 2)
    _assert_same(jsonl.read(p, p.parent, chunk_bytes=chunk), jsonl.read(p, p.parent, engine="python"))


@pytest.mark.parametrize("engine", ["auto", "python"])
@pytest.mark.parametrize("depth", [900, 100_000])
def test_deeply_nested_line_is_one_skip(tmp_path: Path, engine: str, depth: int) -> None:
    """A line nested beyond what json decodes is one Skip with its line number; the other lines are kept.

    One that decodes is flattened at any depth. Such a line used to fail the whole file.
    """
    lines = [json.dumps({"step": i, "loss": 1.0 / (i + 1)}) for i in range(50)]
    lines.insert(20, '{"step": 100, "x": ' + '{"a": ' * depth + "1" + "}" * depth + "}")
    p = tmp_path / "metrics.jsonl"
    p.write_text("\n".join(lines) + "\n")
    res = jsonl.read(p, tmp_path, engine=engine)
    assert res.metrics.filter(pc.equal(res.metrics["metric"], "loss")).num_rows == 50
    if depth > 10_000:
        assert [s.what for s in res.skipped] == ["metrics.jsonl:21"] and "deeply" in res.skipped[0].reason
    else:
        assert not res.skipped and res.metrics.filter(pc.equal(res.metrics["step"], 100)).num_rows == 1


def test_brackets_newlines_and_stars_are_told_apart(tmp_path: Path) -> None:
    """The scan finds newlines and brackets in one pass ('*' shares their low bits).

    A line nested 700 deep in lists (polars would crash on it) and one with 66 brackets go through the
    per-line path, '*' in keys and text changes nothing, and both engines give the same table.
    """
    lines = [json.dumps({"step": i, "loss*": 1.0 / (i + 1), "note": "**", "train": {"a": i}}) for i in range(200)]
    lines[50] = '{"step": 50, "x": ' + "[" * 700 + "1" + "]" * 700 + ', "loss*": 0.5}'
    lines[60] = json.dumps({"step": 60, "loss*": 0.25, "deep": [[[1]]] * 32})  # 66 brackets
    p = tmp_path / "metrics.jsonl"
    p.write_text("\n".join(lines) + "\n")
    fast = jsonl.read(p, tmp_path, chunk_bytes=4096)
    _assert_same(fast, jsonl.read(p, tmp_path, engine="python"))
    assert fast.meta["python_lines"] == 2
    assert fast.metrics.filter(pc.equal(fast.metrics["tag"], "loss*")).num_rows == 200


@pytest.mark.parametrize("width", [2, 80])
def test_newlines_of_short_and_long_lines(width: int) -> None:
    """The scan's newline offsets are numpy's on short lines and the per-line byte search's on long ones."""
    from parsers._jsonl_scan import _newlines

    rng = random.Random(width)
    for _ in range(20):
        parts = [json.dumps({f"k{j}": rng.random() for j in range(rng.randint(0, width))})
                 for _ in range(rng.randint(0, 300))]
        buf = ("\n".join(parts) + rng.choice(["", "\n", "\n\n"])).encode()
        arr = np.frombuffer(buf, np.uint8)
        assert np.array_equal(_newlines(buf, arr, np.empty(len(buf), bool)), np.flatnonzero(arr == 10))
    buf = b"x" * 300_000 + b"\n" + b"{}\n" * 200_000  # long lines in the sample, then short ones: numpy for the rest
    arr = np.frombuffer(buf, np.uint8)
    assert np.array_equal(_newlines(buf, arr, np.empty(len(buf), bool)), np.flatnonzero(arr == 10))


@pytest.mark.parametrize("chunk", [8192, 1 << 20])
def test_engines_agree_on_wide_lines(tmp_path: Path, chunk: int) -> None:
    """Wide records (60 metrics, ~2 KB a line: newlines found per line) with odd lines among them."""
    rng = random.Random(5)
    lines = [json.dumps({"step": i, **{f"layers/{j}/grad_norm": rng.random() for j in range(60)}}) for i in range(300)]
    lines[7] = lines[7].replace("0.", "NaN, \"x\": 0.", 1)
    lines[40] = lines[40][:-300]  # cut
    lines[41] = ""
    lines[90] = lines[90] + "\r"
    lines[150] = "garbage " + lines[150]
    lines[151] = lines[151].replace('"layers/3/grad_norm"', '"layers/2/grad_norm"')  # a duplicate key
    p = tmp_path / "metrics.jsonl"
    p.write_text("\n".join(lines) + "\n")
    fast = jsonl.read(p, tmp_path, chunk_bytes=chunk)
    _assert_same(fast, jsonl.read(p, tmp_path, engine="python"))
    assert fast.meta["python_lines"] >= 4 and fast.meta["records"] >= 296


@pytest.mark.parametrize("where", [3, 120, 199])
@pytest.mark.parametrize("key", ["train", "x"])
def test_objects_nested_too_deep_for_polars_inference(tmp_path: Path, where: int, key: str) -> None:
    """Objects nested 600 deep: polars crashes inferring their type (a segfault), not reading them by schema.

    The nesting guard runs only before a read that infers. The line sits in the first block (inferred),
    in a later one (read with the carried schema, where ``train`` is a known struct and ``x`` an unknown
    key), or at the end; both engines agree.
    """
    lines = [json.dumps({"step": i, "loss": 1.0 / (i + 1), "train": {"a": i}}) for i in range(200)]
    lines[where] = f'{{"step": {where}, "{key}": ' + '{"a": ' * 600 + "1" + "}" * 600 + ', "loss": 0.5}'
    p = tmp_path / "metrics.jsonl"
    p.write_text("\n".join(lines) + "\n")
    for chunk in (4096, 1 << 20):
        fast = jsonl.read(p, tmp_path, chunk_bytes=chunk)
        _assert_same(fast, jsonl.read(p, tmp_path, engine="python"))
        assert fast.meta["python_lines"] == 1
        assert fast.metrics.filter(pc.equal(fast.metrics["tag"], "loss")).num_rows == 200


@pytest.mark.parametrize("engine", jsonl.ENGINES)
def test_overlong_line_is_listed_with_its_line_number(tmp_path, monkeypatch, engine) -> None:
    """An overlong line in the middle of a file is listed with its own line number; the rest is read."""
    from parsers import _jsonl_blocks

    monkeypatch.setattr(_jsonl_blocks, "MAX_LINE_BYTES", 1000)
    lines = [json.dumps({"step": s, "loss": 1.0 / (s + 1)}) for s in range(1, 40)]
    lines[24] = json.dumps({"step": 25, "loss": "x" * 5000})
    p = tmp_path / "metrics.jsonl"
    p.write_text("\n".join(lines) + "\n")
    r = jsonl.read(p, tmp_path, engine=engine, chunk_bytes=256)
    assert [s.what for s in r.skipped] == ["metrics.jsonl:25"]
    assert "bytes" in r.skipped[0].reason
    steps = r.metrics.column("step").to_pylist()
    assert 25 not in steps and steps == [s for s in range(1, 40) if s != 25]


@pytest.mark.parametrize("engine", jsonl.ENGINES)
def test_step_key_by_rule_then_epoch_then_line_index(tmp_path, engine, monkeypatch) -> None:
    """Any case of a step key; an epoch or sample count when no record has one; the line index last."""
    from parsers._io import STEP_KEY

    def read(rows: list[dict], name: str):
        p = tmp_path / name
        p.write_text("".join(json.dumps(r) + "\n" for r in rows))
        r = jsonl.read(p, tmp_path, engine=engine)
        return r, r.metrics.column("step").to_pylist(), set(r.metrics.column("tag").to_pylist())

    r, steps, tags = read([{"Step": 10 * s, "loss": 1.0} for s in range(5)], "a.jsonl")
    assert r.meta["step_key"] == "Step" and steps == [0, 10, 20, 30, 40] and tags == {"loss"}
    r, steps, tags = read([{"EPOCH": e, "TRAIN_LOSS": 1.0} for e in range(1, 6)], "b.jsonl")
    assert r.meta["step_axis"] == {"column": "EPOCH", "kind": "epoch"} and steps == [1, 2, 3, 4, 5]
    assert tags == {"TRAIN_LOSS"}
    r, steps, tags = read([{"epoch": e, "step": e * 100, "loss": 1.0} for e in range(3)], "c.jsonl")
    assert r.meta["step_key"] == "step" and tags == {"epoch", "loss"}  # a step key wins: epoch is a metric
    r, steps, tags = read([{"epoch": e / 4, "loss": 1.0} for e in range(8)], "d.jsonl")  # fractional epochs
    assert r.meta["step_axis"]["kind"] == "row_index" and steps == [s for s in range(8) for _ in (0, 1)]
    assert tags == {"epoch", "loss"}
    r, steps, _ = read([{"consumed_samples": 512 * s, "loss": 1.0} for s in range(4)], "e.jsonl")
    assert r.meta["step_axis"]["kind"] == "samples" and steps == [0, 512, 1024, 1536]
    token = STEP_KEY.set("tick")  # the user's step key (forensics.toml) wins over every rule
    try:
        r, steps, tags = read([{"tick": s + 7, "step": 0, "loss": 1.0} for s in range(3)], "f.jsonl")
    finally:
        STEP_KEY.reset(token)
    assert r.meta["step_key"] == "tick" and steps == [7, 7, 8, 8, 9, 9] and tags == {"step", "loss"}


@pytest.mark.parametrize("size", [64, 300, 4096])
def test_pread_blocks_equal_the_stream_blocks(tmp_path: Path, size: int) -> None:
    """A plain file's blocks read by ``os.pread`` are the blocks of the stream path, long lines and all."""
    import io

    from parsers import _jsonl_blocks

    rng = np.random.default_rng(size)
    lengths = np.r_[rng.choice([0, 5, 20], size=600), rng.choice([0, 5, 40, 200, 900, 5000], size=300)]
    lines = [b"x" * int(n) for n in lengths]
    data = b"\n".join(lines) + b"\ntail without newline"
    p = tmp_path / "m.jsonl"
    p.write_bytes(data)
    got: dict[str, tuple[list, list]] = {}
    for how in ("pread", "stream"):
        long_lines: list[tuple[int, int]] = []
        with open(p, "rb") as fh:
            src = fh if how == "pread" else io.BufferedReader(io.BytesIO(data))  # type: ignore[arg-type]
            blocks = list(_jsonl_blocks._blocks(src, size, long_lines, max_line=2000))
        got[how] = (blocks, long_lines)
        assert all(b.endswith(b"\n") or not b for b, _, _ in blocks[:-1])
        assert blocks[-1][1] == b"tail without newline"
    assert got["pread"] == got["stream"]
    with open(p, "rb") as fh:
        assert sum(1 for _ in _jsonl_blocks._preads(fh, size)) > 0  # the pread path was taken


def test_dense_values_of_columns_with_nulls() -> None:
    """Int64/Float64 columns with nulls come from their Arrow buffer (sliced ones too); the rows present are exact."""
    import polars as pl

    from parsers._jsonl_stage import _dense

    for values in ([1.5, None, -3.0, None, 2**60 + 0.0], [1, None, -(2**62), 7, None], [True, None, False]):
        s = pl.Series(values)
        field = pl.DataFrame({"a": [{"x": v} for v in values]})["a"].struct.unnest()["x"]
        for part in (s, s.slice(1), s.slice(2, 2), field, field.slice(1)):
            got, present = _dense(part), part.is_not_null().to_numpy()
            want = part.to_list()
            assert len(got) == len(want)
            assert [g for g, p in zip(got.tolist(), present, strict=True) if p] == [w for w in want if w is not None]


def test_deep_lines_counted_one_by_one_or_in_one_pass() -> None:
    """The bracket guard gives the same lines whether it counts them one by one or with numpy."""
    from parsers import _jsonl_scan

    rng = random.Random(3)
    lines = [json.dumps({"step": i, "x": [[0]] * rng.choice([1, 20, 61, 62, 63, 90])}) for i in range(3000)]
    buf = ("\n".join(lines) + "\n").encode()
    ends = np.flatnonzero(np.frombuffer(buf, np.uint8) == 10)
    starts = np.r_[0, ends[:-1] + 1]
    want = np.array([line.count("[") + line.count("{") > _jsonl_scan._MAX_BRACKETS for line in lines])
    work = np.empty(len(buf), bool)
    for idx in (np.arange(3000), np.arange(0, 3000, 7), np.arange(10, 400)):
        assert np.array_equal(_jsonl_scan._deep_lines(buf, starts, ends, idx, work), want[idx])
    fast = _jsonl_scan._deep_lines(buf, starts, ends, np.arange(3000), work)
    assert fast.sum() > 100 and np.array_equal(fast, want)


def test_a_one_line_json_config_or_summary_is_no_metric_log(tmp_path: Path) -> None:
    """``json.dump(cfg, f)`` beside the log (config.json, hparams.json, a one-object summary) gives no rows (U16).

    Its ``"steps": 200`` once became a step and its ``"lr"`` a logged lr: a phantom segment and a false
    lr-schedule reset at 0.98. Two records in a ``.json`` file are still a JSON-lines log.
    """
    from parsers.discover import load_run

    cfg = '{"lr": 0.3, "d_model": 32, "n_layer": 2, "warmup": 20, "steps": 200}\n'
    (tmp_path / "config.json").write_text(cfg)
    (tmp_path / "hparams.json").write_text(cfg)
    (tmp_path / "final.json").write_text('{"step": 199, "loss": 0.5}\n')
    (tmp_path / "metrics.jsonl").write_text("".join(f'{{"step": {s}, "loss": {2 - s / 100}, "lr": 0.3}}\n'
                                                     for s in range(200)))
    run = load_run(tmp_path)
    assert {s.path for s in run.sources} == {"metrics.jsonl"}
    assert run.metrics["segment"].unique().to_list() == [0]
    assert "config.json" in run.meta["config_files"]
    (tmp_path / "two.json").write_text('{"step": 1, "x": 1}\n{"step": 2, "x": 2}\n')
    assert jsonl.sniff(tmp_path / "two.json") and not jsonl.sniff(tmp_path / "final.json")
