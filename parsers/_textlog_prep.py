"""The column half of a text-log block: everything about its lines that needs no reader state.

:func:`prepare` cleans a block of raw lines and finds, with polars column kernels (which release the GIL),
its metric candidates, their shapes, their number tokens and their wall times; the assembler's half
(:meth:`parsers._textlog_block.Reader.consume`) then reads the block in file order with the file's state.
Because :func:`prepare` touches no state, :class:`Pipeline` runs it for block i + 1 on a worker thread while
block i is assembled (``benchmarks/bench_textlog.py``: the two halves overlap on a second core).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl

from parsers.lines import common, kv, kv_bulk

SMALL = 2000
"""A block of fewer lines is read line by line: setting up the column kernels costs more than they save."""


@dataclass
class Prepared:
    """One block's column half (see :func:`prepare`); ``small``: the raw pieces of a short block instead."""

    pieces: list[str]
    small: bool = False
    n_ends: int = 0
    rel_linenos: np.ndarray | None = None
    lines: pl.Series | None = None
    ranks: list[int | None] | None = None
    code: pl.Series | None = None
    cand_mask: pl.Series | None = None
    cand_idx: pl.Series | None = None
    rest: pl.Series | None = None
    all_shapes: pl.Series | None = None
    eventish_rest: np.ndarray | None = None
    cand: dict[str, Any] | None = None


def prepare(pieces: list[str], clean: Callable, walls: Callable, small: int = SMALL) -> Prepared:
    """The column half of a block of raw pieces (lines with their ends); no reader state is read or written.

    ``clean`` and ``walls`` are :func:`parsers._textlog_block._clean_block` and ``_wall_times``; a block of
    fewer than ``small`` pieces is left to the line-by-line path.
    """
    if len(pieces) < small:
        return Prepared(pieces, small=True, n_ends=sum(p.endswith("\n") for p in pieces))
    raw = pl.Series("t", pieces, dtype=pl.Utf8)
    ends = raw.str.ends_with("\n").cast(pl.Int64).to_numpy()
    lines, ranks = clean(raw)
    if lines.str.contains(kv.CONTINUATION).any():  # indented ``key=value`` lines under a step line
        lines = pl.Series("t", kv.join_continuations(lines.to_list()), dtype=pl.Utf8)
    code = lines.str.contains(kv.CODE)
    cand_mask = lines.str.contains(kv.CANDIDATE) & ~code
    cand_idx = cand_mask.arg_true()
    rest = (~cand_mask).arg_true()
    eventish_rest = (lines.gather(rest).str.strip_chars().str.contains(common.EVENT_ANY).to_numpy()
                     if rest.len() else np.zeros(0, bool))
    all_shapes = lines.str.replace_all(kv_bulk.SHAPE, "#")
    p = Prepared(pieces, n_ends=int(ends.sum()), rel_linenos=np.cumsum(ends) - ends, lines=lines, ranks=ranks,
                 code=code, cand_mask=cand_mask, cand_idx=cand_idx, rest=rest, all_shapes=all_shapes,
                 eventish_rest=eventish_rest)
    if cand_idx.len():
        cl = lines.gather(cand_idx)
        shape_s = all_shapes.gather(cand_idx)
        uniq = shape_s.unique(maintain_order=True)
        codes = shape_s.replace_strict(uniq, pl.Series(range(uniq.len()), dtype=pl.Int64)).to_numpy()
        p.cand = {"cl": cl, "shape_s": shape_s, "uniq": uniq, "codes": codes,
                  "walls": np.array(walls(cl), dtype=np.float64), "pre": kv_bulk.prepare_block(cl, shape_s)}
    return p


class Pipeline:
    """Blocks in file order: block i + 1's :func:`prepare` on a worker thread while block i is assembled.

    The first block is prepared here (a one-block file starts no thread); from the second on, a worker
    thread prepares one block ahead (at most two blocks are held). :meth:`drain` assembles what is pending
    and returns the line number after it. The assembler's results are those of the sequential order.
    """

    def __init__(self, prep: Callable[[list[str]], Prepared], consume: Callable[[Prepared, int], int],
                 lineno: int) -> None:
        self.prep, self.consume, self.lineno = prep, consume, lineno
        self.pending: Future | list[str] | None = None
        self.pool: ThreadPoolExecutor | None = None
        self._stack = contextlib.ExitStack()

    def submit(self, pieces: list[str]) -> None:
        """Queue one block (its pieces are not used by the caller afterwards)."""
        if self.pending is None:
            self.pending = pieces
            return
        if self.pool is None:
            from parsers._gil import short_gil_turns

            self._stack.enter_context(short_gil_turns())
            self.pool = self._stack.enter_context(ThreadPoolExecutor(1, thread_name_prefix="textlog"))
        ahead = self.pool.submit(self.prep, pieces)
        self._assemble()
        self.pending = ahead

    def _assemble(self) -> None:
        done = self.pending
        self.pending = None
        if done is None:
            return
        self.lineno = self.consume(done.result() if isinstance(done, Future) else self.prep(done), self.lineno)

    def close(self) -> None:
        """Stop the worker without assembling what is pending (the read failed)."""
        if isinstance(self.pending, Future):
            self.pending.cancel()
        self.pending = None
        self._stack.close()
        self.pool = None

    def drain(self) -> int:
        """Assemble the pending block, stop the worker; returns the line number after the last block."""
        try:
            self._assemble()
        finally:
            self.close()
        return self.lineno
