r"""Make ``tests/data/hf_trainer_run/``: a real Hugging Face ``Trainer`` run on CPU, crashed and resumed.

Not a test and not a project dependency: run it once, by hand, in an environment with
``transformers`` and ``accelerate`` (``pip install transformers accelerate`` in a scratch venv; the
committed fixture was made with transformers 5.24.0, accelerate 1.15.0, torch 2.13.0+cpu)::

    python tests/data/make_hf_trainer_fixture.py            # rewrites tests/data/hf_trainer_run/

What it does, with a 2-layer GPT-2 (n_embd 32, vocab 64) on random tokens, ``logging_steps=1``,
``save_steps=10``, ``eval_steps=10``, ``max_steps=30``, seed 0:

1. attempt 1 trains and is stopped by an exception raised in a callback at the end of step 25 (a
   simulated crash): ``checkpoint-10/`` and ``checkpoint-20/`` hold the state up to their step, the
   stdout has the dict lines of steps 1..25 and the traceback;
2. attempt 2 resumes from ``checkpoint-20`` and runs steps 21..30: ``checkpoint-30/``, then
   ``trainer.save_state()`` writes the top-level ``trainer_state.json`` with the end-of-training
   summary.

Both attempts' stdout and stderr (tqdm bars with ``\r``) are appended to ``train.log``, as a job
script's ``>> train.log 2>&1`` would. Only the ``trainer_state.json`` copies are kept from the
checkpoint folders (weights and optimizer states are deleted to keep the fixture small). The values
(losses, norms) depend on torch's CPU kernels: the tests read them from the committed files, never
from a fresh run.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT = HERE / "hf_trainer_run"
MAX_STEPS, CRASH_AT = 30, 25


def _attempt(resume: bool) -> None:
    """One training attempt (runs in a child process so that its stdout/stderr go to the log)."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

    torch.manual_seed(0)
    torch.set_num_threads(1)

    class Tokens(torch.utils.data.Dataset):
        def __init__(self, n: int, seed: int) -> None:
            g = torch.Generator().manual_seed(seed)
            self.x = torch.randint(0, 64, (n, 16), generator=g)

        def __len__(self) -> int:
            return len(self.x)

        def __getitem__(self, i: int) -> dict:
            return {"input_ids": self.x[i], "labels": self.x[i]}

    class Crash(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if not resume and state.global_step == CRASH_AT:
                raise RuntimeError(f"simulated crash at step {CRASH_AT} (tests/data/make_hf_trainer_fixture.py)")

    cfg = GPT2Config(vocab_size=64, n_positions=16, n_embd=32, n_layer=2, n_head=2)
    model = GPT2LMHeadModel(cfg)
    args = TrainingArguments(
        output_dir=str(OUT), max_steps=MAX_STEPS, logging_steps=1, save_steps=10, eval_strategy="steps",
        eval_steps=10, per_device_train_batch_size=4, per_device_eval_batch_size=8, learning_rate=3e-3,
        warmup_steps=5, lr_scheduler_type="linear", seed=0, report_to=[], use_cpu=True, save_total_limit=None,
        dataloader_num_workers=0,
    )
    trainer = Trainer(model=model, args=args, train_dataset=Tokens(256, 1), eval_dataset=Tokens(16, 2),
                      callbacks=[Crash()])
    trainer.train(resume_from_checkpoint=str(OUT / "checkpoint-20") if resume else None)
    trainer.save_state()


def _prune() -> None:
    """Keep the trainer_state.json copies; drop weights, optimizer and RNG states, args."""
    for p in sorted(OUT.rglob("*")):
        if p.is_file() and p.name not in ("trainer_state.json", "train.log"):
            p.unlink()


def main() -> None:
    """Run both attempts in child processes, appending their output to ``train.log``."""
    if len(sys.argv) > 1 and sys.argv[1] in ("attempt1", "attempt2"):
        _attempt(resume=sys.argv[1] == "attempt2")
        return
    if OUT.exists():
        shutil.rmtree(OUT)
    OUT.mkdir(parents=True)
    env = {**os.environ, "PYTHONHASHSEED": "0", "CUDA_VISIBLE_DEVICES": "", "TOKENIZERS_PARALLELISM": "false"}
    with open(OUT / "train.log", "ab") as log:
        for which in ("attempt1", "attempt2"):
            rc = subprocess.call([sys.executable, __file__, which], stdout=log, stderr=subprocess.STDOUT, env=env)
            print(f"{which}: exit code {rc}")
    _prune()
    for p in sorted(OUT.rglob("*")):
        if p.is_file():
            print(p.relative_to(HERE), p.stat().st_size)


if __name__ == "__main__":
    main()
