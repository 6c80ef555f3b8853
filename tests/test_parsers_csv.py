"""Tests of parsers.csv_metrics (W&B exports, Lightning metrics.csv, generic tables)."""

from __future__ import annotations

import math
from pathlib import Path

import polars as pl
import pytest

from forensics.errors import ParseError
from forensics.schema import METRICS_SCHEMA
from parsers import csv_metrics


def read(tmp_path: Path, text: str, name: str = "metrics.csv"):
    """Read."""
    p = tmp_path / name
    p.write_text(text)
    assert csv_metrics.sniff(p)
    r = csv_metrics.read(p, tmp_path)
    assert r.metrics.schema.equals(METRICS_SCHEMA)
    return r, pl.from_arrow(r.metrics)


def vals(df: pl.DataFrame, metric: str, step: int | None = None) -> list:
    """Vals."""
    q = df.filter(pl.col("metric") == metric)
    if step is not None:
        q = q.filter(pl.col("step") == step)
    return q.get_column("value").to_list()


def test_wandb_export(tmp_path):
    """Wandb export."""
    r, df = read(tmp_path, "_step,_runtime,_timestamp,optim/learning_rate,train/loss,eval/loss,"
                           "grad/norm/total\n"
                           "100,5.0,1700000000.5,0.001,2.5,2.7,0.3\n200,10.0,1700000005.5,0.0009,nan,,inf\n")
    assert r.meta["kind"] == "wandb_export" and r.meta["step_column"] == "_step"
    assert vals(df, "lr", 100) == [0.001] and vals(df, "loss", 100) == [2.5]
    assert vals(df, "eval_loss", 100) == [2.7] and vals(df, "eval_loss", 200) == []
    assert math.isnan(vals(df, "loss", 200)[0]) and vals(df, "grad_norm", 200) == [math.inf]
    assert df.filter(pl.col("step") == 200).get_column("wall_time").unique().to_list() == [1700000005.5]
    assert "_runtime" not in df.get_column("metric").to_list()
    assert set(df.get_column("tag")) >= {"optim/learning_rate", "train/loss"}


def test_lightning_sparse_rows(tmp_path):
    """Lightning sparse rows."""
    r, df = read(tmp_path, "epoch,step,train_loss,val_loss\n0,49,2.5,\n0,99,2.1,\n0,99,,2.3\n1,149,1.9,\n")
    assert r.meta["kind"] == "lightning"
    assert vals(df, "loss") == [2.5, 2.1, 1.9] and vals(df, "eval_loss", 99) == [2.3]
    assert vals(df, "epoch", 149) == [1.0]
    assert df.get_column("segment").unique().to_list() == [0]


def test_torn_last_line_and_bad_rows(tmp_path):
    """Torn last line and bad rows."""
    r, df = read(tmp_path, "step,loss,lr\n1,2.0,0.1\n2,1.9\n3,1.8,0.1\n4,1.7,0.")
    # line 5 has three cells but no newline: it may be torn inside its last number, so it is dropped
    assert vals(df, "loss") == [2.0, 1.8]
    assert [s.what for s in r.skipped] == ["metrics.csv:3", "metrics.csv:5"]
    r2, df2 = read(tmp_path, "step,loss,lr\n1,2.0,0.1\n2,1.9", "torn.csv")
    assert vals(df2, "loss") == [2.0]
    assert r2.skipped[0].what == "torn.csv:3" and "torn" in r2.skipped[0].reason


def test_step_rewind_and_non_numeric_cells(tmp_path):
    """Step rewind and non numeric cells."""
    _, df = read(tmp_path, "iteration,loss,note\n10,2.0,ok\n20,1.9,ok\n10,2.1,again\n")
    assert df.select("segment", "step", "value").rows() == [(0, 10, 2.0), (0, 20, 1.9), (1, 10, 2.1)]


def test_wandb_panel_export(tmp_path):
    """Wandb panel export."""
    r, df = read(tmp_path, 'Step,"run-a - train/loss","run-a - train/loss__MIN","run-a - train/loss__MAX"\n'
                           "1,2.0,1.9,2.1\n2,1.8,1.7,1.9\n")
    assert r.meta["runs"] == ["run-a"]
    assert vals(df, "loss") == [2.0, 1.8] and df.height == 2


def test_sniff_and_errors(tmp_path):
    """Sniff and errors."""
    (tmp_path / "a.csv").write_text("name,value\nx,1\n")
    (tmp_path / "b.txt").write_text("step,loss\n1,2\n")
    assert not csv_metrics.sniff(tmp_path / "a.csv") and not csv_metrics.sniff(tmp_path / "b.txt")
    assert not csv_metrics.sniff(tmp_path / "missing.csv")
    with pytest.raises(ParseError):
        csv_metrics.read(tmp_path / "a.csv", tmp_path)


def test_parquet(tmp_path):
    """Parquet."""
    p = tmp_path / "history.parquet"
    pl.DataFrame({"_step": [1, 2], "train/loss": [2.0, None], "_timestamp": [1.0, 2.0]}).write_parquet(p)
    assert csv_metrics.sniff(p)
    df = pl.from_arrow(csv_metrics.read(p, tmp_path).metrics)
    assert df.select("step", "metric", "value", "wall_time").rows() == [(1, "loss", 2.0, 1.0)]


@pytest.mark.cases
def test_case_br16_wandb_history(cases_dir):
    """Case br16 wandb history."""
    folder = next(cases_dir.glob("br16_*"))
    r = csv_metrics.read(folder / "wandb_export/history.csv", folder)
    df = pl.from_arrow(r.metrics)
    assert vals(df, "loss", 180000) == [2.418428] and vals(df, "lr", 192000) == [0.0]
    assert vals(df, "eval/paloma/c4_en/loss", 180000) == [2.537988]
    assert vals(df, "eval/paloma/c4_en/loss", 180100) == []
    assert df.filter(pl.col("step") == 180000).get_column("wall_time")[0] == 1748912345.0
    assert r.meta["segments"] == 1 and not r.skipped


@pytest.mark.cases
def test_case_br25_wandb_history(cases_dir):
    """Case br25 wandb history."""
    folder = next(cases_dir.glob("br25_*"))
    df = pl.from_arrow(csv_metrics.read(folder / "wandb_export/history.csv", folder).metrics)
    assert vals(df, "grad_norm", 174000) == [0.21598]
    assert vals(df, "params/norm/lm_head", 182000) == [559.9799]
    assert df.get_column("step").min() == 174000 and df.get_column("step").max() == 182000
