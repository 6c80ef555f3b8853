"""Blocks of lines for the text reader: cleaned with polars, metric candidates sorted by shape, bulk or one by one.

A line that may be a metric line (:data:`parsers.lines.kv.CANDIDATE`) is reduced to its *shape*
(:data:`parsers.lines.kv_bulk.SHAPE`). The first line of each shape goes through the framework modules
and the general reader one by one (:meth:`parsers._textlog_asm.Assembler.line`); when the general reader
took it, every later line of that shape is read in bulk by :func:`parsers.lines.kv_bulk.read_block` (a
framework module's trap is never bypassed: its shapes are never bulk-read). Script source is counted, a
repeated line shape that nothing takes is counted without being read again.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import numpy as np
import polars as pl

from parsers import _textlog_bulk
from parsers._textlog_prep import SMALL, Prepared, prepare
from parsers.lines import common, hf_bar, kv, kv_bulk

if TYPE_CHECKING:
    from parsers._textlog_asm import Assembler


BLOCK = 1 << 16  # lines per block: memory stays bounded, polars' kernels stay busy
_EVENT = re.compile(common.EVENT_ANY)


class _Text:
    """The lines of a block as Python strings, made only where a line is read one by one.

    Made at once for the ``eager`` lines, on demand for the others (most metric lines are read in bulk
    and never need one).
    """

    def __init__(self, lines: pl.Series, eager: pl.Series) -> None:
        self.lines = lines
        self.text = np.empty(lines.len(), dtype=object)
        if eager.len():
            self.text[eager.to_numpy()] = lines.gather(eager).to_list()

    def __getitem__(self, i: int) -> str:
        v = self.text[i]
        if v is None:
            v = self.text[i] = self.lines[int(i)]
        return v


class _Eventish:
    """Per line of a block: may it be an event line (:data:`parsers.lines.common.EVENT_ANY`)?

    Scanned in one column operation for the lines that are not metric candidates; a candidate line
    (most of them are read in bulk and never asked) is scanned when asked.
    """

    def __init__(self, lines: pl.Series, cand: pl.Series, text: _Text, rest_eventish: np.ndarray) -> None:
        self.text = text
        self.cand = cand.to_numpy()
        self.known = np.zeros(lines.len(), dtype=bool)
        self.known[~self.cand] = rest_eventish  # the scan of the other lines, made with the block's column half

    def __getitem__(self, i: int) -> bool:
        if self.cand[i]:
            return bool(_EVENT.search(self.text[i].strip()))
        return bool(self.known[i])


class Reader:
    """Feeds blocks of lines to the assembler: the general reader's lines in bulk, the rest one by one.

    A line that may be a metric line (:data:`parsers.lines.kv.CANDIDATE`) is reduced to its *shape* (digits
    replaced). The first line of each shape goes through the framework modules and the general reader
    one by one; when the general reader took it, every later line of that shape is read in bulk by
    :func:`parsers.lines.kv.parse_block` (a framework module's trap is never bypassed: its shapes are
    never bulk-read). A long run of such lines becomes rows without a Python loop over them
    (:meth:`_Assembler.bulk_frame`); a short run, or one with rank prefixes, goes through
    :meth:`_Assembler.bulk`.
    """

    LONG_RUN = 48
    SMALL = SMALL

    def __init__(self, asm: Assembler) -> None:
        self.asm = asm
        self.owned: dict[str, bool] = {}
        self.inert: dict[str, str] = {}
        self.plans: dict[str, kv_bulk.Plan | None] = {}

    def block(self, pieces: list[str], lineno: int) -> int:
        """Read one block of raw pieces (lines with their ends) starting at line number ``lineno``."""
        return self.consume(self.prepare(pieces), lineno)

    def prepare(self, pieces: list[str]) -> Prepared:
        """The block's column half (:func:`parsers._textlog_prep.prepare`: reads no state; any thread)."""
        return prepare(pieces, small=self.SMALL)

    def consume(self, prep: Prepared, lineno: int) -> int:
        """Read a prepared block in file order, from line number ``lineno``; returns the line number after it."""
        if not prep.pieces:
            return lineno
        if prep.small:  # a short file: per line is faster than setting up the column kernels
            linenos = []
            for p in prep.pieces:
                linenos.append(lineno)
                lineno += p.endswith("\n")
            return self.small(prep.pieces, linenos, lineno)
        linenos = (prep.rel_linenos + lineno).tolist()
        lineno += prep.n_ends
        lines, ranks, cand_mask, rest = prep.lines, prep.ranks, prep.cand_mask, prep.rest
        n = lines.len()
        asm = self.asm
        text = _Text(lines, rest)
        eventish = _Eventish(lines, cand_mask, text, prep.eventish_rest)
        skip_code = (prep.code & ~cand_mask).to_numpy()
        self._other = (text, linenos, ranks, eventish, skip_code, _Text(prep.all_shapes, rest))
        if prep.cand is None:
            for i in range(n):
                self.other(i)
            asm.hint = None
            if asm.hf_dicts:  # HF Trainer dicts seen: the tqdm bars that date them
                self._bars(lines, linenos)
            return lineno
        plan = self._candidates(n, prep.cand_idx, prep.cand, ranks)
        self._ctx = (text, linenos, ranks, plan["walls"], plan["line_df"], plan["met_df"])
        self._eventish = eventish
        self._steps: dict[int, int | None] | None = None
        self._walk(n, plan)
        asm.hint = None
        if asm.hf_dicts:
            self._bars(lines, linenos)
        return lineno

    def _bars(self, lines: pl.Series, linenos: list[int]) -> None:
        bars = hf_bar.bars_in(lines, linenos)
        if bars is not None:
            self.asm.bars.append(bars)

    def _candidates(self, n: int, cand_idx: pl.Series, cand: dict, ranks: list) -> dict:
        """The block's candidate lines: read in bulk, their shapes, which of them go one by one."""
        codes, uniq_list = cand["codes"], cand["uniq"].to_list()
        owned = self.owned
        own = np.array([(1 if owned[u] else 0) if u in owned else -1 for u in uniq_list], dtype=np.int8)
        cand_np = cand_idx.to_numpy().astype(np.int64)
        pos_arr = np.full(n, -1, dtype=np.int64)
        pos_arr[cand_np] = np.arange(cand_np.shape[0])
        first_pos = np.unique(codes, return_index=True)[1]
        first_pos = first_pos[own[codes[first_pos]] == -1]
        per_line = np.ones(n, dtype=bool)
        per_line[cand_np] = False
        per_line[cand_np[first_pos]] = True
        line_df, met_df = kv_bulk.read_block(cand["cl"], cand["shape_s"], self.asm.state, self.plans, pre=cand["pre"])
        gl = pl.Series(cand_np, dtype=pl.UInt32)  # positions in ``cl`` -> indices in the block
        line_df = line_df.with_columns(pl.col("line").map_batches(lambda c: gl.gather(c), return_dtype=pl.UInt32))
        met_df = met_df.with_columns(pl.col("line").map_batches(lambda c: gl.gather(c), return_dtype=pl.UInt32))
        walls = np.full(n, np.nan)
        walls[cand_np] = cand["walls"]
        return {"codes": codes, "uniq": uniq_list, "own": own, "pos": pos_arr, "walls": walls,
                "per_idx": np.flatnonzero(per_line).tolist(), "line_df": line_df, "met_df": met_df}

    def _walk(self, n: int, plan: dict) -> None:
        """The block in order: runs of known shapes in bulk (:meth:`gap`), the other lines one by one."""
        asm = self.asm
        text, linenos, ranks = self._ctx[:3]
        codes, own, pos_arr = plan["codes"], plan["own"], plan["pos"]
        pos = 0
        for j in [*plan["per_idx"], n]:
            if j > pos:
                self.gap(pos, j, own[codes[pos_arr[pos:j]]] == 1)
            if j < n:
                k = pos_arr[j]
                if k < 0:
                    self.other(j)
                    pos = j + 1
                    continue
                asm.rank = ranks[j]
                asm.hint = (True, self._eventish[j])
                mod = asm.line(text[j], linenos[j])
                if own[codes[k]] == -1:
                    own[codes[k]] = 1 if mod is kv else 0
                    self.owned[plan["uniq"][codes[k]]] = mod is kv
            pos = j + 1

    def small(self, pieces: list[str], linenos: list[int], lineno: int) -> int:
        """A block too short for the column kernels: every line one by one (the same rules, the same rows)."""
        asm = self.asm
        asm.hint = None
        cleaned = [common.clean_rank(p) for p in pieces]
        joined = kv.join_continuations([c[0] for c in cleaned])
        for (_, rank), line, ln in zip(cleaned, joined, linenos, strict=True):
            asm.rank = rank
            if asm.tb is None and asm.dump is None and kv.is_code(line) and not kv.is_candidate(line):
                asm.skip_counts["script source"] += 1
                continue
            asm.line(line, ln)
        if asm.hf_dicts:
            self._bars(pl.Series("t", joined, dtype=pl.Utf8), linenos)
        return lineno

    def other(self, i: int) -> None:
        """A line that is not a metric candidate: script source is counted; a repeated inert shape skipped.

        A shape is *inert* when its first line, read one by one with no dump or traceback open, changed
        nothing (no record, event or open dump: no module and no rule took it) and the block's event scan
        says no event; later lines of that shape are then counted under the same reason, not re-read.
        """
        asm = self.asm
        text, linenos, ranks, eventish, skip_code, shapes = self._other
        idle = asm.tb is None and asm.dump is None
        if skip_code[i] and idle:
            asm.skip_counts["script source"] += 1
            return
        sh = shapes[i]
        if idle and not eventish[i]:
            why = self.inert.get(sh)
            if why is not None:
                asm.skip_counts[why] += 1
                return
        asm.rank = ranks[i]
        asm.hint = (False, eventish[i])
        before = (len(asm.rows), len(asm.rows.events), len(asm.meta), len(asm.configs), len(asm.state),
                  sum(asm.skip_counts.values()))
        counts = dict(asm.skip_counts)
        mod = asm.line(text[i], linenos[i])
        after = (len(asm.rows), len(asm.rows.events), len(asm.meta), len(asm.configs), len(asm.state))
        if (mod is None and idle and not eventish[i] and asm.tb is None and asm.dump is None
                and after == before[:5]):
            grew = [k for k, v in asm.skip_counts.items() if v != counts.get(k, 0)]
            why = grew[0] if grew else "no metric, event or configuration"
            if not grew:
                asm.skip_counts[why] += 1
            self.inert[sh] = why

    def _items(self, lo: int, hi: int) -> list:
        """The metric lines ``lo..hi-1`` as :meth:`_Assembler.bulk` items."""
        text, linenos, ranks, walls, line_df, met_df = self._ctx
        if self._steps is None:
            self._steps = dict(zip(line_df.get_column("line").to_list(),
                                   zip(line_df.get_column("step").to_list(), line_df.get_column("ep").to_list(),
                                       strict=True), strict=True))
            self._cols = (met_df.get_column("line").to_numpy(), met_df.get_column("metric").to_list(),
                          met_df.get_column("tag").to_list(), met_df.get_column("value").to_list())
        steps = self._steps
        ml, mm, mt, mv = self._cols
        a, b = np.searchsorted(ml, [lo, hi])
        out = []
        k = int(a)
        for x in range(lo, hi):
            if x not in steps:
                continue
            k0 = k
            while k < b and ml[k] == x:
                k += 1
            w = walls[x]
            out.append((steps[x][0], list(zip(mm[k0:k], mt[k0:k], mv[k0:k], strict=True)),
                        None if w != w else float(w), ranks[x], steps[x][1]))
        return out

    def gap(self, a: int, b: int, ok: np.ndarray) -> None:
        """Lines ``a..b-1``: candidates whose shape was seen before; bulk where the general reader owns it."""
        asm = self.asm
        text, linenos, ranks, walls, line_df, met_df = self._ctx
        # runs of equal ``ok``
        edges = np.flatnonzero(np.diff(ok.astype(np.int8))) + 1
        starts = [0, *edges.tolist()]
        ends = [*edges.tolist(), len(ok)]
        for s0, e0 in zip(starts, ends, strict=True):
            lo, hi = a + s0, a + e0
            if not ok[s0] or asm.tb is not None:
                for i in range(lo, hi):
                    asm.rank = ranks[i]
                    asm.hint = (True, self._eventish[i])
                    asm.line(text[i], linenos[i])
                continue
            if asm.dump is not None:
                asm.end_dump(linenos[lo])
            if hi - lo >= self.LONG_RUN and ranks[lo:hi].count(None) == hi - lo:  # no rank prefix (C loop)
                ld = line_df.filter((pl.col("line") >= lo) & (pl.col("line") < hi))
                md = met_df.filter((pl.col("line") >= lo) & (pl.col("line") < hi))
                if _textlog_bulk.bulk_frame(asm, ld, md, walls[lo:hi], lo):
                    continue
            _textlog_bulk.bulk(asm, self._items(lo, hi))
