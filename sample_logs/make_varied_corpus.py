"""Generate a corpus of real tiny training runs that varies many axes at once (issue 15).

Every run is a REAL training on CPU (torch, one thread) of the tiny pre-LN character Transformer of
``make_samples.py`` (imported, never edited) or of a small MLP language model, over the bytes of the Python
standard library's sources. Each run draws, from its own seed, all of these at once:

* model: Transformer (d_model 16-48, 1-3 layers) or an MLP LM over a byte context (width 32-128);
* optimizer: AdamW, Adam, SGD with momentum, Adafactor (``torch.optim.Adafactor``);
* schedule: cosine, linear, WSD (trapezoid), step, inverse-sqrt, constant, cyclic; warm-up 0-60 steps;
* precision: fp32, bf16 autocast, fp16 autocast with a real ``torch.amp.GradScaler`` (init scale 2**16 or a
  too-high 2**20..2**32 that calibrates down in the first steps; growth interval 40-2000, so periodic growth
  probes skip a step);
* batch size and gradient accumulation, clipping, log interval (1, 2, 5, 10), which metrics are logged
  (minimal / standard / rich), eval cadence, per-step time and its noise (a virtual clock: a tiny CPU model
  does not have a GPU job's step time; the clock is ``base * noise`` per step, plus the injected shifts);
* writer: torch ``SummaryWriter`` (one event file per process), JSONL, wandb offline (``WANDB_MODE=offline``,
  one ``offline-run-*`` per process), a Megatron-like stdout log (``train.log``), a Lightning-format
  ``lightning_logs/version_N/metrics.csv`` (one version per process, written with ``csv``; Lightning itself is
  not installed);
* resumes: none, a correct one (every state restored; the resumed process re-logs the steps between the
  checkpoint and the crash), an intentional schedule change (a NEW schedule over the remaining steps, with
  an override flag in the config), or a faulty one (below). Checkpoints are kept in memory, never written.

Kinds (label = verdict / cause / mechanism, onset window from what was injected):

* ``healthy`` with traps: fp16 loss-scale calibration and growth probes, a 5 % speed-up or a small slowdown
  inside the noise, one mildly noisy batch after warm-up (half the sequences are byte-shuffled), smooth decay,
  a correct resume, an intentional schedule change;
* ``lr_reset``: the resumed process rebuilds the scheduler from step 0 (warm-up and peak replayed; sometimes
  with an override flag set in the config): lr_schedule_reset / reset_to_initial, ``[c+1, c+1]``;
* ``weights_not_restored`` / ``optimizer_not_restored`` / ``sampler_replay`` (the data position goes back to
  batch 0): state_not_restored, ``[c+1, c+1]``;
* ``bad_batch_nan`` (an all-padding batch: 0/0 = NaN; the job stops a few steps later): anomaly data_batch
  bad_batch ``[f, f]``; ``bad_batch_spike`` (1-3 batches of random bytes, recovered): transient data_batch
  ``[f, f]``; ``recurring_spikes`` (a random-bytes batch every P steps): anomaly data_batch ``[f1, f1]``;
* ``lr_too_high``: peak lr x10-40, no clipping, fp32/bf16: update_scale_growth / lr_too_high ``[1, s]``, ``s``
  the first step from which the 20-step mean loss stays above a healthy twin's (same seed, safe lr) by 0.1;
* ``fp16_overflow``: fp16, far too high lr: overflow ``[1, first skipped step after calibration]``;
* ``grad_scaling_bug``: the resumed process sums (not averages) over k accumulation micro-batches (grad norm
  x k, loss trend unchanged): grad_scaling_bug ``[c+1, c+1]``.

Split (``split`` in each label): a run is ``validation`` when its seed is 0 mod 4 or it uses a held-out axis
value (optimizer Adafactor, schedule WSD, writer Lightning CSV); otherwise ``tuning``. The held-out values never
appear in tuning.

Usage::

    python sample_logs/make_varied_corpus.py --out /work/corpus15 --n 320 --jobs 2
    python sample_logs/make_varied_corpus.py --out /tmp/c --n 40 --first-seed 9000   # a small subset

Labels: ``OUT/labels.json`` (one file, outside the run folders). Runs that did not show their fault (e.g. no
overflow happened) are dropped and listed in ``OUT/dropped.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import csv
import io
import json
import math
import os
import random
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

OPTIMIZERS = ("adamw", "adamw", "adamw", "adam", "adam", "sgd", "sgd", "adafactor")
SCHEDULES = ("cosine", "cosine", "linear", "wsd", "step", "invsqrt", "constant", "cyclic")
WRITERS = ("tb", "tb", "jsonl", "jsonl", "wandb", "megatron", "csv")
"""Axis values, repeated to weight the draw."""
HELD_OUT = {"optimizer": "adafactor", "schedule": "wsd", "writer": "csv"}
"""Axis values that appear only in the validation part."""

KINDS = {
    # kind: (verdict, cause, mechanism, acceptable mechanisms, weight)
    "healthy": ("healthy", None, None, [], 7),
    "lr_reset": ("anomaly", "lr_schedule_reset", "reset_to_initial", [], 3),
    "weights_not_restored": ("anomaly", "state_not_restored", "weights", [], 2),
    "optimizer_not_restored": ("anomaly", "state_not_restored", "optimizer_state", [], 2),
    "sampler_replay": ("anomaly", "state_not_restored", "data_sampler", ["data_replay"], 1),
    "bad_batch_nan": ("anomaly", "data_batch", "bad_batch", [], 2),
    "bad_batch_spike": ("transient", "data_batch", "bad_batch", [], 2),
    "recurring_spikes": ("anomaly", "data_batch", "bad_batch", [], 1),
    "lr_too_high": ("anomaly", "update_scale_growth", "lr_too_high", ["attention_logit_growth"], 2),
    "fp16_overflow": ("anomaly", "overflow", "activation_overflow", ["loss_scale_collapse"], 1),
    "grad_scaling_bug": ("anomaly", "grad_scaling_bug", "accumulation_scaling", [], 1),
}
PROFILE_KEYS = {
    "minimal": {"loss", "lr"},
    "standard": {"loss", "lr", "grad_norm", "loss_scale", "skipped_step", "eval_loss"},
    "rich": {"loss", "lr", "grad_norm", "loss_scale", "skipped_step", "eval_loss", "update_ratio", "param_norm",
             "throughput", "batch_index", "attn_logit_max"},
}


class Dropped(Exception):
    """The injected fault did not show (the run is not labelled)."""


@dataclass
class Spec:
    """Every drawn axis of one run (``public`` is what the run's config records)."""

    name: str
    seed: int
    kind: str
    arch: str
    d_model: int
    n_layers: int
    optimizer: str
    schedule: str
    warmup: int
    steps: int
    lr: float
    precision: str
    init_scale: float
    growth_interval: int
    batch_size: int
    accum: int
    clip: float
    log_every: int
    profile: str
    writer: str
    eval_every: int
    step_time: float
    time_noise: float
    resume: str  # none | correct | intentional | faulty
    crash: int = 0
    ckpt_every: int = 0
    fault_step: int = 0
    fault_len: int = 1
    period: int = 0
    factor: float = 1.0
    traps: list[str] = field(default_factory=list)
    trap_step: int = 0
    override_flag: bool = False

    @property
    def split(self) -> str:
        """``validation`` for held-out axis values or seed 0 mod 4, else ``tuning``."""
        held = (self.optimizer == HELD_OUT["optimizer"] or self.schedule == HELD_OUT["schedule"]
                or self.writer == HELD_OUT["writer"])
        return "validation" if held or self.seed % 4 == 0 else "tuning"


def draw(seed: int) -> Spec:
    """All axes of run ``seed`` (deterministic)."""
    r = random.Random(seed * 7919 + 17)
    kinds = [k for k, v in KINDS.items() for _ in range(v[4])]
    kind = r.choice(kinds)
    arch = r.choice(("transformer", "transformer", "mlp"))
    precision = r.choice(("fp32", "fp32", "bf16", "fp16"))
    if kind == "fp16_overflow":
        precision, arch = "fp16", "transformer"
    if kind == "lr_too_high" and precision == "fp16":
        precision = "fp32"
    opt = r.choice(OPTIMIZERS)
    if kind == "optimizer_not_restored" and opt == "sgd":
        opt = "adamw"
    sched = r.choice(SCHEDULES)
    steps = r.choice((160, 200, 240, 300, 360))
    warmup = r.choice((0, 10, 20, 30, 60)) if sched != "invsqrt" else r.choice((10, 20, 40))
    if kind == "lr_reset":
        warmup = max(warmup, 10)
        if sched == "constant":
            sched = "cosine"
    base_lr = {"adamw": 3e-3, "adam": 3e-3, "sgd": 0.3, "adafactor": 1e-2}[opt] * r.uniform(0.5, 1.5)
    spec = Spec(
        name="", seed=seed, kind=kind, arch=arch, d_model=r.choice((16, 24, 32, 48)), n_layers=r.choice((1, 2, 2, 3)),
        optimizer=opt, schedule=sched, warmup=warmup, steps=steps, lr=base_lr, precision=precision,
        init_scale=2.0 ** 16, growth_interval=2000, batch_size=r.choice((8, 12, 16)), accum=r.choice((1, 1, 2)),
        clip=r.choice((1.0, 1.0, 0.5, 0.0)), log_every=r.choice((1, 1, 1, 2, 5)),
        profile=r.choice(("minimal", "standard", "standard", "rich", "rich")), writer=r.choice(WRITERS),
        eval_every=r.choice((0, 25, 50)), step_time=r.uniform(0.08, 0.6), time_noise=r.uniform(0.005, 0.05),
        resume="none",
    )
    if precision == "fp16":
        if r.random() < 0.6:
            spec.init_scale = 2.0 ** r.choice((20, 24, 28, 32))  # calibration halvings at the start
        spec.growth_interval = r.choice((40, 100, 200, 2000))
    if kind in ("lr_reset", "weights_not_restored", "optimizer_not_restored", "sampler_replay", "grad_scaling_bug"):
        spec.resume = "faulty"
    elif kind == "healthy":
        spec.resume = r.choice(("none", "none", "correct", "intentional"))
    if spec.resume != "none":
        spec.ckpt_every = r.choice((20, 25, 40, 50))
        spec.crash = r.randint(int(steps * 0.45), int(steps * 0.75))
        if spec.crash % spec.ckpt_every == 0:
            spec.crash += 3
        spec.override_flag = spec.resume == "intentional" or (kind == "lr_reset" and r.random() < 0.4)
    if kind == "grad_scaling_bug":
        spec.factor = float(r.choice((4, 8, 16)))
        spec.profile = r.choice(("standard", "rich"))
        spec.clip = 0.0 if r.random() < 0.5 else 1.0
        if spec.optimizer == "sgd":
            spec.clip = 1.0
    if kind == "optimizer_not_restored":
        spec.profile = r.choice(("standard", "rich"))
    if kind in ("bad_batch_nan", "bad_batch_spike"):
        lo = max(spec.warmup + 10, 30)
        spec.fault_step = r.randint(lo, int(steps * 0.8))
        spec.fault_len = 1 if kind == "bad_batch_nan" else r.choice((1, 1, 2, 3))
    if kind in ("bad_batch_spike", "recurring_spikes", "bad_batch_nan"):
        spec.log_every = min(spec.log_every, 2)  # a one-step spike averaged over 5 logged steps is not in the logs
    if kind == "recurring_spikes":
        spec.period = r.choice((25, 35, 50))
        spec.fault_step = r.randint(max(spec.warmup + 5, 20), max(spec.warmup + 5, 20) + 40)
    if kind == "lr_too_high":
        spec.factor = r.uniform(10, 40)
        spec.clip = 0.0
        spec.arch = "transformer"
    if kind == "fp16_overflow":
        spec.lr = r.uniform(0.12, 0.3)
        spec.optimizer = r.choice(("adamw", "adam"))
        spec.d_model, spec.init_scale, spec.growth_interval = r.choice((32, 48)), 2.0 ** 16, 2000
        spec.clip = r.choice((0.0, 1.0))
    if kind == "healthy":
        pool = ["speedup", "slow_in_noise", "noisy_point", "smooth_decay"]
        spec.traps = r.sample(pool, r.choice((0, 1, 1, 2)))
        if "smooth_decay" in spec.traps:
            spec.schedule, spec.steps = "linear", max(steps, 300)
        spec.trap_step = r.randint(max(spec.warmup + 10, 40), int(spec.steps * 0.85))
    spec.name = f"{kind}_{seed:04d}"
    return spec


# --------------------------------------------------------------------------------------------- model


def _mods():
    import make_samples as ms  # the Transformer and the data of make_samples.py
    import torch

    return ms, torch


class MLPLM:
    """A byte MLP language model: embeds the previous ``ctx`` bytes and predicts the next one."""

    @staticmethod
    def build(width: int, seq_len: int):
        """A fresh MLP LM of the given width (seq_len unused: the context is 6 bytes)."""
        ms, torch = _mods()
        from torch import nn

        class _M(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.ctx = 6
                self.emb = nn.Embedding(256, 16)
                self.net = nn.Sequential(nn.Linear(16 * self.ctx, width * 2), nn.GELU(), nn.Linear(width * 2, width),
                                         nn.GELU(), nn.Linear(width, 256))

            def forward(self, idx):
                e = self.emb(idx)  # (b, t, 16)
                pad = torch.zeros(e.shape[0], self.ctx - 1, e.shape[2], dtype=e.dtype)
                e = torch.cat([pad, e], 1)
                win = torch.stack([e[:, i: i + idx.shape[1]] for i in range(self.ctx)], 2)
                return self.net(win.reshape(idx.shape[0], idx.shape[1], -1))

            def attn_logit_max(self):
                return [math.nan]

        return _M()


def lr_factor(sched: str, i: int, warmup: int, total: int, start: int = 0) -> float:
    """Multiplier of the peak lr at optimizer step ``i`` (0-based) of a schedule that began at ``start``."""
    j = i - start
    if warmup and j < warmup:
        return (j + 1) / warmup
    p = min(1.0, (j - warmup) / max(1, total - start - warmup))
    if sched == "cosine":
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * p))
    if sched == "linear":
        return 1.0 - 0.9 * p
    if sched == "wsd":
        return 1.0 if p < 0.7 else 1.0 - 0.95 * (p - 0.7) / 0.3
    if sched == "step":
        return 0.3 ** int(p * 3 - 1e-9) if p < 1 else 0.3 ** 2
    if sched == "invsqrt":
        return math.sqrt(max(1, warmup) / max(1, j + 1)) if j >= warmup else 1.0
    if sched == "constant":
        return 1.0
    if sched == "cyclic":
        return 0.3 + 0.7 * abs(math.cos(math.pi * (j - warmup) / 80))  # continuous at the warm-up's end
    raise ValueError(sched)


def make_optimizer(spec: Spec, params):
    """The run's optimizer over ``params`` (AdamW, Adam, SGD with momentum 0.9, Adafactor)."""
    _, torch = _mods()
    if spec.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=spec.lr, betas=(0.9, 0.95), weight_decay=0.05)
    if spec.optimizer == "adam":
        return torch.optim.Adam(params, lr=spec.lr)
    if spec.optimizer == "sgd":
        return torch.optim.SGD(params, lr=spec.lr, momentum=0.9)
    return torch.optim.Adafactor(params, lr=spec.lr)


# -------------------------------------------------------------------------------------------- writers


class Writer:
    """The run's real writer(s); one ``open`` per process (segment)."""

    def __init__(self, spec: Spec, out: Path) -> None:
        self.spec, self.out = spec, out
        self.keys = PROFILE_KEYS[spec.profile]
        self.proc = -1
        self.fh: Any = None
        self.tb: Any = None
        self.wb: Any = None
        self.csvw: Any = None

    def open(self, cfg: dict[str, Any], resumed_from: int | None) -> None:
        """Start the writer of a new process (segment) with its config."""
        self.proc += 1
        w = self.spec.writer
        if w == "tb":
            from torch.utils.tensorboard import SummaryWriter

            self.tb = SummaryWriter(log_dir=str(self.out), filename_suffix=f".p{self.proc}")
            (self.out / "config.json").write_text(json.dumps(cfg, indent=1))  # each process writes its config
        elif w == "jsonl":
            self.fh = open(self.out / "metrics.jsonl", "a", encoding="utf-8")  # noqa: SIM115
            (self.out / "config.json").write_text(json.dumps(cfg, indent=1))
        elif w == "megatron":
            self.fh = open(self.out / "train.log", "a", encoding="utf-8")  # noqa: SIM115
            self.fh.write("------------------------ arguments ------------------------\n")
            for k, v in sorted(cfg.items()):
                self.fh.write(f"  {k} {'.' * max(3, 40 - len(k))} {v}\n")
            self.fh.write("-------------------- end of arguments ---------------------\n")
            prec = {"fp16": "float16", "bf16": "bfloat16"}.get(self.spec.precision, "float32")
            self.fh.write(f"using torch.{prec} for parameters ...\n")
            if resumed_from is not None:
                self.fh.write(f"  successfully loaded checkpoint from /ckpt at iteration {resumed_from}\n")
        elif w == "csv":
            d = self.out / "lightning_logs" / f"version_{self.proc}"
            d.mkdir(parents=True)
            (d / "hparams.yaml").write_text("".join(f"{k}: {v}\n" for k, v in cfg.items()))
            self.fh = open(d / "metrics.csv", "w", newline="", encoding="utf-8")  # noqa: SIM115
            cols = ["epoch", "step", "train_loss"] + [f"train_{k}" for k in sorted(self.keys - {"loss"})]
            self.csvw = csv.DictWriter(self.fh, fieldnames=cols, restval="")
            self.csvw.writeheader()
        elif w == "wandb":
            os.environ.update(WANDB_MODE="offline", WANDB_SILENT="true", WANDB_DIR=str(self.out),
                              WANDB_DISABLE_GIT="true", WANDB_DISABLE_CODE="true")
            import wandb

            with contextlib.redirect_stdout(io.StringIO()):
                self.wb = wandb.init(project="varied", id=f"r{self.spec.seed:06d}", config=cfg, dir=str(self.out),
                                     resume="allow" if self.proc else None,
                                     settings=wandb.Settings(x_disable_stats=True, console="off"))

    def log(self, step: int, rec: dict[str, Any], wall: float) -> None:
        """Write one logged step, restricted to the profile's metrics."""
        keep = {k: v for k, v in rec.items() if k in self.keys and v is not None}
        w = self.spec.writer
        if w == "tb":
            for k, v in keep.items():
                self.tb.add_scalar(f"train/{k}" if k != "eval_loss" else "eval/loss", v, step, walltime=wall)
        elif w == "jsonl":
            self.fh.write(json.dumps({"step": step, **keep, "wall_time": wall}) + "\n")
        elif w == "megatron":
            ts = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(wall))
            parts = [f"consumed samples: {step * self.spec.batch_size * self.spec.accum}",
                     f"elapsed time per iteration (ms): {rec['step_ms']:.1f}"]
            if "lr" in keep:
                parts.append(f"learning rate: {keep['lr']:.6E}")
            parts.append(f"global batch size: {self.spec.batch_size * self.spec.accum}")
            if "loss" in keep and math.isfinite(keep["loss"]):
                parts.append(f"lm loss: {keep['loss']:.6E}")
            if "loss_scale" in keep:
                parts.append(f"loss scale: {keep['loss_scale']:.1f}")
            if "grad_norm" in keep and math.isfinite(keep["grad_norm"]):
                parts.append(f"grad norm: {keep['grad_norm']:.3f}")
            parts.append(f"number of skipped iterations: {int(keep.get('skipped_step', 0))}")
            nan = int("loss" in keep and not math.isfinite(keep["loss"]))
            parts.append(f"number of nan iterations: {nan}")
            self.fh.write(f" [{ts}] iteration {step:>8d}/{self.spec.steps:>8d} | " + " | ".join(parts) + " |\n")
            if "eval_loss" in keep:
                self.fh.write(f" validation loss at iteration {step} | lm loss value: {keep['eval_loss']:.6E} | "
                              f"lm loss PPL: {math.exp(min(50, keep['eval_loss'])):.6E} |\n")
        elif w == "csv":
            row = {"epoch": 0, "step": step, "train_loss": keep.get("loss", "")}
            row.update({f"train_{k}": v for k, v in keep.items() if k != "loss"})
            self.csvw.writerow({k: v for k, v in row.items() if k in self.csvw.fieldnames})
        elif w == "wandb":
            self.wb.log({f"train/{k}": v for k, v in keep.items()}, step=step)

    def close(self) -> None:
        """Flush and close the process's writers."""
        if self.tb is not None:
            self.tb.close()
            self.tb = None
        if self.fh is not None:
            self.fh.close()
            self.fh = None
        if self.wb is not None:
            with contextlib.redirect_stdout(io.StringIO()):
                self.wb.finish()
            self.wb = None


# ------------------------------------------------------------------------------------------- training


class Run:
    """One run: processes (segments) over a shared in-memory checkpoint store."""

    def __init__(self, spec: Spec, corpus, out: Path | None, lr_mult: float = 1.0) -> None:
        ms, torch = _mods()
        self.ms, self.torch, self.spec, self.corpus, self.out = ms, torch, spec, corpus, out
        self.lr_mult = lr_mult * (spec.factor if spec.kind == "lr_too_high" else 1.0)
        self.mcfg = ms.Config(d_model=spec.d_model, n_layers=spec.n_layers, n_heads=4 if spec.d_model >= 32 else 2,
                              seq_len=32, batch_size=spec.batch_size, seed=spec.seed)
        self.ckpts: dict[int, dict[str, Any]] = {}
        self.records: list[dict[str, Any]] = []  # every logged record, all processes, unfiltered
        self.clock = 1.7e9 + spec.seed * 1000.0
        self.rng = random.Random(spec.seed + 99)
        self.events: dict[str, Any] = {}
        self.sched_start, self.sched_total, self.sched_peak = 0, spec.steps, 1.0
        self.data_offset = 0
        self.sum_accum = False
        self.pending: list[dict[str, Any]] = []
        self.logged: list[int] = []  # steps written to the logs

    def build(self) -> None:
        """A new process: model, optimizer and loss scaler from the seed."""
        torch, spec = self.torch, self.spec
        torch.manual_seed(spec.seed)
        if spec.arch == "mlp":
            self.model = MLPLM.build(spec.d_model * 2, 32)
        else:
            self.model = self.ms.TinyLM(self.mcfg)
        self.opt = make_optimizer(spec, self.model.parameters())
        fp16 = spec.precision == "fp16"
        self.scaler = torch.amp.GradScaler("cpu", init_scale=spec.init_scale, growth_interval=spec.growth_interval,
                                           enabled=fp16)

    def lr_at(self, i: int) -> float:
        """The lr of optimizer step ``i`` (0-based) under the current schedule."""
        s = self.spec
        return s.lr * self.lr_mult * self.sched_peak * lr_factor(s.schedule, i, s.warmup, self.sched_total,
                                                                 self.sched_start)

    def batch(self, step: int):
        """(inputs, labels, injected?) of a step, with the kind's corruption applied."""
        ms, torch, s = self.ms, self.torch, self.spec
        idx = step - 1 - self.data_offset
        x, y = ms.get_batch(self.corpus, self.mcfg, idx * 7 + 3)
        bad = False
        if s.kind == "bad_batch_nan" and step == s.fault_step:
            x, y = ms.corrupt_batch(x, y, "pad", idx)
            bad = True
        if s.kind == "bad_batch_spike" and s.fault_step <= step < s.fault_step + s.fault_len:
            x, y = ms.corrupt_batch(x, y, "random", idx)
            bad = True
        if s.kind == "recurring_spikes" and step >= s.fault_step and (step - s.fault_step) % s.period == 0:
            x, y = ms.corrupt_batch(x, y, "random", idx)
            bad = True
        if "noisy_point" in s.traps and step == s.trap_step:  # half the sequences byte-shuffled: mildly harder
            g = torch.Generator().manual_seed(idx)
            h = x.shape[0] // 4
            perm = torch.randperm(x.shape[1], generator=g)
            x[:h], y[:h] = x[:h, perm], y[:h, perm]
        return x, y, bad

    def eval_loss(self) -> float:
        """Loss on a fixed held-out batch."""
        torch, F = self.torch, self.torch.nn.functional
        with torch.no_grad():
            x, y = self.ms.get_batch(self.corpus, self.mcfg, 10_000_019)
            return F.cross_entropy(self.model(x).float().reshape(-1, 256), y.reshape(-1)).item()

    def step_fn(self, step: int, writer: Writer | None) -> bool:
        """One optimizer step; returns False when the job dies."""
        torch, s = self.torch, self.spec
        F = torch.nn.functional
        lr = self.lr_at(step - 1)
        for g in self.opt.param_groups:
            g["lr"] = lr
        before = self.ms.flat_params(self.model)
        self.opt.zero_grad(set_to_none=True)
        dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(s.precision)
        losses = []
        any_bad = False
        for m in range(s.accum):
            x, y, bad = self.batch(step) if m == 0 else self.batch(step)[:2] + (False,)
            if m:
                x, y = x.roll(m * 3, dims=0), y.roll(m * 3, dims=0)
            any_bad |= bad
            with torch.autocast("cpu", dtype=dtype or torch.float32, enabled=dtype is not None):
                logits = self.model(x)
                loss = F.cross_entropy(logits.float().reshape(-1, 256), y.reshape(-1), ignore_index=-100)
            self.scaler.scale(loss / s.accum).backward()
            losses.append(loss.item())
        if self.sum_accum:
            for p in self.model.parameters():
                if p.grad is not None:
                    p.grad.mul_(s.factor)  # the buggy sum over `factor` micro-batches of one accumulation
        self.scaler.unscale_(self.opt)
        params = [p for p in self.model.parameters() if p.grad is not None]
        if s.clip > 0:
            gn = torch.nn.utils.clip_grad_norm_(params, s.clip).item()
        else:
            gn = torch.nn.utils.get_total_norm([p.grad for p in params]).item()
        scale = self.scaler.get_scale() if s.precision == "fp16" else None
        self.scaler.step(self.opt)
        self.scaler.update()
        skipped = s.precision == "fp16" and self.scaler.get_scale() < scale
        after = self.ms.flat_params(self.model)
        loss_v = sum(losses) / len(losses)
        # virtual clock
        base = s.step_time * s.accum
        if "speedup" in s.traps and step >= s.trap_step:
            base *= 0.95
        if "slow_in_noise" in s.traps and step >= s.trap_step:
            base *= 1.0 + 0.5 * s.time_noise
        dt = base * max(0.5, self.rng.gauss(1.0, s.time_noise))
        self.clock += dt
        rec: dict[str, Any] = {
            "step": step, "loss": loss_v, "lr": lr, "grad_norm": gn,
            "update_ratio": ((after - before).norm() / before.norm().clamp_min(1e-12)).item(),
            "param_norm": after.norm().item(), "throughput": s.batch_size * s.accum * 32 / dt,
            "batch_index": (step - 1 - self.data_offset), "step_ms": dt * 1000,
            "attn_logit_max": self.ms.nan_max(self.model.attn_logit_max()) if s.arch == "transformer" else None,
        }
        if s.precision == "fp16":
            rec["loss_scale"], rec["skipped_step"] = scale, int(skipped)
        if s.eval_every and step % s.eval_every == 0:
            rec["eval_loss"] = self.eval_loss()
        rec["bad"] = any_bad
        self.records.append(rec)
        self.pending.append(rec)
        if writer is not None and (step % s.log_every == 0 or not math.isfinite(loss_v) or step == 1):
            # like Megatron and the HF Trainer: the loss is the mean over the interval, skips are counted
            out = dict(rec)
            out["loss"] = sum(r["loss"] for r in self.pending) / len(self.pending)
            if s.precision == "fp16":
                out["skipped_step"] = sum(r["skipped_step"] for r in self.pending)
            writer.log(step, out, self.clock)
            self.logged.append(step)
            self.pending = []
        if s.ckpt_every and step % s.ckpt_every == 0:
            self.ckpts[step] = {"model": copy.deepcopy(self.model.state_dict()),
                                "opt": copy.deepcopy(self.opt.state_dict()),
                                "scaler": copy.deepcopy(self.scaler.state_dict()), "rng": self.rng.getstate()}
        if not math.isfinite(loss_v):
            self.nan_count = getattr(self, "nan_count", 0) + 1
            if self.nan_count >= 3 or s.precision != "fp16":  # the trainer raises on a NaN loss
                return False
        if s.precision == "fp16":
            self.skips = self.skips + 1 if skipped else 0
            if (self.skips >= 8 and self.scaler.get_scale() < 128) or self.skips >= 40:
                return False
        return True

    def cfg_public(self, proc: int) -> dict[str, Any]:
        """The configuration process ``proc`` records (no fault description)."""
        s = self.spec
        cfg = {"arch": s.arch, "d_model": s.d_model, "n_layers": s.n_layers, "optimizer": s.optimizer,
               "lr_schedule": s.schedule, "warmup_steps": s.warmup, "train_iters": s.steps,
               "lr": round(s.lr * self.lr_mult, 6), "precision": s.precision, "batch_size": s.batch_size,
               "grad_accum": s.accum, "clip_grad": s.clip, "log_interval": s.log_every, "seed": s.seed,
               "world_size": 1}
        if s.precision == "fp16":
            cfg.update(initial_loss_scale=s.init_scale, loss_scale_window=s.growth_interval)
        if proc and s.override_flag:
            cfg["override_opt_param_scheduler"] = True
        if proc and s.kind == "grad_scaling_bug":
            cfg["grad_accum"] = int(s.factor)
        if proc and s.resume == "intentional":
            cfg["lr"] = round(s.lr * self.sched_peak, 6)
            cfg["lr_schedule"] = "cosine"
        return cfg

    def train(self) -> None:
        """The first process, then the resumed one when the run resumes."""
        s = self.spec
        self.skips = 0
        self.build()
        writer = Writer(s, self.out) if self.out is not None else None
        if writer:
            writer.open(self.cfg_public(0), None)
        end = s.crash if s.resume != "none" else s.steps
        step = 0
        try:
            for step in range(1, end + 1):
                if not self.step_fn(step, writer):
                    self.events["job_died"] = step
                    return
        finally:
            if writer:
                writer.close()
        if s.resume == "none":
            return
        c = max(k for k in self.ckpts if k <= s.crash)
        self.events.update(crash=s.crash, checkpoint=c, resume_first_step=c + 1)
        ck = self.ckpts[c]
        self.build()  # a new process
        kind = s.kind
        if kind != "weights_not_restored":
            self.model.load_state_dict(ck["model"])
        if kind != "optimizer_not_restored":
            self.opt.load_state_dict(ck["opt"])
        self.scaler.load_state_dict(ck["scaler"])
        if kind == "lr_reset":
            self.sched_start = c  # the scheduler restarts at its step 0 (warm-up, peak) over the same horizon
            self.sched_total = c + s.steps
        if kind == "sampler_replay":
            self.data_offset = c  # the data position goes back to batch 0
        if kind == "grad_scaling_bug":
            self.sum_accum = True
        if s.resume == "intentional":  # a NEW schedule: lower peak, cosine over the remaining steps, no warm-up
            cur = lr_factor(s.schedule, c, s.warmup, s.steps)
            self.sched_peak = cur * self.rng.uniform(0.4, 0.8)
            self.spec = s = copy.copy(s)
            s.schedule, s.warmup = "cosine", 0
            self.sched_start, self.sched_total = c, s.steps
        self.rng.setstate(ck["rng"])
        self.pending = []
        self.clock += self.rng.uniform(60, 600)
        if writer:
            writer.open(self.cfg_public(1), c)
        try:
            for step in range(c + 1, s.steps + 1):
                if not self.step_fn(step, writer):
                    self.events["job_died"] = step
                    return
        finally:
            if writer:
                writer.close()


def _mean20(vals: list[float]) -> list[float]:
    out = []
    for i in range(len(vals)):
        w = [v for v in vals[max(0, i - 19): i + 1] if math.isfinite(v)]
        out.append(sum(w) / len(w) if w else math.inf)
    return out


def label(spec: Spec, run: Run, corpus) -> dict[str, Any]:
    """The label of a finished run, from what was injected (and, for growth, a healthy twin)."""
    verdict, cause, mech, alts, _ = KINDS[spec.kind]
    ev = dict(run.events)
    window = None
    recs = run.records
    def logged_at(step: int) -> int:  # the first logged step at or after ``step`` (what a reader can see)
        return next((x for x in run.logged if x >= step), step)

    if spec.kind in ("lr_reset", "weights_not_restored", "optimizer_not_restored", "sampler_replay",
                     "grad_scaling_bug"):
        window = [ev["checkpoint"] + 1, logged_at(ev["checkpoint"] + 1)]
    elif spec.kind == "bad_batch_nan":
        nan = next((r["step"] for r in recs if not math.isfinite(r["loss"])), None)
        if nan is None:
            raise Dropped("no NaN loss")
        window = [nan, nan]
    elif spec.kind == "bad_batch_spike":
        window = [spec.fault_step, logged_at(spec.fault_step)]
        pre = [r["loss"] for r in recs if spec.fault_step - 20 <= r["step"] < spec.fault_step]
        peak = max(r["loss"] for r in recs if spec.fault_step <= r["step"] < spec.fault_step + spec.fault_len)
        if not pre or peak < sum(pre) / len(pre) + 1.0:
            raise Dropped("spike too small")
        if ev.get("job_died"):
            raise Dropped("job died")
    elif spec.kind == "recurring_spikes":
        window = [spec.fault_step, logged_at(spec.fault_step)]
        ev["spike_steps"] = [r["step"] for r in recs if r["bad"]]
        if len(ev["spike_steps"]) < 3:
            raise Dropped("fewer than 3 spikes")
    elif spec.kind == "lr_too_high":
        twin = Run(spec, corpus, None, lr_mult=1.0 / spec.factor)
        twin.train()
        a = _mean20([r["loss"] for r in recs])
        b = _mean20([r["loss"] for r in twin.records])
        n = min(len(a), len(b))
        good = None
        for i in range(n - 1, -1, -1):
            if not a[i] > b[i] + 0.1:
                break
            good = i + 1
        if good is None or (good > n - 10 and len(a) >= len(b)):
            raise Dropped("no lasting departure from the healthy twin")
        window = [1, logged_at(good)]
        ev["loss_above_twin_for_good"] = good
    elif spec.kind == "fp16_overflow":
        calib = 0
        for r in recs:  # calibration = the halvings of the first steps before a first good step
            if r.get("skipped_step"):
                calib = r["step"]
            else:
                break
        skip = next((r["step"] for r in recs if r.get("skipped_step") and r["step"] > calib), None)
        if skip is None:
            raise Dropped("no overflow")
        window = [1, logged_at(skip)]
        ev["first_skipped_step"] = skip
        if not ev.get("job_died") and math.isfinite(recs[-1]["loss"]) and recs[-1]["loss_scale"] > 1:
            raise Dropped("overflow skips but the run went on training")
    if spec.kind == "healthy":
        if ev.get("job_died") or not all(math.isfinite(r["loss"]) for r in recs):
            raise Dropped("healthy run did not train")
        skips = sum(int(r.get("skipped_step", 0)) for r in recs)
        ev["skipped_steps"] = skips
        if recs[-1]["loss"] > recs[0]["loss"] - 0.5:
            raise Dropped("healthy run did not learn")
    ev.pop("bad", None)
    return {"run": spec.name, "verdict": verdict, "cause": cause, "mechanism": mech, "acceptable_mechanisms": alts,
            "onset_window": window, "events": ev, "kind": spec.kind, "split": spec.split,
            "axes": {k: v for k, v in spec.__dict__.items() if k not in ("name",)}}


def ci_subset(n: int = 8, first_seed: int = 2000, per_kind: int = 1) -> list[int]:
    """Seeds of a small, cheap VALIDATION subset for CI (no fp16, no healthy-twin runs), drawn in seed order.

    At most ``per_kind`` runs of each kind, healthy runs twice that; the choice depends only on the drawn specs,
    never on how the analyzer does on them.
    """
    out: list[int] = []
    count: dict[str, int] = {}
    s = first_seed
    while len(out) < n and s < first_seed + 5000:
        sp = draw(s)
        cap = 2 * per_kind if sp.kind == "healthy" else per_kind
        if (sp.split == "validation" and sp.precision != "fp16" and sp.kind != "lr_too_high"
                and sp.writer != "wandb" and sp.steps <= 240 and count.get(sp.kind, 0) < cap):
            out.append(s)
            count[sp.kind] = count.get(sp.kind, 0) + 1
        s += 1
    return out


_CORPUS = None


def make_one(args: tuple[int, str]) -> tuple[str, dict[str, Any] | None, str]:
    """Train and label run ``seed`` into ``out`` (a worker process)."""
    global _CORPUS
    seed, out_root = args
    ms, torch = _mods()
    torch.set_num_threads(1)
    if _CORPUS is None:
        _CORPUS = ms.load_corpus(600_000)
    spec = draw(seed)
    out = Path(out_root) / spec.name
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    t0 = time.time()
    try:
        run = Run(spec, _CORPUS, out)
        run.train()
        lab = label(spec, run, _CORPUS)
        lab["train_seconds"] = round(time.time() - t0, 2)
        if spec.writer == "wandb":
            for p in (out / "wandb").iterdir():
                if p.is_symlink() or p.is_file():
                    p.unlink()
                else:  # keep the transaction log and files/ (as make_wandb_sample.py does)
                    for q in p.iterdir():
                        if q.is_dir() and q.name != "files":
                            shutil.rmtree(q)
        return spec.name, lab, ""
    except Dropped as exc:
        shutil.rmtree(out, ignore_errors=True)
        return spec.name, None, str(exc)
    except Exception as exc:  # noqa: BLE001 - reported, the other runs go on
        shutil.rmtree(out, ignore_errors=True)
        return spec.name, None, f"FAILED {type(exc).__name__}: {exc}"


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True, help="folder for the runs and labels.json (outside the repo)")
    p.add_argument("--n", type=int, default=320, help="number of seeds drawn")
    p.add_argument("--first-seed", type=int, default=1)
    p.add_argument("--jobs", type=int, default=1)
    p.add_argument("--list", action="store_true", help="print the drawn specs and exit")
    a = p.parse_args(argv)
    seeds = list(range(a.first_seed, a.first_seed + a.n))
    if a.list:
        for s in seeds:
            sp = draw(s)
            print(sp.name, sp.split, sp.arch, sp.optimizer, sp.schedule, sp.precision, sp.writer, sp.profile)
        return 0
    a.out.mkdir(parents=True, exist_ok=True)
    labels_path, dropped_path = a.out / "labels.json", a.out / "dropped.json"
    labels = {r["run"]: r for r in json.loads(labels_path.read_text())} if labels_path.exists() else {}
    dropped = json.loads(dropped_path.read_text()) if dropped_path.exists() else {}
    todo = [(s, str(a.out)) for s in seeds if draw(s).name not in labels]
    t0 = time.time()
    if a.jobs > 1:
        import multiprocessing as mp

        pool = mp.get_context("spawn").Pool(a.jobs)
        it = pool.imap_unordered(make_one, todo)
    else:
        pool, it = None, map(make_one, todo)
    for k, (name, lab, why) in enumerate(it, 1):
        if lab is None:
            dropped[name] = why
        else:
            labels[name] = lab
        print(f"[{k}/{len(todo)} {time.time() - t0:.0f}s] {name}: {why or lab['onset_window']}",
              file=sys.stderr, flush=True)
        if k % 10 == 0 or k == len(todo):
            labels_path.write_text(json.dumps(sorted(labels.values(), key=lambda r: r["run"]), indent=1) + "\n")
            dropped_path.write_text(json.dumps(dropped, indent=1) + "\n")
    if pool is not None:
        pool.close()
    labels_path.write_text(json.dumps(sorted(labels.values(), key=lambda r: r["run"]), indent=1) + "\n")
    dropped_path.write_text(json.dumps(dropped, indent=1) + "\n")
    print(f"{len(labels)} labelled runs, {len(dropped)} dropped, {time.time() - t0:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
