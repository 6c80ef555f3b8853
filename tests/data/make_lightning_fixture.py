r"""Make ``tests/data/lightning_run/``: a real PyTorch Lightning run on CPU that diverges to NaN.

Not a test and not a project dependency: run it once, by hand, in an environment with
``pytorch-lightning`` (``pip install pytorch-lightning`` in a scratch venv; the committed fixture was
made with pytorch-lightning 2.6.6, torch 2.13.0+cpu)::

    python tests/data/make_lightning_fixture.py            # rewrites tests/data/lightning_run/

A 2-layer MLP regresses random data for ``max_steps=1100`` (one epoch of 1100 batches), logging like a
NeMo 1 Megatron model does (``self.log(..., prog_bar=True)`` of ``reduced_train_loss``, ``global_step``
and ``consumed_samples``; ``lr`` off the bar), ``val_loss`` every 500 steps. At step 1050 the loss is
multiplied by NaN: the weights become NaN and every later loss is NaN (a real divergence, not a
written number). Two real writers:

- ``csv/version_0/metrics.csv`` and ``hparams.yaml`` from Lightning's ``CSVLogger``
  (``log_every_n_steps=10``);
- ``train.log``: the stdout and stderr of the run, with Lightning's ``TQDMProgressBar``
  (``refresh_rate=5``) redrawn with ``\r``: the shape of a NeMo 1 training log, including
  ``global_step=1e+3`` (tqdm's ``{:.3g}``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT = HERE / "lightning_run"
MAX_STEPS, NAN_AT, BATCH = 1100, 1050, 4


def _run() -> None:
    import pytorch_lightning as pl
    import torch
    from pytorch_lightning.callbacks import TQDMProgressBar
    from pytorch_lightning.loggers import CSVLogger

    pl.seed_everything(0, workers=True)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(MAX_STEPS * BATCH, 8, generator=g)
    y = x @ torch.randn(8, 1, generator=g) + 0.1 * torch.randn(MAX_STEPS * BATCH, 1, generator=g)
    train = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=BATCH)
    val = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x[:16], y[:16]), batch_size=BATCH)

    class Model(pl.LightningModule):
        def __init__(self, lr: float = 0.01) -> None:
            super().__init__()
            self.save_hyperparameters()
            self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))

        def training_step(self, batch, batch_idx):
            xb, yb = batch
            loss = torch.nn.functional.mse_loss(self.net(xb), yb)
            if self.trainer.global_step == NAN_AT:
                loss = loss * float("nan")
            gs = self.trainer.global_step
            self.log("reduced_train_loss", loss, prog_bar=True, batch_size=1)
            self.log("global_step", float(gs), prog_bar=True, batch_size=1)
            self.log("consumed_samples", float((gs + 1) * BATCH), prog_bar=True, batch_size=1)
            self.log("lr", self.trainer.optimizers[0].param_groups[0]["lr"], batch_size=1)
            return loss

        def validation_step(self, batch, batch_idx):
            xb, yb = batch
            self.log("val_loss", torch.nn.functional.mse_loss(self.net(xb), yb), prog_bar=True, batch_size=BATCH)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)

    trainer = pl.Trainer(
        max_steps=MAX_STEPS, accelerator="cpu", devices=1, logger=CSVLogger(str(OUT), name="csv", version=0),
        log_every_n_steps=10, val_check_interval=500, limit_val_batches=2, num_sanity_val_steps=0,
        enable_checkpointing=False, enable_model_summary=False, callbacks=[TQDMProgressBar(refresh_rate=5)],
    )
    trainer.fit(Model(), train, val)


def main() -> None:
    """Run the training in a child process with its output in ``train.log``."""
    if len(sys.argv) > 1 and sys.argv[1] == "run":
        _run()
        return
    if OUT.exists():
        shutil.rmtree(OUT)
    OUT.mkdir(parents=True)
    env = {**os.environ, "PYTHONHASHSEED": "0", "CUDA_VISIBLE_DEVICES": "", "COLUMNS": "120"}
    with open(OUT / "train.log", "wb") as log:
        rc = subprocess.call([sys.executable, __file__, "run"], stdout=log, stderr=subprocess.STDOUT, env=env)
    print(f"exit code {rc}")
    for p in sorted(OUT.rglob("*")):
        if p.is_file():
            print(p.relative_to(HERE), p.stat().st_size)


if __name__ == "__main__":
    main()
