"""RK01 (one bad rank) on real data-parallel runs the thresholds were not looked at with.

Trains, with ``sample_logs/make_rank_runs.py`` (torch.distributed, gloo, CPU), a grid of jobs: 2, 3 and 4 ranks,
seeds other than the one the thresholds were set on, other fault steps and other bad ranks, the three faults
(corrupted shard, bit flip in one rank's weights, NaN on one rank), the two negatives (every rank at an lr ramped
300x; healthy), as per-rank JSONL and as rank-prefixed stdout. Prints one line per run (expected bad rank or none,
what RK01 and the analysis found, the onset error) and the totals::

    nice -n 10 python benchmarks/rank_variants.py [--seeds 5 6] [--out DIR [--reuse]]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "sample_logs"))

import make_rank_runs as mk  # noqa: E402

from forensics.api import analyze  # noqa: E402

FAULTS = ("shard", "sdc", "nan", "lr", "healthy")
STYLES = ("jsonl", "bracket", "label")


def grid(seeds: list[int]) -> list[mk.Scenario]:
    """Every fault x world (2, 3, 4), fault steps and bad ranks varied with the seed, the log style rotated."""
    out = []
    k = 0
    for seed in seeds:
        for world in (2, 3, 4):
            for fault in FAULTS:
                step = 90 + 37 * ((seed + world + k) % 5)
                bad = (seed + k) % world
                style = STYLES[k % len(STYLES)]
                out.append(mk.Scenario(f"s{seed}_w{world}_{fault}_{style}", fault, bad, step, world, steps=280,
                                       seed=seed, style=style))
                k += 1
    return out


def main(argv: list[str] | None = None) -> int:
    """Train the grid, analyse every run, print the table and the totals."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[5, 6])
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--reuse", action="store_true", help="analyse the runs already trained under --out")
    a = ap.parse_args(argv)
    out = a.out or Path(tempfile.mkdtemp(prefix="rank_variants_"))
    t0 = time.perf_counter()
    if a.reuse:
        scenarios = [mk.Scenario(**s) for s in json.loads((out / "scenarios.json").read_text(encoding="utf-8"))]
    else:
        scenarios = mk.make(out, grid(a.seeds))
        print(f"trained {len(scenarios)} runs in {time.perf_counter() - t0:.0f} s under {out}")
    hit = miss = false = clean = 0
    errs = []
    for sc in scenarios:
        res = analyze(out / sc.name)
        rk = [f for f in res.findings if f.code == "RK01"]
        expected = sc.bad_rank if sc.fault in ("shard", "sdc", "nan") else None
        found = [f.evidence["rank"] for f in rk]
        cause_ok = (res.cause == "hardware_or_distributed") == (expected is not None)
        if expected is None:
            ok = not found and cause_ok
            clean += ok
            false += not ok
        else:
            ok = found == [expected] and cause_ok
            hit += ok
            miss += not ok
            if rk:
                errs.append(rk[0].step - sc.fault_step)
        onset = rk[0].step if rk else None
        print(f"{'ok ' if ok else 'BAD'} {sc.name:28s} expected {expected!s:4s} found {found!s:8s} onset {onset!s:5s} "
              f"(fault {sc.fault_step}) -> {res.verdict} {res.cause} {res.mechanism}")
    n_pos = hit + miss
    print(f"\nbad rank named (and the cause hardware_or_distributed): {hit}/{n_pos}; "
          f"negatives with no bad rank and another cause or healthy: {clean}/{clean + false}")
    if errs:
        print(f"onset - fault step: median {sorted(errs)[len(errs) // 2]}, max |err| {max(abs(e) for e in errs)}")
    return 0 if miss == 0 and false == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
