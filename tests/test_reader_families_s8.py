"""Reader families found on real published runs of new frameworks (issue 13, session 8): one test per family.

Each test writes the smallest file of the family's shape (the real runs it came from are named; the committed
ones are checked whole by ``tests/test_real_committed.py``).
"""

from __future__ import annotations

import math
from pathlib import Path

import polars as pl

from forensics.api import load as load_run


def _series(run, metric: str) -> list[tuple[int, float]]:
    df = run.metrics.filter(pl.col("metric") == metric).sort("step")
    return list(zip(df["step"].to_list(), df["value"].to_list(), strict=True))


def _loss(i: int) -> float:
    return 2.5 * math.exp(-i / 40) + 0.3


def test_step_line_with_indented_pairs_below_is_one_record(tmp_path: Path) -> None:
    """OLMo: ``[step=10/100,epoch=0]`` then one ``key=value`` per indented line (grad norm, loss, throughput)."""
    out = ["2025-12-27 22:11:58.599\thost-03:0\tolmo.train:990\tINFO\tPre-train system metrics",
           "    System/Peak GPU Memory (MB)=1,218"]
    for s in range(10, 110, 10):
        out += [f"2025-12-27 22:12:{s // 10:02d}.867\thost-03:0\tolmo.train:990\tINFO\t[step={s}/100,epoch=0]",
                f"    optim/total_grad_norm={1 + s / 100:.3f}", f"    train/CrossEntropyLoss={_loss(s):.3f}",
                f"    throughput/total_tokens={s * 524288:,}"]
    (tmp_path / "train.log").write_text("\n".join(out) + "\n")
    run = load_run(tmp_path)
    assert [s for s, _ in _series(run, "loss")] == list(range(10, 110, 10))
    assert [s for s, _ in _series(run, "grad_norm")] == list(range(10, 110, 10))
    assert _series(run, "grad_norm")[0][1] == 1.1


def test_line_with_only_the_epoch_is_the_step_of_the_lines_below(tmp_path: Path) -> None:
    """A Bi-LSTM script: ``epoch   1`` alone, then ``loss: X`` and ``test accuracy: Y%`` without a step."""
    out = []
    for e in range(1, 9):
        out += [f"epoch {e:3d}", f"loss: {_loss(e * 10):.6f}", f"test accuracy: {50 + e:.2f}%, (5/10)"]
    (tmp_path / "train_log.txt").write_text("\n".join(out) + "\n")
    run = load_run(tmp_path)
    loss = run.metrics.filter(pl.col("metric") == "loss")
    assert loss.height == 8 and loss["segment"].n_unique() == 1


def test_epoch_stepped_text_log_with_several_lines_per_epoch_keeps_every_line(tmp_path: Path) -> None:
    """``epoch: 0 loss: X`` once per batch (no step): every line is a point, in order, not one per epoch."""
    lines = [f"epoch:  {i // 20} loss:  {_loss(i)}" for i in range(60)]
    (tmp_path / "nohup.out").write_text("\n".join(lines) + "\n")
    run = load_run(tmp_path)
    loss = _series(run, "loss")
    assert len(loss) == 60 and [s for s, _ in loss] == sorted({s for s, _ in loss})
    assert [v for _, v in loss] == [float(f"{_loss(i)}") for i in range(60)]


def test_constant_zero_column_beside_a_real_loss_is_not_the_loss(tmp_path: Path) -> None:
    """OLMo's ``gradient_provenance.csv`` has ``loss`` = 0.0 on every row beside the text log's real loss."""
    (tmp_path / "gradient_provenance.csv").write_text(
        "step,loss,embedding_grad_l2_norm\n" + "".join(f"{s},0.0,0.02\n" for s in range(1, 41)))
    (tmp_path / "train.log").write_text("".join(f"step {s} | train/CrossEntropyLoss {_loss(s):.4f}\n"
                                                for s in range(1, 41)))
    run = load_run(tmp_path)
    assert run.meta["objective"]["tags"] == ["train/CrossEntropyLoss"]
    assert min(v for _, v in _series(run, "loss")) > 0.3


def test_namespaced_timesteps_column_is_the_step_of_a_table(tmp_path: Path) -> None:
    """A PPO script's CSV: ``time/total timesteps`` (with a space) is a sample counter, the table's step."""
    rows = "".join(f"{-1.4 + i / 100},{0.02},{1.9 - i / 50},{1.97 - i / 50},{512 * (i + 1)},{1.4 * i}\n"
                   for i in range(30))
    (tmp_path / "run.csv").write_text("train/entropy_loss,train/policy_gradient_loss,train/value_loss,"
                                      "train/total_loss,time/total timesteps,time/total_time\n" + rows)
    run = load_run(tmp_path)
    assert run.meta["step_axis"]["kind"] == "samples"
    assert [s for s, _ in _series(run, "loss")][:3] == [512, 1024, 1536]


def test_text_table_whose_lines_end_with_the_delimiter(tmp_path: Path) -> None:
    """PGNet: a tab table in ``train_log.txt`` whose header and rows end with a tab; no step column."""
    rows = "".join(f"{40 - i:.6f}\t{0.24 - i / 1000:.6f}\t{9.2 - i / 10:.6f}\t\n" for i in range(20))
    (tmp_path / "train_log.txt").write_text("total loss\tscore loss\tctc loss\t\n" + rows)
    run = load_run(tmp_path)
    assert run.meta["objective"]["tags"] == ["total loss"]
    assert len(_series(run, "loss")) == 20


def test_yolov5_results_txt_without_a_header(tmp_path: Path) -> None:
    """The trap: YOLOv5 (< v5.0) ``results.txt`` rows by position, epoch as ``e/E-1``, gpu memory as ``3.15G``."""
    rows = "".join(f"{e:>10s}{'3.15G':>10s}" + "".join(f"{v:10.4g}" for v in (
        0.05 - e_ / 1000, 0.02, 0.01, 0.08 - e_ / 1000, 13, 640, 0.9, 0.9, 0.95, 0.8, 0.04, 0.02, 0.01)) + "\n"
        for e_, e in enumerate(f"{i}/19" for i in range(20)))
    (tmp_path / "results.txt").write_text(rows)
    run = load_run(tmp_path)
    assert run.meta["objective"]["tags"] == ["train/total_loss"]
    assert [s for s, _ in _series(run, "loss")] == list(range(20))
    assert _series(run, "loss")[0][1] == 0.08
