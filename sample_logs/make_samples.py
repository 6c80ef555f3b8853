"""Generate real sample training runs, healthy and with injected faults, for train-forensics.

Each run trains a tiny pre-LN causal character-level Transformer on CPU over the bytes of the Python
standard library's own source files, and logs every step through torch's real
``torch.utils.tensorboard.SummaryWriter`` and a JSONL metrics log (``metrics.jsonl``), plus a plain-text
``train.log`` and a ``config.json`` of hyper-parameters. Faults are injected by flag; nothing is drawn.

Usage::

    python sample_logs/make_samples.py --fault none --out sample_logs/healthy
    python sample_logs/make_samples.py --all          # regenerate every committed run exactly

The data order is a pure function of (seed, batch index), so a resumed job sees the same stream.
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import multiprocessing as mp
import os
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TextIO

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.tensorboard import SummaryWriter

FAULTS = ("none", "lr_schedule_reset", "overflow", "data_batch", "update_scale_growth")
IGNORE_INDEX = -100  # label value for padding tokens (ignored by the token-mean loss)


@dataclass
class Config:
    """Hyper-parameters of one run; ``fault_*`` fields are kept out of the run's config.json."""

    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    seq_len: int = 64
    batch_size: int = 32
    vocab_size: int = 256
    lr: float = 3e-3
    min_lr_ratio: float = 0.1
    warmup: int = 40
    steps: int = 400
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.95)
    clip: float = 1.0  # global-norm clipping; 0 disables it
    precision: str = "fp32"  # "fp32" or "fp16"
    init_loss_scale: float = 2.0**16
    max_consecutive_skips: int = 8
    qk_layernorm: bool = False
    seed: int = 0
    data_bytes: int = 1_500_000
    checkpoint_every: int = 100
    optimizer: str = "adamw"
    lr_schedule: str = "linear_warmup_cosine"
    fault: str = field(default="none", metadata={"private": True})
    fault_step: int = field(default=0, metadata={"private": True})
    fault_len: int = field(default=1, metadata={"private": True})
    corruption: str = field(default="pad", metadata={"private": True})
    crash_step: int = field(default=0, metadata={"private": True})

    def public(self) -> dict[str, Any]:
        """Return the hyper-parameters a real job would record (no fault description)."""
        private = {k for k, f in self.__dataclass_fields__.items() if f.metadata.get("private")}
        return {k: v for k, v in asdict(self).items() if k not in private}


# --------------------------------------------------------------------------------------------- data


def load_corpus(n_bytes: int) -> torch.Tensor:
    """Concatenate the sorted top-level ``*.py`` files of the standard library, up to ``n_bytes`` bytes."""
    files = sorted(glob.glob(os.path.join(os.path.dirname(os.__file__), "*.py")))
    chunks: list[bytes] = []
    total = 0
    for path in files:
        with open(path, "rb") as fh:
            data = fh.read()
        chunks.append(data)
        total += len(data)
        if total >= n_bytes:
            break
    return torch.frombuffer(bytearray(b"".join(chunks)[:n_bytes]), dtype=torch.uint8).long()


def get_batch(corpus: torch.Tensor, cfg: Config, batch_index: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Return (inputs, labels) of batch ``batch_index``: a pure function of (seed, batch index)."""
    gen = torch.Generator().manual_seed(cfg.seed * 1_000_003 + batch_index)
    starts = torch.randint(0, corpus.numel() - cfg.seq_len - 1, (cfg.batch_size,), generator=gen)
    window = torch.stack([corpus[s : s + cfg.seq_len + 1] for s in starts.tolist()])
    return window[:, :-1].clone(), window[:, 1:].clone()


def corrupt_batch(
    x: torch.Tensor, y: torch.Tensor, kind: str, batch_index: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Corrupt a batch the way a broken data pipeline does (used only by the ``data_batch`` fault)."""
    gen = torch.Generator().manual_seed(10_007 + batch_index)
    if kind == "random":  # random bytes
        w = torch.randint(0, 256, (x.shape[0], x.shape[1] + 1), generator=gen)
        return w[:, :-1].clone(), w[:, 1:].clone()
    if kind == "repeat":  # one repeated token
        return torch.full_like(x, 0x20), torch.full_like(y, 0x20)
    if kind == "shift":  # labels shifted by an extra position
        return x, torch.roll(y, shifts=-1, dims=1)
    if kind == "pad":  # fully masked (all-padding) batch: 0/0 in the token-mean loss
        return torch.zeros_like(x), torch.full_like(y, IGNORE_INDEX)
    raise ValueError(f"unknown corruption {kind!r}")


# -------------------------------------------------------------------------------------------- model


class Attention(nn.Module):
    """Causal multi-head self-attention with explicit q.k scores (so the raw max logit can be measured)."""

    def __init__(self, cfg: Config) -> None:
        super().__init__()
        self.n_heads, self.d_head = cfg.n_heads, cfg.d_model // cfg.n_heads
        self.q = nn.Linear(cfg.d_model, cfg.d_model)
        self.k = nn.Linear(cfg.d_model, cfg.d_model)
        self.v = nn.Linear(cfg.d_model, cfg.d_model)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)
        self.q_norm = nn.LayerNorm(self.d_head) if cfg.qk_layernorm else nn.Identity()
        self.k_norm = nn.LayerNorm(self.d_head) if cfg.qk_layernorm else nn.Identity()
        mask = torch.ones(cfg.seq_len, cfg.seq_len, dtype=torch.bool).tril()
        self.register_buffer("mask", mask, persistent=False)
        self.last_max_logit = 0.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Attend causally; records the max |q.k|/sqrt(d_head) over unmasked positions."""
        b, t, d = x.shape
        q, k, v = (
            lin(x).view(b, t, self.n_heads, self.d_head).transpose(1, 2) for lin in (self.q, self.k, self.v)
        )
        q, k = self.q_norm(q), self.k_norm(k)
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(self.d_head)
        allowed = self.mask[:t, :t]
        # max |score| over unmasked positions: an fp16 overflow to -inf reads inf, an inf - inf reads NaN
        self.last_max_logit = scores.detach().float().abs().masked_fill(~allowed, 0.0).max().item()
        att = F.softmax(scores.masked_fill(~allowed, -math.inf), dim=-1)
        return self.proj((att @ v).transpose(1, 2).reshape(b, t, d))


class Block(nn.Module):
    """Pre-LN Transformer block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, cfg: Config) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(cfg.d_model), nn.LayerNorm(cfg.d_model)
        self.attn = Attention(cfg)
        self.mlp = nn.Sequential(
            nn.Linear(cfg.d_model, 4 * cfg.d_model), nn.GELU(), nn.Linear(4 * cfg.d_model, cfg.d_model)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Apply the block."""
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class TinyLM(nn.Module):
    """Byte-level causal language model with learned positions and an untied output head."""

    def __init__(self, cfg: Config) -> None:
        super().__init__()
        self.tok = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos = nn.Parameter(torch.zeros(cfg.seq_len, cfg.d_model))
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        for p in self.parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=0.02)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        """Return logits of shape (batch, seq, vocab)."""
        x = self.tok(idx) + self.pos[: idx.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))

    def attn_logit_max(self) -> list[float]:
        """Max raw attention score of each layer in the latest forward pass."""
        return [b.attn.last_max_logit for b in self.blocks]


def lr_lambda(cfg: Config):
    """Linear warm-up then cosine decay to ``min_lr_ratio`` of the peak, as a LambdaLR multiplier."""

    def fn(i: int) -> float:
        if i < cfg.warmup:
            return (i + 1) / cfg.warmup
        progress = min(1.0, (i - cfg.warmup) / max(1, cfg.steps - cfg.warmup))
        return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return fn


# ----------------------------------------------------------------------------------------- training


def nan_max(values: list[float]) -> float:
    """Maximum that propagates NaN (Python's ``max`` silently drops it depending on order)."""
    return math.nan if any(math.isnan(v) for v in values) else max(values)


def flat_params(model: nn.Module) -> torch.Tensor:
    """All parameters as one detached fp32 vector."""
    return torch.cat([p.detach().float().reshape(-1) for p in model.parameters()])


class Trainer:
    """One training process (a "segment"): writer, logs, model, optimizer, scheduler, scaler."""

    def __init__(self, cfg: Config, out: Path, corpus: torch.Tensor, log: TextIO) -> None:
        self.cfg, self.out, self.corpus, self.log = cfg, out, corpus, log
        torch.manual_seed(cfg.seed)
        self.model = TinyLM(cfg)
        decay = [p for p in self.model.parameters() if p.dim() == 2]
        no_decay = [p for p in self.model.parameters() if p.dim() < 2]
        groups = [
            {"params": decay, "weight_decay": cfg.weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ]
        self.opt = torch.optim.AdamW(groups, lr=cfg.lr, betas=cfg.betas)
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, lr_lambda(cfg))
        self.fp16 = cfg.precision == "fp16"
        self.scaler = torch.amp.GradScaler("cpu", init_scale=cfg.init_loss_scale, enabled=self.fp16)
        self.writer = SummaryWriter(log_dir=str(out))
        self.jsonl = open(out / "metrics.jsonl", "a", encoding="utf-8")  # noqa: SIM115 - closed in close()
        self.step = 0
        self.skips = 0  # consecutive skipped (non-finite) fp16 steps

    def say(self, msg: str) -> None:
        """Write a line to train.log and stderr."""
        self.log.write(msg + "\n")
        self.log.flush()
        print(msg, file=sys.stderr)

    def save(self, path: Path) -> None:
        """Checkpoint model, optimizer, scheduler and scaler state."""
        state = {
            "model": self.model.state_dict(),
            "opt": self.opt.state_dict(),
            "sched": self.sched.state_dict(),
            "scaler": self.scaler.state_dict(),
            "step": self.step,
        }
        torch.save(state, path)

    def resume(self, path: Path, restore_scheduler: bool) -> None:
        """Load a checkpoint; the scheduler is restored only when ``restore_scheduler`` is true."""
        state = torch.load(path, weights_only=False)
        self.model.load_state_dict(state["model"])
        self.opt.load_state_dict(state["opt"])
        self.scaler.load_state_dict(state["scaler"])
        if restore_scheduler:
            self.sched.load_state_dict(state["sched"])
        else:  # rebuilt after loading the optimizer: starts again at step 0 (warm-up) from the peak lr
            self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, lr_lambda(self.cfg))
        self.step = state["step"]
        self.say(f"resumed from checkpoint at step {self.step}")

    def train_step(self) -> bool:
        """Run one optimizer step and log it; return False when the job dies."""
        cfg, step = self.cfg, self.step + 1
        batch_index = step - 1
        x, y = get_batch(self.corpus, cfg, batch_index)
        if cfg.fault == "data_batch" and cfg.fault_step <= step < cfg.fault_step + cfg.fault_len:
            x, y = corrupt_batch(x, y, cfg.corruption, batch_index)
        lr = self.opt.param_groups[0]["lr"]
        before = flat_params(self.model)
        with torch.autocast("cpu", dtype=torch.float16, enabled=self.fp16):
            logits = self.model(x)
            loss = F.cross_entropy(
                logits.float().reshape(-1, cfg.vocab_size), y.reshape(-1), ignore_index=IGNORE_INDEX
            )
        log_z = torch.logsumexp(logits.detach().float(), dim=-1).mean().item()
        layer_max = self.model.attn_logit_max()
        self.opt.zero_grad(set_to_none=True)
        self.scaler.scale(loss).backward()
        self.scaler.unscale_(self.opt)
        params = list(self.model.parameters())
        if cfg.clip > 0:
            grad_norm = torch.nn.utils.clip_grad_norm_(params, cfg.clip).item()
        else:
            grad_norm = torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None]).item()
        scale = self.scaler.get_scale() if self.fp16 else 1.0
        self.scaler.step(self.opt)
        self.scaler.update()
        skipped = self.fp16 and self.scaler.get_scale() < scale
        self.sched.step()
        after = flat_params(self.model)
        update_ratio = ((after - before).norm() / before.norm()).item()
        self.step = step
        rec: dict[str, Any] = {
            "step": step,
            "loss": loss.item(),
            "lr": lr,
            "grad_norm": grad_norm,
            "update_ratio": update_ratio,
            "param_norm": after.norm().item(),
            "attn_logit_max": nan_max(layer_max),
            "log_z": log_z,
            "batch_index": batch_index,
            "tokens": step * cfg.batch_size * cfg.seq_len,
        }
        if self.fp16:
            rec["loss_scale"], rec["skipped_step"] = scale, int(skipped)
        rec["wall_time"] = time.time()
        self.jsonl.write(json.dumps(rec) + "\n")
        self.jsonl.flush()
        for key, value in rec.items():
            if key not in ("step", "tokens", "wall_time"):
                self.writer.add_scalar(f"train/{key}", value, step)
        for i, value in enumerate(layer_max):
            self.writer.add_scalar(f"attn_logit_max/layer{i}", value, step)
        line = f"step {step} | loss {rec['loss']:.4f} | lr {lr:.3e} | grad_norm {grad_norm:.4f}"
        self.log.write(line + (f" | loss_scale {scale:g}" if self.fp16 else "") + "\n")
        self.log.flush()
        self.skips = self.skips + 1 if skipped else 0
        if not self.fp16 and not math.isfinite(rec["loss"]):
            self.say(f"ERROR: non-finite loss {rec['loss']} at step {step}; aborting.")
            return False
        if self.fp16 and self.skips >= cfg.max_consecutive_skips:
            self.say(
                f"ERROR: {self.skips} consecutive non-finite steps (loss scale {self.scaler.get_scale():g}) "
                f"at step {step}; aborting."
            )
            return False
        return True

    def close(self) -> None:
        """Flush and close the writer and the JSONL log."""
        self.writer.flush()
        self.writer.close()
        self.jsonl.close()


def latest_checkpoint(ckpt_dir: Path) -> Path:
    """The checkpoint with the highest step in ``ckpt_dir``."""
    return max(ckpt_dir.glob("ckpt_*.pt"), key=lambda p: int(p.stem.split("_")[1]))


def train_process(cfg: Config, out: Path, ckpt_dir: Path, resume: bool) -> None:
    """Body of one training process (job segment); a resumed segment does NOT restore the scheduler."""
    torch.set_num_threads(1)
    corpus = load_corpus(cfg.data_bytes)
    with open(out / "train.log", "a", encoding="utf-8") as log:
        trainer = Trainer(cfg, out, corpus, log)
        if resume:
            trainer.resume(latest_checkpoint(ckpt_dir), restore_scheduler=False)
        while trainer.step < cfg.steps:
            alive = trainer.train_step()
            if alive and cfg.checkpoint_every and trainer.step % cfg.checkpoint_every == 0:
                trainer.save(ckpt_dir / f"ckpt_{trainer.step}.pt")
                trainer.say(f"saved checkpoint at step {trainer.step}")
            if alive and cfg.fault == "lr_schedule_reset" and not resume and trainer.step == cfg.crash_step:
                trainer.say(f"Received SIGTERM at step {trainer.step}; exiting.")
                break
            if not alive:
                break
        trainer.close()


def run(cfg: Config, out: Path) -> float:
    """Train one run into ``out`` (replaced, except expected.json); return the wall time in seconds.

    Every segment runs in its own spawned process, as a real job and its restart would, so each writes
    its own ``events.out.tfevents.*`` file; checkpoints live in a temporary directory, never in ``out``.
    """
    t0 = time.time()
    keep = out / "expected.json"
    saved = keep.read_text() if keep.exists() else None
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    if saved is not None:
        keep.write_text(saved)
    (out / "config.json").write_text(json.dumps(cfg.public(), indent=2) + "\n")
    segments = [False, True] if cfg.fault == "lr_schedule_reset" else [False]
    with tempfile.TemporaryDirectory() as tmp:
        for resume in segments:
            if resume:
                time.sleep(1.1)  # the restarted process's event file gets a later timestamp in its name
            proc = mp.get_context("spawn").Process(target=train_process, args=(cfg, out, Path(tmp), resume))
            proc.start()
            proc.join()
            if proc.exitcode != 0:
                raise RuntimeError(f"training process failed with exit code {proc.exitcode}")
    return time.time() - t0


# --------------------------------------------------------------------------- committed sample runs

RUNS: dict[str, dict[str, Any]] = {
    "healthy": {"fault": "none"},
    "lr_schedule_reset": {"fault": "lr_schedule_reset", "steps": 500, "crash_step": 320},
    "overflow": {
        "fault": "overflow",
        "precision": "fp16",
        "lr": 0.1,
        "clip": 0.0,
        "weight_decay": 0.0,
        "batch_size": 16,
        "warmup": 20,
        "steps": 300,
    },
    "data_batch": {"fault": "data_batch", "fault_step": 250, "fault_len": 1, "corruption": "pad"},
    "update_scale_growth": {"fault": "update_scale_growth", "lr": 6e-2, "clip": 0.0},
}
"""Exact settings of each committed run (the rest are Config defaults)."""

EXPECTED: dict[str, dict[str, Any]] = {
    "healthy": {"verdict": "healthy", "cause": None, "mechanism": None, "onset_window": None},
    "lr_schedule_reset": {
        "verdict": "anomaly",
        "cause": "lr_schedule_reset",
        "mechanism": "reset_to_initial",
        "onset_window": [301, 301],
        "events": {"checkpoint": 300, "crash": 320, "resume_first_step": 301, "warmup_restart_peak": 340},
    },
    "overflow": {
        "verdict": "anomaly",
        "cause": "overflow",
        "mechanism": "activation_overflow",
        "onset_window": [1, 171],
        "events": {
            "attn_logit_max_above_healthy_max": 10,
            "first_fp16_overflow_attn_logit_inf": 97,
            "first_skipped_step_and_nan_loss": 171,
            "job_died": 178,
        },
    },
    "data_batch": {
        "verdict": "anomaly",
        "cause": "data_batch",
        "mechanism": "bad_batch",
        "onset_window": [250, 250],
        "batch_index": 249,
        "events": {"all_padding_batch_nan_loss": 250, "job_died": 250},
    },
    "update_scale_growth": {
        "verdict": "anomaly",
        "cause": "update_scale_growth",
        "mechanism": "lr_too_high",
        "onset_window": [1, 48],
        "mechanism_alternatives": ["attention_logit_growth"],
        "events": {
            "first_grad_norm_spike": 10,
            "first_loss_spike": 12,
            "attn_logit_max_above_healthy_max": 23,
            "loss_above_healthy_for_good": 48,
        },
    },
}
"""Ground truth of each committed run, written to ``<run>/expected.json`` (measured, see README.md)."""

CLI_KEYS = (
    "seed",
    "steps",
    "lr",
    "warmup",
    "clip",
    "precision",
    "d_model",
    "batch_size",
    "weight_decay",
    "init_loss_scale",
    "fault_step",
    "fault_len",
    "corruption",
    "crash_step",
)


def build_config(fault: str, cli: dict[str, Any] | None = None) -> Config:
    """Config of the committed run for ``fault``, then any CLI values given (not None) on top."""
    name = "healthy" if fault == "none" else fault
    cfg = Config(**RUNS[name])
    for key, value in (cli or {}).items():
        if value is not None:
            setattr(cfg, key, value)
    return cfg


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--fault", choices=FAULTS, default="none")
    p.add_argument("--out", type=Path)
    p.add_argument(
        "--all", action="store_true", help="regenerate every committed run with its exact settings"
    )
    p.add_argument("--seed", type=int)
    p.add_argument("--steps", type=int)
    p.add_argument("--lr", type=float, help="peak learning rate")
    p.add_argument("--warmup", type=int)
    p.add_argument("--clip", type=float, help="global-norm clipping threshold (0 disables)")
    p.add_argument("--precision", choices=("fp32", "fp16"))
    p.add_argument("--qk-layernorm", action="store_true", default=None)
    p.add_argument("--d-model", type=int)
    p.add_argument("--batch-size", type=int)
    p.add_argument("--weight-decay", type=float)
    p.add_argument("--init-loss-scale", type=float)
    p.add_argument("--fault-step", type=int, help="data_batch: first corrupted step")
    p.add_argument("--fault-len", type=int, help="data_batch: number of corrupted steps")
    p.add_argument(
        "--corruption", choices=("random", "repeat", "shift", "pad"), help="data_batch: corruption kind"
    )
    p.add_argument("--crash-step", type=int, help="lr_schedule_reset: step at which the first process dies")
    args = p.parse_args(argv)
    if args.all:
        root = Path(__file__).resolve().parent
        for name, settings in RUNS.items():
            seconds = run(build_config(settings["fault"]), root / name)
            (root / name / "expected.json").write_text(json.dumps(EXPECTED[name], indent=2) + "\n")
            print(f"{name}: {seconds:.1f} s", file=sys.stderr)
        return 0
    if args.out is None:
        p.error("--out is required unless --all is given")
    cfg = build_config(args.fault, {k: getattr(args, k) for k in (*CLI_KEYS, "qk_layernorm")})
    print(f"{args.out}: {run(cfg, args.out):.1f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
