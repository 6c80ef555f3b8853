"""Generate real tiny runs for ``forensics compare`` (proxy/target pairs) and ``forensics sweep`` (nested lr sweeps).

Every run is trained for real on CPU (torch, one thread): a tiny pre-LN byte-level causal Transformer
(d_model 16-64, 2 layers, seq 32, batch 8, AdamW (0.9, 0.95), linear warm-up then cosine decay to 10%,
global-norm clipping 1.0) on the Python standard library's ``*.py`` files. Batch ``i`` is a pure function
of ``(seed, i)``. A job dies as a real fp32 job does: at the first non-finite loss (that step is logged).

Switches the trainer has (each acts for real in the forward pass or the optimizer):

- ``qk_layernorm``: LayerNorm over each head's queries and keys (Wortsman et al. 2023, arXiv 2309.14322, s3.1.1);
- ``z_loss``: coefficient of the auxiliary loss z * mean(log Z)^2 (PaLM, arXiv 2204.02311; Wortsman s3.1.2);
- ``mup``: muP for Adam (Yang et al. 2022, arXiv 2203.03466, table 3): hidden matrices at lr x base/width, the
  output logits multiplied by base/width, attention scaled by 1/d_head; the config records it the way the
  ``mup`` package's users do (``mup``, ``mup_base_width``, ``width_mult``, ``output_mult``, ``param_groups``).

Writers (``writer``): ``jsonl`` (``metrics.jsonl`` + ``config.json``), ``text`` (``train.log`` lines
``step N | loss X | lr Y | ...`` + ``config.json``), ``tb`` (``SummaryWriter`` events with
``train/...`` tags + ``config.json``), ``wandb`` (W&B offline: ``wandb/offline-run-*/`` holding the history and
the run's config). Logged per step: loss, lr (and ``lr/hidden`` under muP), grad_norm (before clipping),
update_ratio (||W_t - W_t-1|| / ||W_t-1||), param_norm, attn_logit_max (max |q.k| scale over layers),
output_logit_max (max |logit|), log_z (mean logsumexp of the logits), tokens (cumulative).

Nothing written into a run folder names what was changed; the ground truth is the caller's.

Usage::

    python sample_logs/make_compare_runs.py --pairs  --out /work/gen20      # every pair of PAIRS
    python sample_logs/make_compare_runs.py --sweep  --out /work/gen20      # the nested sweep + held-out width
    python sample_logs/make_compare_runs.py --pairs --small --out DIR        # one pair per setting (CI)

Runs are cached: a run folder whose ``.spec.json`` equals its spec is not trained again.
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import json
import math
import os
import shutil
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

GENERATOR_VERSION = 2

# ----------------------------------------------------------------------------------------------- specs


@dataclass(frozen=True)
class Spec:
    """One run's settings (all of them go into the run's config, under the names a real job uses)."""

    d_model: int = 32
    n_layers: int = 2
    n_heads: int = 4
    seq_len: int = 32
    batch_size: int = 8
    lr: float = 1e-2
    warmup_steps: int = 20
    steps: int = 200
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.1
    clip: float = 1.0
    qk_layernorm: bool = False
    z_loss: float = 0.0
    mup: bool = False
    mup_base_width: int = 32
    seed: int = 0
    writer: str = "jsonl"

    def key(self) -> str:
        """Short stable hash of the spec and the generator version (the cache key)."""
        blob = json.dumps([GENERATOR_VERSION, asdict(self)], sort_keys=True).encode()
        return hashlib.sha1(blob).hexdigest()[:10]


BASE = Spec()
PAIRS: dict[str, list[tuple[dict[str, Any], dict[str, Any], dict[str, Any]]]] = {
    # setting -> [(shared settings, proxy's value(s), target's value(s))]
    "qk_layernorm": [
        ({"lr": 0.1, "writer": "jsonl"}, {"qk_layernorm": True}, {"qk_layernorm": False}),
        ({"lr": 0.06, "seed": 1, "writer": "tb"}, {"qk_layernorm": True}, {"qk_layernorm": False}),
        ({"lr": 0.1, "seed": 2, "d_model": 48, "writer": "wandb"}, {"qk_layernorm": True}, {"qk_layernorm": False}),
    ],
    "warmup_steps": [
        ({"lr": 0.05, "writer": "jsonl"}, {"warmup_steps": 60}, {"warmup_steps": 3}),
        ({"lr": 0.08, "seed": 1, "writer": "wandb"}, {"warmup_steps": 80}, {"warmup_steps": 5}),
        ({"lr": 0.05, "seed": 2, "writer": "tb"}, {"warmup_steps": 40}, {"warmup_steps": 2}),
    ],
    "peak_lr": [
        ({"warmup_steps": 20, "writer": "jsonl"}, {"lr": 0.01}, {"lr": 0.08}),
        ({"warmup_steps": 10, "seed": 1, "writer": "tb"}, {"lr": 0.005}, {"lr": 0.05}),
        ({"warmup_steps": 20, "seed": 2, "writer": "wandb"}, {"lr": 0.01}, {"lr": 0.1}),
    ],
    "z_loss": [
        ({"lr": 0.03, "weight_decay": 0.0, "qk_layernorm": True, "writer": "jsonl"}, {"z_loss": 1e-2},
         {"z_loss": 0.0}),
        ({"lr": 0.05, "weight_decay": 0.0, "qk_layernorm": True, "seed": 1, "writer": "tb"}, {"z_loss": 1e-2},
         {"z_loss": 0.0}),
    ],
    "d_model": [
        ({"lr": 0.05, "writer": "jsonl"}, {"d_model": 16}, {"d_model": 64}),
        ({"lr": 0.08, "seed": 1, "writer": "tb"}, {"d_model": 32}, {"d_model": 96}),
    ],
    "global_batch_size": [
        ({"lr": 0.01, "writer": "jsonl"}, {"batch_size": 8}, {"batch_size": 32}),
        ({"lr": 0.02, "seed": 1, "writer": "tb"}, {"batch_size": 4}, {"batch_size": 16}),
    ],
}
"""Proxy/target pairs per changed setting (the canonical name the comparison should rank first)."""
VALIDATION: dict[str, list[tuple[dict[str, Any], dict[str, Any], dict[str, Any]]]] = {
    "qk_layernorm": [({"lr": 0.08, "d_model": 24, "seed": 5}, {"qk_layernorm": True, "writer": "tb"},
                      {"qk_layernorm": False, "writer": "wandb"}),
                     ({"lr": 0.1, "seed": 11}, {"qk_layernorm": True, "writer": "text"},
                      {"qk_layernorm": False, "writer": "jsonl"})],
    "warmup_steps": [({"lr": 0.06, "seed": 6}, {"warmup_steps": 50, "writer": "wandb"},
                      {"warmup_steps": 4, "writer": "jsonl"}),
                     ({"lr": 0.05, "seed": 12, "writer": "text"}, {"warmup_steps": 40}, {"warmup_steps": 4})],
    "peak_lr": [({"warmup_steps": 15, "seed": 7}, {"lr": 0.02, "writer": "jsonl"}, {"lr": 0.12, "writer": "tb"})],
    "z_loss": [({"lr": 0.04, "weight_decay": 0.0, "qk_layernorm": True, "seed": 8},
                {"z_loss": 2e-2, "writer": "tb"}, {"z_loss": 0.0, "writer": "jsonl"})],
    "d_model": [({"lr": 0.06, "seed": 9}, {"d_model": 24, "writer": "jsonl"}, {"d_model": 48, "writer": "wandb"})],
    "global_batch_size": [({"lr": 0.015, "seed": 10}, {"batch_size": 6, "writer": "wandb"},
                           {"batch_size": 24, "writer": "tb"})],
}
"""Pairs with other seeds, sizes and MIXED writers (proxy and target logged by different writers), kept apart
while the rules were written and run once as a validation set (see the closing note of issue 20)."""

NULL_PAIRS = [({"lr": 0.01, "writer": "jsonl"}, {"seed": 0}, {"seed": 1}),
              ({"lr": 0.05, "qk_layernorm": True, "writer": "tb"}, {"seed": 3}, {"seed": 4}),
              ({"lr": 0.03, "writer": "jsonl", "d_model": 48}, {"seed": 5}, {"seed": 6})]
"""Pairs that differ only in the seed (init and data order): no setting changed, so no departure is expected."""
MUP_PAIR = ({"lr": 0.02, "mup": True, "mup_base_width": 32, "writer": "jsonl"}, {"d_model": 32}, {"d_model": 64})
"""A muP proxy/target pair (width 32 -> 64, both muP): the muP check verifies it from config and logs."""

SWEEP_LRS = (3e-3, 1e-2, 3e-2, 1e-1, 3e-1, 1.0)
"""Peak lrs of the sweep: a half-decade grid from stable to far too high."""
SWEEP_WIDTHS = (16, 32)
"""Widths of the nested sweep."""
HELD_OUT_WIDTH = 64
"""The larger width swept separately (qk-layernorm off) to check the size-trend prediction."""
SWEEP_BASE = {"steps": 300, "warmup_steps": 30, "n_heads": 4, "batch_size": 16, "writer": "jsonl"}
EVAL_EVERY = 25
"""Steps between evaluations of ``eval_loss`` (and at the last step) on a fixed held-out set."""
EVAL_SEQS = 64
"""Sequences of the fixed evaluation set (drawn once, from the last 10% of the corpus, never trained on)."""


def pair_specs(small: bool = False, validation: bool = False) -> list[tuple[str, str, Spec, Spec]]:
    """``(setting, pair name, proxy spec, target spec)`` of every pair.

    The first pair per setting when ``small``; the :data:`VALIDATION` pairs (``val_<setting>_<i>``) when ``validation``.
    """
    out = []
    for setting, pairs in (VALIDATION if validation else PAIRS).items():
        for i, (shared, p, t) in enumerate(pairs[:1] if small else pairs):
            base = replace(BASE, **shared)
            name = f"val_{setting}_{i}" if validation else f"{setting}_{i}"
            out.append((setting, name, replace(base, **p), replace(base, **t)))
    return out


def mup_specs() -> tuple[Spec, Spec]:
    """(proxy, target) of :data:`MUP_PAIR`."""
    shared, p, t = MUP_PAIR
    base = replace(BASE, **shared)
    return replace(base, **p), replace(base, **t)


def sweep_specs(widths: tuple[int, ...] = SWEEP_WIDTHS, lrs: tuple[float, ...] = SWEEP_LRS
                ) -> list[tuple[str, Spec]]:
    """``(relative folder, spec)`` of the nested sweep: ``width_<d>/qkln_<on|off>/lr_<lr>``."""
    out = []
    for d in widths:
        for qk in (False, True):
            for lr in lrs:
                spec = replace(BASE, **SWEEP_BASE, d_model=d, qk_layernorm=qk, lr=lr)
                out.append((f"width_{d}/qkln_{'on' if qk else 'off'}/lr_{lr:.0e}", spec))
    return out


def held_out_specs(width: int = HELD_OUT_WIDTH, lrs: tuple[float, ...] = SWEEP_LRS) -> list[tuple[str, Spec]]:
    """The held-out larger width, qk-layernorm off, same lr grid."""
    return [(f"lr_{lr:.0e}", replace(BASE, **SWEEP_BASE, d_model=width, qk_layernorm=False, lr=lr)) for lr in lrs]


# ----------------------------------------------------------------------------------------------- model


def _corpus(n_bytes: int = 1_000_000) -> Any:
    import torch

    files = sorted(glob.glob(os.path.join(os.path.dirname(os.__file__), "*.py")))
    data, total = [], 0
    for path in files:
        with open(path, "rb") as fh:
            chunk = fh.read()
        data.append(chunk)
        total += len(chunk)
        if total >= n_bytes:
            break
    return torch.frombuffer(bytearray(b"".join(data)[:n_bytes]), dtype=torch.uint8).long()


def _build(spec: Spec) -> Any:
    import torch
    from torch import nn
    from torch.nn import functional as F

    d_head = spec.d_model // spec.n_heads
    attn_scale = 1.0 / d_head if spec.mup else 1.0 / math.sqrt(d_head)
    out_mult = spec.mup_base_width / spec.d_model if spec.mup else 1.0

    class Attn(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.qkv = nn.Linear(spec.d_model, 3 * spec.d_model)
            self.proj = nn.Linear(spec.d_model, spec.d_model)
            self.qn = nn.LayerNorm(d_head) if spec.qk_layernorm else nn.Identity()
            self.kn = nn.LayerNorm(d_head) if spec.qk_layernorm else nn.Identity()
            self.register_buffer("mask", torch.ones(spec.seq_len, spec.seq_len, dtype=torch.bool).tril(),
                                 persistent=False)
            self.max_logit = 0.0

        def forward(self, x: Any) -> Any:
            b, t, d = x.shape
            q, k, v = (z.view(b, t, spec.n_heads, d_head).transpose(1, 2) for z in self.qkv(x).split(d, dim=-1))
            q, k = self.qn(q), self.kn(k)
            s = (q @ k.transpose(-2, -1)) * attn_scale
            m = self.mask[:t, :t]
            self.max_logit = s.detach().abs().masked_fill(~m, 0.0).max().item()
            a = F.softmax(s.masked_fill(~m, -math.inf), dim=-1)
            return self.proj((a @ v).transpose(1, 2).reshape(b, t, d))

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(spec.d_model), nn.LayerNorm(spec.d_model)
            self.attn = Attn()
            self.mlp = nn.Sequential(nn.Linear(spec.d_model, 4 * spec.d_model), nn.GELU(),
                                     nn.Linear(4 * spec.d_model, spec.d_model))

        def forward(self, x: Any) -> Any:
            x = x + self.attn(self.ln1(x))
            return x + self.mlp(self.ln2(x))

    class LM(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.tok = nn.Embedding(256, spec.d_model)
            self.pos = nn.Parameter(torch.zeros(spec.seq_len, spec.d_model))
            self.blocks = nn.ModuleList(Block() for _ in range(spec.n_layers))
            self.ln_f = nn.LayerNorm(spec.d_model)
            self.head = nn.Linear(spec.d_model, 256, bias=False)
            for name, p in self.named_parameters():
                if p.dim() == 2:
                    nn.init.normal_(p, std=0.02)
                    if spec.mup and name.startswith("head"):
                        nn.init.zeros_(p)  # muP readout zero-init (Yang et al. 2022, s D.2)

        def forward(self, idx: Any) -> Any:
            x = self.tok(idx) + self.pos[: idx.shape[1]]
            for blk in self.blocks:
                x = blk(x)
            return self.head(self.ln_f(x)) * out_mult

    return LM()


def _lr_factor(spec: Spec, i: int) -> float:
    if i < spec.warmup_steps:
        return (i + 1) / spec.warmup_steps
    prog = min(1.0, (i - spec.warmup_steps) / max(1, spec.steps - spec.warmup_steps))
    return spec.min_lr_ratio + (1 - spec.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * prog))


# ----------------------------------------------------------------------------------------------- writers


class _Writer:
    def __init__(self, spec: Spec, out: Path, config: dict[str, Any]) -> None:
        self.kind, self.out = spec.writer, out
        if self.kind in ("jsonl", "tb", "text"):
            (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        if self.kind == "jsonl":
            self.fh = open(out / "metrics.jsonl", "w", encoding="utf-8")  # noqa: SIM115 - closed in close()
        elif self.kind == "text":
            self.fh = open(out / "train.log", "w", encoding="utf-8")  # noqa: SIM115 - closed in close()
        elif self.kind == "tb":
            from torch.utils.tensorboard import SummaryWriter

            self.tb = SummaryWriter(log_dir=str(out))
        elif self.kind == "wandb":
            os.environ.setdefault("WANDB_SILENT", "true")
            import wandb

            self.wb = wandb.init(mode="offline", dir=str(out), config=config, project="tiny",
                                 settings=wandb.Settings(console="off", x_disable_stats=True,
                                                         x_disable_meta=True))
        else:
            raise ValueError(f"unknown writer {self.kind!r}")

    def log(self, rec: dict[str, Any]) -> None:
        step = rec["step"]
        if self.kind == "jsonl":
            self.fh.write(json.dumps(rec) + "\n")
        elif self.kind == "text":  # a custom script's print line: step N | loss X | lr Y | ...
            self.fh.write(f"step {step} | " + " | ".join(f"{k} {v:.6g}" for k, v in rec.items()
                                                         if k not in ("step", "wall_time")) + "\n")
        elif self.kind == "tb":
            for k, v in rec.items():
                if k not in ("step", "wall_time"):
                    self.tb.add_scalar(k if "/" in k else ("eval/loss" if k == "eval_loss" else f"train/{k}"), v, step)
        else:
            self.wb.log({(k if "/" in k else ("eval/loss" if k == "eval_loss" else f"train/{k}")): v
                         for k, v in rec.items()
                         if k not in ("step", "wall_time")}, step=step)

    def close(self) -> None:
        if self.kind in ("jsonl", "text"):
            self.fh.close()
        elif self.kind == "tb":
            self.tb.flush()
            self.tb.close()
        else:
            self.wb.finish()


# ----------------------------------------------------------------------------------------------- training


def config_of(spec: Spec) -> dict[str, Any]:
    """The configuration a real job would record (keys as the common trainers spell them)."""
    cfg: dict[str, Any] = {
        "d_model": spec.d_model, "n_layers": spec.n_layers, "n_heads": spec.n_heads, "seq_len": spec.seq_len,
        "batch_size": spec.batch_size, "lr": spec.lr, "warmup_steps": spec.warmup_steps, "max_steps": spec.steps,
        "lr_schedule": "linear_warmup_cosine", "min_lr_ratio": spec.min_lr_ratio,
        "optimizer": "adamw", "betas": [0.9, 0.95], "weight_decay": spec.weight_decay, "clip_grad_norm": spec.clip,
        "qk_layernorm": spec.qk_layernorm, "z_loss": spec.z_loss, "precision": "fp32", "seed": spec.seed,
        "vocab_size": 256,
    }
    if spec.mup:
        m = spec.d_model / spec.mup_base_width
        cfg.update({"mup": True, "mup_base_width": spec.mup_base_width, "width_mult": m, "output_mult": 1.0 / m,
                    "attn_mult": "1/d_head",
                    "param_groups": [{"name": "hidden", "lr": spec.lr / m}, {"name": "vector", "lr": spec.lr}]})
    return cfg


def train(spec: Spec, out: Path) -> dict[str, Any]:
    """Train one run into ``out`` (replaced); return ``{"seconds", "steps", "final_loss", "died"}``."""
    import torch
    from torch.nn import functional as F

    torch.set_num_threads(1)
    t0 = time.time()
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    full = _corpus()
    cut = int(full.numel() * 0.9)
    corpus, held = full[:cut], full[cut:]
    g_eval = torch.Generator().manual_seed(12345)
    ev_starts = torch.randint(0, held.numel() - spec.seq_len - 1, (EVAL_SEQS,), generator=g_eval)
    ev = torch.stack([held[s: s + spec.seq_len + 1] for s in ev_starts.tolist()])
    torch.manual_seed(spec.seed)
    model = _build(spec)
    named = list(model.named_parameters())
    hidden = [p for n, p in named if p.dim() == 2 and not n.startswith(("tok", "head"))]
    matrices_io = [p for n, p in named if p.dim() == 2 and n.startswith(("tok", "head"))]
    vectors = [p for n, p in named if p.dim() < 2]
    m = spec.d_model / spec.mup_base_width if spec.mup else 1.0
    groups = [{"params": hidden, "weight_decay": spec.weight_decay, "lr_mult": 1.0 / m},
              {"params": matrices_io, "weight_decay": spec.weight_decay, "lr_mult": 1.0},
              {"params": vectors, "weight_decay": 0.0, "lr_mult": 1.0}]
    opt = torch.optim.AdamW(groups, lr=spec.lr, betas=(0.9, 0.95))
    writer = _Writer(spec, out, config_of(spec))
    died, last_loss, last_eval = False, float("nan"), None
    losses: list[float] = []
    try:
        for i in range(spec.steps):
            step = i + 1
            lr = spec.lr * _lr_factor(spec, i)
            for g in opt.param_groups:
                g["lr"] = lr * g["lr_mult"]
            gen = torch.Generator().manual_seed(spec.seed * 1_000_003 + i)
            starts = torch.randint(0, corpus.numel() - spec.seq_len - 1, (spec.batch_size,), generator=gen)
            win = torch.stack([corpus[s: s + spec.seq_len + 1] for s in starts.tolist()])
            x, y = win[:, :-1], win[:, 1:]
            before = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
            logits = model(x)
            ce = F.cross_entropy(logits.reshape(-1, 256), y.reshape(-1))
            lz = torch.logsumexp(logits, dim=-1)
            loss = ce + spec.z_loss * (lz ** 2).mean() if spec.z_loss else ce
            opt.zero_grad(set_to_none=True)
            loss.backward()
            params = [p for p in model.parameters() if p.grad is not None]
            gn = (torch.nn.utils.clip_grad_norm_(params, spec.clip) if spec.clip > 0 else
                  torch.nn.utils.get_total_norm([p.grad for p in params])).item()
            opt.step()
            after = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
            last_loss = ce.item()
            rec: dict[str, Any] = {
                "step": step, "loss": last_loss, "lr": lr, "grad_norm": gn,
                "update_ratio": ((after - before).norm() / before.norm()).item(),
                "param_norm": after.norm().item(),
                "attn_logit_max": max(b.attn.max_logit for b in model.blocks),
                "output_logit_max": logits.detach().abs().max().item(),
                "log_z": lz.detach().mean().item(),
                "tokens": step * spec.batch_size * spec.seq_len,
                "wall_time": time.time(),
            }
            if spec.mup:
                rec["lr/hidden"] = lr / m
            if step % EVAL_EVERY == 0 or step == spec.steps:
                with torch.no_grad():
                    rec["eval_loss"] = F.cross_entropy(model(ev[:, :-1]).reshape(-1, 256), ev[:, 1:].reshape(-1)).item()
                last_eval = rec["eval_loss"]
            writer.log(rec)
            losses.append(last_loss)
            if not math.isfinite(last_loss):
                died = True
                break
    finally:
        writer.close()
    tail = [v for v in losses[-max(1, len(losses) // 20):] if math.isfinite(v)]
    info = {"seconds": round(time.time() - t0, 2), "steps": len(losses), "died": died,
            "final_loss": sum(tail) / len(tail) if tail else None, "final_eval_loss": last_eval}
    return info


def ensure(spec: Spec, out: Path) -> dict[str, Any]:
    """Train ``spec`` into ``out`` unless ``out/.spec.json`` already records this very spec (the cache)."""
    marker = out / ".spec.json"
    if marker.exists():
        try:
            saved = json.loads(marker.read_text())
            if saved.get("key") == spec.key():
                return saved["info"]
        except (OSError, ValueError):
            pass
    info = train(spec, out)
    marker.write_text(json.dumps({"key": spec.key(), "spec": asdict(spec), "info": info}) + "\n")
    print(f"{out}: {info}", file=sys.stderr)
    return info


def make_pairs(root: Path, small: bool = False, validation: bool = True) -> list[dict[str, Any]]:
    """Train every pair (and the validation pairs) under ``root/pairs/<name>/{proxy,target}``; return the truth."""
    truth = []
    for setting, name, p, t in pair_specs(small) + (pair_specs(small, True) if validation else []):
        ensure(p, root / "pairs" / name / "proxy")
        ensure(t, root / "pairs" / name / "target")
        truth.append({"setting": setting, "pair": name, "proxy": str(root / "pairs" / name / "proxy"),
                      "target": str(root / "pairs" / name / "target")})
    for i, (shared, p, t) in enumerate(NULL_PAIRS):
        base = replace(BASE, **shared)
        ensure(replace(base, **p), root / "null_pairs" / f"seed_{i}" / "proxy")
        ensure(replace(base, **t), root / "null_pairs" / f"seed_{i}" / "target")
    p, t = mup_specs()
    ensure(p, root / "mup_pair" / "proxy")
    ensure(t, root / "mup_pair" / "target")
    return truth


def make_sweep(root: Path, widths: tuple[int, ...] = SWEEP_WIDTHS, lrs: tuple[float, ...] = SWEEP_LRS,
               held_out: int | None = HELD_OUT_WIDTH) -> dict[str, Path]:
    """Train the nested sweep under ``root/sweep`` and the held-out width under ``root/held_out``.

    Each ``width_<d>/qkln_<x>/`` folder also holds a ``sweep.yaml`` (what a sweep launcher leaves), so a
    sweep folder holds a file of its own besides its runs.
    """
    base = root / "sweep"
    for rel, spec in sweep_specs(widths, lrs):
        ensure(spec, base / rel)
    for d in widths:
        for qk in ("off", "on"):
            (base / f"width_{d}" / f"qkln_{qk}" / "sweep.yaml").write_text(
                f"program: train.py\nmethod: grid\nparameters:\n  lr:\n    values: {list(lrs)}\n")
    paths = {"sweep": base}
    if held_out:
        ho = root / "held_out" / f"width_{held_out}"
        for rel, spec in held_out_specs(held_out, lrs):
            ensure(spec, ho / rel)
        paths["held_out"] = ho
    return paths


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True, help="cache folder (keep it outside the repository)")
    ap.add_argument("--pairs", action="store_true")
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--small", action="store_true", help="one pair per setting")
    ap.add_argument("--only", help="train only the pairs whose name starts with this")
    args = ap.parse_args(argv)
    t0 = time.time()
    if args.pairs:
        if args.only:
            for setting, name, p, t in pair_specs(args.small):
                if name.startswith(args.only):
                    print(setting, ensure(p, args.out / "pairs" / name / "proxy"),
                          ensure(t, args.out / "pairs" / name / "target"))
        else:
            make_pairs(args.out, args.small)
    if args.sweep:
        make_sweep(args.out)
    print(f"total {time.time() - t0:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
