"""The text columns (``metric``, ``tag``, ``run``, ``source``) of a JSONL file's long table (:mod:`parsers.jsonl`).

A trainer log repeats one pattern of keys on most lines (an eval line every N steps breaks it). Rows of
a run of records that log the dominant pattern are slices of one tiled string array kept per pattern and
shared by every block: no per-row string work, no copy per block. Only the other records' rows are taken
from the per-tag names.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

MIN_RUN_SHARE = 0.5
"""The dominant pattern is tiled when its records hold at least this share of a block's rows (else one
``take`` for the block costs less than its pieces)."""


def constant(n: int, text: str) -> pa.Array:
    """``n`` copies of ``text`` as a string array, built from buffers (no Python loop).

    A block holds at most a few million rows, so ``n * len(text)`` stays within int32 offsets.
    """
    raw = text.encode()
    offsets = np.arange(n + 1, dtype=np.int32) * np.int32(len(raw)) if raw else np.zeros(n + 1, np.int32)
    return pa.StringArray.from_buffers(n, pa.py_buffer(offsets), pa.py_buffer(raw * n))


def tiled(names: pa.Array, pattern: np.ndarray, reps: int) -> pa.Array | None:
    """The strings ``names[pattern]`` repeated ``reps`` times, built from buffers (None: past int32 offsets)."""
    raw = [v.encode("utf-8", "surrogatepass") for v in names.take(pa.array(pattern, pa.int32())).to_pylist()]
    data = b"".join(raw)
    if len(data) * reps >= 1 << 31:
        return None
    offsets = np.zeros(len(raw) + 1, np.int64)
    np.cumsum([len(b) for b in raw], out=offsets[1:])
    full = (offsets[:-1][None, :] + np.arange(reps, dtype=np.int64)[:, None] * len(data)).ravel()
    full = np.append(full, len(data) * reps).astype(np.int32)
    return pa.StringArray.from_buffers(len(full) - 1, pa.py_buffer(full), pa.py_buffer(data * reps))


def _dominant(tag: np.ndarray, counts: np.ndarray, first: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """(pattern int32[k], bool per record: it logs exactly that pattern) of the most common row count, or None."""
    k = int(np.bincount(counts).argmax())
    is_k = counts == k
    cand = np.flatnonzero(is_k)
    if k == 0 or k * len(cand) < MIN_RUN_SHARE * len(tag):
        return None
    pattern = tag[first[cand[0]]:first[cand[0]] + k]
    if len(cand) == len(counts):  # every record logs k rows: no gather
        same = (tag.reshape(-1, k) == pattern).all(axis=1)
    else:
        same = np.zeros(len(counts), bool)
        same[cand] = (tag[np.repeat(is_k, counts)].reshape(-1, k) == pattern).all(axis=1)
    if k * int(same.sum()) < MIN_RUN_SHARE * len(tag):
        return None
    return pattern, same


def text_runs(tiles: dict[bytes, tuple[pa.Array, pa.Array]], names: pa.Array, metrics: pa.Array, tag: np.ndarray,
              counts: np.ndarray) -> list[tuple[int, int, pa.Array, pa.Array]]:
    """``(row start, row end, metric, tag)`` string arrays covering the rows ``tag`` in order.

    Args:
        tiles: Tiled (metric, tag) arrays per pattern (``pattern.tobytes()``), kept across blocks.
        names: Tag names by tag id.
        metrics: Canonical metric names by tag id.
        tag: int32 tag id per row, grouped by record.
        counts: int64 rows per record (each > 0).
    """
    n = len(tag)
    first = np.cumsum(counts) - counts
    dom = _dominant(tag, counts, first) if n else None
    if dom is not None:
        pattern, same = dom
        k, key = len(pattern), pattern.tobytes()
        edges = np.flatnonzero(np.diff(np.r_[0, same.astype(np.int8), 0]))  # runs of records logging the pattern
        longest = int((edges[1::2] - edges[::2]).max()) * k
        have = tiles.get(key)
        if have is None or len(have[0]) < longest:
            reps = max(longest // k, 2 * len(have[0]) // k if have is not None else 0)
            made = tiled(metrics, pattern, reps), tiled(names, pattern, reps)
            if made[0] is not None and made[1] is not None:
                have = tiles[key] = made  # type: ignore[assignment]
        if have is not None and len(have[0]) >= longest:
            return _pieces(have, names, metrics, tag, first, edges, k)
    idx = pa.array(tag, pa.int32())
    return [(0, n, pc.take(metrics, idx), pc.take(names, idx))]


def _pieces(tile: tuple[pa.Array, pa.Array], names: pa.Array, metrics: pa.Array, tag: np.ndarray, first: np.ndarray,
            edges: np.ndarray, k: int) -> list[tuple[int, int, pa.Array, pa.Array]]:
    """The runs (record ``edges``: start, end, start, end, ...) as tile slices, the rows between by ``take``."""
    out: list[tuple[int, int, pa.Array, pa.Array]] = []
    bounds = np.r_[first, len(tag)]
    at = 0
    for r0, r1 in zip(edges[::2].tolist(), edges[1::2].tolist(), strict=True):
        lo, hi = int(bounds[r0]), int(bounds[r1])
        if lo > at:
            idx = pa.array(tag[at:lo], pa.int32())
            out.append((at, lo, pc.take(metrics, idx), pc.take(names, idx)))
        out.append((lo, hi, tile[0].slice(0, hi - lo), tile[1].slice(0, hi - lo)))
        at = hi
    if at < len(tag):
        idx = pa.array(tag[at:], pa.int32())
        out.append((at, len(tag), pc.take(metrics, idx), pc.take(names, idx)))
    return out
