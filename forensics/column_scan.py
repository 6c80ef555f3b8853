"""Numpy views of a frame's long columns, a slice at a time, and the blocked transpose that groups a wide log.

:mod:`forensics.metric_rows` reads the metric codes, steps, segments and values of a 50M-row frame through these,
so that no whole-column numpy copy is made before the one grouped array. Imports nothing from the project.
"""

from __future__ import annotations

import numpy as np
import polars as pl
import pyarrow as pa

TRANSPOSE_BLOCK = 256
"""Records per block of the transpose that groups a wide log's rows by metric (our choice, measured at 1M records x
50 metrics: 256 records 0.09 s, 2,048 0.13 s, a whole-column transpose ~0.4 s)."""
SCAN_ROWS = 1 << 20
"""Rows of a frame column turned into numpy at a time when the layout is found and a wide log is grouped (our
choice: a few MB of temporaries, reused, instead of whole-column copies: at 50M rows a fresh 400 MB array cost up
to ~1 s of page faults on a loaded machine)."""


def no_huge_page_advice() -> None:
    """Stop numpy from advising the kernel to back each array of 4 MiB or more with huge pages (this process).

    With the kernel's usual ``transparent_hugepage/defrag = madvise``, a page fault in such an array may first
    compact memory; the analysis makes many 8-80 MB temporaries (1M points), and at 1M steps x 50 metrics the
    advice cost 0.4-0.5 s of a 2.4 s analysis (``benchmarks/bench_jsonl.py --issue17``). A user who sets
    ``NUMPY_MADVISE_HUGEPAGE`` keeps their choice. Never raises (an older or newer numpy without the switch).
    """
    import os

    if "NUMPY_MADVISE_HUGEPAGE" in os.environ:
        return
    try:
        from numpy._core import multiarray

        multiarray._set_madvise_hugepage(False)
    except (ImportError, AttributeError):
        pass


def empty_buffer(n: int, dtype: np.dtype) -> np.ndarray:
    """A writable numpy array of ``n`` ``dtype`` items in memory from Arrow's pool, like the frame's own columns.

    Not numpy's allocator: numpy asks the kernel for huge pages on every array of 4 MB or more, and on a loaded
    machine the kernel then compacts memory before it hands a page out (measured here: 0.07 to 0.93 s CPU for a
    fresh 400 MB array, against a steady ~0.12 s from Arrow's pool; at 1M x 50 the grouped values are 400 MB).
    """
    return np.frombuffer(pa.allocate_buffer(n * np.dtype(dtype).itemsize), dtype=dtype)


def transpose_into(grid: np.ndarray, r0: int, rows: np.ndarray) -> None:
    """``grid[:, r0 + r] = rows[r]`` block by block (a block fits the cache: several times faster than a transpose)."""
    for r in range(0, rows.shape[0], TRANSPOSE_BLOCK):
        block = rows[r:r + TRANSPOSE_BLOCK]
        grid[:, r0 + r:r0 + r + block.shape[0]] = block.T


def scan_step(period: int) -> int:
    """Rows per slice of a scan: about :data:`SCAN_ROWS`, a whole number of records of ``period`` rows."""
    return max(1, SCAN_ROWS // max(period, 1)) * max(period, 1)


def slices(col: pl.Series, step: int | None = None):  # noqa: ANN202 - a generator of (offset, numpy slice)
    """``(offset, rows)`` of a polars column, ``step`` (:data:`SCAN_ROWS`) rows at a time, as numpy (no whole copy)."""
    step = step or SCAN_ROWS
    for a in range(0, col.len(), step):
        yield a, col.slice(a, step).to_numpy()
