"""Tests of parsers.mlflow_store: the MLflow file store (mlruns/) and SQLite store (mlflow.db).

The stores are built by hand exactly as docs/formats.md#mlflow documents the on-disk layout; a
test with the real writer runs only where ``mlflow`` is installed.
"""

from __future__ import annotations

import importlib.util
import math
import sqlite3
from pathlib import Path

import polars as pl
import pytest

from forensics.errors import ParseError
from forensics.schema import METRICS_SCHEMA
from parsers import PARSER_MODULES, mlflow_store

DBL_MAX = 1.7976931348623157e308


def make_run(root: Path, metrics: dict[str, str], run_id: str = "0123456789abcdef",
             params: dict[str, str] | None = None, tags: dict[str, str] | None = None) -> Path:
    """An MLflow file-store run folder ``mlruns/1/<run_id>`` with the given metric file texts."""
    run = root / "mlruns" / "1" / run_id
    (run / "metrics").mkdir(parents=True)
    (run / "artifacts").mkdir()
    (root / "mlruns" / "1" / "meta.yaml").write_text("experiment_id: '1'\nname: exp\n")
    (run / "meta.yaml").write_text(f"artifact_uri: file:///x/mlruns/1/{run_id}/artifacts\nend_time: null\n"
                                   f"experiment_id: '1'\nlifecycle_stage: active\nrun_id: {run_id}\n"
                                   f"run_name: bold-fox-42\nrun_uuid: {run_id}\nstart_time: 1700000000000\n"
                                   "status: 1\nuser_id: me\n")
    for key, text in metrics.items():
        p = run / "metrics" / key
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    for sub, items in (("params", params or {}), ("tags", tags or {})):
        for key, text in items.items():
            p = run / sub / key
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(text)
    return run


def read(path: Path, root: Path):
    """Sniff and read one file; the metrics as polars."""
    assert mlflow_store.sniff(path)
    r = mlflow_store.read(path, root)
    assert r.format == "mlflow" and r.metrics.schema.equals(METRICS_SCHEMA)
    return r, pl.from_arrow(r.metrics)


def test_registered_before_textlog():
    """Registered before textlog."""
    assert PARSER_MODULES.index("parsers.mlflow_store") < PARSER_MODULES.index("parsers.textlog")


def test_file_store_values_nan_inf(tmp_path):
    """File store values nan inf."""
    run = make_run(tmp_path, {"loss": "1700000000000 2.5 0\n1700000001500 nan 10\n1700000002000 inf 20\n"
                                      "1700000003000 -inf 30\n1700000004000 1.25 40\n"},
                   params={"learning_rate": "0.0003", "optimizer": "adamw"}, tags={"mlflow.runName": "bold-fox-42"})
    r, df = read(run / "metrics" / "loss", tmp_path)
    assert df.get_column("step").to_list() == [0, 10, 20, 30, 40]
    v = df.get_column("value").to_list()
    assert v[0] == 2.5 and math.isnan(v[1]) and v[2] == math.inf and v[3] == -math.inf and v[4] == 1.25
    assert df.get_column("wall_time").to_list()[:2] == [1700000000.0, 1700000001.5]
    assert set(df.get_column("metric")) == {"loss"} and set(df.get_column("tag")) == {"loss"}
    assert set(df.get_column("source")) == {"mlruns/1/0123456789abcdef/metrics/loss"}
    assert df.get_column("segment").unique().to_list() == [0]
    assert r.skipped == ()
    assert r.meta["run_id"] == "0123456789abcdef" and r.meta["experiment_id"] == "1"
    assert r.meta["params"]["optimizer"] == "adamw" and r.meta["hparams"]["learning_rate"] == 0.0003
    assert r.meta["tags"]["mlflow.runName"] == "bold-fox-42" and r.meta["store"] == "file"


def test_two_field_lines_are_step_zero(tmp_path):
    """Two field lines are step zero."""
    run = make_run(tmp_path, {"acc": "1600000000000 0.5\n1600000001000 0.75\n"})
    _, df = read(run / "metrics" / "acc", tmp_path)
    assert df.get_column("step").to_list() == [0, 0]
    assert df.get_column("value").to_list() == [0.5, 0.75]


def test_torn_last_line_skipped(tmp_path):
    """Torn last line skipped."""
    run = make_run(tmp_path, {"loss": "1700000000000 2.5 0\n1700000001000 2.4 1\n1700000002000 2.3"})
    r, df = read(run / "metrics" / "loss", tmp_path)
    assert df.get_column("value").to_list() == [2.5, 2.4]
    assert [s.what for s in r.skipped] == ["mlruns/1/0123456789abcdef/metrics/loss:3"]
    assert "torn" in r.skipped[0].reason


def test_bad_line_and_rewind(tmp_path):
    """Bad line and rewind."""
    run = make_run(tmp_path, {"loss": "1700000000000 2.5 0\ngarbage here now and more\n1700000001000 2.4 5\n"
                                      "1700000002000 2.6 3\n"})
    r, df = read(run / "metrics" / "loss", tmp_path)
    assert [s.what for s in r.skipped] == ["mlruns/1/0123456789abcdef/metrics/loss:2"]
    assert df.get_column("segment").to_list() == [0, 0, 1]


def test_nested_key_folders(tmp_path):
    """Nested key folders."""
    run = make_run(tmp_path, {"train/loss": "1700000000000 3.0 1\n", "optim/lr/group0": "1700000000000 0.1 1\n"})
    _, df = read(run / "metrics" / "train" / "loss", tmp_path)
    assert df.get_column("metric").to_list() == ["loss"] and df.get_column("tag").to_list() == ["train/loss"]
    _, df = read(run / "metrics" / "optim" / "lr" / "group0", tmp_path)
    assert df.get_column("tag").to_list() == ["optim/lr/group0"] and df.get_column("value").to_list() == [0.1]


def test_empty_and_unclaimed(tmp_path):
    """Empty and unclaimed."""
    run = make_run(tmp_path, {"loss": ""})
    assert mlflow_store.sniff(run / "metrics" / "loss")
    with pytest.raises(ParseError):
        mlflow_store.read(run / "metrics" / "loss", tmp_path)
    stray = tmp_path / "other" / "metrics"
    stray.mkdir(parents=True)
    (stray / "loss").write_text("1700000000000 2.5 0\n")
    assert not mlflow_store.sniff(stray / "loss")  # no meta.yaml next to metrics/
    assert not mlflow_store.sniff(run / "meta.yaml") and not mlflow_store.sniff(tmp_path / "missing")
    (run / "params").mkdir(exist_ok=True)
    (run / "params" / "x").write_text("1")
    assert not mlflow_store.sniff(run / "params" / "x")


def test_load_file_store_run(tmp_path):
    """Load file store run: sibling metric files are no resume of each other."""
    from forensics.api import load

    make_run(tmp_path, {"train/loss": "1700000000000 2.5 0\n1700000001000 2.25 1\n",
                        "learning_rate": "1700000000000 0.001 0\n1700000001000 0.002 1\n",
                        "grad_norm": "1700000000000 0.5 0\n1700000001000 0.75 1\n"},
             params={"batch_size": "32"})
    run = load(tmp_path)
    df = run.metrics
    assert set(df.get_column("metric")) == {"loss", "lr", "grad_norm"}
    assert df.filter(pl.col("metric") == "loss").sort("step").get_column("value").to_list() == [2.5, 2.25]
    assert df.filter(pl.col("metric") == "lr").sort("step").get_column("value").to_list() == [0.001, 0.002]
    assert df.get_column("segment").unique().to_list() == [0]
    assert {s.format for s in run.sources} == {"mlflow"} and len(run.sources) == 3
    assert run.meta["hparams"]["batch_size"] == 32


def make_db(path: Path, rows: list[tuple], runs: list[tuple] | None = None) -> Path:
    """A SQLite store with MLflow's ``metrics`` (and ``runs``, ``params``) tables."""
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE metrics (key VARCHAR(250) NOT NULL, value FLOAT(53) NOT NULL, "
                "timestamp BIGINT NOT NULL, run_uuid VARCHAR(32) NOT NULL, step BIGINT DEFAULT '0' NOT NULL, "
                "is_nan BOOLEAN DEFAULT '0' NOT NULL, "
                "PRIMARY KEY (key, timestamp, step, run_uuid, value, is_nan))")
    con.execute("CREATE TABLE latest_metrics (key VARCHAR(250), value FLOAT(53), timestamp BIGINT, step BIGINT, "
                "is_nan BOOLEAN, run_uuid VARCHAR(32))")
    con.execute("CREATE TABLE runs (run_uuid VARCHAR(32) PRIMARY KEY, name VARCHAR(250), status VARCHAR(9), "
                "experiment_id INTEGER, start_time BIGINT)")
    con.execute("CREATE TABLE params (key VARCHAR(250), value VARCHAR(8000), run_uuid VARCHAR(32))")
    con.executemany("INSERT INTO metrics (key, value, timestamp, run_uuid, step, is_nan) VALUES (?,?,?,?,?,?)",
                    rows)
    for r in runs or []:
        con.execute("INSERT INTO runs VALUES (?,?,?,?,?)", r)
    con.execute("INSERT INTO params VALUES ('lr', '0.001', 'aaaaaaaa11112222')")
    con.commit()
    con.close()
    return path


def test_sqlite_one_run(tmp_path):
    """Sqlite one run: NaN is 0 with is_nan=1, +-inf is +-DBL_MAX."""
    u = "aaaaaaaa11112222"
    db = make_db(tmp_path / "mlflow.db", [
        ("train/loss", 2.5, 1700000000000, u, 0, 0), ("train/loss", 0.0, 1700000001000, u, 1, 1),
        ("train/loss", DBL_MAX, 1700000002000, u, 2, 0), ("train/loss", -DBL_MAX, 1700000003000, u, 3, 0),
        ("learning_rate", 0.001, 1700000000000, u, 0, 0)], runs=[(u, "run-a", "FINISHED", 0, 1700000000000)])
    r, df = read(db, tmp_path)
    loss = df.filter(pl.col("metric") == "loss").sort("step")
    v = loss.get_column("value").to_list()
    assert v[0] == 2.5 and math.isnan(v[1]) and v[2] == math.inf and v[3] == -math.inf
    assert loss.get_column("tag").unique().to_list() == ["train/loss"]
    assert loss.get_column("wall_time").to_list()[0] == 1700000000.0
    assert df.filter(pl.col("metric") == "lr").get_column("value").to_list() == [0.001]
    assert df.get_column("segment").unique().to_list() == [0]
    assert r.meta["run_id"] == u and r.meta["runs"][u]["name"] == "run-a" and r.meta["hparams"] == {"lr": 0.001}


def test_sqlite_several_runs(tmp_path):
    """Sqlite several runs: one segment, the run id in the tag."""
    a, b = "aaaaaaaa11112222", "bbbbbbbb33334444"
    db = make_db(tmp_path / "mlflow.db", [("loss", 2.5, 1700000000000, a, 0, 0), ("loss", 3.5, 1700000005000, b, 0, 0),
                                          ("loss", 2.0, 1700000001000, a, 1, 0)])
    r, df = read(db, tmp_path)
    assert df.get_column("segment").unique().to_list() == [0]
    assert sorted(df.get_column("tag").unique().to_list()) == ["loss@aaaaaaaa", "loss@bbbbbbbb"]
    assert df.filter(pl.col("tag") == "loss@aaaaaaaa").sort("step").get_column("value").to_list() == [2.5, 2.0]
    assert r.meta["run_ids"] == [a, b] and "run_id" not in r.meta


def test_sqlite_not_mlflow_and_broken(tmp_path):
    """Sqlite not mlflow and broken."""
    other = tmp_path / "optuna.db"
    con = sqlite3.connect(other)
    con.execute("CREATE TABLE trials (id INTEGER)")
    con.commit()
    con.close()
    assert not mlflow_store.sniff(other)
    fake = tmp_path / "mlflow.db"
    fake.write_bytes(b"SQLite format 3\x00" + b"\x00" * 50)
    assert mlflow_store.sniff(fake)
    with pytest.raises(ParseError):
        mlflow_store.read(fake, tmp_path)
    (tmp_path / "notes.db").write_text("hello")
    assert not mlflow_store.sniff(tmp_path / "notes.db")
    empty = make_db(tmp_path / "empty.db", [])
    assert mlflow_store.sniff(empty)
    with pytest.raises(ParseError):
        mlflow_store.read(empty, tmp_path)


def test_load_sqlite_store(tmp_path):
    """Load sqlite store."""
    from forensics.api import load

    u = "aaaaaaaa11112222"
    make_db(tmp_path / "mlflow.db", [("train_loss", 2.5, 1700000000000, u, 0, 0),
                                     ("train_loss", 2.0, 1700000001000, u, 1, 0),
                                     ("lr", 0.001, 1700000000000, u, 0, 0)])
    run = load(tmp_path)
    assert set(run.metrics.get_column("metric")) == {"loss", "lr"}
    assert [s.format for s in run.sources] == ["mlflow"]


@pytest.mark.skipif(importlib.util.find_spec("mlflow") is None, reason="mlflow is not installed")
def test_real_mlflow_file_store(tmp_path, monkeypatch):  # pragma: no cover - needs mlflow
    """Real mlflow file store."""
    import mlflow

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    mlflow.set_tracking_uri((tmp_path / "mlruns").as_uri())
    with mlflow.start_run():
        mlflow.log_param("lr", 0.001)
        for step in range(3):
            mlflow.log_metric("train/loss", 2.0 - step / 10, step=step)
        mlflow.log_metric("train/loss", float("nan"), step=3)
    from forensics.api import load

    df = load(tmp_path).metrics.filter(pl.col("metric") == "loss").sort("step")
    v = df.get_column("value").to_list()
    assert v[:3] == [2.0, 1.9, 1.8] and math.isnan(v[3])
