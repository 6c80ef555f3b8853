"""Make ``tests/data/mlflow_run/``: one MLflow run written by the real client to a file store and to SQLite.

Not a test and not a project dependency: run it once, by hand, where ``mlflow`` (or ``mlflow-skinny``
with ``sqlalchemy`` and ``alembic``) is installed; the committed fixture was made with mlflow-skinny
3.17.2::

    python tests/data/make_mlflow_fixture.py            # rewrites tests/data/mlflow_run/

The same 12 steps go to ``mlruns/`` (the file store, allowed with ``MLFLOW_ALLOW_FILE_STORE=true``) and
to ``mlflow.db`` (the SQLite store): ``train/loss`` (NaN at step 9, +inf at step 10, -inf at step 11),
``lr`` and, every 4th step, ``eval/loss``; one parameter and one tag. Timestamps are fixed
(``timestamp=1700000000000 + 1000 * step`` ms) so that the files are reproducible up to run ids. Only the
tables a reader needs are kept in ``mlflow.db`` (MLflow creates some 65), to keep the fixture small.
"""

from __future__ import annotations

import math
import os
import shutil
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT = HERE / "mlflow_run"
STEPS = 12


def value(step: int) -> float:
    """The logged loss: a decay, then NaN, +inf, -inf."""
    return {9: math.nan, 10: math.inf, 11: -math.inf}.get(step, 2.0 - step / 8)


def _log(uri: str) -> None:
    import mlflow
    from mlflow.entities import Metric
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    exp = client.create_experiment("forensics-fixture")
    run = client.create_run(exp, run_name="tiny-run", start_time=1700000000000)
    rid = run.info.run_id
    client.log_param(rid, "learning_rate", "0.001")
    client.set_tag(rid, "precision", "fp16")
    for s in range(STEPS):
        ts = 1700000000000 + 1000 * s
        batch = [Metric("train/loss", value(s), ts, s), Metric("lr", 1e-3 * (1 - s / STEPS), ts, s)]
        if s % 4 == 0:
            batch.append(Metric("eval/loss", 2.5 - s / 10, ts, s))
        client.log_batch(rid, metrics=batch)
    client.set_terminated(rid, status="FAILED", end_time=1700000000000 + 1000 * STEPS)
    del mlflow


def _trim_db(path: Path) -> None:
    """Keep the tables a reader needs (MLflow's own DDL and rows); the 60-odd others only cost ~850 KB."""
    import sqlite3

    keep = ("alembic_version", "experiments", "experiment_tags", "runs", "metrics", "latest_metrics", "params",
            "tags")
    full = path.with_suffix(".full")
    path.rename(full)
    src, dst = sqlite3.connect(full), sqlite3.connect(path)
    for name, sql in src.execute("SELECT name, sql FROM sqlite_master WHERE type = 'table'").fetchall():
        if name not in keep:
            continue
        dst.execute(sql)
        for (idx,) in src.execute("SELECT sql FROM sqlite_master WHERE type = 'index' AND tbl_name = ? "
                                  "AND sql IS NOT NULL", (name,)).fetchall():
            dst.execute(idx)
        rows = src.execute(f"SELECT * FROM {name}").fetchall()
        if rows:
            dst.executemany(f"INSERT INTO {name} VALUES ({', '.join('?' * len(rows[0]))})", rows)
    dst.commit()
    dst.execute("VACUUM")
    dst.close()
    src.close()
    full.unlink()


def main() -> None:
    """Write both stores."""
    if OUT.exists():
        shutil.rmtree(OUT)
    OUT.mkdir(parents=True)
    os.environ["MLFLOW_ALLOW_FILE_STORE"] = "true"
    _log((OUT / "mlruns").as_uri())
    _log(f"sqlite:///{OUT / 'mlflow.db'}")
    _trim_db(OUT / "mlflow.db")
    for p in sorted(OUT.rglob("*")):
        if p.is_file():
            print(p.relative_to(HERE), p.stat().st_size)


if __name__ == "__main__":
    main()
