"""One metric's rows sorted by (segment, step) with each segment's bounds found once (RS01's per-resume reads).

A run with thousands of resumes must not filter every row once per resume: here "segment ``b``" is one slice,
"every segment before ``b``" a prefix of the rows, and "the earlier rows before (or from) step ``s0``" come from
one binary search in each segment that straddles ``s0`` (segments wholly on one side are taken or left by their
first and last step). Used by :mod:`forensics.resume_rows` and RS01 (``forensics/detectors/resume_state.py``).
"""

from __future__ import annotations

import numpy as np
import polars as pl


class SegmentIndex:
    """Row bounds of each segment of ``frame`` (sorted by ``segment``, then ``step``; steps non-decreasing in one).

    Attributes:
        ids: segment numbers in row order, shape (k,).
        start, end: each segment's first row and one past its last, shape (k,).
        lo, hi: each segment's first and last step, shape (k,).
        steps: the ``step`` column, shape (n,).
    """

    def __init__(self, frame: pl.DataFrame) -> None:
        """Index ``frame`` (columns ``segment`` and ``step``; empty allowed)."""
        n = frame.height
        seg = frame.get_column("segment").to_numpy() if n else np.zeros(0, np.int64)
        self.steps = frame.get_column("step").to_numpy() if n else np.zeros(0, np.int64)
        heads = np.flatnonzero(seg[1:] != seg[:-1]) + 1
        self.start = np.concatenate([[0], heads]).astype(np.int64) if n else np.zeros(0, np.int64)
        self.end = np.concatenate([heads, [n]]).astype(np.int64) if n else np.zeros(0, np.int64)
        self.ids = seg[self.start]
        self.lo, self.hi = self.steps[self.start], self.steps[np.maximum(self.end - 1, 0)]

    def position(self, seg: int) -> int:
        """How many segments come before ``seg`` (its position when present)."""
        return int(np.searchsorted(self.ids, seg, side="left"))

    def rows(self, seg: int) -> tuple[int, int]:
        """(first row, one past the last) of segment ``seg``; an empty range when it has no row."""
        k = self.position(seg)
        if k < self.ids.size and self.ids[k] == seg:
            return int(self.start[k]), int(self.end[k])
        return 0, 0

    def below(self, seg: int) -> int:
        """The number of rows of the segments before ``seg`` (they are the first rows)."""
        k = self.position(seg)
        return int(self.end[k - 1]) if k else 0

    def _cut(self, j: int, s0: int) -> int:
        """The first row of segment position ``j`` whose step is ``s0`` or more."""
        a, b = int(self.start[j]), int(self.end[j])
        if self.lo[j] >= s0:
            return a
        if self.hi[j] < s0:
            return b
        return a + int(np.searchsorted(self.steps[a:b], s0, side="left"))

    def before(self, k: int, s0: int, n: int, ok: np.ndarray | None = None) -> np.ndarray:
        """Row numbers (ascending) of the last ``n`` rows with a step below ``s0`` in the first ``k`` segments.

        ``ok``: a bool per row; only those rows count (and are returned). The walk goes back from segment
        ``k - 1`` over segments that have such a row and stops once ``n`` are found.
        """
        cand = np.flatnonzero(self.lo[:k] < s0)
        parts: list[np.ndarray] = []
        got = 0
        for j in cand[::-1].tolist():
            a = int(self.start[j])
            r = np.arange(a, self._cut(j, s0), dtype=np.int64)
            if ok is not None:
                r = r[ok[r]]
            parts.append(r[-(n - got):])
            got += parts[-1].size
            if got >= n:
                break
        return np.concatenate(parts[::-1]) if parts else np.zeros(0, np.int64)

    def from_step(self, k: int, s0: int) -> np.ndarray:
        """Row numbers (ascending) of the rows with a step of ``s0`` or more in the first ``k`` segments."""
        segs = np.flatnonzero(self.hi[:k] >= s0)
        if not segs.size:
            return np.zeros(0, np.int64)
        first = self.start[segs].copy()
        for i in np.flatnonzero(self.lo[segs] < s0).tolist():  # only the segments that straddle s0 are searched
            first[i] = self._cut(int(segs[i]), s0)
        lens = self.end[segs] - first
        shift = np.repeat(first - np.concatenate([[0], np.cumsum(lens)[:-1]]), lens)
        return shift + np.arange(int(lens.sum()), dtype=np.int64)
