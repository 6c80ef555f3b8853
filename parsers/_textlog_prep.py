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

_RANK_BRACKET = r"^\[(?:rank|default|Rank)\s*(\d+)\]:\s?"
_RANK_NUM = r"^(\d{1,5}):\s"
_RANK_ANY = r"^(?:\[(?:rank|default|Rank)|[0-9]{1,5}:\s)"
_ANSI = (r"\x1b(?:\[[0-9;?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)|[@-Z\\-_])")
_US = r"[0-9]{2}/[0-9]{2}/[0-9]{4} [0-9]{2}:[0-9]{2}:[0-9]{2}"
_ISO = r"(\d{4})-(\d{2})-(\d{2})[ T](\d{2}):(\d{2}):(\d{2})(?:[.,](\d{1,6}))?"


def _clean_block(t: pl.Series) -> tuple[pl.Series, list[int | None]]:
    """:func:`parsers.lines.common.clean` over many lines at once, with each line's rank prefix.

    Returns:
        The cleaned lines and, per line, the rank of a ``[rankN]:``/``[defaultN]:``/``N: `` prefix (or None).
    """
    if t.str.contains("\x1b", literal=True).any():
        t = t.str.replace_all(_ANSI, "")
    t = t.str.strip_chars_end()
    ranks: list[int | None] = [None] * t.len()
    has = t.str.contains(_RANK_ANY).arg_true()
    if has.len() == 0:
        return t, ranks
    sub = t.gather(has)
    df = pl.DataFrame({"t": sub}).select(
        "t",
        pl.col("t").str.extract(_RANK_BRACKET, 1).cast(pl.Int64, strict=False).alias("r1"),
        pl.col("t").str.extract(_RANK_NUM, 1).cast(pl.Int64, strict=False).alias("r2"),
        pl.col("t").str.replace(_RANK_BRACKET, "").alias("c1"),
        pl.col("t").str.replace(_RANK_NUM, "").alias("c2"),
    ).select(
        pl.when(pl.col("r1").is_not_null()).then(pl.col("c1"))
        .when(pl.col("r2").is_not_null() & (pl.col("c2").str.strip_chars() != "")).then(pl.col("c2"))
        .otherwise(pl.col("t")).alias("line"),
        pl.when(pl.col("r1").is_not_null()).then(pl.col("r1"))
        .when(pl.col("r2").is_not_null() & (pl.col("c2").str.strip_chars() != "")).then(pl.col("r2"))
        .alias("rank"),
    )
    t = t.scatter(has, df.get_column("line"))
    for i, r in zip(has.to_list(), df.get_column("rank").to_list(), strict=True):
        ranks[i] = r
    return t, ranks


def _wall_times(lines: pl.Series) -> list[float | None]:
    """:func:`parsers.lines.common.wall_time` over many lines (ISO timestamps vectorised; others per line)."""
    head = lines.str.slice(0, 64)
    walls: list[float | None] = [None] * head.len()
    iso = head.str.contains(_ISO).arg_true()
    if iso.len():
        g = pl.DataFrame({"h": head.gather(iso)}).select(pl.col("h").str.extract_groups(_ISO).alias("g")).unnest("g")
        g.columns = ["y", "mo", "d", "hh", "mi", "ss", "frac"]
        stamp = pl.concat_str([pl.col("y"), pl.lit("-"), pl.col("mo"), pl.lit("-"), pl.col("d"), pl.lit(" "),
                               pl.col("hh"), pl.lit(":"), pl.col("mi"), pl.lit(":"), pl.col("ss")])
        w = g.select(
            (stamp.str.strptime(pl.Datetime("us", "UTC"), "%Y-%m-%d %H:%M:%S", strict=False).dt.epoch("s")
             .cast(pl.Float64) + pl.concat_str([pl.lit("0."), pl.col("frac")]).cast(pl.Float64, strict=False)
             .fill_null(0.0)).alias("w")).get_column("w").to_list()
        for i, v in zip(iso.to_list(), w, strict=True):
            walls[i] = v
    for i in head.str.contains(_US).arg_true().to_list():
        if walls[i] is None:
            walls[i] = common.wall_time(head[i])
    return walls



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


def prepare(pieces: list[str], small: int = SMALL) -> Prepared:
    """The column half of a block of raw pieces (lines with their ends); no reader state is read or written.

    A block of fewer than ``small`` pieces is left to the line-by-line path.
    """
    if len(pieces) < small:
        return Prepared(pieces, small=True, n_ends=sum(p.endswith("\n") for p in pieces))
    raw = pl.Series("t", pieces, dtype=pl.Utf8)
    ends = raw.str.ends_with("\n").cast(pl.Int64).to_numpy()
    lines, ranks = _clean_block(raw)
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
                  "walls": np.array(_wall_times(cl), dtype=np.float64), "pre": kv_bulk.prepare_block(cl, shape_s)}
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
