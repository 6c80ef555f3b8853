"""Reader families found on real published runs (issue 13, session 9): one test per family.

The HF Trainer stdout files are written the way the Trainer writes them: a real :mod:`tqdm` bar (its
``ProgressCallback`` updates the bar at every optimizer step and prints each log dict with ``tqdm.write``),
to one file through the two streams a ``python train.py > log 2>&1`` run has (stdout block-buffered, stderr
unbuffered), and on the real committed MKGL log (``tests/data/real/hf-trainer/mkgl_stdout``).
"""

from __future__ import annotations

import io
import math
from pathlib import Path

import polars as pl
import pytest

from forensics.api import load as load_run
from parsers import textlog

tqdm = pytest.importorskip("tqdm").tqdm
REAL = Path(__file__).parent / "data" / "real"


def _steps(path: Path, metric: str = "loss") -> tuple[list[int], dict]:
    r = textlog.read(path, path.parent)
    df = pl.from_arrow(r.metrics).filter(pl.col("metric") == metric)
    return df["step"].to_list(), r.meta


def _logs(step: int, spe: int) -> dict:
    return {"loss": round(2.5 * math.exp(-step / 80) + 0.4, 4), "grad_norm": 0.5, "learning_rate": 3e-4,
            "epoch": round(step / spe, 2)}


def _train(path: Path, total: int, spe: int, every: int, buffered: bool, summary: bool = True) -> None:
    """A Trainer's stdout and stderr in one file: the bar on stderr, the dicts on stdout."""
    raw_err = open(path, "ab", buffering=0)  # noqa: SIM115 (both streams stay open for the whole run)
    err = io.TextIOWrapper(raw_err, encoding="utf-8", write_through=True)
    out = open(path, "a", encoding="utf-8", buffering=4096 if buffered else 1)  # noqa: SIM115
    bar = tqdm(total=total, file=err, mininterval=0, ascii=True)
    for step in range(1, total + 1):
        bar.update(1)
        if step % every == 0:
            if buffered:
                print(str(_logs(step, spe)), file=out)  # a print() to a redirected stdout: block-buffered
            else:
                bar.write(str(_logs(step, spe)), file=err)  # ProgressCallback.on_log: tqdm.write
    if summary:
        print(str({"train_runtime": 12.5, "train_loss": 0.9, "epoch": round(total / spe, 2)}), file=out)
    out.flush()
    bar.close()
    out.close()
    err.close()


def test_hf_dicts_take_the_tqdm_bar_redrawn_after_each(tmp_path: Path) -> None:
    """U18: every dict is followed by the bar at the trainer's global step: that count is the dict's step."""
    log = tmp_path / "train.out"
    _train(log, total=120, spe=40, every=10, buffered=False, summary=False)
    steps, meta = _steps(log)
    assert steps == list(range(10, 130, 10))
    assert meta["step_axis"]["kind"] == "optimizer_step" and "tqdm bar" in meta["step_axis"]["column"]


def test_hf_dicts_flushed_in_bursts_are_dated_by_epoch_and_bar_total(tmp_path: Path) -> None:
    """qwen3/llama SFT (TRL): the dicts come in bursts after the bar moved on; epoch x (TOTAL / final epoch)."""
    log = tmp_path / "train.out"
    _train(log, total=300, spe=100, every=10, buffered=True)
    text = log.read_text()
    assert "}\n{" in text  # bursts: dicts with no bar between them
    steps, meta = _steps(log)
    assert steps == list(range(10, 310, 10))
    assert "steps per epoch" in meta["step_axis"]["column"]


def test_hf_dicts_in_bursts_without_a_summary_use_the_tightest_bar_bound(tmp_path: Path) -> None:
    """A run killed before its summary: the steps per epoch are bounded by the bar counts after the dicts."""
    log = tmp_path / "train.out"
    _train(log, total=300, spe=100, every=10, buffered=True, summary=False)
    steps, meta = _steps(log)
    assert len(steps) == 30 and steps == sorted(steps)
    assert all(abs(s - t) <= 10 for s, t in zip(steps, range(10, 310, 10), strict=True))
    assert "bound" in meta["step_axis"]["column"]


def test_hf_dict_glued_to_a_bar_is_read_by_the_hf_reader(tmp_path: Path) -> None:
    """qwen3 QLoRA: ``  34%|###| 600/1755 [..]{'loss': ...}`` (stdout flushed while the bar had no newline)."""
    lines = []
    for s in range(10, 60, 10):
        lines.append(f"\r {s}%|#   | {s}/50 [00:0{s // 10}<00:10,  1.00it/s]"
                     + str(_logs(s, 50)).replace("'epoch'", "'epoch'"))
    lines.append("\r100%|####| 50/50 [00:50<00:00,  1.00it/s]")
    (tmp_path / "train.out").write_text("\n".join(lines) + "\n")
    steps, meta = _steps(tmp_path / "train.out")
    assert meta["framework"] == "hf_trainer_stdout"
    assert steps == [10, 20, 30, 40, 50]


def test_real_mkgl_stdout_bursts_are_put_on_the_trainer_steps() -> None:
    """MKGL (real, committed): 133 dicts in bursts, 2-decimal epochs, a 1330-step bar, 5 epochs."""
    run_dir = REAL / "hf-trainer" / "mkgl_stdout"
    if not run_dir.is_dir():
        pytest.skip("tests/data/real/hf-trainer/mkgl_stdout is absent")
    steps, meta = _steps(run_dir / "train_log.txt")
    assert steps == list(range(10, 1340, 10))
    evals, _ = _steps(run_dir / "train_log.txt", "eval_loss")
    assert set(evals) <= set(steps) and len(evals) == 5
    run = load_run(run_dir)
    assert run.meta["step_axis"]["kind"] == "optimizer_step"


def _names(path: Path) -> set[str]:
    r = textlog.read(path, path.parent)
    return set(pl.from_arrow(r.metrics)["tag"].unique().to_list())


def test_log_record_prefix_fields_are_not_metrics() -> None:
    """OLMo (real, committed): ``<time> host-03:0 olmo.train:990 INFO [step=..]`` (tabs): hostname:rank, logger:line."""
    path = REAL / "olmo" / "olmo150m_tied_emb" / "train.log"
    if not path.is_file():
        pytest.skip("tests/data/real/olmo is absent")
    names = _names(path)
    assert "olmo.train" not in names and not any(n.startswith("fine-work-echoes") for n in names)
    assert {"train/CrossEntropyLoss", "optim/total_grad_norm"} <= names


def test_loguru_source_location_is_not_a_metric() -> None:
    """YOLOX (real, committed): loguru's ``| INFO | yolox.core.trainer:after_iter:246 - epoch: 1/300, ...``."""
    path = REAL / "yolox" / "yolox_s_mlu" / "train_log.txt"
    if not path.is_file():
        pytest.skip("tests/data/real/yolox is absent")
    names = _names(path)
    assert "after_iter" not in names and "total_loss" in names


@pytest.mark.parametrize("n", [3, 1500])  # one by one, and in bulk (a block of >= 2,000 lines, shapes shared)
def test_glued_pairs_in_the_message_stay_pairs_prefix_fields_go(tmp_path: Path, n: int) -> None:
    """The rule is the position: a glued ``key:N`` before the level word (or an ``a:b:N`` chain) is a prefix field.

    After the level, in the message, a glued pair is a pair (modded-nanogpt ``step:10/100 train_loss:3.2``).
    """
    rows = [f"2024-05-01 10:00:{i % 60:02d},123 node-7:3 trainer.loop:88 INFO step:{i}/{n} train_loss:{3 - i / n:.4f} "
            f"train_time:{i * 10}ms" for i in range(1, n + 1)]
    rows += [f"2024-05-01 10:01:{i % 60:02d}.5 | WARNING | my.pkg.train:fit_epoch:120 - step: {n + i}, loss: 1.5"
             for i in range(1, n + 1)]
    (tmp_path / "train.log").write_text("\n".join(rows) + "\n")
    r = textlog.read(tmp_path / "train.log", tmp_path)
    df = pl.from_arrow(r.metrics)
    assert set(df["tag"].unique().to_list()) == {"train_loss", "train_time", "loss"}
    assert df.filter(pl.col("tag") == "train_loss")["step"].to_list() == list(range(1, n + 1))
    assert df.filter(pl.col("tag") == "loss")["step"].to_list() == list(range(n + 1, 2 * n + 1))


def test_opennmt_xent_is_the_training_loss(tmp_path: Path) -> None:
    """OpenNMT-py ``onmt/utils/statistics.py`` prints ``Step N/M; acc: ..; ppl: ..; xent: ..; lr: ..``."""
    from forensics.schema import canonical_metric, explain_metric

    assert canonical_metric("xent") == "loss" and canonical_metric("valid_xent") == "eval_loss"
    assert "rule" in explain_metric("xent")[1]
    rows = [f"[2024-03-01 10:{i // 60:02d}:{i % 60:02d},000 INFO] Step {i * 50}/5000; acc: {20 + i / 3:.2f}; "
            f"ppl: {math.exp(6 - i / 40):.2f}; xent: {6 - i / 40:.2f}; lr: 0.00070; 9000/9100 tok/s;     {i * 9} sec"
            for i in range(1, 101)]
    (tmp_path / "train.log").write_text("\n".join(rows) + "\n")
    run = load_run(tmp_path)
    assert run.meta["objective"]["metric"] == "loss" and "xent" in run.meta["objective"]["tags"]
    assert run.series("loss").steps.tolist()[:2] == [50, 100]


def test_step_less_loss_lines_take_a_running_index_only_when_nothing_else_steps(tmp_path: Path) -> None:
    """A script that prints ``batch loss:X`` and never a step: row numbers, named as such; with a step: not."""
    rows = ["Namespace(lr=0.01, epochs=3)"] + [f"batch loss:{2 * math.exp(-i / 500) + 0.3:.4f}" for i in range(3000)]
    (tmp_path / "train.log").write_text("\n".join(rows) + "\n")
    steps, meta = _steps(tmp_path / "train.log")
    assert steps == list(range(1, 3001)) and meta["step_axis"]["kind"] == "row_index"
    other = tmp_path / "other"
    other.mkdir()
    (other / "train.log").write_text("\n".join(["step 5 lr 0.1", *rows[1:]]) + "\n")
    steps, meta = _steps(other / "train.log")
    assert set(steps) == {5} and "step_axis" not in meta  # the step seen wins: the lines belong to it


@pytest.mark.parametrize("n", [120, 3000])  # one by one, and in bulk
def test_episode_n_of_m_steps_an_rl_script(tmp_path: Path, n: int) -> None:
    """``Episode 3/500 | Reward: .. | Loss: ..``: the episode is the step, named episode (not epoch)."""
    rows = [f"Episode {e}/{n} | Reward: {e % 7:.2f} | Loss: {2 / (1 + e / 20):.4f} | Epsilon: {1 - e / (2 * n):.3f}"
            for e in range(1, n + 1)]
    (tmp_path / "train.log").write_text("\n".join(rows) + "\n")
    steps, meta = _steps(tmp_path / "train.log")
    assert steps == list(range(1, n + 1))
    assert meta["step_axis"] == {"column": "Episode", "kind": "episode"}
    eps, _ = _steps(tmp_path / "train.log", "episode")
    assert len(eps) == n and not _steps(tmp_path / "train.log", "epoch")[0]


@pytest.mark.parametrize(("name", "steps", "evals"), [
    ("unbuffered.log", list(range(10, 260, 10)), [50, 100, 150, 200, 250]),
    ("resumed/train_1.out", list(range(10, 110, 10)), [50, 100]),
    ("resumed/train_2.out", list(range(110, 260, 10)), [150, 200, 250]),
])
def test_real_trainer_stdout_dicts_are_on_the_trainer_steps(name: str, steps: list[int], evals: list[int]) -> None:
    """A real HF Trainer (transformers 4.46.3, ``tests/data/make_hf_tqdm_logs.py``): dicts at 10, 20, ...

    A resumed launch continues at 110 (the running index said 1, 2, ...).
    """
    path = Path(__file__).parent / "data" / "hf_tqdm_real" / name
    got, meta = _steps(path)
    assert got == steps
    assert _steps(path, "eval_loss")[0] == evals
    assert meta["step_axis"]["kind"] == "optimizer_step"


def test_dicts_dated_by_the_training_block_keep_that_step(tmp_path: Path) -> None:
    """``Total optimization steps`` and ``Num Epochs`` printed: epoch x N / E is exact; a later bar does not move it."""
    lines = ["***** Running training *****", "  Num examples = 4000", "  Num Epochs = 2",
             "  Total optimization steps = 500"]
    for s in range(10, 510, 10):
        lines.append(str({"loss": round(3 * math.exp(-s / 200), 4), "learning_rate": 1e-3, "epoch": round(s / 250, 2)}))
        lines.append(f"\r {s // 5}%|###| {s + 3}/500 [00:01<00:30,  9.8it/s]")  # a bar drawn 3 steps later
    (tmp_path / "train.out").write_text("\n".join(lines) + "\n")
    steps, meta = _steps(tmp_path / "train.out")
    assert steps == list(range(10, 510, 10)) and meta["step_source"] == "epoch"
