"""parsers.mlflow_store on stores written by the real MLflow client (``tests/data/make_mlflow_fixture.py``).

The same 12 steps were logged to the file store (``mlruns/``) and to SQLite (``mlflow.db``): NaN at
step 9 (the file store writes ``nan``; SQLite stores 0 with ``is_nan``), +-inf at steps 10 and 11
(``inf`` / +-1.7976931348623157e308).
"""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import polars as pl

from parsers import mlflow_store

RUN = Path(__file__).parent / "data" / "mlflow_run"
LOSS = [2.0 - s / 8 for s in range(9)] + [math.nan, math.inf, -math.inf]


def _read(path: Path, root: Path) -> tuple:
    assert mlflow_store.sniff(path)
    r = mlflow_store.read(path, root)
    return r, pl.from_arrow(r.metrics)


def _series(df: pl.DataFrame, metric: str) -> list[tuple]:
    return df.filter(pl.col("metric") == metric).sort("step").select("step", "value").rows()


def _same(a: list[float], b: list[float]) -> bool:
    return len(a) == len(b) and all((math.isnan(x) and math.isnan(y)) or x == y for x, y in zip(a, b, strict=True))


def test_real_file_store():
    """Every metric file of the run: values, steps and millisecond timestamps as the client wrote them."""
    (loss_file,) = RUN.glob("mlruns/*/*/metrics/train/loss")
    found = {}
    for p in sorted(RUN.glob("mlruns/*/*/metrics/**/*")):
        if p.is_file():
            r, df = _read(p, RUN)
            assert not r.skipped
            found[p.relative_to(loss_file.parents[1]).as_posix()] = df
    assert sorted(found) == ["eval/loss", "lr", "train/loss"]
    loss = found["train/loss"]
    assert [s for s, _ in _series(loss, "loss")] == list(range(12))
    assert _same([v for _, v in _series(loss, "loss")], LOSS)
    assert loss.get_column("wall_time").to_list() == [1700000000.0 + s for s in range(12)]
    assert _series(found["eval/loss"], "eval_loss") == [(0, 2.5), (4, 2.1), (8, 1.7)]
    assert len(_series(found["lr"], "lr")) == 12


def test_real_sqlite_store():
    """mlflow.db: is_nan rows are NaN, +-DBL_MAX are +-inf; the same series as the file store."""
    r, df = _read(RUN / "mlflow.db", RUN)
    assert not r.skipped
    assert _same([v for _, v in _series(df, "loss")], LOSS)
    assert _series(df, "eval_loss") == [(0, 2.5), (4, 2.1), (8, 1.7)]
    assert len(_series(df, "lr")) == 12 and df.height == 12 + 12 + 3


def test_real_file_store_torn_last_line(tmp_path):
    """A metric file cut inside its last line: the complete lines are kept and the cut one listed."""
    shutil.copytree(RUN / "mlruns", tmp_path / "mlruns")
    (loss_file,) = tmp_path.glob("mlruns/*/*/metrics/train/loss")
    text = loss_file.read_text()
    loss_file.write_text(text[: text.rindex("\n", 0, len(text) - 1) + 8])  # 7 bytes into the last line
    r, df = _read(loss_file, tmp_path)
    assert [s for s, _ in _series(df, "loss")] == list(range(11))
    assert len(r.skipped) == 1 and r.skipped[0].what.endswith("train/loss:12")
