"""One case per detector code: a small run built here -> the findings it must give and must not give.

sqlfluff-style: :data:`CASES` lists, per case, the detector, the run (a table built from a few signals, or a
tiny run folder written to ``tmp_path``), the findings it must give as ``(code, step, segment)`` (plus the
mechanism where the detector names one) and the codes it must not give. Every code of the registry is
named by at least one case (:func:`test_every_code_has_a_case`). The engine's two skip paths are tested at
the end: a detector that raises becomes a listed skip, and so does one whose metrics are missing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from forensics.detectors import DETECTORS
from forensics.detectors.base import Detector
from forensics.engine import run_detectors
from forensics.model import Finding, RunData

BY_CODE = {d.code: d for d in DETECTORS}
RNG_SEED = 7


def table_run(cols: dict[str, np.ndarray], steps: np.ndarray | None = None, segments: np.ndarray | None = None,
              meta: dict | None = None, events: list[dict] | None = None, tensors: pl.DataFrame | None = None,
              col_steps: dict[str, np.ndarray] | None = None) -> RunData:
    """A RunData with one long metrics table: every column on ``steps`` (or its own steps in ``col_steps``)."""
    n = len(next(iter(cols.values())))
    steps = np.arange(n) if steps is None else np.asarray(steps)
    segments = np.zeros(n, dtype=np.int32) if segments is None else np.asarray(segments)
    frames = []
    for m, v in cols.items():
        st = steps if not col_steps or m not in col_steps else np.asarray(col_steps[m])
        sg = segments if not col_steps or m not in col_steps else np.zeros(len(st), dtype=np.int32)
        frames.append(pl.DataFrame({"run": "case", "segment": sg.astype(np.int32), "step": st.astype(np.int64),
                                    "metric": m, "value": np.asarray(v, dtype=np.float64), "wall_time": None,
                                    "tag": m, "source": "metrics.jsonl"},
                                   schema_overrides={"wall_time": pl.Float64}))
    ev = pl.DataFrame(events) if events else pl.DataFrame()
    return RunData(run="case", metrics=pl.concat(frames), events=ev, meta=meta or {}, sources=[], skipped=[],
                   tensors=tensors if tensors is not None else pl.DataFrame())


def _noise(n: int, sd: float, seed: int = RNG_SEED) -> np.ndarray:
    """Multiplicative log-normal noise, shape (n,)."""
    return np.exp(np.random.default_rng(seed).normal(0.0, sd, n))


def _loss(n: int = 300, sd: float = 0.01) -> np.ndarray:
    """A falling training loss with log-normal noise."""
    s = np.arange(n)
    return (2.0 + 3.0 / np.sqrt(1 + s / 20)) * _noise(n, sd)


def _tensors(norms: dict[str, list[float]], steps: list[int],
             n_nan: dict[str, list[int]] | None = None) -> pl.DataFrame:
    """Checkpoint tensor statistics (TENSORS_SCHEMA rows): one row per tensor and checkpoint step."""
    rows = [{"run": "case", "step": s, "checkpoint": f"ckpt/step_{s}", "tensor": t, "role": "param", "dtype": "F32",
             "shape": [8, 8], "numel": 64, "l2": v[i], "rms": v[i] / 8, "max_abs": v[i],
             "n_nan": (n_nan or {}).get(t, [0] * len(steps))[i], "n_inf": 0, "n_zero": 0}
            for t, v in norms.items() for i, s in enumerate(steps)]
    return pl.DataFrame(rows)


# ---- the runs, one builder per case ---------------------------------------------------------------


def int01_restart(_: Path) -> RunData:
    """A restart: steps go back from 99 to 60 in a second segment."""
    steps = np.concatenate([np.arange(0, 100), np.arange(60, 160)])
    seg = np.concatenate([np.zeros(100), np.ones(100)])
    return table_run({"loss": _loss(200)}, steps, seg)


def nf01_nan_loss(_: Path) -> RunData:
    """The loss turns NaN at step 120 and stays there."""
    loss = _loss(200)
    loss[120:] = np.nan
    return table_run({"loss": loss, "grad_norm": _noise(200, 0.1)})


def sp01_spike(_: Path) -> RunData:
    """One loss point three times its neighbours at step 200."""
    loss = _loss(300)
    loss[200] *= 3.0
    return table_run({"loss": loss})


def gn01_grad_spike(_: Path) -> RunData:
    """The grad norm jumps 40x for three steps from step 220."""
    g = _noise(300, 0.1)
    g[220:223] *= 40.0
    return table_run({"loss": _loss(300), "grad_norm": g})


def dv01_divergence(_: Path) -> RunData:
    """The loss falls to step 150, then rises for good (no spike)."""
    s = np.arange(300)
    base = np.where(s < 150, 4.0 - 1.5 * s / 150, 2.5 + 1.5 * (np.maximum(s - 150, 0) / 150) ** 1.5)
    return table_run({"loss": base * _noise(300, 0.005)})


def dv01_sparse_rise(_: Path) -> RunData:
    """Lightning-style rows every 10 steps (9, 19, ...): the loss falls, then rises linearly from step 700."""
    s = np.arange(9, 1000, 10)
    base = np.where(s < 700, 0.4 + 0.6 / np.sqrt(1 + s / 20), 0.4 + 0.6 / np.sqrt(1 + 700 / 20) + 0.01 * (s - 700))
    return table_run({"loss": base * _noise(len(s), 0.03)}, s)


def dv01_level_jump(_: Path) -> RunData:
    """The loss falls, then jumps x4000 at step 600 and stays there (un-normalised inputs from then on)."""
    s = np.arange(800)
    loss = _loss(800) * np.where(s < 600, 1.0, 4000.0)
    return table_run({"loss": loss}, s)


def st01_flat(_: Path) -> RunData:
    """A run from step 0 whose loss stays at log(1000) (never learns)."""
    return table_run({"loss": 6.9 * _noise(200, 0.01)})


def ov01_scale_collapse(_: Path) -> RunData:
    """An fp16 loss scale halving twelve times in a row from step 100."""
    scale = np.full(200, 65536.0)
    for k, st in enumerate(range(100, 112)):  # twelve back-offs in a row, no growth: /4096
        scale[st:] = 65536.0 / 2 ** (k + 1)
    return table_run({"loss": _loss(200), "loss_scale": scale})


def ov02_activation_limit(_: Path) -> RunData:
    """An fp16 run whose MLP activation maximum grows into the fp16 limit (65504)."""
    s = np.arange(200)
    act = 2000.0 * np.exp(s / 55.0)
    return table_run({"loss": _loss(200), "act_max/layers.3.mlp": act}, meta={"precision": "fp16"})


def lr01_reset(_: Path) -> RunData:
    """A resume at step 150 whose lr warms up again from zero."""
    s0, s1 = np.arange(0, 200), np.arange(150, 300)
    lr = lambda s: np.where(s < 20, 1e-3 * (s + 1) / 20, 1e-3 * np.cos(np.pi / 2 * s / 400))  # noqa: E731
    lr1 = np.where(s1 - 150 < 20, 1e-3 * (s1 - 150 + 1) / 20, 1e-3)  # the warm-up starts again
    steps = np.concatenate([s0, s1])
    seg = np.concatenate([np.zeros(200), np.ones(150)])
    return table_run({"lr": np.concatenate([lr(s0), lr1]), "loss": _loss(350)}, steps, seg)


def lr01_plateau_jump(_: Path) -> RunData:
    """A constant lr (1e-3, no warm-up) raised x30 at step 200 inside one process (a hot-edited config)."""
    s = np.arange(400)
    return table_run({"lr": np.where(s < 200, 1e-3, 3e-2), "loss": _loss(400)}, s)


def lr01_warmup_plateau(_: Path) -> RunData:
    """A linear warm-up to a constant lr, then milestone decays (x0.1): a schedule, no jump up."""
    s = np.arange(400)
    lr = np.where(s < 50, 1e-3 * (s + 1) / 50, np.where(s < 250, 1e-3, np.where(s < 350, 1e-4, 1e-5)))
    return table_run({"lr": lr, "loss": _loss(400)}, s)


def rs01_weights_lost(_: Path) -> RunData:
    """A resume at step 200 whose loss is back at its initial level, the lr continuous."""
    s0, s1 = np.arange(0, 200), np.arange(200, 300)
    loss0 = (2.0 + 8.0 / (1 + s0 / 10)) * _noise(200, 0.01)
    loss1 = (2.0 + 8.0 / (1 + (s1 - 200) / 10)) * _noise(100, 0.01, seed=3)  # back at the initial loss
    steps = np.concatenate([s0, s1])
    seg = np.concatenate([np.zeros(200), np.ones(100)])
    lr = np.full(300, 1e-3)
    return table_run({"loss": np.concatenate([loss0, loss1]), "lr": lr}, steps, seg)


def wu01_warmup_spike(_: Path) -> RunData:
    """Loss spikes at step 120 while the lr is still warming up (to step 250)."""
    s = np.arange(300)
    lr = 1e-3 * np.minimum(1.0, (s + 1) / 250)
    loss = _loss(300)
    loss[120:124] *= 2.0
    return table_run({"loss": loss, "lr": lr})


def _warmup_noisy(n: int = 300, seed: int = 10) -> tuple[np.ndarray, np.ndarray]:
    """A per-batch loss (sd 5%) falling to a plateau of ~3.0 while the lr warms up to step 50, then decays."""
    s = np.arange(n)
    lr = 3e-3 * np.minimum(1.0, (s + 1) / 50) * np.where(s > 50, np.cos(0.5 * np.pi * (s - 50) / n), 1.0)
    return lr, (2.8 + 2.2 * np.exp(-s / 25)) * _noise(n, 0.05, seed)


def wu01_lucky_low_batch(_: Path) -> RunData:
    """A healthy noisy warm-up: one lucky low batch at step 70 (2.45), a normal one at 71 (user test U9)."""
    lr, loss = _warmup_noisy()
    loss[70], loss[71] = 2.45, 3.47
    return table_run({"loss": loss, "lr": lr})


def wu01_level_shift(_: Path) -> RunData:
    """The loss level steps up 18% at step 160 and stays there while the lr still ramps (to step 400)."""
    s = np.arange(450)
    lr = 0.5 * np.minimum(1.0, (s + 1) / 400)
    loss = (2.6 + 2.2 * np.exp(-s / 25)) * _noise(450, 0.05) * np.where(s >= 160, 1.18, 1.0)
    return table_run({"loss": loss, "lr": lr})


def wu01_grad_cospike(_: Path) -> RunData:
    """One loss jump x1.7 at step 70 that the next batch leaves, with the grad norm x6 at the same step."""
    lr, loss = _warmup_noisy()
    gn = 0.5 * _noise(300, 0.1, 3)
    loss[70] *= 1.7
    gn[70] *= 6.0
    return table_run({"loss": loss, "lr": lr, "grad_norm": gn})


def wu01_lone_jump(_: Path) -> RunData:
    """The same lone jump without the grad norm moving: one noisy point, not an lr too high."""
    lr, loss = _warmup_noisy()
    loss[70] *= 1.7
    return table_run({"loss": loss, "lr": lr, "grad_norm": 0.5 * _noise(300, 0.1, 3)})


def sp01_held_shift(_: Path) -> RunData:
    """The loss is lifted +40% for 18 steps from step 200, below 6 sigmas at any point (user test U10)."""
    loss = _loss(400, 0.08)
    loss[200:218] *= 1.4
    return table_run({"loss": loss})


def db01_bad_batch(_: Path) -> RunData:
    """A NaN loss at step 210 with a flat grad norm before it (no precursor)."""
    loss = _loss(300)
    loss[210] = np.nan
    return table_run({"loss": loss, "grad_norm": _noise(300, 0.1)})


def db01_co_rise(_: Path) -> RunData:
    """Loss and grad norm rise together from 210 (grad x1.3/step), NaN at 230 (user test U5: not a bad batch)."""
    loss, gn = _loss(300), 0.5 * _noise(300, 0.1)
    loss[210:230] = loss[209] + 0.2 * np.arange(1, 21)
    gn[210:] = gn[209] * 1.3 ** np.arange(1, 91)
    loss[230:] = np.nan
    return table_run({"loss": loss, "grad_norm": gn})


def db02_recurring(_: Path) -> RunData:
    """The same batch every 40 steps from step 30: small bumps during the fast early fall, a full spike at 230."""
    loss = _loss(300)
    for k, step in enumerate(range(30, 300, 40)):
        loss[step] *= 1.06 if k < 5 else 1.6
    return table_run({"loss": loss})


def db02_single_spike(_: Path) -> RunData:
    """One full spike at 230 and no recurrence: DB02 gives nothing (DB01/SP01 report it)."""
    loss = _loss(300)
    loss[230] *= 1.6
    return table_run({"loss": loss})


def do01_ordering(_: Path) -> RunData:
    """The train loss steps up by 0.12 at step 400; the eval loss does not."""
    s = np.arange(600)
    train = (2.0 + 1.0 / np.sqrt(1 + s / 50)) * _noise(600, 0.004) + np.where(s >= 400, 0.12, 0.0)
    ev_steps = np.arange(0, 600, 25)
    ev = (2.1 + 1.0 / np.sqrt(1 + ev_steps / 50)) * _noise(len(ev_steps), 0.002, seed=2)
    return table_run({"loss": train, "eval_loss": ev}, col_steps={"eval_loss": ev_steps})


def up01_update_growth(_: Path) -> RunData:
    """The update ratio grows exponentially from step 150; the loss then diverges."""
    s = np.arange(300)
    ur = 1e-3 * np.where(s < 150, 1.0, np.exp((s - 150) / 30.0)) * _noise(300, 0.02)
    loss = _loss(300)
    loss[250:] = loss[250] * np.exp((s[250:] - 250) / 20.0)
    return table_run({"loss": loss, "update_ratio": ur})


def pr01_precursor(_: Path) -> RunData:
    """The grad norm ramps from step 250 to a NaN/inf failure at step 390."""
    s = np.arange(400)
    g = np.where(s < 250, 1.0, np.exp((s - 250) / 40.0)) * _noise(400, 0.03)
    loss = _loss(400)
    loss[390:] = np.nan
    g[390:] = np.inf
    return table_run({"loss": loss, "grad_norm": g})


def at01_logit_growth(_: Path) -> RunData:
    """The max attention logit grows from 20 without bound after step 120."""
    s = np.arange(300)
    logit = np.where(s < 120, 20.0, 20.0 * np.exp((s - 120) / 50.0)) * _noise(300, 0.02)
    return table_run({"loss": _loss(300), "attn_logit_max": logit})


def ol01_output_logits(_: Path) -> RunData:
    """The max output logit grows after step 150."""
    s = np.arange(300)
    out = np.where(s < 150, 15.0, 15.0 * np.exp((s - 150) / 60.0)) * _noise(300, 0.02)
    return table_run({"loss": _loss(300), "output_logit_max": out})


def hw01_magic_norm(_: Path) -> RunData:
    """The grad norm is exactly sqrt(2) with a loss of 0.0 from step 150."""
    g = _noise(200, 0.1)
    g[150:] = 1.4142135623730951
    loss = _loss(200)
    loss[150:] = 0.0
    return table_run({"loss": loss, "grad_norm": g})


def _ranks_run(factor: Callable[[int], np.ndarray], n_ranks: int = 4, n: int = 300) -> RunData:
    """Per-rank losses (``RunData.ranks``): each rank its own shard's noise, times ``factor(rank)``."""
    rows = [pl.DataFrame({"rank": r, "segment": 0, "step": np.arange(n), "metric": "loss",
                          "value": _loss(n, 0.02) * _noise(n, 0.02, seed=r) * factor(r)},
                         schema_overrides={"rank": pl.Int32, "segment": pl.Int32, "step": pl.Int64})
            for r in range(n_ranks)]
    run = table_run({"loss": _loss(n)})
    run.ranks = pl.concat(rows)
    return run


def rk01_bad_rank(_: Path) -> RunData:
    """Rank 2's loss is 1.8x the other ranks' from step 150; ranks 0, 1, 3 agree."""
    return _ranks_run(lambda r: np.where((r == 2) & (np.arange(300) >= 150), 1.8, 1.0))


def rk01_ranks_together(_: Path) -> RunData:
    """Every rank's loss rises 3x from step 150 (the run's problem, not a rank's)."""
    return _ranks_run(lambda r: np.where(np.arange(300) >= 150, 1.0 + 2.0 * (np.arange(300) - 150) / 150, 1.0))


def gs01_constant_factor(_: Path) -> RunData:
    """The train loss is four times the eval loss at every step."""
    ev_steps = np.arange(0, 300, 20)
    ev = (2.0 + 3.0 / np.sqrt(1 + ev_steps / 20)) * _noise(len(ev_steps), 0.005, seed=4)
    return table_run({"loss": 4.0 * _loss(300), "eval_loss": ev}, col_steps={"eval_loss": ev_steps})


def nt01_notes(tmp: Path) -> RunData:
    """A run folder whose notes say skipping the data did not help."""
    from forensics.api import load

    lines = [{"step": int(s), "loss": float(v)} for s, v in zip(range(100), _loss(100), strict=True)]
    (tmp / "metrics.jsonl").write_text("".join(f'{{"step": {r["step"]}, "loss": {r["loss"]}}}\n' for r in lines))
    (tmp / "notes.md").write_text("# attempts\n\n- skipped the data around step 80: diverged again, same behaviour\n")
    return load(tmp)


def ck01_nan_checkpoint(_: Path) -> RunData:
    """A checkpoint tensor with NaNs from the checkpoint at step 200."""
    t = _tensors({"layers.0.mlp.weight": [3.0, 3.1, 3.2]}, [100, 200, 300],
                 n_nan={"layers.0.mlp.weight": [0, 4, 4]})
    return table_run({"loss": _loss(300)}, tensors=t)


def ck02_qk_growth(_: Path) -> RunData:
    """Q/K projection norms tripling over checkpoints while V stays flat."""
    t = _tensors({"l.0.attn.q_proj.weight": [1, 1.6, 2.3, 3.0], "l.0.attn.k_proj.weight": [1, 1.5, 2.2, 3.1],
                  "l.0.attn.v_proj.weight": [1, 1.05, 1.1, 1.1]}, [100, 200, 300, 400])
    return table_run({"loss": _loss(400)}, tensors=t)


def ck03_optimizer_restart(_: Path) -> RunData:
    """A resume whose checkpoint's optimizer step restarted (100 at step 300)."""
    t = _tensors({"l.0.mlp.weight": [1, 1.01, 1.02, 1.03]}, [100, 200, 300, 400])
    cks = [{"step": 200, "path": "c200", "step_source": "name", "optimizer": {"step": 200},
            "scheduler": {"last_epoch": 200}},
           {"step": 300, "path": "c300", "step_source": "name", "optimizer": {"step": 100},
            "scheduler": {"last_epoch": 100}}]
    steps = np.concatenate([np.arange(1, 301), np.arange(201, 401)])
    seg = np.concatenate([np.zeros(300), np.ones(200)])
    return table_run({"loss": np.full(500, 2.0)}, steps, seg, meta={"checkpoints": cks}, tensors=t)


def ck03_restart_beside_a_later_record(_: Path) -> RunData:
    """HF layout (user test U2): the onset belongs to the resumed attempt.

    trainer_state.json's sparse loss (segment 0, steps 10-500) runs past the resume at 300 that the stdout
    logs as segment 1.
    """
    t = _tensors({"l.0.mlp.weight": [1, 1.01]}, [300, 400])
    cks = [{"step": 300, "path": "c300", "step_source": "trainer_state", "optimizer": {"step": 300}},
           {"step": 400, "path": "c400", "step_source": "trainer_state", "optimizer": {"step": 100}}]
    return table_run({"samples_per_second": np.full(20, 9.0), "loss": np.full(50, 2.0)}, np.arange(301, 321),
                     np.ones(20), meta={"checkpoints": cks}, tensors=t, col_steps={"loss": np.arange(10, 510, 10)})


def wu01_ppo_objective(_: Path) -> RunData:
    """An RLHF actor + critic loss around 0 (often negative) whose swings widen during the warm-up: no WU01."""
    rng = np.random.default_rng(RNG_SEED)
    s = np.arange(300)
    loss = np.where(s < 84, rng.normal(0.1, 0.25, 300), rng.normal(0.6, 1.0, 300))
    lr = np.where(s < 110, 5e-6 * (s + 1) / 110, 5e-6)
    return table_run({"loss": loss, "lr": lr}, s)


def healthy(_: Path) -> RunData:
    """A healthy run: warm-up + cosine lr, falling loss, steady grad norm."""
    s = np.arange(400)
    lr = np.where(s < 40, 1e-3 * (s + 1) / 40, 1e-3 * 0.5 * (1 + np.cos(np.pi * (s - 40) / 360)))
    return table_run({"loss": _loss(400), "lr": lr, "grad_norm": _noise(400, 0.1)})


# ---- the cases --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    """One detector on one run: ``must`` findings as (code, step, segment[, mechanism]), ``must_not`` codes."""

    id: str
    code: str
    build: Callable[[Path], RunData]
    must: tuple[tuple, ...] = ()
    must_not: tuple[str, ...] = field(default_factory=tuple)


CASES = (
    Case("int01_restart", "INT01", int01_restart, must=(("INT01", 60, 1),)),
    Case("nf01_nan_loss", "NF01", nf01_nan_loss, must=(("NF01", 120, 0),)),
    Case("sp01_spike", "SP01", sp01_spike, must=(("SP01", 200, 0),)),
    Case("gn01_grad_spike", "GN01", gn01_grad_spike, must=(("GN01", 220, 0),)),
    Case("dv01_divergence", "DV01", dv01_divergence, must=(("DV01", 158, 0),)),
    # the onset is the first row above the level before the rise, not a smoothed point before it
    Case("dv01_sparse_rise", "DV01", dv01_sparse_rise, must=(("DV01", 709, 0),)),
    Case("dv01_level_jump", "DV01", dv01_level_jump, must=(("DV01", 600, 0),)),
    Case("st01_flat", "ST01", st01_flat, must=(("ST01", 0, 0),)),
    Case("ov01_scale_collapse", "OV01", ov01_scale_collapse, must=(("OV01", None, 0, "loss_scale_collapse"),)),
    Case("ov02_activation_limit", "OV02", ov02_activation_limit, must=(("OV02", 192, 0, "activation_overflow"),)),
    Case("lr01_reset", "LR01", lr01_reset, must=(("LR01", 150, 1, "reset_to_initial"),)),
    # a jump above a plateau counts as one after the peak (the peak is where the plateau began)
    Case("lr01_plateau_jump", "LR01", lr01_plateau_jump, must=(("LR01", 200, 0, None),)),
    Case("lr01_warmup_plateau", "LR01", lr01_warmup_plateau, must_not=("LR01",)),
    Case("wu01_ppo_objective", "WU01", wu01_ppo_objective, must_not=("WU01",)),
    Case("rs01_weights_lost", "RS01", rs01_weights_lost, must=(("RS01", 200, 1, "weights"),)),
    Case("wu01_warmup_spike", "WU01", wu01_warmup_spike, must=(("WU01", 120, 0, "lr_too_high"),)),
    # a warm-up instability is judged against the loss's trailing level and noise, and must persist or come
    # with its mechanism (user test U9: a lucky low batch made the next normal one a 'jump')
    Case("wu01_lucky_low_batch", "WU01", wu01_lucky_low_batch, must_not=("WU01",)),
    Case("wu01_level_shift", "WU01", wu01_level_shift, must=(("WU01", 160, 0, "lr_too_high"),)),
    Case("wu01_grad_cospike", "WU01", wu01_grad_cospike, must=(("WU01", 70, 0, "lr_too_high"),)),
    Case("wu01_lone_jump", "WU01", wu01_lone_jump, must_not=("WU01",)),
    Case("sp01_held_shift", "SP01", sp01_held_shift, must=(("SP01", 201, 0),)),
    Case("db01_bad_batch", "DB01", db01_bad_batch, must=(("DB01", 210, 0, "bad_batch"),)),
    Case("db01_co_rise", "DB01", db01_co_rise, must_not=("DB01",)),
    Case("db02_recurring", "DB02", db02_recurring, must=(("DB02", 30, 0, "bad_batch"),)),
    Case("db02_single_spike", "DB02", db02_single_spike, must_not=("DB02",)),
    Case("db02_healthy", "DB02", lambda _: table_run({"loss": _loss(300)}), must_not=("DB02",)),
    Case("do01_ordering", "DO01", do01_ordering, must=(("DO01", 400, 0, "ordering"),)),
    Case("up01_update_growth", "UP01", up01_update_growth, must=(("UP01", 164, 0, "lr_too_high"),)),
    Case("pr01_precursor", "PR01", pr01_precursor, must=(("PR01", 252, 0, "lr_too_high"),)),
    Case("at01_logit_growth", "AT01", at01_logit_growth, must=(("AT01", 134, 0, "attention_logit_growth"),)),
    Case("ol01_output_logits", "OL01", ol01_output_logits, must=(("OL01", 167, 0, "output_logit_divergence"),)),
    Case("hw01_magic_norm", "HW01", hw01_magic_norm, must=(("HW01", 150, 0, "collective_bug"),)),
    Case("rk01_bad_rank", "RK01", rk01_bad_rank, must=(("RK01", 150, 0, "bad_rank"),)),
    Case("rk01_ranks_together", "RK01", rk01_ranks_together, must_not=("RK01",)),
    Case("gs01_constant_factor", "GS01", gs01_constant_factor, must=(("GS01", 0, 0),)),
    Case("nt01_notes", "NT01", nt01_notes, must=(("NT01", None, None),)),
    Case("ck01_nan_checkpoint", "CK01", ck01_nan_checkpoint, must=(("CK01", 200, 0, "nonfinite_state"),)),
    Case("ck02_qk_growth", "CK02", ck02_qk_growth, must=(("CK02", 300, 0, "attention_logit_growth"),)),
    Case("ck03_optimizer_restart", "CK03", ck03_optimizer_restart, must=(("CK03", 201, 1, "optimizer_state"),)),
    Case("ck03_restart_beside_a_later_record", "CK03", ck03_restart_beside_a_later_record,
         must=(("CK03", 301, 1, "optimizer_state"),)),
    # must-not: a healthy run gives no finding of the fault detectors
    *(Case(f"healthy_{c.lower()}", c, healthy, must_not=(c,))
      for c in ("SP01", "GN01", "DV01", "ST01", "LR01", "WU01", "DB01", "PR01", "HW01", "NF01")),
    # must-not: a spike that recovers is not a divergence; a restart alone is not an lr reset
    Case("sp01_spike_not_dv01", "DV01", sp01_spike, must_not=("DV01",)),
    Case("int01_restart_not_lr01", "LR01", int01_restart, must_not=("LR01",)),
)


def _matches(f: Finding, want: tuple) -> bool:
    code, step, segment, *mech = want
    return (f.code == code and (step is None or f.step == step) and (segment is None or f.segment == segment)
            and (not mech or f.mechanism == mech[0]))


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_detector_case(case: Case, tmp_path: Path) -> None:
    """The case's detector, on the case's run, gives every ``must`` finding and no ``must_not`` code."""
    det = BY_CODE[case.code]
    run = case.build(tmp_path)
    assert det.missing(run) is None or not case.must, f"{case.code} skipped: {det.missing(run)}"
    found = det.detect(run) if det.missing(run) is None else []
    seen = [(f.code, f.step, f.segment, f.mechanism) for f in found]
    for want in case.must:
        assert any(_matches(f, want) for f in found), f"{case.id}: wanted {want}, found {seen}"
    for code in case.must_not:
        assert not any(f.code == code for f in found), f"{case.id}: must not give {code}, found {seen}"


def test_every_code_has_a_case() -> None:
    """Every code of the registry is named by at least one case that must find it."""
    covered = {w[0] for c in CASES for w in c.must}
    assert {d.code for d in DETECTORS} <= covered, sorted({d.code for d in DETECTORS} - covered)


def test_defaults_are_typed_fields() -> None:
    """``forensics detectors`` prints the defaults; every detector with a threshold declares it as a field."""
    for d in DETECTORS:
        assert isinstance(d.defaults(), dict)
    assert BY_CODE["OL01"].defaults(), "OL01 declares its thresholds"


class _Crashing(Detector):
    code = "ZZ98"
    name = "test.crashing"
    requires = ("loss",)

    def detect(self, run: RunData) -> list[Finding]:
        raise ValueError("boom")


class _NeedsEval(Detector):
    code = "ZZ99"
    name = "test.needs_eval"
    requires = ("eval_loss",)

    def detect(self, run: RunData) -> list[Finding]:  # pragma: no cover - never reached: the metric is missing
        raise AssertionError("a detector whose metric is missing must not run")


def test_crashing_detector_is_a_listed_skip() -> None:
    """A detector that raises becomes one Skip naming it and the exception; the others still run."""
    run = sp01_spike(Path("."))
    findings, skipped = run_detectors(run, (_Crashing(), BY_CODE["SP01"]))
    assert [s.what for s in skipped] == ["ZZ98 test.crashing"]
    assert "detector failed: ValueError: boom" in skipped[0].reason
    assert [f.code for f in findings] == ["SP01"]


def test_missing_metric_is_a_listed_skip() -> None:
    """A detector whose required metric is absent is not run and is listed with the metric it needs."""
    findings, skipped = run_detectors(sp01_spike(Path(".")), (_NeedsEval(),))
    assert findings == []
    assert [(s.what, s.reason) for s in skipped] == [("ZZ99 test.needs_eval",
                                                      "not evaluated: needs one of the metrics eval_loss")]


def test_lr01_says_where_the_replayed_schedule_starts() -> None:
    """LR01 names where a replayed schedule starts: its first step, or (user test U3) its peak.

    A warm-up replayed is "from its first step"; a cosine restarted at its peak (no warm-up) names the old
    step it replays from and says it is past the warm-up.
    """
    (warm,) = [f for f in BY_CODE["LR01"].detect(lr01_reset(Path())) if f.step == 150]
    assert "from its first step" in warm.message, warm.message
    sched = lambda s: np.where(s < 30, 3e-3 * (s + 5) / 35, 3e-3 * 0.5 * (1 + np.cos(np.pi * (s - 30) / 570)))  # noqa: E731
    s0, s1 = np.arange(5, 305, 5), np.arange(305, 605, 5)
    lr = np.concatenate([sched(s0), sched(s1 - 300 + 30 - 5)])  # job 2: the cosine again from its peak
    run = table_run({"lr": lr, "loss": _loss(120)}, np.concatenate([s0, s1]), np.r_[np.zeros(60), np.ones(60)])
    (peak,) = [f for f in BY_CODE["LR01"].detect(run) if f.step == 305]
    assert peak.mechanism == "reset_to_initial"
    assert "from its step 30 (its peak, past the warm-up)" in peak.message, peak.message


def test_a_chain_link_against_a_schedule_decayed_to_zero_states_both_lrs() -> None:
    """ENG01 printed "59999999999999993100671909888% off the schedule" for an lr against ~0 (user test U18)."""
    from forensics.engine.onset import _size
    from forensics.model import Finding

    def link(observed: float, expected: float) -> Finding:
        rel = abs(observed - expected) / max(expected, 1e-30)
        return Finding(code="LR01", name="lr.schedule_reset", cause="lr_schedule_reset", mechanism=None, step=301,
                       segment=1, confidence=0.9, severity="high", message="",
                       evidence={"relative_difference": rel, "observed_lr": observed, "expected_lr": expected})

    assert _size(link(6e-4, 1e-32)) == "lr 0.0006 where the schedule gives 1e-32"
    assert _size(link(1.5e-3, 1e-3)) == "50% off the schedule"
