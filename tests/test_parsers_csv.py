"""Tests of parsers.csv_metrics (W&B exports, Lightning metrics.csv, generic tables)."""

from __future__ import annotations

import json
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
    (tmp_path / "b.txt").write_text("step,loss\n1,2\n")  # a table printed to a text file is read as one
    (tmp_path / "c.txt").write_text("step, then loss\nrun 1, fine\n")
    assert not csv_metrics.sniff(tmp_path / "a.csv") and csv_metrics.sniff(tmp_path / "b.txt")
    assert not csv_metrics.sniff(tmp_path / "c.txt")
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
    assert vals(df, "eval_loss/paloma_c4_en", 180000) == [2.537988]  # a per-dataset eval loss, by rule
    assert vals(df, "eval_loss/paloma_c4_en", 180100) == []
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


# ---------------------------------------------------------------------------------------------
# Lightning CSVLogger, real (tests/data/make_lightning_fixture.py, pytorch-lightning 2.6.6)
# ---------------------------------------------------------------------------------------------
LIGHTNING = Path(__file__).parent / "data" / "lightning_run"


def test_real_lightning_metrics_csv():
    """110 train rows every 10 steps, 2 validation rows, NaN from step 1059 (the loss turned NaN at 1050)."""
    r = csv_metrics.read(LIGHTNING / "csv/version_0/metrics.csv", LIGHTNING)
    df = pl.from_arrow(r.metrics)
    assert r.meta["kind"] == "lightning" and r.meta["step_column"] == "step" and not r.skipped
    assert r.path == "csv/version_0/metrics.csv" and r.meta["segments"] == 1
    loss = df.filter(pl.col("metric") == "loss")
    assert loss.get_column("step").to_list() == list(range(9, 1100, 10))
    assert loss.get_column("tag").unique().to_list() == ["reduced_train_loss"]
    assert vals(df, "loss", 9) == [7.314020156860352] and vals(df, "loss", 1049) == [0.09340929985046387]
    assert [s for s, v in loss.select("step", "value").rows() if math.isnan(v)] == list(range(1059, 1100, 10))
    assert df.filter(pl.col("metric") == "eval_loss").select("step", "value").rows() == [
        (499, 0.47118109464645386), (999, 0.2625895142555237)]
    assert vals(df, "lr", 9) == [0.009999999776482582] and vals(df, "samples", 1099) == [4400.0]
    counts = dict(df.group_by("metric").len().rows())
    assert counts == {"loss": 110, "lr": 110, "samples": 110, "global_step": 110, "epoch": 112, "eval_loss": 2}


# ---------------------------------------------------------------------------------------------
# W&B history exports as JSON arrays (scan_history() dumped with json, run.history() via pandas)
# ---------------------------------------------------------------------------------------------
def history_rows() -> list[dict]:
    """Six rows as W&B's public API returns them: sparse eval key, media object, NaN at step 3."""
    out = []
    for s in range(6):
        row = {"_step": s * 10, "_runtime": 1.5 * s, "_timestamp": 1700000000.25 + s, "train/loss": 2.0 - s / 8,
               "optim/lr": 1e-3, "_wandb": {"runtime": s}}
        if s == 3:
            row["train/loss"] = math.nan
        if s in (2, 5):
            row["eval/loss"] = 2.5 - s / 10
        if s == 1:
            row["samples"] = {"_type": "table-file", "path": "media/table/samples_1.table.json"}
        out.append(row)
    return out


def test_wandb_json_export_nan_spellings(tmp_path):
    """NaN token (json.dump), "NaN" string (value_json spelling), null (pandas) and a media object."""
    rows = history_rows()
    rows[4]["train/loss"] = "NaN"
    rows[5]["train/loss"] = None
    p = tmp_path / "history.json"
    p.write_text(json.dumps(rows, indent=2))
    assert "NaN" in p.read_text() and csv_metrics.sniff(p)
    r = csv_metrics.read(p, tmp_path)
    df = pl.from_arrow(r.metrics)
    assert r.format == "csv" and r.meta["container"] == "json" and r.meta["kind"] == "wandb_export"
    assert r.meta["records"] == 6 and r.meta["null_values"] == 1 and not r.skipped
    loss = df.filter(pl.col("metric") == "loss").select("step", "value").rows()
    assert loss[:3] == [(0, 2.0), (10, 1.875), (20, 1.75)] and [s for s, _ in loss] == [0, 10, 20, 30, 40]
    assert math.isnan(loss[3][1]) and math.isnan(loss[4][1])
    assert df.filter(pl.col("metric") == "eval_loss").select("step", "value").rows() == [(20, 2.3), (50, 2.0)]
    assert vals(df, "lr") == [1e-3] * 6 and df.height == 5 + 6 + 2
    assert set(df.get_column("metric")) == {"loss", "lr", "eval_loss"}  # no _runtime, _timestamp, _wandb, media
    assert df.filter(pl.col("step") == 30).get_column("wall_time").unique().to_list() == [1700000003.25]


def test_wandb_json_export_written_by_pandas(tmp_path):
    """``run.history()`` (a DataFrame) saved with ``to_json(orient="records")``: NaN and gaps are null."""
    pd = pytest.importorskip("pandas")
    rows = [{k: v for k, v in row.items() if k not in ("_wandb", "samples")} for row in history_rows()]
    p = tmp_path / "history.json"
    pd.DataFrame(rows).to_json(p, orient="records")
    assert p.read_text().startswith('[{"_step":0,') and "null" in p.read_text()
    r = csv_metrics.read(p, tmp_path)
    df = pl.from_arrow(r.metrics)
    assert r.meta["null_values"] == 1 + 4  # the NaN loss and the four rows without eval/loss
    assert df.filter(pl.col("metric") == "loss").get_column("step").to_list() == [0, 10, 20, 40, 50]
    assert df.filter(pl.col("metric") == "eval_loss").get_column("step").to_list() == [20, 50]
    assert df.height == 5 + 6 + 2


def test_pandas_default_to_json_column_layout(tmp_path):
    """The default pandas ``to_json()`` (column-oriented) reads like the row layout; a cut one is refused clearly.

    The JSONL parser does not claim it (it used to, as a single record).
    """
    pd = pytest.importorskip("pandas")
    from parsers import jsonl

    rows = [{k: v for k, v in row.items() if k not in ("_wandb", "samples")} for row in history_rows()]
    p, q = tmp_path / "history.json", tmp_path / "rows.json"
    pd.DataFrame(rows).to_json(p)
    pd.DataFrame(rows).to_json(q, orient="records")
    assert p.read_text().startswith('{"_step":{"0":0,')
    assert csv_metrics.sniff(p) and not jsonl.sniff(p)
    a, b = csv_metrics.read(p, tmp_path), csv_metrics.read(q, tmp_path)
    assert a.meta["layout"] == "columns"
    assert a.metrics.drop_columns(["source"]).equals(b.metrics.drop_columns(["source"]))
    p.write_text(p.read_text()[:-30])
    with pytest.raises(ParseError, match="damaged column-oriented JSON"):
        csv_metrics.read(p, tmp_path)


def test_wandb_json_export_cut_at_every_offset_keeps_complete_rows(tmp_path):
    """A JSON export cut anywhere: every row complete before the cut is read, the cut is listed."""
    text = json.dumps(history_rows(), indent=1)
    ends = []  # offset just past each top-level row object
    dec, i = json.JSONDecoder(), 1
    while True:
        while text[i] in " \n,":
            i += 1
        if text[i] == "]":
            break
        _, i = dec.raw_decode(text, i)
        ends.append(i)
    p = tmp_path / "history.json"
    for cut in range(2, len(text)):
        p.write_text(text[:cut])
        r = csv_metrics.read(p, tmp_path)
        whole = sum(e <= cut for e in ends)
        steps = sorted(set(pl.from_arrow(r.metrics).get_column("step").to_list()))
        assert steps == [10 * k for k in range(whole)], cut
        assert len(r.skipped) == 1 and r.skipped[0].what.startswith("history.json:"), cut


def test_wandb_json_export_corrupt_row_is_skipped(tmp_path):
    """A corrupt row in the middle is listed with its line; the rows after it are read."""
    text = json.dumps(history_rows(), indent=1)
    i = text.index('"_step": 20')
    p = tmp_path / "history.json"
    p.write_text(text[:i] + "#" + text[i + 1:])
    r = csv_metrics.read(p, tmp_path)
    df = pl.from_arrow(r.metrics)
    assert sorted(set(df.get_column("step").to_list())) == [0, 10, 30, 40, 50]
    line = text[:i].count("\n") + 1
    assert [s.what for s in r.skipped] == [f"history.json:{line - 1}"]
    assert "skipped to the next element" in r.skipped[0].reason


def test_json_sniff(tmp_path):
    """Only arrays of row objects with a step key, or with a loss column (read by row index), are claimed."""
    cases = {"a.json": '[{"_step": 0, "loss": 1}]', "b.json": '{"_step": 0}', "c.json": "[1, 2]",
             "d.json": '[{"loss": 1}]', "e.json": '  \n[\n {"step": 3, "loss": 1}\n]', "f.json": "",
             "g.json": '[{"name": "x", "size": 3}]'}
    for name, text in cases.items():
        (tmp_path / name).write_text(text)
    assert [n for n in sorted(cases) if csv_metrics.sniff(tmp_path / n)] == ["a.json", "d.json", "e.json"]
    d = csv_metrics.read(tmp_path / "d.json", tmp_path)
    assert d.meta["step_axis"]["kind"] == "row_index" and pl.from_arrow(d.metrics)["step"].to_list() == [0]
    with pytest.raises(ParseError):
        csv_metrics.read(tmp_path / "b.json", tmp_path)


def test_parquet_exports_pandas_and_polars(tmp_path):
    """The to_parquet of pandas turns NaN into null (no row); polars keeps NaN; a cut file is claimed and refused."""
    pd = pytest.importorskip("pandas")
    rows = [{k: v for k, v in row.items() if k not in ("_wandb", "samples")} for row in history_rows()]
    a = tmp_path / "pandas.parquet"
    pd.DataFrame(rows).to_parquet(a)
    b = tmp_path / "polars.parquet"
    pl.DataFrame(rows).write_parquet(b)
    ra, rb = csv_metrics.read(a, tmp_path), csv_metrics.read(b, tmp_path)
    da, db = pl.from_arrow(ra.metrics), pl.from_arrow(rb.metrics)
    assert ra.meta["kind"] == "wandb_export" and ra.meta["null_values"] == 5 and rb.meta["null_values"] == 4
    assert da.filter(pl.col("metric") == "loss").get_column("step").to_list() == [0, 10, 20, 40, 50]
    assert db.filter(pl.col("metric") == "loss").get_column("step").to_list() == [0, 10, 20, 30, 40, 50]
    assert math.isnan(vals(db, "loss", 30)[0]) and da.height == 13 and db.height == 14
    assert "_runtime" not in set(da.get_column("metric")) and vals(da, "lr", 50) == [1e-3]
    assert da.filter(pl.col("step") == 10).get_column("wall_time").unique().to_list() == [1700000001.25]
    cut = tmp_path / "cut.parquet"
    cut.write_bytes(a.read_bytes()[: a.stat().st_size // 2])
    assert csv_metrics.sniff(cut)
    with pytest.raises(ParseError, match="damaged Parquet"):
        csv_metrics.read(cut, tmp_path)


def _epoch_table(extra_blank: bool) -> str:
    """An epoch-indexed TSV in flair's ``loss.tsv`` layout (upper-case header, clock times, ``_`` for none).

    With ``extra_blank`` every row has one empty cell more than the header (after ``TRAIN_LOSS``), as
    older writers produce when the train metrics are off.
    """
    head = ["EPOCH", "TIMESTAMP", "BAD_EPOCHS", "LEARNING_RATE", "TRAIN_LOSS", "TRAIN_F1", "DEV_LOSS", "DEV_F1"]
    out = ["\t".join(head)]
    for e in range(6):
        train = f"{1.5 / (e + 1):.4f}"
        cells = [str(e), f"10:{e:02d}:00", "0", "0.1000", train] + ([""] if extra_blank else [])
        out.append("\t".join(cells + ["_", f"{1.7 / (e + 1):.4f}", f"{0.5 + e * 0.05:.4f}"]))
    return "\n".join(out) + "\n"


@pytest.mark.parametrize("extra_blank", [False, True])
def test_epoch_indexed_tsv_with_odd_header_and_extra_blank_cells(tmp_path, extra_blank) -> None:
    """An epoch-indexed TSV with an upper-case header is read; a writer's extra blank cells are dropped."""
    r, df = read(tmp_path, _epoch_table(extra_blank), name="loss.tsv")
    assert r.meta["step_column"] == "EPOCH" and r.meta["step_axis"]["kind"] == "epoch"
    assert not r.skipped
    assert vals(df, "loss") == pytest.approx([1.5 / (e + 1) for e in range(6)], abs=1e-4)
    assert vals(df, "eval_loss") == pytest.approx([1.7 / (e + 1) for e in range(6)], abs=1e-4)
    assert (r.meta.get("dropped_blank_cells") == [5]) is extra_blank
    assert df.filter(pl.col("tag") == "TRAIN_F1").height == 0  # "_" is no value


def test_rows_of_another_width_are_still_listed(tmp_path) -> None:
    """A single row of another width is still skipped and listed."""
    text = "step,loss\n1,2.0\n2,1.9,7\n3,1.8\n"
    r, df = read(tmp_path, text)
    assert [s.what for s in r.skipped] == ["metrics.csv:3"]
    assert vals(df, "loss") == [2.0, 1.8]


def test_table_past_the_byte_budget_is_cut_at_a_line_and_listed(tmp_path, monkeypatch) -> None:
    """A table longer than its byte budget (a gzip that expands to gigabytes) keeps its first whole lines."""
    from parsers import _io

    monkeypatch.setattr(_io.read_table_bytes, "__defaults__", (1000,))
    text = "step,loss\n" + "".join(f"{s},{1.0 / (s + 1):.6f}\n" for s in range(500))
    r, df = read(tmp_path, text)
    assert len(r.skipped) == 1 and "MiB of table text" in r.skipped[0].reason
    steps = df.get_column("step").to_list()
    assert steps == list(range(len(steps))) and 50 < len(steps) < 100
