"""Text-log reading speed: parsers.textlog.read vs a plain ``re`` loop over the same file, as a ratio.

The file: N lines of the shapes custom scripts print (``step:N/M train_loss:X train_time:Xms``,
``step N | loss X | lr X | grad_norm X``, ``iter N: loss X, time Xms``), every shape the general reader
(parsers/lines/kv.py) owns, after a 64 KiB script dump. The plain loop is what a user would write: one
compiled ``re`` over each line, ``float()`` on each value, rows appended to lists. Our reader also finds
segments, events and names. Before the general reader (commit f2fe6a6) the text reader took about 60 us per
line on such files; the figure printed here is per line now.

    python benchmarks/bench_textlog.py [N_LINES]
"""

from __future__ import annotations

import re
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from parsers import textlog  # noqa: E402


def make(path: Path, n: int) -> None:
    with path.open("w") as fh:
        fh.write("import torch\n" + "".join(f"def f{i}(x):\n    return x * {i}\n" for i in range(2500)))
        for i in range(n):
            k = i % 3
            if k == 0:
                fh.write(f"step:{i}/{n} train_loss:{3 + 1 / (i + 1):.4f} train_time:{i * 12}ms step_avg:12.01ms\n")
            elif k == 1:
                fh.write(f"step {i} | loss {3 + 1 / (i + 1):.4f} | lr 3.0e-04 | grad_norm {0.5 + i % 7 / 10:.3f}\n")
            else:
                fh.write(f"iter {i}: loss {3 + 1 / (i + 1):.4f}, time {100 + i % 5:.2f}ms\n")


_PLAIN = re.compile(r"([A-Za-z_][\w/]*)[:= ]\s*([-+]?\d+(?:\.\d+)?(?:e[-+]?\d+)?)")


def plain(path: Path) -> int:
    steps, names, values = [], [], []
    with path.open() as fh:
        for line in fh:
            pairs = _PLAIN.findall(line)
            if not pairs or pairs[0][0] not in ("step", "iter"):
                continue
            step = int(float(pairs[0][1]))
            for k, v in pairs[1:]:
                steps.append(step)
                names.append(k)
                values.append(float(v))
    return len(values)


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 300_000
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "train.log"
        make(path, n)
        t = time.perf_counter()
        rows = plain(path)
        t_plain = time.perf_counter() - t
        t = time.perf_counter()
        r = textlog.read(path, path.parent)
        t_ours = time.perf_counter() - t
        ours = r.metrics.num_rows
    print(f"{n} metric lines after a 64 KiB script dump")
    print(f"plain re loop      : {t_plain:6.2f} s  {t_plain / n * 1e6:6.2f} us/line  {rows} values")
    print(f"parsers.textlog    : {t_ours:6.2f} s  {t_ours / n * 1e6:6.2f} us/line  {ours} rows "
          f"(segments, events, names too)")
    print(f"ratio ours / plain : {t_ours / t_plain:.2f}x   speed-up vs ~60 us/line before: {60 / (t_ours / n * 1e6):.1f}x")


if __name__ == "__main__":
    main()
