"""Rows of the general reader's metric lines read in bulk, with the assembler's rules (:mod:`parsers._textlog_asm`).

:func:`bulk` takes items one line at a time (short runs, rank-prefixed lines); :func:`bulk_frame` takes a
long run as arrays, without a Python loop over its lines: a step that goes back on its own counter opens
a segment (:func:`_breaks`), a line without a step belongs to the last step seen, a non-finite loss is a
``nan_detected`` event.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np
import polars as pl
import pyarrow as pa

from forensics.schema import METRICS_SCHEMA
from parsers._textlog_asm import counter
from parsers.lines import dedupe_canonical, kv

if TYPE_CHECKING:
    from parsers._textlog_asm import Assembler


def bulk(asm: Assembler, lines: list[tuple[int | None, list, float | None, int | None, bool]]) -> None:
    """Metric lines read by the general reader (:mod:`parsers.lines.kv`) in bulk, in file order.

    Each item is ``(step or None, [(metric, tag, value)], wall_time, rank, step is the epoch)``; the rules are those of
    :meth:`metrics` for a general line (a step that goes back opens a segment; a line without a step
    belongs to the last step seen; another rank's lines are counted, not kept).
    """
    rows = asm.rows
    for step, mets, wall, rank, ep in lines:
        asm.rank = rank
        if ep and asm.finer:  # an epoch-indexed line among finer steps belongs to the last step seen
            step = None
        elif step is not None and not ep:
            asm.finer = True
        explicit = step is not None
        if step is None:
            step = asm.any_step
            if step is None:
                asm.skip_counts["metric line before any step"] += 1
                continue
        ctr = counter("generic", mets)
        if explicit and asm.went_back(step, ctr):
            asm.brk()
        mets = asm.rank_rows(step, dedupe_canonical(mets))
        if not mets:
            continue
        for name, tag, v in mets:
            if v is not None and not math.isfinite(v) and kv.is_objective(name):
                asm.event("nan_detected", kv.nonfinite_message(tag, v), step)
        rows.extend(asm.segment, step, mets, wall)
        asm.frameworks["generic"] += len(mets)
        asm.seg_rows += len(mets)
        if explicit:
            asm.set_last(step, ctr)
        asm.any_step = step
    if lines:
        asm.activity = True
        asm.launch_open = False
        asm.block_kinds.clear()
        asm.last_ckpt = None


def bulk_frame(asm: Assembler, lines: pl.DataFrame, mets: pl.DataFrame, walls: np.ndarray, lo: int) -> bool:
    """A long run of general metric lines without rank prefixes, as arrays (the rules of :meth:`bulk`).

    Args:
        asm: The file's assembler.
        lines: ``line``, ``step`` (null: the last step seen) per metric line, in line order.
        mets: ``line``, ``metric``, ``tag``, ``value`` per metric, in line order.
        walls: Wall time (NaN: none) of every line of the run; ``walls[0]`` is line ``lo``.
        lo: The run's first line.

    Returns:
        False (nothing done) when a line names one metric twice: :meth:`bulk` then handles the run.
    """
    if lines.height == 0:
        return True
    if lines.get_column("dup").any():
        return False
    line_no = lines.get_column("line").to_numpy().astype(np.int64)
    st = lines.get_column("step")
    explicit = _explicit(asm, st.is_not_null().to_numpy(), lines.get_column("ep").to_numpy())
    steps = st.fill_null(-1).to_numpy().astype(np.int64)
    brk, last = _breaks(asm, steps, explicit, lines.get_column("sig"))
    filled, have = _fill_steps(asm, steps, explicit, brk)
    seg = (np.cumsum(brk) + asm.segment).astype(np.int32)
    # per metric row: the row of its line
    ml = mets.get_column("line").to_numpy().astype(np.int64)
    row = np.searchsorted(line_no, ml)
    keep = have[row]
    names, tags = _names(mets.get_column("metric")), _names(mets.get_column("tag"))
    vals = mets.get_column("value").to_numpy()
    if not keep.all():  # lines before any step: no rows (usually none)
        row, ml, vals = row[keep], ml[keep], vals[keep]
        names, tags = names.filter(pa.array(keep)), tags.filter(pa.array(keep))
    n = int(row.shape[0])
    _add(asm, chunk(asm.rows.source, seg[row], filled[row], names, vals, walls[ml - lo], tags))
    _nonfinite_events(asm, names, tags, vals, seg[row], filled[row])
    n_brk = int(brk.sum())
    asm.segment += n_brk
    if n_brk:
        asm.seg_rows = int((seg[row] == asm.segment).sum())
        asm.last = {}
    else:
        asm.seg_rows += n
    asm.last.update(last)
    if have.any():
        asm.any_step = int(filled[have][-1])
    asm.frameworks["generic"] += n
    asm.activity = True
    asm.launch_open = False
    asm.block_kinds.clear()
    asm.last_ckpt = None
    return True


NAME = pa.dictionary(pa.int32(), pa.string())
"""Type of a chunk's ``metric``/``tag``: a few names over many rows (4 bytes a row)."""
CONST = pa.dictionary(pa.int8(), pa.string())
"""Type of a chunk's ``run``/``source``: one value per file (1 byte a row)."""


def _names(col: pl.Series) -> pa.DictionaryArray:
    """A polars string column as an Arrow dictionary (:data:`NAME`): each distinct name stored once."""
    return col.cast(pl.Categorical).to_arrow().cast(NAME)


def constant(value: str, n: int) -> pa.DictionaryArray:
    """``n`` rows of one string (:data:`CONST`): one byte a row, the string once."""
    return pa.DictionaryArray.from_arrays(pa.array(np.zeros(n, dtype=np.int8)), pa.array([value], pa.string()))


def chunk(source: str, seg: np.ndarray, step: np.ndarray, names: pa.DictionaryArray, vals: np.ndarray,
          walls: np.ndarray, tags: pa.DictionaryArray) -> pa.Table:
    """Rows read in bulk as a table of :data:`forensics.schema.METRICS_COMPACT_SCHEMA`'s kind, grouped by metric.

    Text columns are dictionaries (:data:`NAME`, :data:`CONST`); ``wall_time`` is of the ``null`` type (no
    buffer) when no line had a time. Rows are put in metric order (stable: each metric's rows keep their read
    order), so that a metric's rows of a whole file are a few slices (:meth:`forensics.rundata.RunData.raw`).
    """
    n = int(step.shape[0])
    codes = names.indices.to_numpy(zero_copy_only=False)
    if n and (codes[1:] < codes[:-1]).any():  # numbers permuted in numpy: each column allocated once, exactly
        order = np.argsort(codes, kind="stable")
        seg, step, vals, walls = seg[order], step[order], vals[order], walls[order]
        names, tags = _take(names, order), _take(tags, order)
    no_wall = bool(np.isnan(walls).all())
    cols = [constant("", n), pa.array(seg, pa.int32()), pa.array(step, pa.int64()), names,
            pa.array(vals, pa.float64()),
            pa.nulls(n, pa.null()) if no_wall else pa.array(walls, pa.float64(), mask=np.isnan(walls)), tags,
            constant(source, n)]
    fields = [pa.field(f.name, t.type, f.nullable or f.name == "wall_time")
              for f, t in zip(METRICS_SCHEMA, cols, strict=True)]
    return pa.Table.from_arrays(cols, schema=pa.schema(fields))


def _take(col: pa.DictionaryArray, order: np.ndarray) -> pa.DictionaryArray:
    """``col`` in ``order``: its indices permuted in numpy, its dictionary shared."""
    idx = col.indices.to_numpy(zero_copy_only=False)[order]
    return pa.DictionaryArray.from_arrays(pa.array(idx, col.type.index_type), col.dictionary)


MERGE = 16
"""Bulk chunks are merged into one table every 16 (about 2M rows of a block's 65,536 lines): a few big buffers
instead of many of about 1 MB left between each block's transient arrays, which fragment the heap (measured:
the reader's peak RSS about 45 % over its table on a 10M-line log, our choice of count: a merge copies
each row once more and holds at most 16 chunks twice for a moment)."""


def _add(asm: Assembler, table: pa.Table) -> None:
    """Append a bulk chunk to the file's rows; every :data:`MERGE` chunks, the latest are merged into one."""
    rows = asm.rows
    if not table.num_rows:
        return
    rows.add_chunk(table)
    asm.unmerged += 1
    if asm.unmerged < MERGE:
        return
    tail = rows.chunks[-asm.unmerged:]
    del rows.chunks[-asm.unmerged:]
    rows.chunks.append(pa.concat_tables(tail, promote_options="permissive").combine_chunks())
    asm.unmerged = 0


def _explicit(asm: Assembler, explicit: np.ndarray, ep: np.ndarray) -> np.ndarray:
    """Which lines give their own step: not an epoch-indexed line once finer steps were seen (the last step seen)."""
    ep = ep & explicit
    seen = np.logical_or.accumulate(explicit & ~ep) | asm.finer
    prior = np.concatenate([[asm.finer], seen[:-1]])
    asm.finer = bool(seen[-1])
    return explicit & ~(ep & prior)


def _fill_steps(asm: Assembler, steps: np.ndarray, explicit: np.ndarray,
                brk: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(steps, have)``: a line without a step belongs to the last step seen (none yet: counted, no row).

    ``brk`` is updated in place: no break on a line left out, nor before the segment has a row.
    """
    idx = np.where(explicit, np.arange(steps.shape[0]), -1)
    np.maximum.accumulate(idx, out=idx)
    filled = np.where(idx >= 0, steps[np.maximum(idx, 0)], -1)
    have = idx >= 0
    if asm.any_step is not None:
        filled[~have] = asm.any_step
        have[:] = True
    if not asm.seg_rows and brk[0]:
        brk[0] = False
    n_skip = int((~have).sum())
    if n_skip:
        asm.skip_counts["metric line before any step"] += n_skip
        brk &= have
    return filled, have


def _nonfinite_events(asm: Assembler, names: pa.Array, tags: pa.Array, vals: np.ndarray, segs: np.ndarray,
                      steps: np.ndarray) -> None:
    """A ``nan_detected`` event for each non-finite loss-family value of a run read in bulk."""
    bad = np.flatnonzero(~np.isfinite(vals))
    if not bad.size:
        return
    names_l, tags_l = names.to_pylist(), tags.to_pylist()
    for k in bad.tolist():
        if kv.is_objective(names_l[k]):
            asm.segment, seg_now = int(segs[k]), asm.segment
            asm.event("nan_detected", kv.nonfinite_message(tags_l[k], float(vals[k])), int(steps[k]))
            asm.segment = seg_now


def _breaks(asm: Assembler, steps: np.ndarray, explicit: np.ndarray, sig: pl.Series) -> tuple[np.ndarray, dict]:
    """Where a run of general metric lines opens a segment: a counter's step goes back (``Assembler.went_back``).

    Args:
        asm: The file's assembler (its counters' last steps).
        steps: Step per line (any value where not ``explicit``).
        explicit: The line gives its step.
        sig: The line's keys (its counter, :func:`parsers._textlog_asm.counter`).

    Returns:
        ``(breaks, last)``: a bool per line, and each counter's last step after the last break.
    """
    n = steps.shape[0]
    brk = np.zeros(n, dtype=bool)
    pos = np.flatnonzero(explicit)
    if not pos.size:
        return brk, {}
    names = sig.gather(pl.Series(pos, dtype=pl.UInt32))
    uniq = names.unique(maintain_order=True)
    keys = [(None, "generic", u) for u in uniq.to_list()]
    g = names.replace_strict(uniq, pl.Series(range(len(keys)), dtype=pl.Int64)).to_numpy()
    s = steps[pos]
    order = np.argsort(g, kind="stable")
    gs, ss, ps = g[order], s[order], pos[order]
    first = np.ones(gs.shape[0], dtype=bool)
    first[1:] = gs[1:] != gs[:-1]
    prev = np.empty_like(ss)
    prev[1:] = ss[:-1]
    prev_pos = np.full(ss.shape[0], -1, dtype=np.int64)
    prev_pos[1:] = ps[:-1]
    before = np.array([asm.last.get(keys[k], np.iinfo(np.int64).min) for k in gs[first]], dtype=np.int64)
    prev[first] = before
    prev_pos[first] = -1
    cand = np.flatnonzero(ss < prev)
    last_brk = -1
    for c in sorted(cand.tolist(), key=lambda c: ps[c]):  # a break resets every counter: few, in order
        if prev_pos[c] >= last_brk:
            brk[ps[c]] = True
            last_brk = int(ps[c])
    after = ps >= last_brk
    last: dict = {}
    for k, v in zip(gs[after].tolist(), ss[after].tolist(), strict=True):
        last[keys[k]] = v
    return brk, last

# -- one line --------------------------------------------------------------------------------
