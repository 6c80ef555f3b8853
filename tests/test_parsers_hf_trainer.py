"""Tests of parsers.hf_trainer (trainer_state.json log_history, newest copy wins)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import polars as pl
import pytest

from forensics.errors import ParseError
from forensics.schema import METRICS_SCHEMA
from parsers import hf_trainer


def state(global_step: int, history: list[dict], **extra) -> dict:
    """State."""
    return {"global_step": global_step, "max_steps": 100, "logging_steps": 1, "train_batch_size": 8,
            "epoch": 0.5, "log_history": history, **extra}


def write(path: Path, obj: dict | str) -> Path:
    """Write."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(obj if isinstance(obj, str) else json.dumps(obj, indent=2))
    return path


def train(step: int, loss: float = 2.0) -> dict:
    """Train."""
    return {"epoch": step / 100, "grad_norm": 1.5, "learning_rate": 1e-4, "loss": loss, "step": step}


def rows(r) -> pl.DataFrame:
    """Rows."""
    assert r.metrics.schema.equals(METRICS_SCHEMA)
    return pl.from_arrow(r.metrics)


def vals(df: pl.DataFrame, metric: str, step: int) -> list:
    """Vals."""
    return df.filter((pl.col("metric") == metric) & (pl.col("step") == step)).get_column("value").to_list()


def test_train_eval_summary_and_nan(tmp_path):
    """Train eval summary and nan."""
    text = json.dumps(state(3, [
        train(1), {"epoch": 0.02, "grad_norm": float("nan"), "learning_rate": 9e-5, "loss": 0.0,
                   "num_input_tokens_seen": 4096, "logits_max": 12.5, "step": 2},
        {"epoch": 0.02, "eval_loss": 1.9, "eval_accuracy": 0.5, "eval_runtime": 3.0, "step": 2},
        {"epoch": 0.03, "step": 3, "total_flos": 1e15, "train_loss": 6.29, "train_runtime": 241.7},
    ]))
    assert "NaN" in text
    p = write(tmp_path / "out" / "trainer_state.json", text)
    assert hf_trainer.sniff(p)
    r = hf_trainer.read(p, tmp_path)
    df = rows(r)
    assert r.format == "hf_trainer" and r.path == "out/trainer_state.json"
    assert vals(df, "loss", 1) == [2.0] and vals(df, "lr", 1) == [1e-4] and vals(df, "epoch", 1) == [0.01]
    assert math.isnan(vals(df, "grad_norm", 2)[0]) and vals(df, "loss", 2) == [0.0]
    assert vals(df, "tokens", 2) == [4096.0] and vals(df, "output_logit_max", 2) == [12.5]
    assert vals(df, "eval_loss", 2) == [1.9] and vals(df, "eval_accuracy", 2) == [0.5]
    assert df.filter(pl.col("step") == 3).height == 0  # the summary is not a row
    assert r.meta["train_summary"]["train_loss"] == 6.29
    assert r.meta["global_step"] == 3 and r.meta["logging_steps"] == 1 and r.meta["max_steps"] == 100
    assert set(df.get_column("source")) == {"out/trainer_state.json"}
    assert df.filter(pl.col("metric") == "lr").get_column("tag").to_list() == ["learning_rate"] * 2


def test_newest_checkpoint_copy_wins(tmp_path):
    """Newest checkpoint copy wins."""
    old = write(tmp_path / "out" / "checkpoint-20" / "trainer_state.json", state(20, [train(10), train(20)]))
    new = write(tmp_path / "out" / "checkpoint-40" / "trainer_state.json",
                state(40, [train(10), train(20), train(30), train(40)]))
    r_old, r_new = hf_trainer.read(old, tmp_path), hf_trainer.read(new, tmp_path)
    assert r_old.metrics.num_rows == 0 and not r_old.skipped
    assert r_old.meta["superseded_by"] == "out/checkpoint-40/trainer_state.json"
    assert "superseded_by" not in r_new.meta
    steps = rows(r_new).filter(pl.col("metric") == "loss").get_column("step").to_list()
    assert sorted(steps) == [10, 20, 30, 40]


def test_top_level_copy_with_largest_global_step_wins(tmp_path):
    """Top level copy with largest global step wins."""
    ck = write(tmp_path / "out" / "checkpoint-40" / "trainer_state.json", state(40, [train(40)]))
    top = write(tmp_path / "out" / "trainer_state.json", state(45, [train(40), train(45)]))
    assert hf_trainer.read(ck, tmp_path).meta["superseded_by"] == "out/trainer_state.json"
    assert hf_trainer.read(top, tmp_path).metrics.num_rows == 8


def test_older_copy_keeps_rows_beyond_newest(tmp_path):
    """Older copy keeps rows beyond newest."""
    odd = write(tmp_path / "checkpoint-10" / "trainer_state.json", state(10, [train(5), train(50)]))
    write(tmp_path / "checkpoint-20" / "trainer_state.json", state(20, [train(5), train(20)]))
    df = rows(hf_trainer.read(odd, tmp_path))
    assert df.get_column("step").unique().to_list() == [50]


def test_corrupt_sibling_is_ignored_and_bad_file_raises(tmp_path):
    """Corrupt sibling is ignored and bad file raises."""
    ok = write(tmp_path / "checkpoint-10" / "trainer_state.json", state(10, [train(10)]))
    write(tmp_path / "checkpoint-20" / "trainer_state.json", '{"global_step": 20, "log_hist')
    assert hf_trainer.read(ok, tmp_path).metrics.num_rows == 4
    with pytest.raises(ParseError):
        hf_trainer.read(tmp_path / "checkpoint-20" / "trainer_state.json", tmp_path)
    assert not hf_trainer.sniff(tmp_path / "other.json")


def test_step_rewind_in_history_starts_segment(tmp_path):
    """Step rewind in history starts segment."""
    p = write(tmp_path / "trainer_state.json", state(3, [train(1), train(2), train(1, 3.0)]))
    df = rows(hf_trainer.read(p, tmp_path)).filter(pl.col("metric") == "loss")
    assert df.select("segment", "step", "value").rows() == [(0, 1, 2.0), (0, 2, 2.0), (1, 1, 3.0)]


@pytest.mark.cases
def test_case_br08_two_checkpoints(cases_dir):
    """Case br08 two checkpoints."""
    folder = next(cases_dir.glob("br08_*"))
    old = hf_trainer.read(folder / "t5-base-summ/checkpoint-20/trainer_state.json", folder)
    assert old.metrics.num_rows == 0
    assert old.meta["superseded_by"] == "t5-base-summ/checkpoint-40/trainer_state.json"
    df = rows(hf_trainer.read(folder / "t5-base-summ/checkpoint-40/trainer_state.json", folder))
    assert vals(df, "loss", 33) == [1.4426388569914503]
    assert all(math.isnan(vals(df, "loss", s)[0]) for s in range(34, 41))
    assert vals(df, "lr", 34) == [0.0002898]


@pytest.mark.cases
def test_case_br26_custom_metric(cases_dir):
    """Case br26 custom metric."""
    folder = next(cases_dir.glob("br26_*"))
    r = hf_trainer.read(folder / "output/checkpoint-30000/trainer_state.json", folder)
    df = rows(r)
    assert vals(df, "output_logit_max", 30000) == [1002.242]
    assert df.filter(pl.col("metric") == "output_logit_max").get_column("tag")[0] == "logits_max"
    assert vals(df, "eval_loss", 30000) == [1.9878925559212133]
    assert r.meta["logging_steps"] == 500 and r.precision == "%.4f"


@pytest.mark.cases
def test_case_br27_two_runs(cases_dir):
    """Case br27 two runs."""
    folder = next(cases_dir.glob("br27_*"))
    a = hf_trainer.read(folder / "out_tf4.47.0/checkpoint-60/trainer_state.json", folder)
    b = hf_trainer.read(folder / "out_tf4.48.1/checkpoint-60/trainer_state.json", folder)
    assert "superseded_by" not in a.meta and "superseded_by" not in b.meta
    assert vals(rows(a), "loss", 5) == [10.5949] and vals(rows(b), "loss", 5) == [2.119]
    assert a.meta["train_summary"]["train_loss"] == 6.290766666666666
    assert 6.290766666666666 not in rows(a).get_column("value").to_list()
    assert vals(rows(a), "eval_loss", 20) == [1.6016]


@pytest.mark.cases
def test_case_br29(cases_dir):
    """Case br29."""
    folder = next(cases_dir.glob("br29_*"))
    df = rows(hf_trainer.read(folder / "output/checkpoint-100/trainer_state.json", folder))
    assert vals(df, "grad_norm", 100) == [1.1975992918014526]
    assert df.get_column("step").max() == 100 and df.height == 400


# ---------------------------------------------------------------------------------------------
# A real Trainer run (tests/data/make_hf_trainer_fixture.py, transformers 5.24.0 on CPU): crashed at
# step 25, resumed from checkpoint-20, finished at 30; trainer_state.json copies and the stdout.
# ---------------------------------------------------------------------------------------------
HF_RUN = Path(__file__).parent / "data" / "hf_trainer_run"


def _history(path: Path) -> list[dict]:
    return json.loads(path.read_text())["log_history"]


def test_real_trainer_state_top_level_copy():
    """The final trainer_state.json: 30 train entries, 3 evaluations, the summary; values exact."""
    r = hf_trainer.read(HF_RUN / "trainer_state.json", HF_RUN)
    df = rows(r)
    assert r.format == "hf_trainer" and not r.skipped and "superseded_by" not in r.meta
    assert r.meta["global_step"] == 30 and r.meta["logging_steps"] == 1 and r.meta["max_steps"] == 30
    assert df.height == 30 * 4 + 3 * 4 and set(df.get_column("segment")) == {0}
    assert df.filter(pl.col("metric") == "loss").get_column("step").to_list() == list(range(1, 31))
    assert vals(df, "loss", 1) == [3.9135632514953613] and vals(df, "grad_norm", 1) == [1.5371434688568115]
    assert vals(df, "lr", 1) == [0.0] and vals(df, "lr", 2) == [0.0006000000000000001]
    assert vals(df, "epoch", 30) == [0.46875]
    assert df.filter(pl.col("metric") == "eval_loss").select("step", "value").rows() == [
        (10, 3.9230270385742188), (20, 3.920131206512451), (30, 3.918332099914551)]
    assert r.meta["train_summary"]["train_loss"] == 3.915132212638855
    history = _history(HF_RUN / "trainer_state.json")
    for e in history[:-1]:
        for key, metric in (("loss", "loss"), ("grad_norm", "grad_norm"), ("eval_loss", "eval_loss")):
            if key in e:
                assert vals(df, metric, e["step"]) == [e[key]]


def test_real_checkpoint_copies_are_superseded():
    """checkpoint-10/20/30 hold the history up to their step; the top-level copy supersedes them."""
    for n, entries in ((10, 11), (20, 22), (30, 33)):
        path = HF_RUN / f"checkpoint-{n}" / "trainer_state.json"
        assert len(_history(path)) == entries
        r = hf_trainer.read(path, HF_RUN)
        assert r.metrics.num_rows == 0 and r.meta["superseded_by"] == "trainer_state.json"


def test_real_state_cut_short_keeps_complete_entries(tmp_path):
    """A final trainer_state.json cut mid-write: complete entries salvaged, damage listed, newest intact copy wins.

    With checkpoint-30 cut as well, checkpoint-20 (intact, global step 20) holds more than either salvaged copy.
    """
    out = tmp_path / "out"
    for n in (20, 30):
        src = (HF_RUN / f"checkpoint-{n}/trainer_state.json").read_text()
        write(out / f"checkpoint-{n}" / "trainer_state.json", src)
    text = (HF_RUN / "trainer_state.json").read_text()
    top = write(out / "trainer_state.json", text[:text.index('"step": 19') + 5])
    r = hf_trainer.read(top, tmp_path)
    assert r.metrics.num_rows == 0 and r.meta["superseded_by"] == "out/checkpoint-30/trainer_state.json"
    assert len(r.skipped) == 1 and "19 complete log_history entries" in r.skipped[0].reason
    assert r.skipped[0].what.startswith("out/trainer_state.json:")
    ck = out / "checkpoint-30" / "trainer_state.json"
    ck_text = ck.read_text()
    ck.write_text(ck_text[:ck_text.index('"step": 19') + 5])
    r30 = hf_trainer.read(ck, tmp_path)
    assert r30.meta["superseded_by"] == "out/checkpoint-20/trainer_state.json" and len(r30.skipped) == 1
    r20 = hf_trainer.read(out / "checkpoint-20" / "trainer_state.json", tmp_path)
    df = rows(r20)
    assert not r20.skipped and df.filter(pl.col("metric") == "loss").get_column("step").to_list() == list(range(1, 21))
    assert df.height == 20 * 4 + 2 * 4


def test_real_trainer_stdout():
    """The stdout of both attempts: f"{v:.4g}" strings, tqdm bars, the crash and the resume (epoch rewind)."""
    from parsers import textlog

    r = textlog.read(HF_RUN / "train.log", HF_RUN)
    df, ev = pl.from_arrow(r.metrics), pl.from_arrow(r.events)
    assert r.meta["framework"] == "hf_trainer_stdout" and r.precision == "%.4g" and r.meta["segments"] == 2
    assert not r.skipped
    loss = df.filter(pl.col("metric") == "loss").select("segment", "step").rows()
    assert loss == [(0, s) for s in range(1, 25)] + [(1, s) for s in range(21, 31)]
    assert df.filter(pl.col("metric") == "eval_loss").select("segment", "step", "value").rows() == [
        (0, 10, 3.923), (0, 20, 3.92), (1, 30, 3.918)]
    assert df.height == 34 * 4 + 3 * 4
    assert ev.select("segment", "step", "kind").rows() == [(0, 24, "error")]
    assert "simulated crash at step 25" in ev.get_column("message")[0]
    assert r.meta["train_summary"]["train_loss"] == 3.915
    # every value is the trainer_state.json value printed with 4 significant digits
    exact = {(e["step"], k): e[k] for e in _history(HF_RUN / "trainer_state.json")[:-1]
             for k in ("loss", "grad_norm", "learning_rate", "eval_loss") if k in e}
    names = {"loss": "loss", "grad_norm": "grad_norm", "lr": "learning_rate", "eval_loss": "eval_loss"}
    checked = 0
    for _, step, metric, value in df.select("segment", "step", "metric", "value").rows():
        if metric in names:
            assert value == float(f"{exact[(step, names[metric])]:.4g}"), (step, metric)
            checked += 1
    assert checked == 34 * 3 + 3
