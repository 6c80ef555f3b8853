"""Text-log reading speed: parsers.textlog.read vs a plain ``re`` loop and vs the previous reader, as ratios.

The file: N lines of five real shapes (modded-nanogpt ``step:N/M train_loss:X``, DeepSpeed-Chat
``epoch: 0|step: N|act_loss: X``, detectron2 ``iter: N  total_loss: X``, mmengine
``Iter(train) [N/M]  loss: X``, ``step=N loss=X`` scripts), all read by the general reader
(parsers/lines/kv.py), after a 64 KiB script dump. The plain loop is what a user would write: one
compiled ``re`` over each line, ``float()`` on each value, rows appended to lists; our reader also
finds segments, events and names. Each reader is timed three times on the same file in the same run
and the best time counts (a shared machine's load only ever adds time).

    python benchmarks/bench_textlog.py [N_LINES] [--before REV|none]
    python benchmarks/bench_textlog.py --files LOG [LOG ...]   # real logs, e.g. ../shared/realruns/*/*/*.log

``--before REV`` also times the text reader of git revision REV (default ``f2fe6a6``, the last one before
the general reader) on the same file in a subprocess (``--before none``: not). Printed: microseconds per
line, the ratio to the plain loop, and the speed-up over the fixed 60 us/line baseline of issue 13.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tarfile
import tempfile
import time
from io import BytesIO
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from parsers import textlog  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
BASELINE_US = 60.0
"""Microseconds per line of the text reader before the general reader (issue 13's "today's ~60 us per line")."""


def make(path: Path, n: int) -> None:
    """Write ``n`` metric lines of five real shapes after a 64 KiB script dump (what modded-nanogpt logs)."""
    with path.open("w") as fh:
        fh.write("import torch\n" + "".join(f"def f{i}(x):\n    return x * {i}\n" for i in range(2500)))
        for i in range(n):
            loss = 3 + 1 / (i + 1)
            k = i % 5
            if k == 0:  # modded-nanogpt
                fh.write(f"step:{i}/{n} train_loss:{loss:.4f} train_time:{i * 12}ms step_avg:12.01ms\n")
            elif k == 1:  # DeepSpeed-Chat step 3
                fh.write(f"epoch: 0|step: {i}|ppo_ep: 1|act_loss: {loss:.6f}|cri_loss: {loss / 3:.6f}|"
                         "unsuper_loss: 0.0\n")
            elif k == 2:  # detectron2 stdout
                fh.write(f"[12/01 10:00:00 d2.utils.events]:  eta: 0:10:00  iter: {i}  total_loss: {loss:.3f}  "
                         f"loss_cls: {loss / 2:.3f}  loss_box_reg: {loss / 4:.3f}  time: 0.5012  data_time: 0.0103  "
                         f"lr: 0.00025  max_mem: 2500M\n")
            elif k == 3:  # mmengine
                fh.write(f"2024/01/01 10:00:00 - mmengine - INFO - Iter(train) [{i}/{n}]  lr: 1.0000e-04  "
                         f"eta: 1:00:00  time: 0.5012  data_time: 0.0103  memory: 5000  loss: {loss:.4f}  "
                         f"loss_cls: {loss / 2:.4f}\n")
            else:  # key=value scripts
                fh.write(f"step={i} loss={loss:.5f} lr=3e-4 grad_norm={0.5 + i % 7 / 10:.3f} tokens_per_sec=1.2K\n")


_PLAIN = re.compile(r"([A-Za-z_][\w/]*)(?:\([a-z]+\))?[:= ]\s*\[?([-+]?\d+(?:\.\d+)?(?:e[-+]?\d+)?)")


def plain(path: Path) -> int:
    """The loop a user would write: one compiled ``re`` per line, floats appended to lists."""
    steps, names, values = [], [], []
    with path.open() as fh:
        for line in fh:
            pairs = _PLAIN.findall(line)
            step = next((int(float(v)) for k, v in pairs if k in ("step", "iter", "Iter")), None)
            if step is None:
                continue
            for k, v in pairs:
                steps.append(step)
                names.append(k)
                values.append(float(v))
    return len(values)


def before(path: Path, rev: str, tmp: Path) -> tuple[float, float] | None:
    """``(wall, CPU)`` seconds the text reader of git revision ``rev`` takes on ``path`` (None: no git checkout)."""
    try:
        blob = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "parsers", "forensics"],
                              check=True, capture_output=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    old = tmp / "before"
    with tarfile.open(fileobj=BytesIO(blob)) as tf:
        tf.extractall(old, filter="data")
    code = ("import sys, time; from pathlib import Path; from parsers import textlog; p = Path(sys.argv[1]); "
            "w = Path(sys.argv[2]); textlog.read(w, w.parent); "
            "ts = []\ncs = []\nfor _ in range(3):\n    t = time.perf_counter(); c = time.process_time(); "
            "textlog.read(p, p.parent); ts.append(time.perf_counter() - t); cs.append(time.process_time() - c)\n"
            "print(min(ts), min(cs))")
    warm = tmp / "warm.log"
    argv = [sys.executable, "-c", code, str(path.resolve()), str(warm.resolve())]
    env = {**os.environ, "PYTHONPATH": str(old)}
    out = subprocess.run(argv, check=True, capture_output=True, text=True, env=env,
                         cwd=old).stdout  # cwd too: ``-c`` puts the working folder first on sys.path
    wall, cpu = out.strip().splitlines()[-1].split()
    return float(wall), float(cpu)


def files(paths: list[str], rev: str) -> None:
    """Per real log: us per line now and at ``rev`` (same run, best of three each), rows, the speed-up."""
    with tempfile.TemporaryDirectory() as d:
        warm = Path(d) / "warm.log"
        make(warm, 200)
        textlog.read(warm, warm.parent)
        for f in paths:
            p = Path(f)
            n = sum(1 for _ in p.open("rb"))
            best = float("inf")
            for _ in range(3):
                t = time.perf_counter()
                r = textlog.read(p, p.parent)
                best = min(best, time.perf_counter() - t)
            got = before(p, rev, Path(d))
            old = got[0] if got else None
            ratio = f"{old / best:5.1f}x" if old else "  n/a"
            was = old / n * 1e6 if old else float("nan")
            print(f"{p.parent.name[:34]:34s} {n:7d} lines  now {best / n * 1e6:7.2f} us/line "
                  f"({r.metrics.num_rows} rows)  at {rev}: {was:7.2f} us/line  speed-up {ratio}")


def main() -> None:
    """Time both readers on one file and print the ratios."""
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    rev = "f2fe6a6"
    if "--before" in sys.argv:
        rev = sys.argv[sys.argv.index("--before") + 1]
        args = [a for a in args if a != rev]
    if "--files" in sys.argv:
        files(sys.argv[sys.argv.index("--files") + 1:], rev)
        return
    n = int(args[0]) if args else 300_000
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "train.log"
        make(path, n)
        warm = Path(d) / "warm.log"  # both readers first read a small file: imports are not timed
        make(warm, 200)
        textlog.read(warm, warm.parent)
        t_plain, t_ours, c_plain, c_ours = (float("inf"),) * 4
        for _ in range(3):  # the best of three: a shared machine's load only ever adds time
            t, c = time.perf_counter(), time.process_time()
            rows = plain(path)
            t_plain, c_plain = min(t_plain, time.perf_counter() - t), min(c_plain, time.process_time() - c)
            t, c = time.perf_counter(), time.process_time()
            r = textlog.read(path, path.parent)
            t_ours, c_ours = min(t_ours, time.perf_counter() - t), min(c_ours, time.process_time() - c)
        ours = r.metrics.num_rows
        t_before = before(path, rev, Path(d))
    us = t_ours / n * 1e6
    print(f"{n} metric lines after a 64 KiB script dump")
    print(f"plain re loop      : {t_plain:6.2f} s  {t_plain / n * 1e6:6.2f} us/line  {rows} values")
    print(f"parsers.textlog    : {t_ours:6.2f} s  {us:6.2f} us/line  {ours} rows (segments, events, names too)")
    print(f"ratio ours / plain re loop    : {t_ours / t_plain:.2f}x  (below 1: faster than the loop)")
    print(f"CPU time (all threads)        : plain {c_plain / n * 1e6:.2f} us/line, ours {c_ours / n * 1e6:.2f} us/line "
          f"(ratio {c_ours / c_plain:.2f}x; less sensitive to a loaded machine than wall time)")
    print(f"vs the {BASELINE_US:.0f} us/line baseline : {BASELINE_US / us:.1f}x faster in wall time, "
          f"{BASELINE_US / (c_ours / n * 1e6):.1f}x in CPU time (issue 13 asks for 10x; idle: wall <= CPU)")
    if t_before is not None:
        (tb, cb) = t_before
        print(f"reader at {rev:8s}: {tb:6.2f} s  {tb / n * 1e6:6.2f} us/line (CPU {cb / n * 1e6:.2f})   "
              f"speed-up now: {tb / t_ours:.1f}x wall, {cb / c_ours:.1f}x CPU (same file, same run)")


if __name__ == "__main__":
    main()
