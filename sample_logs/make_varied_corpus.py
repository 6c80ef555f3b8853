"""Generate a corpus of real tiny training runs that varies many axes at once (issue 15).

Every run is a REAL training on CPU (torch, one thread) of the tiny pre-LN character Transformer of
``make_samples.py`` (imported, never edited) or of a small MLP language model, over the bytes of the Python
standard library's sources. Each run draws, from its own seed, all of these at once:

* model: Transformer (d_model 16-48, 1-3 layers) or an MLP LM over a byte context (width 32-128);
* optimizer: AdamW, Adam, SGD with momentum, Adafactor (``torch.optim.Adafactor``);
* schedule: cosine, linear, WSD (trapezoid), step, inverse-sqrt, constant, cyclic; warm-up 0-60 steps;
* precision: fp32, bf16 autocast, fp16 autocast with a real ``torch.amp.GradScaler`` (init scale 2**16 or a
  too-high 2**20..2**32 that calibrates down in the first steps; growth interval 40-2000, so periodic growth
  probes skip a step);
* batch size and gradient accumulation, clipping, log interval (1, 2, 5, 10), which metrics are logged
  (minimal / standard / rich), eval cadence, per-step time and its noise (a virtual clock: a tiny CPU model
  does not have a GPU job's step time; the clock is ``base * noise`` per step, plus the injected shifts);
* writer: torch ``SummaryWriter`` (one event file per process), JSONL, wandb offline (``WANDB_MODE=offline``,
  one ``offline-run-*`` per process), a Megatron-like stdout log (``train.log``), a Lightning-format
  ``lightning_logs/version_N/metrics.csv`` (one version per process, written with ``csv``; Lightning itself is
  not installed);
* resumes: none, a correct one (every state restored; the resumed process re-logs the steps between the
  checkpoint and the crash), an intentional schedule change (a NEW schedule over the remaining steps, with
  an override flag in the config), or a faulty one (below). Checkpoints are kept in memory, never written.

Kinds (label = verdict / cause / mechanism, onset window from what was injected):

* ``healthy`` with traps: fp16 loss-scale calibration and growth probes, a 5 % speed-up or a small slowdown
  inside the noise, one mildly noisy batch after warm-up (half the sequences are byte-shuffled), smooth decay,
  a correct resume, an intentional schedule change;
* ``lr_reset``: the resumed process rebuilds the scheduler from step 0 (warm-up and peak replayed; sometimes
  with an override flag set in the config): lr_schedule_reset / reset_to_initial, ``[c+1, c+1]``;
* ``weights_not_restored`` / ``optimizer_not_restored`` / ``sampler_replay`` (the data position goes back to
  batch 0): state_not_restored, ``[c+1, c+1]``;
* ``bad_batch_nan`` (an all-padding batch: 0/0 = NaN; the job stops a few steps later): anomaly data_batch
  bad_batch ``[f, f]``; ``bad_batch_spike`` (1-3 batches of random bytes, recovered): transient data_batch
  ``[f, f]``; ``recurring_spikes`` (a random-bytes batch every P steps): anomaly data_batch ``[f1, f1]``;
* ``lr_too_high``: peak lr x10-40, no clipping, fp32/bf16: update_scale_growth / lr_too_high ``[1, s]``, ``s``
  the first step from which the 20-step mean loss stays above a healthy twin's (same seed, safe lr) by 0.1;
* ``fp16_overflow``: fp16, far too high lr: overflow ``[1, first skipped step after calibration]``;
* ``grad_scaling_bug``: the resumed process sums (not averages) over k accumulation micro-batches (grad norm
  x k, loss trend unchanged): grad_scaling_bug ``[c+1, c+1]``.

Split (``split`` in each label): a run is ``validation`` when its seed is 0 mod 4 or it uses a held-out axis
value (optimizer Adafactor, schedule WSD, writer Lightning CSV); otherwise ``tuning``. The held-out values never
appear in tuning.

Usage::

    python sample_logs/make_varied_corpus.py --out /work/corpus15 --n 320 --jobs 2
    python sample_logs/make_varied_corpus.py --out /tmp/c --n 40 --first-seed 9000   # a small subset
    python sample_logs/make_varied_corpus.py --out /work/corpus15 --n 650 --kinds optimizer_not_restored --redo
    python sample_logs/make_varied_corpus.py --out /work/corpus15 --first-seed 651 --n 400 --kinds sampler_replay
    # (the last two: make the kind's runs again with today's drop test; more runs of one kind, new seeds)

Labels: ``OUT/labels.json`` (one file, outside the run folders). Runs that did not show their fault (e.g. no
overflow happened) are dropped and listed in ``OUT/dropped.json``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from varied_labels import label  # noqa: E402
from varied_spec import HELD_OUT, KINDS, PROFILE_KEYS, Dropped, Spec, draw  # noqa: E402,F401
from varied_training import Run, _mods  # noqa: E402,F401


def ci_subset(n: int = 8, first_seed: int = 2000, per_kind: int = 1) -> list[int]:
    """Seeds of a small, cheap VALIDATION subset for CI (no fp16, no healthy-twin runs), drawn in seed order.

    At most ``per_kind`` runs of each kind, healthy runs twice that; the choice depends only on the drawn specs,
    never on how the analyzer does on them.
    """
    out: list[int] = []
    count: dict[str, int] = {}
    s = first_seed
    while len(out) < n and s < first_seed + 5000:
        sp = draw(s)
        cap = 2 * per_kind if sp.kind == "healthy" else per_kind
        if (sp.split == "validation" and sp.precision != "fp16" and sp.kind != "lr_too_high"
                and sp.writer != "wandb" and sp.steps <= 240 and count.get(sp.kind, 0) < cap):
            out.append(s)
            count[sp.kind] = count.get(sp.kind, 0) + 1
        s += 1
    return out


_CORPUS = None


def make_one(args: tuple[int, str]) -> tuple[str, dict[str, Any] | None, str]:
    """Train and label run ``seed`` into ``out`` (a worker process)."""
    global _CORPUS
    seed, out_root = args
    ms, torch = _mods()
    torch.set_num_threads(1)
    if _CORPUS is None:
        _CORPUS = ms.load_corpus(600_000)
    spec = draw(seed)
    out = Path(out_root) / spec.name
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    t0 = time.time()
    try:
        run = Run(spec, _CORPUS, out)
        run.train()
        lab = label(spec, run, _CORPUS)
        lab["train_seconds"] = round(time.time() - t0, 2)
        if spec.writer == "wandb":
            for p in (out / "wandb").iterdir():
                if p.is_symlink() or p.is_file():
                    p.unlink()
                else:  # keep the transaction log and files/ (as make_wandb_sample.py does)
                    for q in p.iterdir():
                        if q.is_dir() and q.name != "files":
                            shutil.rmtree(q)
        return spec.name, lab, ""
    except Dropped as exc:
        shutil.rmtree(out, ignore_errors=True)
        return spec.name, None, str(exc)
    except Exception as exc:  # noqa: BLE001 - reported, the other runs go on
        shutil.rmtree(out, ignore_errors=True)
        return spec.name, None, f"FAILED {type(exc).__name__}: {exc}"


def _select(a: argparse.Namespace, labels: dict, dropped: dict) -> list[int]:
    """The seeds to make: drawn kind and split as asked, not yet labelled or dropped (unless ``--redo``)."""
    out = []
    for s in range(a.first_seed, a.first_seed + a.n):
        sp = draw(s)
        if a.kinds and sp.kind not in a.kinds.split(","):
            continue
        if a.split and sp.split != a.split:
            continue
        if not a.redo and (sp.name in labels or sp.name in dropped):
            continue
        out.append(s)
    return out


def _save(labels_path: Path, labels: dict, dropped_path: Path, dropped: dict) -> None:
    labels_path.write_text(json.dumps(sorted(labels.values(), key=lambda r: r["run"]), indent=1) + "\n")
    dropped_path.write_text(json.dumps(dropped, indent=1) + "\n")


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True, help="folder for the runs and labels.json (outside the repo)")
    p.add_argument("--n", type=int, default=320, help="number of seeds drawn")
    p.add_argument("--first-seed", type=int, default=1)
    p.add_argument("--jobs", type=int, default=1)
    p.add_argument("--kinds", help="only seeds whose drawn kind is one of these (comma-separated)")
    p.add_argument("--split", choices=("tuning", "validation"), help="only seeds whose drawn split is this")
    p.add_argument("--redo", action="store_true",
                   help="make the selected seeds again even when labelled or dropped (a run that no longer shows "
                   "its fault leaves labels.json)")
    p.add_argument("--list", action="store_true", help="print the drawn specs and exit")
    a = p.parse_args(argv)
    if a.list:
        for s in range(a.first_seed, a.first_seed + a.n):
            sp = draw(s)
            print(sp.name, sp.split, sp.arch, sp.optimizer, sp.schedule, sp.precision, sp.writer, sp.profile)
        return 0
    a.out.mkdir(parents=True, exist_ok=True)
    labels_path, dropped_path = a.out / "labels.json", a.out / "dropped.json"
    labels = {r["run"]: r for r in json.loads(labels_path.read_text())} if labels_path.exists() else {}
    dropped = json.loads(dropped_path.read_text()) if dropped_path.exists() else {}
    todo = [(s, str(a.out)) for s in _select(a, labels, dropped)]
    t0 = time.time()
    if a.jobs > 1:
        import multiprocessing as mp

        pool = mp.get_context("spawn").Pool(a.jobs)
        it = pool.imap_unordered(make_one, todo)
    else:
        pool, it = None, map(make_one, todo)
    for k, (name, lab, why) in enumerate(it, 1):
        if lab is None:
            dropped[name] = why
            labels.pop(name, None)
        else:
            labels[name] = lab
            dropped.pop(name, None)
        print(f"[{k}/{len(todo)} {time.time() - t0:.0f}s] {name}: {why or lab['onset_window']}",
              file=sys.stderr, flush=True)
        if k % 5 == 0:
            _save(labels_path, labels, dropped_path, dropped)
    if pool is not None:
        pool.close()
    _save(labels_path, labels, dropped_path, dropped)
    print(f"{len(labels)} labelled runs, {len(dropped)} dropped, {time.time() - t0:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
