"""Local segments of a JSONL file's records (:mod:`parsers.jsonl`): where an appended resume starts."""

from __future__ import annotations

import numpy as np


class _Segmenter:
    """Local segments of one stream's records, block by block.

    A record starts a new segment when its step is below the previous record's, or equals it and logs
    a tag already logged at that step since the segment began (an appended resume). Records without
    rows take no part. Vectorised; only runs of equal steps that repeat a tag are walked in Python.
    """

    def __init__(self) -> None:
        self.last: int | None = None  # step of the last record so far
        self.tags: set[int] = set()  # tags logged at that step since the current segment began
        self.seg = 0
        self._same = np.zeros(0, np.int32)  # read-only: blocks without a new segment share slices of it

    def _constant(self, n: int) -> np.ndarray:
        """int32[n] of the current segment: a slice of one array, rebuilt when the segment changes or n outgrows it."""
        held = len(self._same)
        if held < n or self._same[0] != self.seg:
            self._same = np.full(max(n, 2 * held if held < n else held), self.seg, np.int32)
            self._same.flags.writeable = False
        return self._same[:n]

    def __call__(self, s: np.ndarray, counts: np.ndarray, tag: np.ndarray) -> np.ndarray:
        """int32 segment per row, from int64 step and row count (> 0) per record and int32 tag per row."""
        first = np.cumsum(counts) - counts
        brk, same = np.zeros(len(s), bool), np.zeros(len(s), bool)
        brk[1:], same[1:] = s[1:] < s[:-1], s[1:] == s[:-1]
        if self.last is not None:
            brk[0], same[0] = s[0] < self.last, s[0] == self.last
        new_run = ~same
        new_run[0] = True
        bounds = np.r_[np.flatnonzero(new_run), len(s)]  # runs of records at one step
        run = np.cumsum(new_run) - 1
        walk = {0} if same[0] else set()  # run 0 continues the last block's run
        multi = same.copy()
        multi[:-1] |= same[1:]
        if multi[1:].any():  # the rows of the records that share a step with a neighbour (few, most logs)
            recs = np.flatnonzero(multi)
            lens = counts[recs]
            rows = np.repeat(first[recs] - (np.cumsum(lens) - lens), lens) + np.arange(int(lens.sum()))
            width = int(tag.max()) + 1
            combo = np.sort(np.repeat(run[recs].astype(np.int64), lens) * width + tag[rows])
            walk.update(np.unique(combo[1:][combo[1:] == combo[:-1]] // width).tolist())
        last_run = len(bounds) - 2
        final: set[int] | None = None
        for r in sorted(walk):
            seen = set(self.tags) if r == 0 and same[0] else set()
            for ri in range(int(bounds[r]), int(bounds[r + 1])):
                tags = set(tag[first[ri]:first[ri] + counts[ri]].tolist())
                if seen & tags:
                    brk[ri], seen = True, tags
                else:
                    seen |= tags
            if r == last_run:
                final = seen
        if final is None:
            final = set(tag[first[bounds[last_run]]:].tolist())
        self.last, self.tags = int(s[-1]), final
        if not brk.any():  # no new segment in this block (the common log): a slice of one shared array
            return self._constant(int(counts.sum()))
        seg = self.seg + np.cumsum(brk)
        self.seg = int(seg[-1])
        return np.repeat(seg.astype(np.int32), counts)
