"""Speed of our W&B transaction-log reader against a plain pass with wandb's own protobuf classes.

Writes (once, cached in the temp folder) a real offline run with the installed wandb SDK
(``WANDB_MODE=offline``, no network): ``--steps`` steps (default 50,000) of loss / lr / grad_norm /
a nested ``opt/scale``. Then times (CPU seconds, best of ``--repeat``):

- ``parsers.wandb_run.read``: block/chunk walk with CRC checks, our protobuf wire decoder, JSON values,
  Arrow tables (what ``forensics ingest`` runs);
- the same chunk walk alone (payloads collected, nothing decoded);
- wandb's ``wandb_internal_pb2.Record.ParseFromString`` over those same payloads (upb or C++ backend),
  and that pass plus pulling every numeric history value out (``float(item.value_json)``).

wandb is needed only to write the file and for the reference pass. The ratio printed is our full read
over (our chunk walk + the reference pass with value extraction): both end with the numbers.

Usage: ``python benchmarks/bench_wandb.py [--steps N] [--repeat R]``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from parsers import wandb_log  # noqa: E402
from parsers import wandb_run as wb  # noqa: E402

WRITER = r'''
import sys, wandb
run = wandb.init(project="bench", id="bench01", config={"lr": 3e-4})
for s in range(int(sys.argv[1])):
    wandb.log({"loss": 2.0 / (1 + s) + 1e-7 * s, "lr": 3e-4 * min(1.0, s / 1000), "grad_norm": 1.0 + (s % 13) / 7,
               "opt": {"scale": 2.0 ** (s % 9)}}, step=s)
run.finish()
'''


def make_file(steps: int) -> Path:
    """Write (or reuse) an offline run of ``steps`` steps; returns its ``run-*.wandb`` path."""
    folder = Path(tempfile.gettempdir()) / f"forensics_bench_wandb_{steps}"
    found = sorted(folder.glob("wandb/*run-*/run-*.wandb"))
    if found:
        return found[0]
    folder.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env.update(WANDB_MODE="offline", WANDB_DIR=str(folder), WANDB_SILENT="true", WANDB_DISABLE_GIT="true")
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", WRITER, str(steps)], env=env, cwd=folder, check=True)
    print(f"wrote {steps} steps with wandb offline in {time.perf_counter() - t0:.1f} s")
    return sorted(folder.glob("wandb/*run-*/run-*.wandb"))[0]


def best(fn, repeat: int) -> tuple[float, object]:
    """Best CPU time in s of ``repeat`` calls, and the last result.

    ``time.process_time`` is steadier than wall time on a shared machine; the work is single-threaded.
    """
    t, out = float("inf"), None
    for _ in range(repeat):
        t0 = time.process_time()
        out = fn()
        t = min(t, time.process_time() - t0)
    return t, out


def main() -> None:
    """Print seconds, MB/s and ratios."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=50_000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    path = make_file(args.steps)
    root = path.parents[2]
    data = path.read_bytes()
    mb = len(data) / 1e6
    t_ours, res = best(lambda: wb.read(path, root), args.repeat)
    print(f"file: {path} ({mb:.1f} MB), records by type: {res.meta['records']}")
    print(f"ours, full read:          {t_ours:7.3f} s  {mb / t_ours:6.1f} MB/s  "
          f"{res.metrics.num_rows} rows, steps {res.meta['first_step']}..{res.meta['last_step']}")

    def walk() -> list[bytes]:
        payloads: list[bytes] = []
        wandb_log.walk(data, path.name, payloads.append, [])
        return payloads

    t_walk, payloads = best(walk, args.repeat)
    print(f"ours, chunk walk + CRC:   {t_walk:7.3f} s  {mb / t_walk:6.1f} MB/s  {len(payloads)} records")
    try:
        from google.protobuf.internal import api_implementation
        from wandb.proto import wandb_internal_pb2 as pb
    except ImportError as exc:
        print(f"wandb protobuf classes not importable ({exc}); no reference pass")
        return

    def parse_only() -> int:
        for p in payloads:
            pb.Record().ParseFromString(p)
        return len(payloads)

    def parse_values() -> int:
        n = 0
        for p in payloads:
            r = pb.Record()
            r.ParseFromString(p)
            if r.WhichOneof("record_type") == "history":
                for it in r.history.item:
                    try:
                        float(it.value_json)
                        n += 1
                    except ValueError:
                        pass
        return n

    t_pb, _ = best(parse_only, args.repeat)
    t_pbv, n_vals = best(parse_values, args.repeat)
    impl = api_implementation.Type()
    print(f"wandb pb ParseFromString: {t_pb:7.3f} s  ({impl} backend, same payloads, walk not included)")
    print(f"wandb pb + history values:{t_pbv:7.3f} s  {n_vals} values (incl. _step/_runtime/_timestamp)")
    print(f"ratio ours / (walk + pb + values): {t_ours / (t_walk + t_pbv):.2f}x;  "
          f"ours / pb parse only: {t_ours / t_pb:.2f}x")


if __name__ == "__main__":
    main()
