"""parsers.wandb_run: real wandb offline runs (a subprocess), cross-checked with wandb's own protobuf classes.

The runs are written by the installed wandb SDK (``WANDB_MODE=offline``, no network); wandb is used
here only to write them and, as a reference, to decode their records (``wandb_internal_pb2``). The
parser itself never imports wandb.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import struct
import subprocess
import sys
import time
import zlib
from pathlib import Path

import pytest

pytest.importorskip("wandb", reason="wandb is needed to write real offline runs (pip install -e .[samples])")

from forensics.errors import ParseError  # noqa: E402
from parsers import wandb_run as wb  # noqa: E402
from parsers.discover import discover, load_run  # noqa: E402

RUN_ID = "fx7run01"
SAMPLE = Path(__file__).resolve().parents[1] / "sample_logs" / "wandb_healthy"

FIRST_RUN = r'''
import json, math, sys, wandb
logged = {}
run = wandb.init(project="tf-tests", id=sys.argv[1], name="fixture",
                 config={"lr": 1e-3, "model": {"d_model": 64, "layers": 2}, "tags": ["a", "b"]})
for s in range(200):
    row = {"loss": math.nan if s == 120 else 2.0 / (1 + s) + 0.001 * s, "lr": 1e-3 * (s + 1) / 200,
           "grad_norm": 1 + (s % 7) * 0.25, "opt": {"scale": 2.0 ** (s % 5), "inner": {"x": s}}}
    if s == 7:
        row["flag"] = True
    if s == 100:
        row["notes"] = "x" * 70000  # one record larger than two blocks: FIRST + MIDDLE + LAST chunks
    logged[s] = dict(row)
    if s % 20 == 0:
        row["weights"] = wandb.Histogram(list(range(10)))
    wandb.log(row, step=s)
    if s == 120:
        print("Loss is NaN at step 120", flush=True)
print("Traceback (most recent call last):", file=sys.stderr, flush=True)
print('  File "train.py", line 9, in <module>', file=sys.stderr, flush=True)
print("RuntimeError: NCCL error: unhandled system error", file=sys.stderr, flush=True)
run.finish()
json.dump(logged, open(sys.argv[2], "w"))
'''

RESUMED_RUN = r'''
import json, sys, wandb
run = wandb.init(project="tf-tests", id=sys.argv[1], resume="allow")
logged = {}
for s in range(150, 251):
    logged[s] = {"loss": 1.0 / (s + 1), "lr": 5e-4}
    wandb.log(logged[s], step=s)
run.finish()
json.dump(logged, open(sys.argv[2], "w"))
'''


def _run_script(code: str, wandb_dir: Path, logged: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env.update(WANDB_MODE="offline", WANDB_DIR=str(wandb_dir), WANDB_SILENT="true", WANDB_DISABLE_GIT="true",
               WANDB_DISABLE_CODE="true", WANDB_CONSOLE="wrap")
    subprocess.run([sys.executable, "-c", code, RUN_ID, str(logged)], env=env, check=True, timeout=300,
                   cwd=wandb_dir, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


@pytest.fixture(scope="module")
def real_runs(tmp_path_factory) -> dict:
    """Two real offline folders of one run id: 200 steps, then a resume that logs steps 150-250."""
    root = tmp_path_factory.mktemp("wandb_real")
    _run_script(FIRST_RUN, root, root / "logged1.json")
    time.sleep(1.1)  # the resume's folder name carries a later second
    _run_script(RESUMED_RUN, root, root / "logged2.json")
    dirs = sorted((root / "wandb").glob("offline-run-*"))
    assert len(dirs) == 2, dirs
    logged = [{int(k): v for k, v in json.loads((root / f"logged{i}.json").read_text()).items()} for i in (1, 2)]
    (root / "logged1.json").unlink()
    (root / "logged2.json").unlink()
    return {"root": root, "dirs": dirs, "files": [next(d.glob("run-*.wandb")) for d in dirs], "logged": logged}


# ------------------------------------------------ a reference: the simplest chunker + wandb's own protobuf class


def _reference(data: bytes) -> list[dict]:
    """Every record of an undamaged file: first chunk offset, end offset, blocks touched, decoded Record."""
    from wandb.proto import wandb_internal_pb2 as pb

    out, pos, parts, start, blocks = [], 7, b"", 0, set()
    while pos + 7 <= len(data):
        if 32768 - pos % 32768 < 7:
            pos += 32768 - pos % 32768
            continue
        crc, length, typ = struct.unpack_from("<IHB", data, pos)
        payload = data[pos + 7:pos + 7 + length]
        assert zlib.crc32(payload, zlib.crc32(bytes([typ]))) == crc, pos  # the documented CRC, on a real file
        if typ in (1, 2):
            parts, start, blocks = b"", pos, set()
        parts += payload
        blocks.add(pos // 32768)
        pos += 7 + length
        if typ in (1, 4):
            rec = pb.Record()
            rec.ParseFromString(parts)
            out.append({"start": start, "end": pos, "blocks": blocks, "rec": rec})
    assert pos == len(data)
    return out


def _history_rows(recs: list[dict]) -> dict[tuple[int, str], float | None]:
    """(step, key) -> value of every numeric history item, decoded by wandb's protobuf classes."""
    rows = {}
    for r in recs:
        rec = r["rec"]
        if rec.WhichOneof("record_type") != "history":
            continue
        items = {("/".join(i.nested_key) or i.key): json.loads(i.value_json) for i in rec.history.item}
        step = int(items.pop("_step", rec.history.step.num))
        for k, v in items.items():
            if k not in ("_runtime", "_timestamp") and (isinstance(v, (int, float)) or v is None):
                rows[(step, k)] = None if v is None else float(v)
    return rows


def _steps(res, tag: str = "loss") -> list[int]:
    t = res.metrics.to_pydict()
    return [s for s, g in zip(t["step"], t["tag"], strict=True) if g == tag]


def _same(a: float | None, b: float | None) -> bool:
    return a == b or (a is not None and b is not None and math.isnan(a) and math.isnan(b))


# ------------------------------------------------------------------------------------------ real runs


def test_every_logged_value_is_read(real_runs):
    """Every step and value that was logged (NaN kept, nested keys joined with /, True as 1)."""
    root, path, logged = real_runs["root"], real_runs["files"][0], real_runs["logged"][0]
    res = wb.read(path, root)
    assert res.format == "wandb" and res.skipped == ()
    t = res.metrics.to_pydict()
    got = {(s, g): v for s, g, v in zip(t["step"], t["tag"], t["value"], strict=True)}
    want = {}
    for step, row in logged.items():
        flat = {"loss": row["loss"], "lr": row["lr"], "grad_norm": row["grad_norm"],
                "opt/scale": row["opt"]["scale"], "opt/inner/x": row["opt"]["inner"]["x"]}
        flat.update({"flag": 1.0} if "flag" in row else {})
        want.update({(step, k): float(v) for k, v in flat.items()})
    assert got.keys() == want.keys()
    assert all(_same(got[k], want[k]) for k in want)
    assert math.isnan(got[(120, "loss")]) and sorted(set(t["step"])) == list(range(200))
    assert set(t["segment"]) == {0} and set(t["source"]) == {path.relative_to(root).as_posix()}
    walls = [w for w, g in zip(t["wall_time"], t["tag"], strict=True) if g == "loss"]
    assert all(1.7e9 < w < 2.2e9 for w in walls) and walls == sorted(walls)
    assert {m for m, g in zip(t["metric"], t["tag"], strict=True) if g in ("loss", "lr", "grad_norm")} == {
        "loss", "lr", "grad_norm"}


def test_matches_wandb_protobuf_decoding(real_runs):
    """Our wire decoder gives exactly what wandb's own Record class gives, record for record."""
    for path in real_runs["files"]:
        recs = _reference(path.read_bytes())
        res = wb.read(path, real_runs["root"])
        t = res.metrics.to_pydict()
        ours = {(s, g): v for s, g, v in zip(t["step"], t["tag"], t["value"], strict=True)}
        ref = _history_rows(recs)
        assert ours.keys() == ref.keys() and all(_same(ours[k], ref[k]) for k in ref)
        kinds = {}
        for r in recs:
            k = r["rec"].WhichOneof("record_type")
            kinds[k] = kinds.get(k, 0) + 1
        assert res.meta["records"] == kinds


def test_run_meta_config_summary_exit(real_runs):
    """Run id, name, start time, config, summary and the exit record go to meta; media are counted."""
    res = wb.read(real_runs["files"][0], real_runs["root"])
    m = res.meta
    assert m["run_id"] == RUN_ID and m["run_name"] == "fixture" and m["project"] == "tf-tests"
    assert m["config"] == {"lr": 1e-3, "model": {"d_model": 64, "layers": 2}, "tags": ["a", "b"]}
    assert m["hparams"] == m["config"]
    assert m["summary"]["_step"] == 199 and m["summary"]["opt"]["inner"]["x"] == 199
    assert m["exit"]["exit_code"] == 0 and m["finished"] is True and not m.get("resumed")
    assert 1.7e9 < m["start_time"] < 2.2e9 and m["first_step"] == 0 and m["last_step"] == 199
    assert m["media"] == {"weights": {"type": "histogram", "rows": 10}} and m["non_numeric"] == {"notes": 1}
    assert m["records"]["history"] == 200 and m["damaged_bytes"] == 0 and m["producer"].startswith("0.31")


def test_console_lines_become_events(real_runs):
    """Console output records: a NaN notice and a traceback ending in an NCCL error, at the step printed."""
    res = wb.read(real_runs["files"][0], real_runs["root"])
    ev = res.events.to_pydict()
    kinds = dict(zip(ev["kind"], ev["step"], strict=True))
    assert kinds["nan_detected"] in (119, 120)  # W&B writes the row of step 120 when step 121 starts
    assert kinds["hardware_error"] >= 198 and "NCCL error" in ev["message"][ev["kind"].index("hardware_error")]
    assert res.meta["console"]["source"] == "binary"


def test_resume_is_a_second_segment(real_runs):
    """Two offline-run folders of one run id: one group, two segments in time order, a restart event."""
    run = load_run(real_runs["root"])
    rels = [f.relative_to(real_runs["root"]).as_posix() for f in real_runs["files"]]
    assert {s.path for s in run.sources if s.records} == set(rels)
    assert {run.meta["source_groups"][r] for r in rels} == {f"wandb:{RUN_ID}"}
    m = run.metrics.filter(run.metrics["tag"] == "loss")
    seg0 = m.filter(m["segment"] == 0)["step"].to_list()
    seg1 = m.filter(m["segment"] == 1)["step"].to_list()
    assert seg0 == list(range(200)) and seg1 == list(range(150, 251))
    assert m.filter((m["segment"] == 1) & (m["step"] == 150))["value"].to_list() == [1.0 / 151]
    restart = run.events.filter(run.events["kind"] == "restart")
    assert restart["segment"].to_list() == [1] and restart["step"].to_list() == [150]
    res2 = wb.read(real_runs["files"][1], real_runs["root"])
    assert res2.meta["resumed"] is True and res2.meta["config"] == {}
    assert not any(s.format == "textlog" for s in run.sources)  # W&B's own logs are not read as training logs


def test_latest_run_link_does_not_hide_the_real_folder(real_runs):
    """``wandb/latest-run`` links to the resume folder: the real folder name is what gets read."""
    link = real_runs["root"] / "wandb" / "latest-run"
    if not link.is_symlink():
        pytest.skip("this wandb version wrote no latest-run link")
    claims, _ = discover(real_runs["root"])
    paths = [p.relative_to(real_runs["root"]).as_posix() for p, m in claims if p.name.endswith(".wandb")]
    assert paths == [f.relative_to(real_runs["root"]).as_posix() for f in real_runs["files"]]


# ------------------------------------------------------------------------------------------ damage


def _copy_run(src_dir: Path, dst_root: Path, data: bytes, with_files: bool = True) -> Path:
    dst = dst_root / "wandb" / src_dir.name
    dst.mkdir(parents=True)
    path = dst / next(src_dir.glob("run-*.wandb")).name
    path.write_bytes(data)
    if with_files and (src_dir / "files").is_dir():
        shutil.copytree(src_dir / "files", dst / "files")
    return path


@pytest.mark.parametrize("where", ["last_byte", "mid_block", "block_start", "chunk_header", "mid_record"])
def test_truncated_file_keeps_every_complete_record(real_runs, tmp_path, where):
    """A cut anywhere keeps each record whose last chunk is complete, and names the offset of the cut."""
    src = real_runs["files"][0]
    data = src.read_bytes()
    recs = _reference(data)
    big = next(r for r in recs if len(r["blocks"]) >= 3)  # the FIRST + MIDDLE + LAST record
    cut = {"last_byte": len(data) - 1, "mid_block": 3 * 32768 + 12345, "block_start": 2 * 32768 + 2,
           "chunk_header": recs[300]["start"] + 3, "mid_record": big["start"] + 40000}[where]
    path = _copy_run(src.parent, tmp_path, data[:cut], with_files=False)
    res = wb.read(path, tmp_path)
    complete = [r for r in recs if r["end"] <= cut]
    want = sorted((s for s, _ in _history_rows(complete)), key=int)
    assert sorted(set(_steps(res, "grad_norm"))) == sorted(set(want))
    assert len(res.skipped) == 1, res.skipped
    what, reason = res.skipped[0].what, res.skipped[0].reason
    offset = int(what.rpartition(":")[2])
    assert what.startswith(path.relative_to(tmp_path).as_posix()) and "end of file" in reason
    assert max([r["end"] for r in complete] + [7]) <= offset < cut
    assert res.meta["finished"] is False and res.meta["exit"] is None


@pytest.mark.parametrize("block", [2, 4])
def test_flipped_byte_loses_at_most_its_block(real_runs, tmp_path, block):
    """One flipped byte: records with a chunk in that block may be lost, all others are kept; damage listed."""
    src = real_runs["files"][0]
    data = bytearray(src.read_bytes())
    recs = _reference(bytes(data))
    at = block * 32768 + 16000
    data[at] ^= 0x5A
    path = _copy_run(src.parent, tmp_path, bytes(data))
    res = wb.read(path, tmp_path)
    everything = _history_rows(recs)
    safe = _history_rows([r for r in recs if block not in r["blocks"]])
    t = res.metrics.to_pydict()
    got = {(s, g) for s, g in zip(t["step"], t["tag"], strict=True)}
    assert safe.keys() <= got <= everything.keys()
    assert sum(res.meta["records"].values()) < len(recs)  # something in the damaged block was lost
    offsets = [int(s.what.rpartition(":")[2]) for s in res.skipped]
    assert offsets and all(block * 32768 <= o <= at for o in offsets[:1])
    assert any("next block" in s.reason for s in res.skipped)
    assert res.meta["damaged_bytes"] > 0 and res.meta["exit"] is not None  # the walk went on to the end


def test_truncated_binary_takes_the_console_tail_from_output_log(real_runs, tmp_path):
    """The binary lost its end (no exit record): the traceback is still read from files/output.log."""
    src = real_runs["files"][0]
    data = src.read_bytes()
    recs = _reference(data)
    before_output = next(r["start"] for r in recs if r["rec"].WhichOneof("record_type") == "output_raw")
    path = _copy_run(src.parent, tmp_path, data[:before_output + 5])
    res = wb.read(path, tmp_path)
    ev = res.events.to_pydict()
    assert "hardware_error" in ev["kind"] and "nan_detected" in ev["kind"]
    assert res.meta["console"]["source"] == "files/output.log"


def test_side_files_fall_back_when_the_binary_has_none(real_runs, tmp_path):
    """config.yaml (W&B's {desc, value} shape) and wandb-summary.json are used when the binary lacks them."""
    src = real_runs["dirs"][1]  # the resume: its binary has no config
    data = real_runs["files"][1].read_bytes()
    first_summary = next(r["start"] for r in _reference(data) if r["rec"].WhichOneof("record_type") == "summary")
    path = _copy_run(src, tmp_path, data[:first_summary])
    files = path.parent / "files"
    files.mkdir(exist_ok=True)
    (files / "config.yaml").write_text("wandb_version: 1\n_wandb:\n  value: {}\nlr:\n  desc: null\n  value: 0.02\n")
    (files / "wandb-summary.json").write_text('{"loss": 0.5, "_step": 250, "_wandb": {"runtime": 3}}')
    res = wb.read(path, tmp_path)
    assert res.meta["config"] == {"lr": 0.02} and res.meta["summary"] == {"loss": 0.5, "_step": 250}
    claims, _ = discover(tmp_path)
    assert {p.name: m.__name__ for p, m in claims}["wandb-summary.json"] == "parsers.wandb_run"
    side = wb.read(files / "wandb-summary.json", tmp_path)
    assert side.metrics.num_rows == 0 and side.meta["side_file"] == f"read with {path.name}"


def test_output_log_when_the_binary_has_no_console(real_runs, tmp_path):
    """No console records in the binary: files/output.log is read; a printed metric the history lacks is kept."""
    src = real_runs["dirs"][1]
    path = _copy_run(src, tmp_path, real_runs["files"][1].read_bytes())
    (path.parent / "files").mkdir(exist_ok=True)
    (path.parent / "files" / "output.log").write_text(
        "step 200: val loss 2.3100\nstep 210: loss 9.9000\nRuntimeError: CUDA error: an illegal memory access\n")
    res = wb.read(path, tmp_path)
    t = res.metrics.to_pydict()
    assert [(s, v) for s, m, v in zip(t["step"], t["metric"], t["value"], strict=True) if m == "eval_loss"] == [
        (200, 2.31)]
    assert 9.9 not in t["value"] and t["step"].count(210) == 2  # history's loss and lr at 210 only
    assert {"source": "files/output.log", "stdout_metric_rows": 1, "stdout_metric_rows_ignored": 1}.items() <= (
        res.meta["console"].items())
    assert "error" in res.events.column("kind").to_pylist()


def test_empty_and_foreign_files(tmp_path):
    """An empty log and a non-W&B file named run-*.wandb are ParseErrors; sniff checks the magic."""
    d = tmp_path / "wandb" / "offline-run-20260101_000000-x"
    d.mkdir(parents=True)
    empty, foreign, header_only = d / "run-a.wandb", d / "run-b.wandb", d / "run-c.wandb"
    empty.write_bytes(b"")
    foreign.write_bytes(b"PK\x03\x04 not a transaction log")
    header_only.write_bytes(wb.MAGIC)
    assert wb.sniff(empty) and not wb.sniff(foreign) and wb.sniff(header_only)
    for p in (empty, header_only):
        with pytest.raises(ParseError):
            wb.read(p, tmp_path)
    with pytest.raises(ParseError, match="not a W&B"):
        wb.read(foreign, tmp_path)


def test_committed_sample_run():
    """sample_logs/wandb_healthy: a real 400-step training logged by wandb offline, read whole."""
    (path,) = SAMPLE.glob("wandb/offline-run-*/run-*.wandb")
    res = wb.read(path, SAMPLE)
    assert res.skipped == () and res.meta["finished"] is True
    assert _steps(res, "train/loss") == list(range(1, 401)) and res.meta["config"]["steps"] == 400
    assert {"loss", "lr", "grad_norm", "update_ratio", "param_norm", "attn_logit_max"} <= set(
        res.metrics.column("metric").to_pylist())
    assert path.stat().st_size < 500_000


def test_wandb_history_export_jsonl_is_read_by_the_jsonl_parser(tmp_path):
    """A W&B history export as JSON lines (``_step``, ``_timestamp``, NaN) is the JSONL parser's."""
    from parsers import jsonl

    p = tmp_path / "history.jsonl"
    p.write_text('{"_step": 0, "_timestamp": 1.79e9, "loss": 2.5}\n{"_step": 1, "_timestamp": 1.79e9, "loss": NaN}\n')
    res = jsonl.read(p, tmp_path)
    t = res.metrics.to_pydict()
    assert res.meta["step_key"] == "_step" and t["step"] == [0, 1] and math.isnan(t["value"][1])


# ------------------------------------------------------------------------------------------ crafted files


def _write_log(path: Path, records: list[bytes]) -> Path:
    """A .wandb file holding ``records``, framed as the writers frame them (FULL or FIRST/MIDDLE/LAST)."""
    out = bytearray(wb.MAGIC)
    for rec in records:
        first = True
        while True:
            left = 32768 - len(out) % 32768
            if left < 7:
                out += b"\0" * left
                continue
            piece, rec = rec[:left - 7], rec[left - 7:]
            typ = (1 if first else 4) if not rec else (2 if first else 3)
            out += struct.pack("<IHB", zlib.crc32(piece, zlib.crc32(bytes([typ]))), len(piece), typ) + piece
            first = False
            if not rec:
                break
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(bytes(out))
    return path


def test_crafted_records_exit_code_values_and_zero_tail(tmp_path):
    """Negative exit code, preemption, fork, JSON true/null/objects, _runtime-only wall time, a zeroed tail."""
    from wandb.proto import wandb_internal_pb2 as pb

    def rec(**kw) -> bytes:
        return pb.Record(**kw).SerializeToString()

    run = pb.RunRecord(run_id="r1", forked=True, branch_point=pb.BranchPoint(run="r0", value=5, metric="_step"))
    run.start_time.FromSeconds(1_700_000_000)
    hist = pb.HistoryRecord(item=[
        pb.HistoryItem(key="_step", value_json="7"), pb.HistoryItem(key="_runtime", value_json="2.5"),
        pb.HistoryItem(key="ok", value_json="true"), pb.HistoryItem(key="gone", value_json="null"),
        pb.HistoryItem(key="legacy", value_json='{"a": 1, "b": [1]}'), pb.HistoryItem(key="note", value_json='"x"'),
        pb.HistoryItem(nested_key=["opt", "lr"], value_json="-Infinity")])
    path = _write_log(tmp_path / "wandb" / "run-20260101_000000-r1" / "run-r1.wandb", [
        rec(run=run), rec(history=hist),
        rec(summary=pb.SummaryRecord(update=[pb.SummaryItem(key="best", value_json="1.5")])),
        rec(summary=pb.SummaryRecord(remove=[pb.SummaryItem(key="best")])),
        rec(preempting=pb.RunPreemptingRecord()), rec(exit=pb.RunExitRecord(exit_code=-9, runtime=3))])
    path.write_bytes(path.read_bytes() + b"\0" * 40000)  # preallocated, never written
    res = wb.read(path, tmp_path)
    t = res.metrics.to_pydict()
    assert dict(zip(t["tag"], t["value"], strict=True)) == {"ok": 1.0, "gone": None, "opt/lr": -math.inf}
    assert set(t["step"]) == {7} and set(t["wall_time"]) == {1_700_000_002.5}
    m = res.meta
    assert m["exit"] == {"exit_code": -9, "runtime_s": 3, "not_complete": False} and m["summary"] == {}
    assert m["forked"] is True and m["branch_point"] == "r0" and m["non_numeric"] == {"legacy": 1, "note": 1}
    ev = dict(zip(res.events.column("kind").to_pylist(), res.events.column("message").to_pylist(), strict=True))
    assert "code -9" in ev["error"] and "preempted" in ev["job_end"] and "forked" in ev["restart"]
    assert len(res.skipped) == 1 and "zero bytes" in res.skipped[0].reason


def test_wandb_history_exports_json_csv_parquet_are_discovered(tmp_path):
    """The three exports of one history (JSON array, CSV, Parquet) are found in a run folder and agree.

    A cut JSON export keeps its complete rows and lists the cut among the run's skipped inputs.
    """
    from parsers.discover import load_run

    rows = [{"_step": s, "_runtime": 2.0 * s, "_timestamp": 1.79e9 + s, "train/loss": 3.0 - s / 4,
             "train/grad_norm": math.nan if s == 3 else 0.5 + s} for s in range(5)]
    export = tmp_path / "wandb_export"
    export.mkdir()
    (export / "history.json").write_text(json.dumps(rows))
    header = list(rows[0])
    (export / "history.csv").write_text(",".join(header) + "\n" + "".join(
        ",".join(repr(r[k]) for k in header) + "\n" for r in rows))
    import polars as pl

    pl.DataFrame(rows).write_parquet(export / "history.parquet")
    data = load_run(tmp_path)
    assert sorted((s.path, s.format) for s in data.sources) == [
        ("wandb_export/history.csv", "csv"), ("wandb_export/history.json", "csv"),
        ("wandb_export/history.parquet", "csv")]
    by_source = {src: sorted(data.metrics.filter(pl.col("source") == src).select("step", "metric", "value")
                             .rows(), key=repr) for src in data.metrics.get_column("source").unique()}
    assert len(by_source) == 3 and all(len(v) == 10 for v in by_source.values())
    first = next(iter(by_source.values()))
    assert all(repr(v) == repr(first) for v in by_source.values())
    assert ("loss" in {m for _, m, _ in first}) and ("grad_norm" in {m for _, m, _ in first})
    text = (export / "history.json").read_text()
    (export / "history.json").write_text(text[: text.index('{"_step": 4')] + '{"_step": 4, "_run')
    data = load_run(tmp_path)
    cut = data.metrics.filter(pl.col("source") == "wandb_export/history.json")
    assert sorted(set(cut.get_column("step").to_list())) == [0, 1, 2, 3] and cut.height == 8
    assert [s.what for s in data.skipped if s.what.startswith("wandb_export/history.json")] == [
        "wandb_export/history.json:1"]


_RSS_DRIVER = r"""
import re, sys
from pathlib import Path
from parsers import wandb_run as wb
p = Path(sys.argv[1])
res = wb.read(p, p.parent)
peak = int(re.search(r"VmHWM:\s*(\d+)", open("/proc/self/status").read()).group(1)) * 1024
print(res.metrics.num_rows, len(res.skipped), peak)
"""


def test_large_written_log_is_read_in_bounded_memory(tmp_path):
    """A real log followed by 512 MiB of written (not sparse) zeros: the map drops its pages behind the walk.

    Issue 16: every page of the memory-mapped file counted to RSS (a 4 GiB sparse ``.wandb``: 4.3 GB).
    """
    import os
    import subprocess
    import sys

    if not Path("/proc/self/status").exists():  # ru_maxrss would carry the parent's peak across fork + exec
        pytest.skip("peak RSS of this process (VmHWM) needs Linux /proc")

    (src,) = SAMPLE.glob("wandb/offline-run-*/run-*.wandb")
    p = tmp_path / "run-big.wandb"
    with open(p, "wb") as fh:
        fh.write(src.read_bytes())
        block = bytes(16 << 20)
        for _ in range(32):
            fh.write(block)
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-c", _RSS_DRIVER, str(p)], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(root)}, cwd=root).stdout.split()  # cwd: this checkout
    rows, skips, peak = (int(x) for x in out)
    assert rows == wb.read(src, SAMPLE).metrics.num_rows and skips == 1
    assert peak < 400 << 20, f"peak RSS {peak >> 20} MiB for a {p.stat().st_size >> 20} MiB file"
