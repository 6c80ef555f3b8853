"""A step counter that restarts every epoch is one run's step axis, not a series of restarts.

The hand-written loop ``for epoch ...: for i, batch in enumerate(loader): log(epoch=epoch, step=i)``
logs a step that falls back to its start at every epoch while the ``epoch`` column goes up by one at
the same row. A reader that splits a file where the step goes back then reads each epoch as a resume.
Two shapes of that family are repaired here, on one file's long metrics table (any format):

- *step restarts per epoch*: the file's local segments each hold one ``epoch`` value, and a segment
  whose epoch is the previous one's + 1 starts at the file's first step. The global step is then
  ``(epoch - first epoch) x steps_per_epoch + step`` and such a boundary is no segment; a boundary
  where the epoch does not go up by one (a real resume repeating an epoch) stays a segment.
- *epoch as the step axis with several records per epoch* (no step key, ``batch_idx`` instead): equal
  epoch values on consecutive records are not segments. The step is ``(epoch - first epoch) x
  steps_per_epoch + batch index`` when a batch-index column is logged, else the record's row order.

``steps_per_epoch`` is the largest in-epoch counter minus its start plus its stride (the smallest
positive step between two consecutive records of an epoch), so that sparse logging keeps its scale.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from forensics.model import ParseResult
from parsers._table_header import EPOCH_COLUMNS

__all__ = ["BATCH_INDEX_KEYS", "repair"]

BATCH_INDEX_KEYS = ("batch_idx", "batch_index", "batch_id", "batch_nb", "batch_num", "iter_in_epoch",
                    "step_in_epoch", "epoch_step")
"""Keys of a batch index within an epoch (``enumerate(loader)``; Lightning's ``batch_idx``)."""
_EPOCH_TAGS = frozenset(EPOCH_COLUMNS) | {k.upper() for k in EPOCH_COLUMNS}
_WHY = ("the step counter restarts at every epoch while the epoch goes up by one at the same row: "
        "one run, not a restart")


def repair(pr: ParseResult) -> ParseResult:
    """``pr`` with an epoch-restarting step made global (see the module docstring), else ``pr`` itself.

    Only a file with more than one local segment, or one whose step axis is the epoch (a text log's
    ``epoch: 0 loss: ...`` lines, several per epoch, in one segment), is looked at (one ``max`` over the
    segment column otherwise). ``meta["epoch_steps"]`` records ``steps_per_epoch`` (0: row order), the in-epoch counter
    and why; ``meta["step_axis"]`` names the composed axis.
    """
    t = pr.metrics
    if t.num_rows == 0:
        return pr
    epoch_axis = (pr.meta.get("step_axis") or {}).get("kind") == "epoch"
    text_epochs = pr.meta.get("step_unit") == "epoch"  # a text log's ``epoch: 0 loss: ...`` lines
    several = (pc.max(t.column("segment")).as_py() or 0) >= 1
    if not several and not text_epochs:
        return pr  # an epoch-stepped text log holds its records of one epoch in one segment: looked at too
    if not epoch_axis and not _EPOCH_TAGS & _tag_names(t.column("tag")):
        return pr  # no epoch logged: nothing to recompose (and no copy of a 20M-row file's columns)
    seg = t.column("segment").to_numpy().astype(np.int64)
    step = t.column("step").to_numpy().astype(np.int64)
    tag = t.column("tag")
    if pa.types.is_dictionary(tag.type):
        tag = tag.cast(pa.string())
    value = t.column("value").to_numpy(zero_copy_only=False).astype(np.float64)
    fixed = None
    if several and epoch_axis:
        fixed = _epoch_axis(seg, step, tag, value)
    elif several:
        fixed = _restarting_step(seg, step, tag, value, pr.meta.get("step_key") or "step")
    if fixed is None and text_epochs:  # a text log: one record per line
        fixed = _epoch_axis(seg, step, tag, value, by_line=True)
    if fixed is None:
        return pr
    new_step, new_seg, spe, counter = fixed
    t = t.set_column(t.schema.get_field_index("step"), t.schema.field("step"), pa.array(new_step, pa.int64()))
    t = t.set_column(t.schema.get_field_index("segment"), t.schema.field("segment"),
                     pa.array(new_seg, pa.int32()))
    meta: dict[str, Any] = dict(pr.meta)
    meta["epoch_steps"] = {"steps_per_epoch": spe, "in_epoch_counter": counter, "why": _WHY}
    meta["step_axis"] = {"column": f"epoch x {spe} + {counter}" if spe else "row order", "kind": "optimizer_step"}
    if "segments" in meta:
        meta["segments"] = int(new_seg.max()) + 1
    return replace(pr, metrics=t, meta=meta)


def _tag_names(tag: pa.ChunkedArray) -> set[str]:
    """The distinct tags of a column: a dictionary column's dictionaries (small), else ``pc.unique``."""
    if pa.types.is_dictionary(tag.type):
        return {v for chunk in tag.chunks for v in chunk.dictionary.to_pylist() if v is not None}
    return {v for v in pc.unique(tag).to_pylist() if v is not None}


def _is_in(tag: pa.ChunkedArray, names: frozenset[str] | tuple[str, ...]) -> np.ndarray:
    return pc.is_in(tag, pa.array(sorted(names), pa.string())).to_numpy(zero_copy_only=False)


def _stride(counter: np.ndarray, group: np.ndarray) -> int:
    """Smallest positive step of ``counter`` between consecutive entries of one group (1 when none)."""
    d = np.diff(counter)
    ok = (d > 0) & (group[1:] == group[:-1])
    return int(d[ok].min()) if ok.any() else 1


def _restarting_step(seg: np.ndarray, step: np.ndarray, tag: pa.ChunkedArray, value: np.ndarray, counter: str
                     ) -> tuple[np.ndarray, np.ndarray, int, str] | None:
    """Global step and segments of a step that restarts at each epoch, or None when the file is not so."""
    is_epoch = _is_in(tag, _EPOCH_TAGS)
    if not is_epoch.any():
        return None
    n = int(seg.max()) + 1
    ep_lo, ep_hi = np.full(n, np.inf), np.full(n, -np.inf)
    np.minimum.at(ep_lo, seg[is_epoch], value[is_epoch])
    np.maximum.at(ep_hi, seg[is_epoch], value[is_epoch])
    if not (np.isfinite(ep_lo).all() and (ep_lo == ep_hi).all() and (ep_lo == np.round(ep_lo)).all()):
        return None  # a segment without an epoch, or spanning several (a real resume), or a fractional epoch
    st_lo, st_hi = np.full(n, np.iinfo(np.int64).max), np.full(n, np.iinfo(np.int64).min)
    np.minimum.at(st_lo, seg, step)
    np.maximum.at(st_hi, seg, step)
    start = int(st_lo[0])
    joined = np.zeros(n, bool)  # boundary k-1 -> k is an epoch boundary, not a restart
    joined[1:] = (ep_lo[1:] == ep_lo[:-1] + 1) & (st_lo[1:] == start)
    if not joined.any():
        return None
    spe = int((st_hi - start).max()) + _stride(step, seg)
    offset = ((ep_lo - ep_lo[0]) * spe).astype(np.int64)
    new_seg = np.cumsum(~joined) - 1
    new_seg[0] = 0
    return step + offset[seg], new_seg[seg], spe, counter


def _line_records(seg: np.ndarray, step: np.ndarray, tag: pa.ChunkedArray) -> np.ndarray:
    """Record id of each row of a text log whose lines share one step (``epoch: 0 loss: X`` per batch).

    Rows of one (segment, step) are one group, in (segment, step) order; within it, the k-th row of a tag
    belongs to the k-th record (each line logs its keys once), so a group of n lines becomes n records, in
    order.
    """
    # the group of a row is its (segment, step) pair, wherever the row sits (rows may come column by column)
    grp = np.unique(np.stack([seg, step]), axis=1, return_inverse=True)[1].reshape(-1).astype(np.int64)
    flat = tag.combine_chunks() if isinstance(tag, pa.ChunkedArray) else tag  # one dictionary for all chunks
    codes = pc.dictionary_encode(flat).indices.to_numpy(zero_copy_only=False).astype(np.int64)
    key = grp * (int(codes.max()) + 1) + codes
    order = np.argsort(key, kind="stable")
    ks = key[order]
    first = np.r_[True, ks[1:] != ks[:-1]]
    run_start = np.maximum.accumulate(np.where(first, np.arange(len(ks)), 0))
    occ = np.empty(len(ks), np.int64)
    occ[order] = np.arange(len(ks)) - run_start
    n_grp = int(grp.max()) + 1
    per = np.zeros(n_grp, np.int64)
    np.maximum.at(per, grp, occ + 1)
    offset = np.r_[0, np.cumsum(per)[:-1]]
    return offset[grp] + occ


def _epoch_axis(seg: np.ndarray, step: np.ndarray, tag: pa.ChunkedArray, value: np.ndarray, by_line: bool = False
                ) -> tuple[np.ndarray, np.ndarray, int, str] | None:
    """Step and segments of an epoch-stepped file with several records per epoch, or None.

    ``by_line``: the file is a text log whose lines of one epoch share one step (records by line,
    :func:`_line_records`), not a table whose records each have a row per metric at their own step.
    """
    if by_line:  # rows need not be in line order (the bulk reader writes a block column by column)
        rid = _line_records(seg, step, tag)
        epoch = np.zeros(int(rid.max()) + 1, np.int64)
        epoch[rid] = step  # the epoch of each record (the step axis here)
    else:
        new_rec = np.ones(len(seg), bool)
        new_rec[1:] = (seg[1:] != seg[:-1]) | (step[1:] != step[:-1])
        rid = np.cumsum(new_rec) - 1
        epoch = step[new_rec]  # the epoch of each record (the step axis here)
    starts = np.flatnonzero(np.r_[True, epoch[1:] != epoch[:-1]])
    if np.median(np.diff(np.r_[starts, len(epoch)])) < 2:
        return None  # about one record per epoch: an epoch-indexed table (a resume re-logging an epoch stays one)
    n_rec = len(epoch)
    is_batch = _is_in(tag, BATCH_INDEX_KEYS)
    counter, spe = "row order", 0
    rec_step = np.arange(n_rec, dtype=np.int64)
    if is_batch.any():
        b_rid, b_val = rid[is_batch], value[is_batch]
        first = np.unique(b_rid, return_index=True)[1]
        if len(first) == n_rec and np.isfinite(b_val[first]).all() and (b_val == np.round(b_val)).all():
            batch = b_val[first].astype(np.int64)
            b0 = int(batch.min())
            spe = int(batch.max()) - b0 + _stride(batch, epoch)
            rec_step = (epoch - epoch[0]) * spe + batch
            counter = _first_name(tag, is_batch)
    rec_seg = np.zeros(n_rec, np.int64)
    rec_seg[1:] = np.cumsum(rec_step[1:] < rec_step[:-1])
    return rec_step[rid], rec_seg[rid], spe, counter


def _first_name(tag: pa.ChunkedArray, sel: np.ndarray) -> str:
    return str(tag.take(pa.array([int(np.argmax(sel))])).to_pylist()[0])
