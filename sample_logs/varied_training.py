"""Real tiny training on CPU: the models, the schedules, the optimizers and :class:`Run` (processes, resumes)."""

from __future__ import annotations

import copy
import math
import random
from pathlib import Path
from typing import Any

from varied_spec import Spec
from varied_writers import Writer


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

    def _grads(self, step: int) -> tuple[list[float], bool]:
        """Forward and backward over the step's micro-batches: (their losses, whether a batch was injected)."""
        torch, s = self.torch, self.spec
        F = torch.nn.functional
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
        return losses, any_bad

    def _clock(self, step: int) -> float:
        """The virtual step time (seconds) with the healthy traps' shifts, advancing the clock."""
        s = self.spec
        base = s.step_time * s.accum
        if "speedup" in s.traps and step >= s.trap_step:
            base *= 0.95
        if "slow_in_noise" in s.traps and step >= s.trap_step:
            base *= 1.0 + 0.5 * s.time_noise
        dt = base * max(0.5, self.rng.gauss(1.0, s.time_noise))
        self.clock += dt
        return dt

    def step_fn(self, step: int, writer: Writer | None) -> bool:
        """One optimizer step; returns False when the job dies."""
        torch, s = self.torch, self.spec
        lr = self.lr_at(step - 1)
        for g in self.opt.param_groups:
            g["lr"] = lr
        before = self.ms.flat_params(self.model)
        self.opt.zero_grad(set_to_none=True)
        losses, any_bad = self._grads(step)
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
        dt = self._clock(step)
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
        self._log(step, rec, writer)
        if s.ckpt_every and step % s.ckpt_every == 0:
            self.ckpts[step] = {"model": copy.deepcopy(self.model.state_dict()),
                                "opt": copy.deepcopy(self.opt.state_dict()),
                                "scaler": copy.deepcopy(self.scaler.state_dict()), "rng": self.rng.getstate()}
        return self._alive(loss_v, skipped)

    def _log(self, step: int, rec: dict[str, Any], writer: Writer | None) -> None:
        """Keep the record; write it when the step is logged (the loss as the mean over the interval)."""
        s = self.spec
        self.records.append(rec)
        self.pending.append(rec)
        loss_v = rec["loss"]
        if writer is not None and (step % s.log_every == 0 or not math.isfinite(loss_v) or step == 1):
            # like Megatron and the HF Trainer: the loss is the mean over the interval, skips are counted
            out = dict(rec)
            out["loss"] = sum(r["loss"] for r in self.pending) / len(self.pending)
            if s.precision == "fp16":
                out["skipped_step"] = sum(r["skipped_step"] for r in self.pending)
            writer.log(step, out, self.clock)
            self.logged.append(step)
            self.pending = []

    def _alive(self, loss_v: float, skipped: bool) -> bool:
        """False when the trainer would stop: a NaN loss (fp16: the third), or a long skip streak."""
        s = self.spec
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
        if not self._steps(1, s.crash if s.resume != "none" else s.steps, writer) or s.resume == "none":
            return
        c = max(k for k in self.ckpts if k <= s.crash)
        self.events.update(crash=s.crash, checkpoint=c, resume_first_step=c + 1)
        self.resume(c)
        if writer:
            writer.open(self.cfg_public(1), c)
        self._steps(c + 1, self.spec.steps, writer)

    def _steps(self, first: int, last: int, writer: Writer | None) -> bool:
        """Steps ``first..last`` of one process; False (and ``job_died``) when the job dies."""
        try:
            for step in range(first, last + 1):
                if not self.step_fn(step, writer):
                    self.events["job_died"] = step
                    return False
        finally:
            if writer:
                writer.close()
        return True

    def resume(self, c: int) -> None:
        """A new process from the in-memory checkpoint at step ``c``, with the kind's fault applied."""
        s = self.spec
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
        self.resume_index = len(self.records)  # records (and logged steps) of the resumed process start here
        self.logged_index = len(self.logged)
        self.clock += self.rng.uniform(60, 600)

    def twin_after_resume(self, c: int, last: int) -> list[dict[str, Any]]:
        """Records of steps ``c+1..last`` of a CORRECT resume from the same checkpoint (same seed, same data).

        The twin restores every state; comparing it with this run shows what the fault changed.
        """
        twin = Run(copy.copy(self.spec), self.corpus, None)
        twin.spec.kind = "healthy"  # every state restored, no corruption: the same batches
        twin.ckpts, twin.clock, twin.skips = dict(self.ckpts), self.clock, 0
        twin.resume(c)
        twin._steps(c + 1, min(last, self.spec.steps), None)
        return twin.records
