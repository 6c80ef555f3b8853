"""The run's real writers: SummaryWriter, JSONL, wandb offline, a Megatron-like stdout log, a Lightning CSV."""

from __future__ import annotations

import contextlib
import csv
import io
import json
import math
import os
import time
from pathlib import Path
from typing import Any

from varied_spec import PROFILE_KEYS, Spec

MEGATRON_KEYS = {"loss", "lr", "grad_norm", "loss_scale", "skipped_step", "eval_loss"}
"""What the Megatron-like stdout log prints (Megatron's default training_log fields)."""


def logged_keys(spec: Spec) -> set[str]:
    """The metrics a run's writer actually logs: its profile's, less what its writer does not print."""
    keys = set(PROFILE_KEYS[spec.profile])
    return keys & MEGATRON_KEYS if spec.writer == "megatron" else keys


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

