"""Global segments of a run: which files form one group, and the segment offset of each file.

The files of one *group* are put in time order, and a file whose first step is at or below the
previous file's last step starts a new segment (a resume that went back); a file that continues
forward stays in the segment, except a text log: each stdout file is one launch, so a later one is a
new segment even when its steps continue (with a ``restart`` event naming the file boundary). Groups:
TensorBoard files of the whole run form chains of files that follow one another in time
(``version_0``, ``version_1``, ... of one job; writers running at the same time, like Keras
``train/`` and ``validation/``, are separate chains); W&B transaction logs are grouped by run id (each
``offline-run-*`` folder of the run, a resume, is a new segment); a file in a Lightning logger folder
(``version_0/metrics.csv``, ``version_1/metrics.csv``, ... of one ``lightning_logs/NAME``: one folder per
launch) is grouped with its namesakes in the sibling version folders, and each is a new segment, like
a text log; other formats are grouped by (format, folder). Each group numbers its segments from 0.
"""

from __future__ import annotations

import math
import re
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from forensics.model import ParseResult
from parsers.rank_files import RANKS
from parsers.walk import natural

_SEG0 = pa.Array.from_buffers(pa.int32(), 1, [None, pa.py_buffer(np.zeros(1, np.int32))])[0]
"""Local segment 0 as an Arrow scalar (``pc.equal(seg, 0)`` converts the 0 with ``pa.scalar``, which imports pandas)."""


def bounds(pr: ParseResult) -> dict[str, Any]:
    """First wall time, last wall time, first step (local segment 0), last step (last local segment)."""
    t = pr.metrics
    if t.num_rows == 0:
        return {"rows": 0, "segments": 0}
    seg = t.column("segment")
    low, high = pc.min_max(seg).as_py().values()
    n_local = high + 1
    step = t.column("step")
    one = low == high == 0 and not seg.null_count  # every row in local segment 0: no filter (a copy of the column)
    first = step if one else step.filter(pc.equal(seg, _SEG0))  # the step column only, not the whole table
    last = step if n_local == 1 else step.filter(pc.equal(seg, pa.scalar(high, seg.type)))
    walls = pc.min_max(t.column("wall_time")).as_py()
    first_wall, last_wall = (w if w is not None and math.isfinite(w) else None for w in walls.values())
    return {"rows": t.num_rows, "segments": n_local, "first_wall": first_wall, "last_wall": last_wall,
            "first_step": pc.min(first).as_py() if len(first) else None,
            "last_step": pc.max(last).as_py(),
            "one_step": len(set(pc.min_max(step).as_py().values())) == 1}  # one step only (no hash of 50M rows)


_VERSION_DIR = re.compile(r"version_\d+")
"""A Lightning logger's folder of one launch (``CSVLogger``/``TensorBoardLogger``: ``version_{n}``)."""

LAUNCHES = "launches:"
"""Group-key prefix of files of which each is one launch (a later one is a new segment)."""


def _plain_group(fmt: str, rel: str) -> str:
    """Group key of a non-TensorBoard, non-W&B file: its folder, or its chain of version folders."""
    parent, _, name = rel.rpartition("/")
    above, _, leaf = parent.rpartition("/")
    if _VERSION_DIR.fullmatch(leaf):
        return f"{LAUNCHES}{fmt}:{above or '.'}/version_*/{name}"
    return f"{fmt}:{parent or '.'}"


def _order_key(item: tuple[str, ParseResult, dict]) -> tuple:
    rel, _, b = item
    wall = b.get("first_wall")
    return (wall is None, wall or 0.0, natural(rel))


def groups_of(items: list[tuple[str, ParseResult, dict]]) -> dict[str, str]:
    """Group key of each source (see the module docstring)."""
    out: dict[str, str] = {}
    chains: list[dict[str, Any]] = []
    for rel, pr, b in sorted(items, key=_order_key):
        parent = rel.rpartition("/")[0]
        if pr.format == "wandb" and pr.meta.get("run_id"):
            out[rel] = f"wandb:{pr.meta['run_id']}"  # one W&B run: its offline-run-* folders, one per resume
            continue
        if pr.format == "mlflow" and pr.meta.get("store") == "file":
            out[rel] = f"mlflow:{rel}"  # one file per metric key of a run: a sibling file is no resume
            continue
        if pr.format != "tensorboard":
            out[rel] = _plain_group(pr.format, rel)
            continue
        if b["rows"] == 0 or b.get("first_wall") is None or ("hparams" in pr.meta and b["one_step"]):
            out[rel] = f"tensorboard:{rel}"  # no rows, or an add_hparams side file: on its own
            continue
        free = [c for c in chains if c["end"] <= b["first_wall"]]
        same = [c for c in free if c["dir"] == parent]
        pick = max(same or free, key=lambda c: c["end"], default=None)
        if pick is None:
            pick = {"id": len(chains), "end": b["first_wall"], "dir": parent}
            chains.append(pick)
        pick["end"], pick["dir"] = max(pick["end"], b["last_wall"] or pick["end"]), parent
        out[rel] = f"tensorboard#{pick['id']}"
    return out


def offsets_of(items: list[tuple[str, ParseResult, dict]], groups: dict[str, str],
             continued: dict[str, tuple[int, int]]) -> dict[str, int]:
    """Global segment offset of each source: local segment + offset = global segment.

    A text log that follows another one of its folder is a new launch, so a new segment, even when its
    steps continue forward; such files are put in ``continued`` (rel -> (previous last step, first step))
    and get a ``restart`` event.
    """
    offsets: dict[str, int] = {}
    continued.clear()
    state: dict[str, tuple[int, int]] = {}  # group -> (global segment of the last file's end, its last step)
    base: dict[str, int] = {}  # group -> global segment of its first file's start
    for rel, _, b in sorted(items, key=_order_key):
        g = groups[rel]
        prev = state.get(g)
        if b["rows"] == 0:
            offsets[rel] = prev[0] if prev else 0
            continue
        if prev is None:
            off = 0
        elif g.startswith(RANKS):  # per-rank files of one run (parsers.rank_files): ranks, never restarts
            off = base[g]
        elif g.startswith("wandb:"):  # each W&B run folder of a run id is a new process (a resume)
            off = prev[0] + 1
        elif g.startswith(("textlog:", LAUNCHES)):  # each stdout file (version folder) is one launch
            off = prev[0] + 1
            if b["first_step"] is not None and b["first_step"] > prev[1]:
                continued[rel] = (prev[1], b["first_step"])
        else:
            off = prev[0] + 1 if b["first_step"] is None or b["first_step"] <= prev[1] else prev[0]
        offsets[rel] = off
        base.setdefault(g, off)
        state[g] = (off + b["segments"] - 1, b["last_step"])
        if prev is not None and g.startswith(RANKS):
            state[g] = (max(state[g][0], prev[0]), max(state[g][1], prev[1]))
    return offsets
