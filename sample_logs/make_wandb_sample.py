"""Generate ``sample_logs/wandb_healthy/``: a real healthy training run logged by wandb in offline mode.

The model, data and schedule are those of ``make_samples.py`` (the tiny byte-level Transformer trained
on CPU over the standard library's source); this script only swaps the loggers for ``wandb.log``
(``WANDB_MODE=offline``, no network). It keeps the transaction log ``run-<id>.wandb`` and
``files/output.log`` of the real ``wandb/offline-run-<ts>-<id>/`` folder and drops what only describes
this machine (``logs/debug*.log``, ``requirements.txt``, ``tmp/``, the ``latest-run`` and ``debug*.log``
links). Needs ``pip install -e .[samples]`` (torch, wandb).

Usage::

    python sample_logs/make_wandb_sample.py            # writes sample_logs/wandb_healthy/
    python sample_logs/make_wandb_sample.py --steps 50 --out /tmp/wb
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
EXPECTED = {"verdict": "healthy", "cause": None, "mechanism": None, "onset_window": None}
RUN_ID = "healthy0"


def train(out: Path, steps: int) -> None:
    """Train the healthy configuration of ``make_samples.py`` for ``steps`` steps, logging to wandb offline."""
    os.environ.update(WANDB_MODE="offline", WANDB_SILENT="true", WANDB_DIR=str(out),
                      WANDB_DISABLE_GIT="true", WANDB_DISABLE_CODE="true")
    import torch
    import torch.nn.functional as F
    import wandb

    sys.path.insert(0, str(HERE))
    from make_samples import Config, TinyLM, flat_params, get_batch, load_corpus, lr_lambda, nan_max

    cfg = Config(steps=steps)
    torch.manual_seed(cfg.seed)
    torch.set_num_threads(1)
    corpus = load_corpus(cfg.data_bytes)
    model = TinyLM(cfg)
    decay = [p for p in model.parameters() if p.dim() == 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=cfg.lr, betas=cfg.betas)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(cfg))
    run = wandb.init(project="train-forensics-samples", id=RUN_ID, name="wandb_healthy", config=cfg.public(),
                     settings=wandb.Settings(x_disable_stats=True))
    for step in range(1, cfg.steps + 1):
        x, y = get_batch(corpus, cfg, step - 1)
        lr = opt.param_groups[0]["lr"]
        before = flat_params(model)
        logits = model(x)
        loss = F.cross_entropy(logits.reshape(-1, cfg.vocab_size), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(list(model.parameters()), cfg.clip).item()
        opt.step()
        sched.step()
        after = flat_params(model)
        layer_max = model.attn_logit_max()
        wandb.log({"train/loss": loss.item(), "train/lr": lr, "train/grad_norm": grad_norm,
                   "train/update_ratio": ((after - before).norm() / before.norm()).item(),
                   "train/param_norm": after.norm().item(), "train/attn_logit_max": nan_max(layer_max),
                   "attn_logit_max": {f"layer{i}": v for i, v in enumerate(layer_max)}}, step=step)
        if step % 50 == 0:
            print(f"step {step} | loss {loss.item():.4f} | lr {lr:.3e} | grad_norm {grad_norm:.4f}", flush=True)
    run.finish()


def tidy(out: Path) -> Path:
    """Keep only the transaction log and ``files/output.log`` of the run folder; return that folder."""
    wb = out / "wandb"
    for p in wb.iterdir():
        if p.is_symlink() or p.is_file():
            p.unlink()
    (run_dir,) = [p for p in wb.iterdir() if p.is_dir()]
    for p in run_dir.iterdir():
        if p.is_dir() and p.name != "files":
            shutil.rmtree(p)
    for p in (run_dir / "files").iterdir():
        if p.name != "output.log":
            p.unlink()
    return run_dir


def main(argv: list[str] | None = None) -> int:
    """Command line: ``--out`` (default ``sample_logs/wandb_healthy``), ``--steps`` (default 400)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=HERE / "wandb_healthy")
    ap.add_argument("--steps", type=int, default=400)
    args = ap.parse_args(argv)
    shutil.rmtree(args.out / "wandb", ignore_errors=True)
    args.out.mkdir(parents=True, exist_ok=True)
    train(args.out, args.steps)
    run_dir = tidy(args.out)
    (args.out / "expected.json").write_text(json.dumps(EXPECTED) + "\n")
    size = sum(p.stat().st_size for p in args.out.rglob("*") if p.is_file())
    print(f"wrote {run_dir} ({size} bytes in {args.out})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
