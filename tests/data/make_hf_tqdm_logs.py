r"""Make ``tests/data/hf_tqdm_real/``: the stdout+stderr of a real Hugging Face ``Trainer`` (tqdm bar, dict lines).

Not a test and not a project dependency: run it once, by hand, where ``transformers`` and ``accelerate`` import
(the committed files were made with transformers 4.46.3, accelerate 1.1.1, tqdm 4.70.1, torch 2.13.0+cpu)::

    python tests/data/make_hf_tqdm_logs.py

A 2-layer GPT-2 (n_embd 32, vocab 64) learns arithmetic token sequences on CPU: ``max_steps=250``,
``logging_steps=10``, ``eval_steps=50``, 125 steps per epoch, no ``trainer_state.json`` kept. Each run is
``python -u train.py > LOG 2>&1`` (the Trainer's ``ProgressCallback`` writes each dict with ``tqdm.write`` and
redraws the bar after it):

- ``unbuffered.log``: one run of 250 steps;
- ``resumed/train_1.out`` (steps 1..100, checkpoint-100) and ``resumed/train_2.out`` (resumed from checkpoint-100,
  steps 101..250; ``rng_state.pth`` removed first: torch 2.13's ``weights_only`` default refuses it).

The dict lines carry no step; the tests check that the reader puts them on the trainer's steps 10, 20, ...
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

OUT = Path(__file__).parent / "hf_tqdm_real"
TRAIN = r'''
import sys
import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

torch.set_num_threads(1)
torch.manual_seed(0)
out, max_steps, resume = sys.argv[1], int(sys.argv[2]), len(sys.argv) > 3


class Seqs(torch.utils.data.Dataset):
    def __init__(self, n):
        g = torch.Generator().manual_seed(1)
        self.starts = torch.randint(0, 64, (n,), generator=g)

    def __len__(self):
        return len(self.starts)

    def __getitem__(self, i):
        ids = (self.starts[i] + torch.arange(32) * 3) % 64
        return {"input_ids": ids, "labels": ids}


model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=32, n_embd=32, n_layer=2, n_head=2))
args = TrainingArguments(output_dir=out, max_steps=max_steps, logging_steps=10, per_device_train_batch_size=8,
                         learning_rate=3e-3, warmup_steps=20, save_steps=100, eval_strategy="steps", eval_steps=50,
                         report_to=[], use_cpu=True, dataloader_num_workers=0, seed=0)
trainer = Trainer(model=model, args=args, train_dataset=Seqs(1000), eval_dataset=Seqs(64))
trainer.train(resume_from_checkpoint=True if resume else None)
'''


def _run(work: Path, log: Path, *args: str) -> None:
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "wb") as fh:
        subprocess.run([sys.executable, "-u", str(work / "train.py"), *args], stdout=fh, stderr=subprocess.STDOUT,
                       check=True)


def main() -> None:
    """Write the three logs (about 10 s on one CPU core)."""
    work = Path(tempfile.mkdtemp())
    (work / "train.py").write_text(TRAIN)
    _run(work, OUT / "unbuffered.log", str(work / "a"), "250")
    _run(work, OUT / "resumed" / "train_1.out", str(work / "c"), "100")
    (work / "c" / "checkpoint-100" / "rng_state.pth").unlink()
    _run(work, OUT / "resumed" / "train_2.out", str(work / "c"), "250", "resume")
    shutil.rmtree(work)


if __name__ == "__main__":
    main()
