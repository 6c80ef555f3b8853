"""Records inside text lines and odd JSON values (parsers.lines.json_inline, parsers.jsonl).

A JSON object or Python dict after any log prefix is a record; a JSON boolean is no measurement; a step beyond
int64 is said, not mistaken for "no step key".
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from forensics.api import analyze_run, load


def _loss(s: int) -> float:
    return 282.0 if s == 700 else 2.0 / (1 + s / 50) + 0.3


@pytest.mark.parametrize("prefix", [
    "2026-11-30 22:11:40,123 INFO trainer.py:88 metrics ", "2026-11-30 22:00:00,123 INFO ", "metrics: ",
    "step_metrics ", "[rank0] INFO {job} ",
])
def test_json_after_any_prefix_is_a_record(tmp_path: Path, prefix: str) -> None:
    """``logger.info(json.dumps(metrics))``: was "no metric records could be read"; now the bad batch is at 700."""
    with (tmp_path / "train.log").open("w") as fh:
        for s in range(0, 1200, 5):
            fh.write(prefix + json.dumps({"global_step": s, "train_loss": _loss(s), "learning_rate": 1e-3}) + "\n")
    run = load(tmp_path)
    loss = run.metrics.filter(run.metrics["metric"] == "loss")
    assert loss.height == 240 and loss["step"].max() == 1195
    analysis = analyze_run(run)
    assert analysis.onset is not None and analysis.onset["step"] == 700


def test_a_python_dict_after_a_prefix_and_nested_values(tmp_path: Path) -> None:
    """A Python literal (single quotes, ``nan``) and a nested object (``train/loss``) after a prefix."""
    with (tmp_path / "train.log").open("w") as fh:
        for s in range(100):
            loss = "nan" if s == 60 else repr(_loss(s))
            fh.write(f"INFO step_end {{'step': {s}, 'train': {{'loss': {loss}}}, 'lr': 0.001}}\n")
    run = load(tmp_path)
    loss = run.metrics.filter(run.metrics["metric"] == "loss")
    assert loss.height == 100 and set(loss["tag"].to_list()) == {"train/loss"}


def test_a_config_dict_after_a_prefix_is_not_a_record(tmp_path: Path) -> None:
    """A dict with neither a step key nor a loss value (a configuration) gives no metric rows."""
    with (tmp_path / "train.log").open("w") as fh:
        fh.write('INFO config {"lr": 0.001, "epochs": 10, "batch_size": 32}\n')
        for s in range(50):
            fh.write(f"step {s} loss {_loss(s):.4f}\n")
    run = load(tmp_path)
    assert run.metrics.filter(run.metrics["metric"] == "batch_size").height == 0
    assert run.metrics.filter(run.metrics["metric"] == "loss").height == 50


def test_a_json_boolean_is_no_loss_but_a_flag_stays(tmp_path: Path) -> None:
    """``"loss": true`` was read as 1.0; now skipped and listed. A flag (``fp16_finite``) is still 0/1."""
    with (tmp_path / "metrics.jsonl").open("w") as fh:
        for s in range(100):
            fh.write(json.dumps({"step": s, "loss": True, "fp16_finite": s != 50, "lr": 1e-3}) + "\n")
    run = load(tmp_path)
    assert run.metrics.filter(run.metrics["metric"] == "loss").height == 0
    flag = run.metrics.filter(run.metrics["tag"] == "fp16_finite")
    assert flag.height == 100 and flag["value"].sum() == 99
    assert any("booleans are not numbers" in s.reason and "loss (100)" in s.reason for s in run.skipped)


def test_a_step_beyond_int64_is_said(tmp_path: Path) -> None:
    """``"step": 2**70 + i``: the records are numbered by line, and the skip and step source say why."""
    with (tmp_path / "metrics.jsonl").open("w") as fh:
        for i in range(50):
            fh.write(json.dumps({"step": 2**70 + i, "loss": _loss(i)}) + "\n")
    run = load(tmp_path)
    meta = run.meta["by_source"]["metrics.jsonl"]
    assert "beyond int64" in meta["step_source"] and "no step key" not in meta["step_source"]
    assert any("beyond int64" in s.reason for s in run.skipped)


def _bar(desc: str, n: int, total: int, postfix: str) -> str:
    return f"{desc}{100 * n // total:3d}%|####      | {n}/{total} [00:08<00:10, 42.1it/s, {postfix}]"


@pytest.mark.parametrize("sep", ["\n", "\r"])
def test_tqdm_postfix_metrics_are_read(tmp_path: Path, sep: str) -> None:
    """``pbar.set_postfix(loss=..., lr=...)``, one bar a line or redrawn after CR: step N, postfix read."""
    bars = [_bar("Epoch 0: ", n, 1000, f"loss={_loss(n):.3g}, lr=1.00e-03") for n in range(1, 1001)]
    (tmp_path / "log.out").write_text("Loading data...\n" + sep.join(bars) + "\n")
    run = load(tmp_path)
    loss = run.metrics.filter(run.metrics["metric"] == "loss")
    assert loss.height == 1000 and loss["step"].min() == 1 and loss["step"].max() == 1000
    assert analyze_run(run).onset["step"] == 700


def test_lightning_bars_count_batches_over_epochs(tmp_path: Path) -> None:
    """Lightning's ``Epoch E: ... N/TOTAL [..., v_num=0, train_loss_step=...]``: step E*TOTAL + N, v_num no metric."""
    bars = [_bar(f"Epoch {e}: ", n, 250, f"v_num=0, train_loss_step={_loss(250 * e + n):.3g}, "
                                         "train_loss_epoch=0.512")
            for e in range(4) for n in range(1, 251)]
    bars.append("Validation DataLoader 0: 100%|##########| 10/10 [00:00<00:00, 50.0it/s, val_loss=0.3]")
    (tmp_path / "stdout.txt").write_text("\r".join(bars) + "\n")
    run = load(tmp_path)
    loss = run.metrics.filter(run.metrics["metric"] == "loss")
    assert loss.height == 1000 and loss["step"].max() == 1000
    assert run.metrics.filter(run.metrics["tag"] == "v_num").height == 0
    assert run.metrics.filter(run.metrics["tag"] == "val_loss").height == 0
