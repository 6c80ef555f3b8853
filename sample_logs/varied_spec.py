"""The drawn axes of one varied-corpus run: kinds, profiles, the held-out values and :func:`draw`."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

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
    _draw_precision_resume(spec, r, kind, steps)
    _draw_kind(spec, r, kind, steps)
    spec.name = f"{kind}_{seed:04d}"
    return spec





def _draw_precision_resume(spec: Spec, r: random.Random, kind: str, steps: int) -> None:
    """fp16 scaler settings and the resume (when, from which checkpoint interval, with an override flag)."""
    precision = spec.precision
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


def _draw_kind(spec: Spec, r: random.Random, kind: str, steps: int) -> None:
    """The kind's own axes: magnitudes, timing, profiles it needs, and the healthy traps."""
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
