"""Generate real sample runs WITH checkpoints for train-forensics' checkpoint readers and detectors.

Trains the tiny byte-level Transformer of ``make_samples.py`` (imported from there: same model, data
and schedule; here d_model 16, 2 layers, 2 heads, seq 32 so that checkpoints stay small) on CPU and,
every ``--every`` steps, saves a checkpoint the way Hugging Face-style trainers do::

    ckpt/step_N/model.safetensors   weights, safetensors.torch.save_file (fp32)
    ckpt/step_N/optimizer.pt        AdamW state dict, torch.save (param_groups carry param_names)
    ckpt/step_N/scheduler.pt        LambdaLR state dict, torch.save

plus ``metrics.jsonl`` (one JSON object per step), ``train.log`` and ``config.json``. Faults are
injected by name, nothing is drawn:

- ``none``: a healthy run.
- ``nonfinite_state``: right after the optimizer step at ``--fault-step``, one coordinate of AdamW's
  second moment ``exp_avg_sq`` of ``--fault-tensor`` is set to +inf (what an fp16/8-bit optimizer
  state does when a squared gradient overflows). The coordinate's update becomes m / sqrt(inf) = 0:
  training goes on with a finite loss, the logs show nothing, and every later checkpoint carries the inf.
- ``attention_logit_growth``: nothing is injected; the run's own settings are the fault. A wider copy of
  the model (d_model 20, seq 64, so that a head has room to sharpen) warmed up over 100 steps to a peak
  lr of 0.3 (100x the healthy run's) without qk-layernorm. Once the lr passes about 0.07, the raw q.k
  scores grow by orders of magnitude while the loss stalls, as in Wortsman et al. 2023 (arXiv 2309.14322,
  section 3.1.1). Checkpoints every 25 steps; the job is stopped (SIGTERM) at ``--stop-step`` the way an
  operator stops a run whose loss went the wrong way. It logs the max attention logit of each layer too.

Usage::

    python sample_logs/make_checkpoint_samples.py --all     # regenerate the committed runs exactly
    python sample_logs/make_checkpoint_samples.py --fault none --out /tmp/run --steps 300 --every 50
    python sample_logs/make_checkpoint_samples.py --fault attention_logit_growth --lr 0.03 --out /tmp/twin  # its twin
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from safetensors.torch import save_file

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_samples import Config, TinyLM, get_batch, load_corpus, lr_lambda  # noqa: E402

BASE = Config(d_model=16, n_layers=2, n_heads=2, seq_len=32, batch_size=32, lr=3e-3, warmup=20, steps=250,
              checkpoint_every=50)
"""Shared settings of the committed checkpoint runs (Config defaults otherwise)."""

ATTN = replace(BASE, d_model=20, seq_len=64, lr=0.3, warmup=100, steps=300, checkpoint_every=25)
"""Settings of the attention-logit-growth run: hyper-parameters only (the fault is the lr without qk-layernorm)."""

RUNS: dict[str, dict[str, Any]] = {
    "ckpt_healthy": {"fault": "none"},
    "ckpt_nonfinite_state": {"fault": "nonfinite_state", "fault_step": 130,
                             "fault_tensor": "blocks.1.mlp.0.weight", "fault_index": 7},
    "ckpt_attention_logit_growth": {"fault": "attention_logit_growth", "stop_step": 110},
}
"""Exact settings of each committed run."""

CONFIGS: dict[str, Config] = {"ckpt_attention_logit_growth": ATTN}
"""Per-run config (``BASE`` when a run is not listed)."""

EXPECTED: dict[str, dict[str, Any]] = {
    "ckpt_healthy": {"verdict": "healthy", "cause": None, "mechanism": None, "onset_window": None},
    "ckpt_nonfinite_state": {
        "verdict": "anomaly", "cause": "overflow", "mechanism": "nonfinite_state", "onset_window": [131, 150],
        "events": {"exp_avg_sq_set_to_inf_after_step": 130, "first_checkpoint_with_inf": 150,
                   "last_finite_checkpoint": 100},
    },
    "ckpt_attention_logit_growth": {
        "verdict": "anomaly", "cause": "update_scale_growth", "mechanism": "attention_logit_growth",
        "onset_window": [12, 69],
        "events": {"stable_twin_peak_lr": 0.03,
                   "grad_norm_first_above_twin_max": 12, "attn_logit_max_above_twin_max_for_good": 22,
                   "attn_logit_max_above_100_for_good": 33, "loss_20_step_mean_above_twin_for_good": 69,
                   "first_checkpoint": 25, "newest_checkpoint_before_onset": None,
                   "qk_v_growth_layer": "blocks.1.attn", "stopped_after_step": 110},
    },
}
"""Ground truth written to ``<run>/expected.json``. ``ckpt_nonfinite_state``: the onset lies between the
injection and the first checkpoint that shows it (the logs never do). ``ckpt_attention_logit_growth``: the
window runs from the first step a logged series leaves the whole-run range of a stable twin (the same
command with ``--lr 0.03``) to the first step from which the loss's 20-step mean stays at least 0.1 above
the twin's (the rule of ``make_samples.py``'s ``update_scale_growth``); sample_logs/README.md gives the
numbers."""


def train(cfg: Config, out: Path, fault: str = "none", fault_step: int = 0, fault_tensor: str = "",
          fault_index: int = 0, stop_step: int = 0) -> float:
    """Train one run into ``out`` (replaced); return the wall time in seconds.

    ``stop_step`` > 0 ends the job after that step as a SIGTERM does (logged, no checkpoint).
    """
    t0 = time.time()
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    (out / "config.json").write_text(json.dumps(cfg.public(), indent=2) + "\n")
    torch.set_num_threads(1)
    torch.manual_seed(cfg.seed)
    corpus = load_corpus(cfg.data_bytes)
    model = TinyLM(cfg)
    named = list(model.named_parameters())
    groups = [{"params": [(n, p) for n, p in named if p.dim() == 2], "weight_decay": cfg.weight_decay},
              {"params": [(n, p) for n, p in named if p.dim() < 2], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=cfg.lr, betas=cfg.betas)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(cfg))
    params = dict(named)
    per_layer = fault == "attention_logit_growth"  # this job instruments attention per layer
    with open(out / "metrics.jsonl", "w", encoding="utf-8") as jl, open(out / "train.log", "w") as log:
        for step in range(1, cfg.steps + 1):
            x, y = get_batch(corpus, cfg, step - 1)
            logits = model(x)
            loss = F.cross_entropy(logits.reshape(-1, cfg.vocab_size), y.reshape(-1))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.clip).item()
            lr = opt.param_groups[0]["lr"]
            opt.step()
            sched.step()
            if fault == "nonfinite_state" and step == fault_step:
                with torch.no_grad():
                    opt.state[params[fault_tensor]]["exp_avg_sq"].view(-1)[fault_index] = math.inf
            with torch.no_grad():
                pnorm = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).norm().item()
            layer_max = model.attn_logit_max()
            rec = {"step": step, "loss": loss.item(), "lr": lr, "grad_norm": grad_norm, "param_norm": pnorm,
                   "attn_logit_max": max(layer_max), "batch_index": step - 1,
                   "tokens": step * cfg.batch_size * cfg.seq_len}
            if per_layer:
                rec.update({f"attn_logit_max/layer{i}": v for i, v in enumerate(layer_max)})
            jl.write(json.dumps(rec) + "\n")
            log.write(f"step {step} | loss {rec['loss']:.4f} | lr {lr:.3e} | grad_norm {grad_norm:.4f}\n")
            if step % cfg.checkpoint_every == 0:
                d = out / "ckpt" / f"step_{step}"
                d.mkdir(parents=True)
                weights = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
                save_file(weights, str(d / "model.safetensors"), metadata={"format": "pt", "step": str(step)})
                torch.save(opt.state_dict(), d / "optimizer.pt")
                torch.save(sched.state_dict(), d / "scheduler.pt")
                log.write(f"saved checkpoint at step {step} to {d.relative_to(out)}\n")
            if step == stop_step:
                log.write(f"Received SIGTERM at step {step}; exiting.\n")
                break
    return time.time() - t0


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--all", action="store_true", help="regenerate every committed run with its exact settings")
    p.add_argument("--fault", choices=("none", "nonfinite_state", "attention_logit_growth"), default="none")
    p.add_argument("--out", type=Path)
    p.add_argument("--steps", type=int, help="planned steps (default: the fault's committed run)")
    p.add_argument("--every", type=int, help="checkpoint every N steps (default: the fault's committed run)")
    p.add_argument("--lr", type=float, help="peak lr (default: the fault's committed run)")
    p.add_argument("--stop-step", type=int, help="stop the job after this step (attention_logit_growth: 110)")
    p.add_argument("--fault-step", type=int, default=130)
    p.add_argument("--fault-tensor", default="blocks.1.mlp.0.weight")
    args = p.parse_args(argv)
    if args.all:
        root = Path(__file__).resolve().parent
        for name, kw in RUNS.items():
            seconds = train(CONFIGS.get(name, BASE), root / name, **kw)
            (root / name / "expected.json").write_text(json.dumps(EXPECTED[name], indent=2) + "\n")
            print(f"{name}: {seconds:.1f} s", file=sys.stderr)
        return 0
    if args.out is None:
        p.error("--out is required unless --all is given")
    base = ATTN if args.fault == "attention_logit_growth" else BASE
    cfg = replace(base, steps=args.steps or base.steps, checkpoint_every=args.every or base.checkpoint_every,
                  lr=args.lr or base.lr)
    stop = args.stop_step if args.stop_step is not None else (
        RUNS["ckpt_attention_logit_growth"]["stop_step"] if args.fault == "attention_logit_growth" else 0)
    seconds = train(cfg, args.out, args.fault, args.fault_step, args.fault_tensor, stop_step=stop)
    print(f"{args.out}: {seconds:.1f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
