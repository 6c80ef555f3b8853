"""Real data-parallel runs with one bad rank (and the two negatives), trained with torch.distributed (gloo, CPU).

Every scenario is a real data-parallel job: W processes, each with its own data shard (its own sampler seed), a
tiny MLP classifier broadcast from rank 0 at the start, and each step: the local forward and backward, the local
grad norm, an ``all_reduce`` of the gradients (averaged), one AdamW step. Each rank logs its OWN loss and its own
(pre-reduce) grad norm, as a per-rank JSONL file (``metrics_rank{r}.jsonl`` with a ``rank`` key) or as
rank-prefixed stdout lines (``[rank3]: ...`` like torchrun's, or ``3: ...`` like ``srun --label``), appended
line by line to one ``train.log``. The faults:

* ``shard``: from step ``fault_step`` the bad rank reads a corrupted data shard (its labels are noise): its local
  loss and grad norm leave the others', and its gradients still enter the all-reduce;
* ``sdc``: at ``fault_step`` a silent data corruption on the bad rank's device flips an exponent bit in a block
  of the output weight matrix
  (the weights of the ranks are no longer the same, which data parallelism never checks): its loss departs;
* ``nan``: from ``fault_step`` the bad rank's batches hold a NaN: its loss is NaN; it drops its gradient
  from the all-reduce (a non-finite guard), so the other ranks stay finite;
* ``lr``: no bad rank; from ``fault_step`` the lr of EVERY rank ramps to 300x: all ranks diverge together;
* ``healthy``: no fault; each rank's loss differs from the others' only by its shard's noise.

All scenarios of one launch share the same W processes (one torch import, one process group; a 2-rank scenario
uses a subgroup of ranks 0 and 1), so a whole set takes a few seconds. Used by ``tests/test_rank_departure.py``
(under a time budget) and by ``benchmarks/rank_variants.py`` (other seeds, fault steps, rank counts)::

    nice -n 10 python sample_logs/make_rank_runs.py OUT_DIR [--seed 0]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path


@dataclass(frozen=True)
class Scenario:
    """One run: its folder name, fault, bad rank, fault step, ranks, steps, seed and log style."""

    name: str
    fault: str = "healthy"  # shard | sdc | nan | lr | healthy
    bad_rank: int = 2
    fault_step: int = 200
    world: int = 4
    steps: int = 300
    seed: int = 0
    style: str = "jsonl"  # jsonl | bracket ("[rank3]: ") | label ("3: ")
    lr: float = 3e-3


def default_set(seed: int = 0) -> list[Scenario]:
    """The scenarios the tests read: the three faults, both negatives, 2 ranks, both stdout styles."""
    return [
        Scenario("shard4", "shard", 2, 180, 4, seed=seed),
        Scenario("sdc4", "sdc", 1, 150, 4, seed=seed),
        Scenario("nan4", "nan", 3, 220, 4, seed=seed),
        Scenario("lr4", "lr", 0, 150, 4, seed=seed),
        Scenario("healthy4", "healthy", 0, 0, 4, seed=seed),
        Scenario("shard2", "shard", 1, 160, 2, seed=seed),
        Scenario("healthy2", "healthy", 0, 0, 2, seed=seed),
        Scenario("titan_shard4", "shard", 3, 200, 4, seed=seed, style="bracket"),
        Scenario("label_healthy4", "healthy", 0, 0, 4, seed=seed, style="label"),
    ]


START_METHOD = "fork" if sys.platform == "linux" else "spawn"
"""Forked workers share the parent's imported torch (a spawned one imports it again: ~2 s CPU each)."""
IN, HIDDEN, CLASSES, BATCH = 16, 32, 8, 32
"""The model and batch (tiny: a step takes about a millisecond on one CPU thread)."""
LR_RAMP = 300.0
"""The ``lr`` scenario's final lr factor: AdamW at 300x a working lr diverges within ~100 steps."""
SDC_BITS = 2.0 ** 8
"""The ``sdc`` scenario's corruption: weights scaled by 2^8 (an exponent bit flipped)..."""
SDC_UNITS = 8
"""...in the output weights of this many hidden units (a corrupted block of the last matrix)."""


def _run(sc: Scenario, out: Path, rank: int, group) -> None:  # noqa: ANN001 - a torch process group
    import torch
    import torch.distributed as dist

    if rank >= sc.world:
        return
    torch.manual_seed(1000 + sc.seed)  # the same teacher and initial model on every rank
    teacher = torch.randn(IN, CLASSES)
    model = torch.nn.Sequential(torch.nn.Linear(IN, HIDDEN), torch.nn.Tanh(), torch.nn.Linear(HIDDEN, CLASSES))
    for p in model.parameters():
        dist.broadcast(p.data, src=0, group=group)
    opt = torch.optim.AdamW(model.parameters(), lr=sc.lr, weight_decay=0.0)
    gen = torch.Generator().manual_seed(7919 * (sc.seed + 1) + rank)  # this rank's data shard
    bad = sc.fault in ("shard", "sdc", "nan") and rank == sc.bad_rank
    folder = out / sc.name
    folder.mkdir(parents=True, exist_ok=True)
    log = open(folder / (f"metrics_rank{rank}.jsonl" if sc.style == "jsonl" else "train.log"),  # noqa: SIM115
               "a", buffering=1, encoding="utf-8")
    for step in range(1, sc.steps + 1):
        x = torch.randn(BATCH, IN, generator=gen)
        y = (x @ teacher + 0.5 * torch.randn(BATCH, CLASSES, generator=gen)).argmax(1)
        if bad and sc.fault == "shard" and step >= sc.fault_step:
            y = torch.randint(0, CLASSES, (BATCH,), generator=gen)  # corrupted shard: labels are noise
            x = x * 3.0
        if bad and sc.fault == "nan" and step >= sc.fault_step:
            x[0, 0] = float("nan")
        if bad and sc.fault == "sdc" and step == sc.fault_step:
            with torch.no_grad():
                model[2].weight[:, :SDC_UNITS].mul_(SDC_BITS)
        lr = sc.lr
        if sc.fault == "lr" and step >= sc.fault_step:
            lr = sc.lr * min(LR_RAMP, 1.0 + (LR_RAMP - 1.0) * (step - sc.fault_step) / 50)
        for g in opt.param_groups:
            g["lr"] = lr
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        grads = [p.grad for p in model.parameters()]
        gnorm = float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads])))
        finite = bool(torch.isfinite(loss)) and all(bool(torch.isfinite(g).all()) for g in grads)
        if not finite:
            for g in grads:
                g.zero_()  # a non-finite guard: this rank's gradient is left out of the average
        flat = torch.cat([g.reshape(-1) for g in grads] + [torch.tensor([1.0 if finite else 0.0])])
        dist.all_reduce(flat, group=group)
        n_ok = max(float(flat[-1]), 1.0)
        off = 0
        for g in grads:
            g.copy_(flat[off:off + g.numel()].view_as(g) / n_ok)
            off += g.numel()
        opt.step()
        value = float(loss.detach())
        _write(log, sc, rank, step, value, gnorm, lr)
    log.close()


def _write(log, sc: Scenario, rank: int, step: int, loss: float, gnorm: float, lr: float) -> None:  # noqa: ANN001
    if sc.style == "jsonl":
        rec = {"step": step, "rank": rank, "loss": loss, "grad_norm": gnorm, "lr": lr}
        log.write(json.dumps(rec) + "\n")  # NaN/Infinity as Python's json writes them
        return
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()) + ",000"
    if sc.style == "bracket":  # torchrun --tee / torchtitan
        log.write(f"[rank{rank}]:[titan] {stamp} - root - INFO - step: {step:4d}  loss: {loss:7.4f}  "
                  f"grad_norm: {gnorm:7.4f}  memory:  0.01GiB(0.10%)  tps: 1,000  tflops: 0.00  mfu: 0.00%\n")
    else:  # srun --label / Megatron-style labels
        log.write(f"{rank}: step={step} loss={loss:.5f} grad_norm={gnorm:.5f} lr={lr:.3e}\n")


def _worker(rank: int, world: int, out: str, scenarios: list[dict], port: int) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    groups: dict[int, object] = {}
    for w in sorted({s["world"] for s in scenarios}):
        groups[w] = dist.new_group(list(range(w)))  # every rank takes part in creating every group
    for s in scenarios:
        sc = Scenario(**s)
        _run(sc, Path(out), rank, groups[sc.world])
        dist.barrier()
    dist.destroy_process_group()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def make(out: Path, scenarios: list[Scenario]) -> list[Scenario]:
    """Train every scenario into ``out/<name>/`` (one launch of max-world processes); returns the scenarios.

    Raises:
        RuntimeError: A worker process failed.
    """
    import torch.multiprocessing as mp

    world = max(s.world for s in scenarios)
    out.mkdir(parents=True, exist_ok=True)
    mp.start_processes(_worker, args=(world, str(out), [asdict(s) for s in scenarios], _free_port()),
                       nprocs=world, join=True, start_method=START_METHOD)
    (out / "scenarios.json").write_text(json.dumps([asdict(s) for s in scenarios], indent=1), encoding="utf-8")
    return scenarios


def main(argv: list[str] | None = None) -> int:
    """Train :func:`default_set` into OUT_DIR (``--seed`` picks the data shards and the model)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    t0 = time.perf_counter()
    make(a.out, default_set(a.seed))
    print(f"{a.out}: {len(default_set())} runs in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
