"""Generate a labelled corpus of real tiny training runs for the accuracy benchmark.

Every run is a real training of the tiny Transformer of ``make_samples.py`` (imported, never edited),
with a fault injected by its own switches, varied over seeds, sizes (d_model 32/48/64), lengths, fault
steps and precisions. After the run, what it wrote is post-filtered to a logging profile and a format,
so the trainer stays untouched:

* profiles: ``minimal`` (loss and lr only), ``standard`` (+ grad_norm, loss_scale), ``rich`` (everything
  ``make_samples.py`` logs);
* formats: ``jsonl`` (``metrics.jsonl`` only), ``tb`` (the TensorBoard event files only), ``both``.

``train.log`` is dropped (the corpus stays small) and ``config.json`` is kept. Labels live in ONE file
outside the run folders, ``sample_logs/corpus_labels.json``. Onset windows come from what was injected
(fault step, checkpoint the resumed process started from) or from the run's own measured events, with the
definitions ``make_samples.py`` uses in its ``EXPECTED`` table:

* ``lr_schedule_reset``: ``[c + 1, c + 1]`` where ``c`` is the checkpoint the second process resumed from;
* ``data_batch``: ``[fault_step, fault_step]`` (fully padded batch, NaN loss);
* ``overflow``: ``[1, first skipped step]`` (the lr is too high from step 1; the first skip is the last
  acceptable onset);
* ``update_scale_growth``: ``[1, s]``, ``s`` the step from which the 20-step mean loss stays above the paired
  healthy run's (same seed, size, length) by more than 0.1 nats to the end; when it never does, the first step
  the attention logit max passes the paired healthy run's whole-run maximum.

Usage::

    python sample_logs/make_corpus.py                 # the whole corpus, 2 runs at a time
    python sample_logs/make_corpus.py --only ov_s3_d64  # one run (labels of the others are kept)
    python sample_logs/make_corpus.py --list           # the run plan, without training
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import make_samples as ms  # noqa: E402  (the trainer, imported from this folder)

CORPUS = HERE / "corpus"
LABELS = HERE / "corpus_labels.json"

PROFILE_KEYS: dict[str, set[str] | None] = {
    "minimal": {"step", "loss", "lr", "wall_time"},
    "standard": {"step", "loss", "lr", "grad_norm", "loss_scale", "wall_time"},
    "rich": None,  # everything
}
"""JSONL keys kept per logging profile (``None``: all)."""

MECHANISM = {
    "none": (None, []),
    "lr_schedule_reset": ("reset_to_initial", []),
    "overflow": ("activation_overflow", []),
    "data_batch": ("bad_batch", []),
    "update_scale_growth": ("lr_too_high", ["attention_logit_growth"]),
}
"""Mechanism label and acceptable alternatives per injected fault (as in make_samples.EXPECTED)."""


@dataclass
class Spec:
    """One corpus run: its name, the fault, the config overrides and how its logs are filtered.

    Attributes:
        name: Folder name under ``sample_logs/corpus``.
        fault: A ``make_samples.FAULTS`` value.
        overrides: ``make_samples.Config`` fields set on top of the committed run's config for the fault.
        profile: ``minimal``, ``standard`` or ``rich``.
        fmt: ``jsonl``, ``tb`` or ``both``.
        pair: For ``update_scale_growth``: the name of the healthy run with the same seed, size and length.
    """

    name: str
    fault: str
    overrides: dict[str, Any]
    profile: str
    fmt: str
    pair: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


PROFILES = ("minimal", "standard", "rich")
FORMATS = ("jsonl", "tb", "both")


def plan() -> list[Spec]:
    """The corpus plan: 10 healthy runs and 8 runs of each of the four faults.

    Returns:
        The specs, deterministic. Profile and format are assigned by cycling so that every fault sees
        every profile and format.
    """
    specs: list[Spec] = []
    sizes = (32, 48, 64)
    # healthy: the first 8 pair with the update_scale_growth runs (same seed, size, length)
    for i in range(10):
        seed, d = 11 + i, sizes[i % 3]
        steps = (150, 200, 250, 300)[i % 4]
        ov: dict[str, Any] = {"seed": seed, "d_model": d, "steps": steps, "warmup": 30}
        if i in (8, 9):  # two fp16 healthy runs (loss scaling active, nothing wrong)
            ov["precision"] = "fp16"
        specs.append(Spec(f"healthy_s{seed}_d{d}", "none", ov, "", ""))
    for i in range(8):
        h = specs[i]
        lr = (0.06, 0.04, 0.08, 0.05)[i % 4]
        ov = {**h.overrides, "lr": lr, "clip": 0.0}
        specs.append(Spec(f"usg_s{ov['seed']}_d{ov['d_model']}", "update_scale_growth", ov, "", "", pair=h.name))
    for i in range(8):
        seed, d = 31 + i, sizes[(i + 1) % 3]
        steps = (200, 250, 300)[i % 3]
        crash = (140, 180, 200, 120, 130, 260, 90, 170)[i]
        ov = {"seed": seed, "d_model": d, "steps": steps, "warmup": 30, "crash_step": crash,
              "checkpoint_every": 50}
        if i in (3, 6):
            ov["precision"] = "fp16"
        specs.append(Spec(f"lrreset_s{seed}_d{d}", "lr_schedule_reset", ov, "", ""))
    for i in range(8):
        seed, d = 41 + i, sizes[(i + 2) % 3]
        lr = {32: 0.3, 48: 0.2, 64: 0.15}[d]
        ov = {"seed": seed, "d_model": d, "steps": 300, "lr": lr}
        specs.append(Spec(f"overflow_s{seed}_d{d}", "overflow", ov, "", ""))
    for i in range(8):
        seed, d = 51 + i, sizes[i % 3]
        steps = (150, 200, 250)[i % 3]
        fstep = (70, 105, 140, 50, 160, 210, 120, 45)[i]
        ov = {"seed": seed, "d_model": d, "steps": steps, "warmup": 30, "fault_step": fstep, "fault_len": 1,
              "corruption": "pad"}
        specs.append(Spec(f"databatch_s{seed}_d{d}", "data_batch", ov, "", ""))
    # assign profile x format independently (profile cycles fastest) per fault family
    counters: dict[str, int] = {}
    for s in specs:
        k = counters.get(s.fault, 0)
        counters[s.fault] = k + 1
        s.profile = PROFILES[k % 3]
        s.fmt = FORMATS[(k // 3 + k) % 3]
    return specs


# ---------------------------------------------------------------------------------------- running


def _config(spec: Spec) -> ms.Config:
    cfg = ms.build_config(spec.fault)
    for k, v in spec.overrides.items():
        setattr(cfg, k, v)
    return cfg


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _rolling_mean(values: list[float], n: int) -> list[float]:
    out = []
    for i in range(len(values)):
        w = values[max(0, i - n + 1) : i + 1]
        out.append(sum(w) / len(w))
    return out


def label(spec: Spec, records: list[dict[str, Any]], pair_records: list[dict[str, Any]] | None) -> dict[str, Any]:
    """Ground truth of a run from what was injected and what the run itself recorded.

    Args:
        spec: The run's spec.
        records: The full (unfiltered) ``metrics.jsonl`` records of the run, in file order.
        pair_records: For ``update_scale_growth``, the records of the paired healthy run.

    Returns:
        The label fields ``verdict, cause, mechanism, acceptable_mechanisms, onset_window, events``.
    """
    mech, alts = MECHANISM[spec.fault]
    events: dict[str, Any] = {}
    window: list[int] | None = None
    if spec.fault == "none":
        return {"verdict": "healthy", "cause": None, "mechanism": None, "acceptable_mechanisms": [],
                "onset_window": None, "events": {}}
    if spec.fault == "lr_schedule_reset":
        ck = spec.overrides["checkpoint_every"]
        c = spec.overrides["crash_step"] // ck * ck
        steps = [r["step"] for r in records]
        # the second process re-logs steps c+1..crash (none when it crashed right after a checkpoint)
        back = next((i for i in range(1, len(steps)) if steps[i] <= steps[i - 1]), len(steps[:c]))
        events = {"crash": spec.overrides["crash_step"], "checkpoint": c, "resume_first_step": steps[back],
                  "relogged_steps": spec.overrides["crash_step"] - c}
        assert steps[back] == c + 1, (spec.name, steps[back], c)
        window = [c + 1, c + 1]
    elif spec.fault == "data_batch":
        f = spec.overrides["fault_step"]
        nan = next(r["step"] for r in records if not math.isfinite(r["loss"]))
        events = {"all_padding_batch_nan_loss": nan, "batch_index": f - 1, "job_died": records[-1]["step"]}
        assert nan == f, (spec.name, nan, f)
        window = [f, f]
    elif spec.fault == "overflow":
        skip = next((r["step"] for r in records if r.get("skipped_step")), None)
        inf = next((r["step"] for r in records if not math.isfinite(r["attn_logit_max"])), None)
        nan_loss = next((r["step"] for r in records if not math.isfinite(r["loss"])), None)
        grad_only = next((r["step"] for r in records if r.get("skipped_step") and math.isfinite(r["loss"])), None)
        events = {"first_fp16_overflow_attn_logit_inf": inf, "first_skipped_step": skip,
                  "first_nonfinite_loss": nan_loss, "first_skip_with_finite_loss": grad_only,
                  "loss_scale_at_death": records[-1].get("loss_scale"), "job_died": records[-1]["step"]}
        if skip is None:
            raise RuntimeError(f"{spec.name}: no skipped step, not an overflow run")
        window = [1, skip]
        # mechanism from what the run recorded (README of make_samples: a forward value beyond fp16 range
        # before any finite-loss/inf-gradient skip is activation_overflow; gradient-only skips that walk the
        # scale down first are loss_scale_collapse). Both are accepted when both happened.
        forward = min(x for x in (inf, nan_loss, 10**9) if x is not None)
        if grad_only is not None and grad_only < forward:
            mech, alts = "loss_scale_collapse", (["activation_overflow"] if forward < 10**9 else [])
        elif grad_only is not None:
            alts = ["loss_scale_collapse"]
    elif spec.fault == "update_scale_growth":
        assert pair_records is not None
        a = _rolling_mean([r["loss"] for r in records], 20)
        b = _rolling_mean([r["loss"] for r in pair_records], 20)
        n = min(len(a), len(b))
        above = [a[i] > b[i] + 0.1 for i in range(n)]
        good = None
        for i in range(n - 1, -1, -1):
            if not above[i]:
                break
            good = i + 1
        hmax = max(r["attn_logit_max"] for r in pair_records)
        attn = next((r["step"] for r in records if r["attn_logit_max"] > hmax), None)
        events = {"loss_above_healthy_for_good": good, "attn_logit_max_above_healthy_max": attn,
                  "final_loss_gap_20": round(a[n - 1] - b[n - 1], 3)}
        hi = good if good is not None else attn
        if hi is None:
            raise RuntimeError(f"{spec.name}: no measurable departure from its healthy pair")
        window = [1, hi]
    return {"verdict": "anomaly", "cause": spec.fault, "mechanism": mech, "acceptable_mechanisms": alts,
            "onset_window": window, "events": events}


def filter_run(out: Path, profile: str, fmt: str) -> None:
    """Reduce a finished run folder to a logging profile and a format (in place).

    Args:
        out: The run folder written by ``make_samples.run``.
        profile: ``minimal``, ``standard`` or ``rich``.
        fmt: ``jsonl``, ``tb`` or ``both``.
    """
    from tensorboard.backend.event_processing.event_file_loader import RawEventFileLoader
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.summary.writer.record_writer import RecordWriter

    keys = PROFILE_KEYS[profile]
    (out / "train.log").unlink(missing_ok=True)
    (out / "expected.json").unlink(missing_ok=True)
    jl = out / "metrics.jsonl"
    if fmt == "tb":
        jl.unlink()
    elif keys is not None:
        lines = []
        for line in jl.read_text().splitlines():
            rec = json.loads(line)
            lines.append(json.dumps({k: v for k, v in rec.items() if k in keys}))
        jl.write_text("\n".join(lines) + "\n")
    tags = None if keys is None else {f"train/{k}" for k in keys}
    for ev in sorted(out.glob("events.out.tfevents.*")):
        if fmt == "jsonl":
            ev.unlink()
            continue
        if tags is None:
            continue
        raws = list(RawEventFileLoader(str(ev)).Load())
        tmp = ev.with_name(ev.name + ".tmp")
        with open(tmp, "wb") as fh:
            w = RecordWriter(fh)
            for raw in raws:
                e = Event.FromString(raw)
                if e.HasField("summary") and not all(v.tag in tags for v in e.summary.value):
                    continue
                w.write(raw)
            w.flush()
        tmp.replace(ev)


def command(spec: Spec) -> str:
    """The command that regenerates one run."""
    return f"python sample_logs/make_corpus.py --only {spec.name}"


def generate(specs: list[Spec], jobs: int = 2) -> list[dict[str, Any]]:
    """Train, label and filter ``specs`` (update_scale_growth runs wait for their healthy pair).

    Args:
        specs: The runs to make.
        jobs: Runs trained at the same time (each one thread).

    Returns:
        The label records, in ``specs`` order.
    """
    CORPUS.mkdir(exist_ok=True)
    raw: dict[str, list[dict[str, Any]]] = {}
    done: dict[str, threading.Event] = {s.name: threading.Event() for s in specs}
    labels: dict[str, dict[str, Any]] = {}
    times: dict[str, float] = {}
    all_specs = {s.name: s for s in plan()}
    tmp_root = Path(tempfile.mkdtemp(prefix="corpus_pairs_"))

    def pair_records(spec: Spec) -> list[dict[str, Any]]:
        if spec.pair in done:
            done[spec.pair].wait()
            return raw[spec.pair]
        # pair not in this batch: retrain it (deterministic) into a scratch folder
        p = all_specs[spec.pair]  # type: ignore[index]
        ms.run(_config(p), tmp_root / p.name)
        return _read_jsonl(tmp_root / p.name / "metrics.jsonl")

    def one(spec: Spec) -> None:
        out = CORPUS / spec.name
        try:
            secs = ms.run(_config(spec), out)
            recs = _read_jsonl(out / "metrics.jsonl")
            raw[spec.name] = recs
            done[spec.name].set()
            pr = pair_records(spec) if spec.fault == "update_scale_growth" else None
            lab = label(spec, recs, pr)
            filter_run(out, spec.profile, spec.fmt)
            labels[spec.name] = {
                "run": spec.name, **lab, "profile": spec.profile, "format": spec.fmt,
                "seed": spec.overrides["seed"], "config": {k: v for k, v in spec.overrides.items()},
                "command": command(spec), "steps_logged": len(recs), "train_seconds": round(secs, 1),
            }
            times[spec.name] = secs
            print(f"{spec.name}: {secs:.1f} s, window {lab['onset_window']}", file=sys.stderr, flush=True)
        except Exception as exc:  # noqa: BLE001 - report and continue with the other runs
            done[spec.name].set()
            shutil.rmtree(out, ignore_errors=True)  # no unlabelled, unfiltered folder is left behind
            print(f"{spec.name}: FAILED {exc!r}", file=sys.stderr, flush=True)

    # healthy first so that their pairs are ready early
    order = sorted(specs, key=lambda s: s.fault != "none")
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        list(pool.map(one, order))
    shutil.rmtree(tmp_root, ignore_errors=True)
    return [labels[s.name] for s in specs if s.name in labels]


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", nargs="*", help="run names to (re)make; labels of other runs are kept")
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--list", action="store_true", help="print the plan and exit")
    args = p.parse_args(argv)
    specs = plan()
    if args.list:
        for s in specs:
            print(s.name, s.fault, s.profile, s.fmt, s.overrides)
        return 0
    if args.only:
        specs = [s for s in specs if s.name in set(args.only)]
    t0 = time.time()
    new = generate(specs, args.jobs)
    old = json.loads(LABELS.read_text()) if LABELS.exists() and args.only else []
    by_name = {r["run"]: r for r in old}
    by_name.update({r["run"]: r for r in new})
    order = [s.name for s in plan()]
    LABELS.write_text(json.dumps([by_name[n] for n in order if n in by_name], indent=1) + "\n")
    print(f"{len(new)} runs in {time.time() - t0:.0f} s -> {LABELS}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
