"""Diagnosis kinds from the s6 user test (F9, F11, F12, F13, F16, F17), each on runs generated here.

F9: a "bad batch" that a logged activation growth precedes, followed by an fp16 scale collapse, is the overflow.
F11: a recovered spike long before the failure that ended the run is an earlier episode, not the diagnosis.
F12: a run that never learned (loss at its initial value after an early rise) is no transient; ST01 fires on it,
and not on a run that went down and diverged later.
F16: too few loss points -> inconclusive. F17: a loss non-finite from step 0 is no bad batch.
F13: compare reads no float32 noise and no warm-up difference smaller than the logging interval.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from forensics.api import analyze
from forensics.cli import main

CHANCE = math.log(10)


def _write(tmp: Path, rows: list[dict]) -> Path:
    with (tmp / "metrics.jsonl").open("w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    return tmp


def _decaying(n: int, seed: int, every: int = 1) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    steps = np.arange(0, n, every)
    loss = (0.3 + 2.0 * np.exp(-steps / 150)) * np.exp(rng.normal(0, 0.03, steps.size))
    return steps, loss


def _rows(steps: np.ndarray, loss: np.ndarray, lr: float) -> list[dict]:
    return [{"step": int(st), "loss": float(v), "lr": lr} for st, v in zip(steps, loss, strict=True)]


def _codes(a) -> list[str]:  # noqa: ANN001 - an Analysis
    return [f.code for f in a.findings]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_recovered_spike_does_not_hide_the_later_divergence(tmp_path: Path, seed: int) -> None:
    """F11: a 5-step spike at 620 that recovers, then a rise from 900 that never comes back."""
    steps, loss = _decaying(1000, seed)
    loss[620:625] += 5.0
    loss[900:] += np.linspace(0, 5, 100)
    a = analyze(_write(tmp_path, _rows(steps, loss, 1e-3)))
    assert a.verdict == "anomaly", a.summary
    assert a.onset is not None and 860 <= a.onset["step"] <= 905, a.summary  # the failure's onset, not 620
    assert any(f.code == "DB01" and f.step == 620 for f in a.findings)  # still listed, as a secondary finding
    db = [h for h in a.hypotheses if h.cause == "data_batch"]
    assert db and any("620" in x and "earlier episode" in x for x in db[0].against), db


def _fp16_rows(seed: int) -> list[dict]:
    """Inputs grow 10x per 40 steps from 500: activations grow, the loss rises, the scale halves to its floor."""
    rng = np.random.default_rng(seed)
    steps, loss = _decaying(800, seed)
    act = 3.3 * np.exp(rng.normal(0, 0.05, steps.size))
    grow = steps >= 500
    act[grow] *= 10 ** ((steps[grow] - 500) / 40)
    loss[grow] *= np.exp(np.clip(act[grow] / 3.3 - 1, 0, 50) * 0.02)
    scale = np.full(steps.size, 2048.0)
    skipped = np.zeros(steps.size)
    over = act > 300
    first = int(np.argmax(over))
    scale[first:] = np.maximum(2048.0 * 0.5 ** (np.arange(steps.size - first) + 1), 2.0 ** -14)
    skipped[first:] = np.arange(1, steps.size - first + 1)
    loss[first + 7:] = np.nan
    return [{"step": int(s), "loss": float(v), "act/absmax": float(min(x, 65000.0)), "loss_scale": float(c),
             "skipped_step": float(k), "lr": 1e-3}
            for s, v, x, c, k in zip(steps, loss, act, scale, skipped, strict=True)]


@pytest.mark.parametrize("seed", [0, 3])
def test_fp16_collapse_after_activation_growth_is_no_bad_batch(tmp_path: Path, seed: int) -> None:
    """F9: the loss departs while act/absmax grows; DB01 must see that precursor and the overflow must win."""
    a = analyze(_write(tmp_path, _fp16_rows(seed)))
    assert a.cause == "overflow", a.summary
    assert "DB01" not in _codes(a), [f.message for f in a.findings if f.code == "DB01"]
    assert a.onset is not None and 490 <= a.onset["step"] <= 560, a.summary


def test_bad_batch_message_names_what_it_checked(tmp_path: Path) -> None:
    """DB01 says which series it read for a precursor and over which steps (not a window that does not exist)."""
    steps, loss = _decaying(400, 4)
    loss[300] = 30.0
    a = analyze(_write(tmp_path, [{"step": int(s), "loss": float(v), "grad_norm": 1.0 + 0.01 * (s % 7), "lr": 1e-3}
                                  for s, v in zip(steps, loss, strict=True)]))
    db = [f for f in a.findings if f.code == "DB01"]
    assert db and "the grad norm over steps 172..299" in db[0].message, [f.message for f in a.findings]


def _train_mlp(peak: float, steps: int = 600, warm: int = 50, seed: int = 1) -> list[dict]:
    """A real tiny MLP (10 classes, AdamW, warm-up + cosine) trained on CPU; one record per 5 steps."""
    torch = pytest.importorskip("torch", reason="torch (the test extra) trains the tiny model")
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    teach = torch.randn(32, 10, generator=g)
    torch.manual_seed(seed)
    m = torch.nn.Sequential(torch.nn.Linear(32, 128), torch.nn.GELU(), torch.nn.Linear(128, 128), torch.nn.GELU(),
                            torch.nn.Linear(128, 10))
    opt = torch.optim.AdamW(m.parameters(), lr=peak, weight_decay=0.01)
    gen = torch.Generator().manual_seed(seed + 100)
    rows = []
    for step in range(steps):
        p = (step - warm) / max(1, steps - warm)
        lr = peak * (step + 1) / warm if step < warm else peak * 0.5 * (1 + math.cos(math.pi * min(p, 1.0)))
        for pg in opt.param_groups:
            pg["lr"] = lr
        x = torch.randn(64, 32, generator=gen)
        y = (x @ teach + 0.5 * torch.randn(64, 10, generator=gen)).argmax(1)
        loss = torch.nn.functional.cross_entropy(m(x), y)
        opt.zero_grad()
        loss.backward()
        gn = torch.nn.utils.clip_grad_norm_(m.parameters(), 1e9).item()
        opt.step()
        if step % 5 == 0:
            rows.append({"step": step, "loss": loss.item(), "lr": lr, "grad_norm": gn})
    return rows


def test_real_mlp_at_lr_1_never_learns_and_is_no_transient(tmp_path: Path) -> None:
    """F12: a real MLP at peak lr 1.0 collapses to chance (ln 10) for the rest of the run: an anomaly, lr too high."""
    rows = _train_mlp(1.0)
    tail = np.array([r["loss"] for r in rows[-40:]])
    assert abs(float(np.median(tail)) - CHANCE) < 0.1  # the fixture is what it claims: stuck at chance
    a = analyze(_write(tmp_path, rows))
    assert a.verdict == "anomaly", a.summary
    assert "ST01" in _codes(a)
    assert a.cause == "update_scale_growth" and a.mechanism == "lr_too_high", a.summary


def test_stuck_at_chance_after_a_warmup_spike_fires_st01(tmp_path: Path) -> None:
    """F12, shaped: ln 10 with noise, a rise to 4.3 at step 5, back by 25 and flat, two recovered spikes later."""
    rng = np.random.default_rng(7)
    steps = np.arange(0, 600, 5)
    loss = CHANCE + rng.normal(0, 0.01, steps.size)
    loss[1], loss[2], loss[3], loss[4] = 4.3, 3.4, 2.8, 2.5
    loss[41], loss[93] = 3.1, 13.6
    a = analyze(_write(tmp_path, _rows(steps, loss, 1.0)))
    assert a.verdict == "anomaly" and "ST01" in _codes(a), a.summary
    assert a.cause == "update_scale_growth" and a.onset == {"step": 5, "segment": 0}, a.summary


def test_st01_silent_on_a_run_that_went_down_then_diverged(tmp_path: Path) -> None:
    """F12 converse: 2.3 -> 0.3, then a rise to 3.4 at the end: the loss did go down (DV01's case, not ST01's)."""
    steps, loss = _decaying(800, 5)
    loss[600:] += np.linspace(0, 3.1, 200)
    a = analyze(_write(tmp_path, _rows(steps, loss, 1e-3)))
    assert "ST01" not in _codes(a), [f.message for f in a.findings if f.code == "ST01"]
    assert "DV01" in _codes(a)


@pytest.mark.parametrize("n", [1, 2, 5, 12])
def test_too_few_loss_points_is_inconclusive(tmp_path: Path, n: int, capsys: pytest.CaptureFixture[str]) -> None:
    """F16: a job that died right after its start: not healthy, inconclusive (exit 3), with the minimum named."""
    _write(tmp_path, [{"step": i, "loss": 2.4 - 0.01 * i} for i in range(n)])
    a = analyze(tmp_path)
    assert a.verdict == "inconclusive" and f"too few training-loss points ({n})" in a.summary, a.summary
    assert "at least 13" in a.summary
    with pytest.raises(SystemExit) as e:
        main(["analyze", str(tmp_path), "-f", "text"])
    assert e.value.code == 3
    assert "too few training-loss points" in capsys.readouterr().out


def test_enough_points_can_be_healthy(tmp_path: Path) -> None:
    """F16's minimum is a floor, not a ban: 40 quiet points are judged (healthy)."""
    steps, loss = _decaying(40, 6)
    a = analyze(_write(tmp_path, [{"step": int(s), "loss": float(v)} for s, v in zip(steps, loss, strict=True)]))
    assert a.verdict == "healthy", a.summary


def test_loss_nan_from_step_0_is_no_bad_batch(tmp_path: Path) -> None:
    """F17: no finite loss ever: not a bad batch, no look-back window claimed, no batches to skip."""
    a = analyze(_write(tmp_path, [{"step": i, "loss": float("nan"), "lr": 1e-3} for i in range(600)]))
    assert a.verdict == "anomaly" and a.cause == "unknown", a.summary
    assert "DB01" not in _codes(a) and "NF02" in _codes(a)
    assert not any("previous 128 steps" in f.message for f in a.findings)
    assert a.recovery is not None
    settings = [t.settings for t in a.recovery.trials]
    assert not any("skip_batches" in s for s in settings), settings
    names = " ".join(t.name for t in a.recovery.trials)
    assert "data" in names and "fp32" in names and "init" in names, names


def _lr_rows(first: int, every: int, peak: float, warm: int = 100, n: int = 400) -> list[dict]:
    rows = []
    for s in range(first, n, every):
        lr = float(np.float32(peak * min(1.0, (s + 1) / warm)))  # a float32 lr read back as a float
        rows.append({"step": s, "loss": 2.0 * math.exp(-s / 200) + 0.3, "lr": lr})
    return rows


def test_compare_no_float32_noise_and_no_logging_grid_warmup(tmp_path: Path) -> None:
    """F13: same 100-step warm-up logged every 5 from 0 and every 10 from 10; peak 1e-3 vs 2e-3 (float32)."""
    from forensics.compare import compare

    p, t = tmp_path / "proxy", tmp_path / "target"
    p.mkdir()
    t.mkdir()
    _write(p, _lr_rows(0, 5, 1e-3))
    _write(t, _lr_rows(10, 10, 2e-3))
    out = compare(p, t)
    settings = {d["setting"]: d for d in out["differences"]}
    assert "warmup_steps" not in settings, settings.get("warmup_steps")
    assert settings["peak_lr"]["proxy"] == 0.001 and settings["peak_lr"]["target"] == 0.002
    assert out["trial"] is not None and "peak_lr = 0.001 " in out["trial"]["change"], out["trial"]


def test_one_nan_at_step_0_then_finite_is_transient(tmp_path: Path) -> None:
    """F17's boundary: only the first logged loss is NaN, then it trains normally: not broken from the start."""
    steps, loss = _decaying(300, 8)
    loss[0] = np.nan
    a = analyze(_write(tmp_path, _rows(steps, loss, 1e-3)))
    assert a.verdict == "transient" and "NF02" not in _codes(a) and "DB01" not in _codes(a), a.summary


def test_sweep_text_calls_stable_only_the_stable_lrs() -> None:
    """F12 (sweep wording): a run that did not diverge but never trained is not called "stable"."""
    from reports.sweep_report import render_text

    runs = [{"lr": lr, "final_loss": fl, "diverged": False, "divergence_step": None}
            for lr, fl in ((0.01, 0.25), (1.0, 2.27))]
    text = render_text({"root": "sweep", "groups": [{"key": {}, "lr_sensitivity": 1.0, "best_lr": 0.01,
                                                      "largest_stable_lr": 0.01, "stable_lrs": [0.01],
                                                      "runs": runs}]})
    assert "lr 0.01: final loss 0.25, stable" in text
    assert "lr 1: final loss 2.27, no divergence, but the final loss is far from the best (outside the stable band)" \
        in text
    low = render_text({"root": "sweep", "groups": [{"key": {}, "lr_sensitivity": 1.0, "best_lr": 1.0,
                                                     "largest_stable_lr": 1.0, "stable_lrs": [1.0],
                                                     "runs": runs[:1]}]})
    assert "lr 0.01: final loss 0.25, no divergence; the final loss is far from the best: too small an lr" in low


def test_fp16_activation_overflow_onset_is_where_the_growth_starts(tmp_path: Path) -> None:
    """F9 without a loss-scale series: the activation reaches the fp16 limit late; the onset is its growth's start."""
    rows = [{k: v for k, v in r.items() if k not in ("loss_scale", "skipped_step")} for r in _fp16_rows(1)]
    a = analyze(_write(tmp_path, rows))
    assert a.onset is not None and 490 <= a.onset["step"] <= 560, a.summary
    assert "DB01" not in _codes(a)
