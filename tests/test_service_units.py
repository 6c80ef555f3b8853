"""Service parts without a server: incremental reading, database migrations, incidents, replay, ``watch``."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import polars as pl
import pytest
from service_helpers import REPO, SAMPLES

from forensics.service import db as sdb
from forensics.service.incidents import Alert, Confirmer, alerts_of, record
from forensics.service.replay import plan, replay, steps_of, write_until
from parsers.discover import load_run
from parsers.incremental import IncrementalReader, line_boundary, tfrecord_boundary

pytestmark = pytest.mark.skipif(not (SAMPLES / "lr_schedule_reset").is_dir(), reason="sample runs missing")


def _sorted(df: pl.DataFrame) -> pl.DataFrame:
    return df.drop("run").sort(df.drop("run").columns, nulls_last=True)


@pytest.mark.parametrize("sample", ["lr_schedule_reset", "overflow"])
def test_incremental_equals_full_read(tmp_path: Path, sample: str) -> None:
    """Grown piece by piece (cuts mid-line and mid-frame), the tables equal one full read; appends are pieces."""
    src = SAMPLES / sample
    dst = tmp_path / sample
    pieces = plan(src)
    steps = steps_of(pieces)
    reader = IncrementalReader()
    i = 0
    cuts = [steps[len(steps) * k // 7] for k in range(1, 7)] + [steps[-1]]
    for n, until in enumerate(cuts):
        i = write_until(pieces, src, dst, i, until)
        log = dst / "train.log"
        if n < len(cuts) - 1 and i < len(pieces) and pieces[i].rel == "train.log":  # a half-written line
            with open(log, "ab") as fh:
                fh.write(pieces[i].data[:5])
            pieces[i] = type(pieces[i])(pieces[i].step, pieces[i].rel, pieces[i].data[5:], False, pieces[i].segment)
        run = load_run(dst, reader=reader.read)
    full = load_run(dst)
    assert _sorted(run.metrics).equals(_sorted(full.metrics))
    assert _sorted(run.events).equals(_sorted(full.events))
    assert sorted(run.metrics["segment"].unique()) == sorted(full.metrics["segment"].unique())
    states = {Path(k).name: v for k, v in reader.files.items()}
    assert all(s.full_reads == 1 for s in states.values()), "no file was re-read in full"
    assert sum(s.piece_reads for s in states.values()) >= 12
    reader.close()


def test_incremental_rewrite_and_boundaries(tmp_path: Path) -> None:
    """A file that is rewritten (not appended) is read again in full; boundaries stop at complete records."""
    run = tmp_path / "run"
    run.mkdir()
    f = run / "metrics.jsonl"
    f.write_text('{"step": 1, "loss": 2.0}\n{"step": 2, "loss": 1.9}\n{"step": 3, "lo')
    assert line_boundary(f, 0, f.stat().st_size) == len('{"step": 1, "loss": 2.0}\n{"step": 2, "loss": 1.9}\n')
    r = IncrementalReader()
    assert load_run(run, reader=r.read).metrics.filter(pl.col("metric") == "loss").height == 2
    f.write_text('{"step": 1, "loss": 5.0}\n')  # replaced: shorter
    got = load_run(run, reader=r.read).metrics.filter(pl.col("metric") == "loss")
    assert got["value"].to_list() == [5.0]
    tb = next(SAMPLES.glob("overflow/events.out.tfevents.*"))
    data = tb.read_bytes()
    part = tmp_path / "cut.tfevents"
    part.write_bytes(data[:1000])
    end = tfrecord_boundary(part, 0, 1000)
    assert end is not None and 0 < end <= 1000
    part.write_bytes(data[:end])
    assert tfrecord_boundary(part, 0, end) == end
    r.close()


def test_migrations_from_v1(tmp_path: Path) -> None:
    """A version-1 database is upgraded in place; a newer one is refused."""
    path = tmp_path / "old.db"
    conn = sdb.connect(path)
    assert sdb.migrate(conn, target=1) == 1
    conn.execute("INSERT INTO runs (root, path, name, first_seen) VALUES ('/r', '/r/a', 'a', 0)")
    conn.close()
    db = sdb.Database(path)
    assert sdb.version(db.conn()) == sdb.SCHEMA_VERSION == 2
    cols = {r["name"] for r in db.all("PRAGMA table_info(incidents)")}
    assert {"group_key", "node", "shard", "onset_latest"} <= cols
    assert db.one("SELECT name FROM runs")["name"] == "a"
    assert db.one("PRAGMA journal_mode")["journal_mode"] == "wal"
    db.conn().execute("INSERT INTO schema_version VALUES (99, 0)")
    db.close()
    with pytest.raises(RuntimeError, match="newer"):
        sdb.Database(path)
    with pytest.raises(sqlite3.OperationalError):
        sqlite3.connect(path).execute("SELECT nothing FROM runs")


def test_incidents_once_per_fingerprint_and_groups(tmp_path: Path) -> None:
    """Same cause with a refined onset attaches; resolved then recurring opens anew; groups span runs."""
    db = sdb.Database(tmp_path / "s.db")
    a_id, b_id = db.upsert_run("/r", "/r/a", "a"), db.upsert_run("/r", "/r/b", "b")
    alert = Alert("anomaly", "overflow", "activation_overflow", 97, 0, "x", node="gpu-node-7")
    assert len(record(db, a_id, "/r/a", [alert], None, 120)) == 1
    moved = Alert("anomaly", "overflow", "activation_overflow", 99, 0, "x", node="gpu-node-7")
    assert record(db, a_id, "/r/a", [moved], None, 140) == []
    assert db.one("SELECT onset_step, onset_latest FROM incidents") == {"onset_step": 97, "onset_latest": 99}
    assert len(record(db, b_id, "/r/b", [alert], None, 50)) == 1
    groups = db.all("SELECT group_key, COUNT(DISTINCT run_id) AS n FROM incidents GROUP BY group_key")
    assert groups == [{"group_key": "overflow|node=gpu-node-7", "n": 2}]
    db.close()


def test_confirmer_waits_for_a_stable_onset() -> None:
    """A moving onset never alerts; a stable one does after CONFIRM_STEPS; a critical finding at once."""
    c = Confirmer(confirm_steps=32, tolerance=2)
    body = {"findings": [{"severity": "high"}]}
    moving = [c.update("r", [Alert("anomaly", "update_scale_growth", None, s - 8, 0, "")], body, s)
              for s in range(55, 121, 5)]
    assert not any(moving)
    stable = [c.update("s", [Alert("anomaly", "update_scale_growth", None, 10, 0, "")], body, s)
              for s in range(10, 60, 5)]
    first = next(i for i, got in enumerate(stable) if got)
    assert 10 + 5 * first >= 42
    assert c.update("u", [Alert("anomaly", "update_scale_growth", None, 90, 0, "")], body, 120, final=True)
    crit = {"findings": [{"severity": "critical"}]}
    assert c.update("t", [Alert("anomaly", "data_batch", None, 250, 0, "")], crit, 250)


def test_alerts_of_contract() -> None:
    """The alerts of an analysis: anomaly, early warning (growth precursor), nothing for healthy."""
    assert alerts_of({"verdict": "healthy", "findings": []}) == []
    a = alerts_of({"verdict": "anomaly", "cause": "data_batch", "mechanism": "bad_batch",
                   "onset": {"step": 250, "segment": 0}, "summary": "s", "findings": []})
    assert (a[0].kind, a[0].cause, a[0].onset_step) == ("anomaly", "data_batch", 250)
    w = alerts_of({"verdict": "transient", "findings": [
        {"code": "UR01", "name": "update_ratio.growth", "cause": "update_scale_growth", "confidence": 0.7,
         "step": 40, "segment": 0, "message": "m"}]})
    assert (w[0].kind, w[0].cause, w[0].onset_step) == ("early_warning", "update_scale_growth", 40)


def test_replay_is_byte_identical(tmp_path: Path) -> None:
    """The replayed folder ends byte-identical to the source (restarts kept in order), without expected.json."""
    src = SAMPLES / "lr_schedule_reset"
    dst = tmp_path / "r"
    last = replay(src, dst, steps_per_tick=50, tick_s=0)
    assert last == 500
    for f in src.iterdir():
        if f.name != "expected.json":
            assert (dst / f.name).read_bytes() == f.read_bytes(), f.name
    assert not (dst / "expected.json").exists()


def _watch(run: Path, *args: str) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.Popen([sys.executable, "-c", "from forensics.cli import main; main()", "watch", str(run),
                             "--interval", "0.2", *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def test_watch_exits_1_at_the_onset_and_0_when_healthy(tmp_path: Path) -> None:
    """``forensics watch`` on a live faulty run prints the alert with its onset, exits 1; a healthy run ends 0."""
    faulty = tmp_path / "data_batch"
    faulty.mkdir()
    p = _watch(faulty, "--idle-timeout", "20")
    t = threading.Thread(target=replay, args=(SAMPLES / "data_batch", faulty), kwargs={"steps_per_tick": 25,
                                                                                       "tick_s": 0.1})
    t.start()
    out, err = p.communicate(timeout=120)
    t.join()
    assert p.returncode == 1, err
    assert "ALERT anomaly: data_batch" in out and "onset at step 250" in out
    from forensics.service.live import watch

    healthy = tmp_path / "healthy"
    replay(SAMPLES / "healthy", healthy, steps_per_tick=1000, tick_s=0)
    lines: list[str] = []
    assert watch(healthy, interval_s=0.1, idle_timeout_s=5, echo=lines.append) == 0
    assert any("final step 400" in ln and "healthy" in ln for ln in lines), lines
    empty = tmp_path / "empty"
    empty.mkdir()
    lines.clear()
    assert watch(empty, interval_s=0.1, idle_timeout_s=0.3, echo=lines.append) == 2
    assert lines[-1].startswith("forensics: error:") and str(empty) in lines[-1]


def test_non_loopback_bind_needs_the_token(tmp_path: Path) -> None:
    """The CLI refuses a non-loopback bind without a token; with one, every route but /healthz needs it."""
    import asyncio

    import httpx
    from click.testing import CliRunner

    from forensics.cli import main
    from forensics.service.app import create_app
    from forensics.service.scheduler import ServiceConfig

    res = CliRunner().invoke(main, ["serve", str(tmp_path), "--host", "0.0.0.0", "--db", str(tmp_path / "x.db")],
                             env={"FORENSICS_TOKEN": None})
    assert res.exit_code == 2 and "needs --token" in res.output and "Traceback" not in res.output
    app = create_app(ServiceConfig(roots=[tmp_path], host="0.0.0.0", db=tmp_path / "s.db", token="t0ken"))

    async def go() -> tuple[int, int, int, int]:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://x") as c:
            return ((await c.get("/api/runs")).status_code, (await c.get("/")).status_code,
                    (await c.get("/api/runs", headers={"Authorization": "Bearer t0ken"})).status_code,
                    (await c.get("/healthz")).status_code)

    assert asyncio.run(go()) == (401, 401, 200, 200)


def test_history_keeps_rows_and_drops_repeated_bodies(tmp_path: Path) -> None:
    """A repeated (verdict, cause, onset) keeps its history row but not its body; a change keeps both."""
    db = sdb.Database(tmp_path / "h.db")
    rid = db.upsert_run("/r", "/r/a", "a")
    same = {"verdict": "healthy", "cause": None, "onset": None}
    ids = [db.store_analysis(rid, same, f'{{"v": {k}}}', k, 0.1) for k in range(3)]
    changed = {"verdict": "anomaly", "cause": "overflow", "onset": {"step": 9, "segment": 0}}
    ids.append(db.store_analysis(rid, changed, '{"v": 3}', 3, 0.1))
    bodies = [db.one("SELECT body FROM analyses WHERE id = ?", (i,))["body"] for i in ids]
    assert bodies == ["", "", '{"v": 2}', '{"v": 3}']
    assert db.one("SELECT analysis_id FROM runs")["analysis_id"] == ids[-1]
    db.close()


def test_worker_time_limit_kills_and_replaces_the_worker() -> None:
    """A job past its time limit is a JobError; the worker is killed and a fresh one answers the next job."""
    import time

    from forensics.service.worker import JobError, WorkerPool

    pool = WorkerPool(1, timeout_s=60)
    try:
        first = pool.run("run", os.getpid)
        t0 = time.monotonic()
        with pytest.raises(JobError, match="time limit"):
            pool.run("run", time.sleep, 30, timeout_s=1.0)
        assert time.monotonic() - t0 < 15
        assert pool.run("run", os.getpid) != first
    finally:
        pool.close()


def test_worker_memory_limit_kills_and_replaces_the_worker() -> None:
    """A job whose worker holds more than the memory limit is a JobError ("over budget"); a fresh worker follows."""
    import time

    from service_helpers import hold_memory

    from forensics.run_limits import rss_bytes
    from forensics.service.worker import JobError, WorkerPool

    if rss_bytes(os.getpid()) is None:
        pytest.skip("no /proc/<pid>/statm: resident memory is not sampled here")
    pool = WorkerPool(1, timeout_s=60, memory=400 << 20)
    try:
        first = pool.run("run", os.getpid)
        assert pool.run("run", hold_memory, 8, 0.0) == 8 << 20  # under the limit: answered
        t0 = time.monotonic()
        with pytest.raises(JobError, match="over budget"):
            pool.run("run", hold_memory, 800, 30.0)
        assert time.monotonic() - t0 < 20
        assert pool.run("run", os.getpid) != first
    finally:
        pool.close()



def test_ui_pages_show_hostile_run_names_inert(tmp_path: Path) -> None:
    r"""A run named with a bidi override, markup and an escape sequence: the UI pages keep it inert.

    The name is autoescaped and its controls shown (``<U+202E>``, ``\x1b``), never the raw characters.
    """
    import asyncio

    import httpx

    from forensics.service.app import create_app
    from forensics.service.scheduler import ServiceConfig

    app = create_app(ServiceConfig(roots=[tmp_path], db=tmp_path / "s.db", token="t0ken"))
    name = "run\u202eTNEM<script>alert(1)</script>\x1b]0;t\x07"
    svc = app.state.service
    rid = svc.db.upsert_run(str(tmp_path), str(tmp_path / "r"), name)
    svc.db.store_error(rid, f"{name}: cannot be read")

    async def go() -> list[str]:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://x") as c:
            return [(await c.get(u)).text for u in ("/runs", f"/runs/{rid}", "/compare")]

    for page in asyncio.run(go()):
        assert "\u202e" not in page and "\x1b" not in page and "<script>alert" not in page
    assert "run&lt;U+202E&gt;TNEM&lt;script&gt;" in asyncio.run(go())[0]
    svc.db.close()


def test_run_named_with_a_non_utf8_byte_is_analysed_and_served(tmp_path: Path) -> None:
    r"""A run folder whose name is not UTF-8: stored escaped (``run\xff``), analysed, its report and page served."""
    import asyncio
    import json

    import httpx

    from forensics.service.app import create_app
    from forensics.service.scheduler import ServiceConfig

    root = (tmp_path / "root").resolve()
    root.mkdir()
    bad = os.path.join(os.fsencode(root), b"run\xff")
    os.mkdir(bad)
    with open(os.path.join(bad, b"metrics.jsonl"), "w") as fh:
        fh.writelines(json.dumps({"step": s, "loss": 2.0 - s * 0.01}) + "\n" for s in range(50))
    app = create_app(ServiceConfig(roots=[root], db=tmp_path / "s.db", token="t0ken", workers=1, events=False,
                                   rescan_s=3600, unreadable_grace_s=0))
    svc = app.state.service

    async def go() -> tuple[dict, int, str, str]:
        await svc.start()
        try:
            row = await svc.analyze(str(root), os.fsdecode(bad))
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://x") as c:
                runs = (await c.get("/api/runs")).json()
                report = await c.get(f"/api/runs/{row['id']}/report.html")
                page = (await c.get(f"/runs/{row['id']}")).text
            return runs, report.status_code, report.text, page
        finally:
            await svc.stop()

    runs, status, report, page = asyncio.run(go())
    assert [r["name"] for r in runs] == ["root/run\\xff"] and runs[0]["verdict"] and not runs[0]["error"]
    assert status == 200 and "<html" in report.lower()
    assert "run\\xff" in page


def test_serve_start_up_errors_are_one_line_naming_what_failed(tmp_path) -> None:  # noqa: ANN001
    """Serve's start-up errors are one line naming what failed, exit 2.

    A port already taken: host:port, before any URL or token is announced; a corrupt ``--db``: the database
    file, not the root, not an "internal error".
    """
    import socket as _socket

    from click.testing import CliRunner

    from forensics.cli import main

    root = tmp_path / "runs"
    root.mkdir()
    with _socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        res = CliRunner().invoke(main, ["serve", str(root), "--port", str(port), "--db", str(tmp_path / "s.db")])
    assert res.exit_code == 2 and f"127.0.0.1:{port}" in res.output and "token" not in res.output
    bad = tmp_path / "bad.db"
    bad.write_text("garbage" * 100)
    res = CliRunner().invoke(main, ["serve", str(root), "--port", "0", "--db", str(bad)])
    assert res.exit_code == 2 and "bad.db" in res.output and "internal" not in res.output
