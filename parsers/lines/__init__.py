r"""Line shapes of trainer stdout, one small module per framework, and a row buffer.

Each framework module exports ``parse_line(line, state) -> LineRecord | None``: ``line`` is one
physical line already cleaned by :mod:`parsers.textlog` (ANSI escapes and ``[rankN]:`` prefixes
removed, split on ``\r`` too), ``state`` a per-file dict the module may use for its own counters.
A module returns ``None`` when the line is not one of its shapes; :mod:`parsers.textlog` then
tries the next module. Modules never raise on odd input. The general reader :mod:`parsers.lines.kv`
reads any ``key value`` line and goes last; a framework module exists only for a trap of its
framework, named in its docstring.

:class:`Rows` collects metrics and events column-wise and builds the Arrow tables of
:mod:`forensics.schema`; :mod:`parsers.hf_trainer` and :mod:`parsers.csv_metrics` use it too.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import numpy as np
import pyarrow as pa

from forensics.schema import EVENTS_SCHEMA, METRICS_SCHEMA, canonical_metric

Metric = tuple[str, str, float | None]
"""(canonical metric, tag as logged, value)."""
Event = tuple[str, str, int | None]
"""(kind, message, step or ``None`` for "the last step seen")."""


@dataclass
class LineRecord:
    """What one line says.

    Attributes:
        framework: ``megatron``, ``deepspeed``, ``hf_trainer_stdout``, ``fairseq``, ``metaseq``,
            ``imagenet``, ``mlx``, ``generic`` or ``common`` (framework-neutral lines).
        step: The step the metrics belong to (``None``: derive it, or use the last step seen).
        metrics: ``(metric, tag, value)`` triples; ``value`` NaN/inf kept, ``None`` for null.
        events: ``(kind, message, step)``; a ``None`` step means the last step seen.
        epoch: Fractional epoch, used to derive a step when the line has none (HF dict lines).
        eval: The metrics are evaluation metrics (they never advance a running index).
        summary: End-of-training summary (kept in ``meta["train_summary"]``, not as metrics).
        config: A one-line configuration dump (``Namespace(...)``, a config dict) to diff and keep.
        arg: One ``(name, value)`` line of a multi-line argument dump.
        dump: ``"begin"``/``"end"`` of a multi-line argument dump, with its namespace in ``ns``.
        ns: Namespace of ``config``/``arg``/``dump`` (``args``, ``deepspeed``, ``training_args``).
        launch: The line marks a (re)start of the program.
        resume: A checkpoint was loaded; ``step`` is the checkpoint step (or ``None``).
        meta: Facts for ``ParseResult.meta``; a change of value later in the file is a ``config`` event.
        has_loss: For step lines that normally carry a loss: whether this one did (Megatron NaN trap).
        agg_last: The metrics replace earlier rows with the same (segment, step, metric).
        wall_time: Seconds since epoch parsed from the line's timestamp, if any.
        damaged: The line starts like one of the framework's metric lines but does not parse (cut by an
            interleaved write, garbled): why, for a ``Skip`` naming the line; no row is made of it.
        bar_pos: For a dict line of HF Trainer stdout: ``(epoch, its printed precision, count, total)`` of the
            dict's epoch and of a tqdm bar printed before it on its line (``None`` where absent), from which
            the text reader dates the dict at the end of the file (:func:`parsers.lines.hf_stdout.bar_steps`).
    """

    framework: str
    step: int | None = None
    metrics: list[Metric] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    epoch: float | None = None
    eval: bool = False
    summary: dict[str, Any] | None = None
    config: dict[str, Any] | None = None
    arg: tuple[str, Any] | None = None
    dump: str | None = None
    ns: str = "args"
    launch: bool = False
    resume: bool = False
    meta: dict[str, Any] = field(default_factory=dict)
    has_loss: bool | None = None
    agg_last: bool = False
    wall_time: float | None = None
    damaged: str | None = None
    bar_pos: tuple[float | None, float | None, int | None, int | None] | None = None


def metric(tag: str, value: float | None, name: str | None = None) -> Metric:
    """A metric triple with the canonical name of ``tag`` (or ``name`` when given).

    Args:
        tag: The name as logged.
        value: The value (``None`` for a JSON null).
        name: Override for the canonical name.

    Returns:
        ``(metric, tag, value)``.
    """
    return (name or _canonical(tag), tag, value)


@lru_cache(maxsize=4096)
def _canonical(tag: str) -> str:
    return canonical_metric(tag)


def dedupe_canonical(metrics: list[Metric]) -> list[Metric]:
    """Keep one row per canonical name on a line; the other tags stay under their raw names.

    fairseq logs ``loss`` and ``nll_loss``, both aliases of ``loss``: the tag spelled like the
    canonical name wins, otherwise the first one; the rest keep their tag as metric name.

    Args:
        metrics: The triples of one line.

    Returns:
        The triples with unique metric names.
    """
    names = [m for m, _, _ in metrics]
    if len(set(names)) == len(names):
        return metrics
    winner: dict[str, int] = {}
    for i, (m, tag, _) in enumerate(metrics):
        if m not in winner or (tag.lower() == m and metrics[winner[m]][1].lower() != m):
            winner[m] = i
    out = []
    for i, (m, tag, v) in enumerate(metrics):
        out.append((m, tag, v) if winner[m] == i else (tag, tag, v))
    return out


def _safe_text(text: str) -> str:
    from parsers.file_policy import display

    return display(text)


def _strings(values: list[str]) -> pa.Array:
    r"""A string column; names with lone surrogates (``"acc\ud800"`` in JSON, a non-UTF-8 file name) kept escaped."""
    try:
        return pa.array(values, pa.string())
    except UnicodeEncodeError:
        return pa.array([_safe_text(v) if isinstance(v, str) else v for v in values], pa.string())


def repeat_string(value: str, n: int) -> pa.Array:
    """``n`` copies of one string as an Arrow string array, built from buffers (no Python list of ``n``)."""
    data = value.encode("utf-8")
    offsets = np.arange(n + 1, dtype=np.int32) * len(data)
    return pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(offsets), pa.py_buffer(data * n)])


_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


def _like(col: pa.ChunkedArray, typ: pa.DataType) -> pa.ChunkedArray:
    """``col`` in the type of the bulk chunks' column (a dictionary; ``null`` when every value is null)."""
    if pa.types.is_null(typ):
        return pa.chunked_array([pa.nulls(len(col), pa.null())]) if col.null_count == len(col) else col
    return col if col.type == typ else col.cast(typ)


class Rows:
    """Column buffers for the metrics and events tables of one source file.

    Args:
        source: Path relative to the run folder, written into every row.
    """

    def __init__(self, source: str) -> None:
        self.source = _safe_text(source)
        self.seg: list[int] = []
        self.step: list[int] = []
        self.metric: list[str] = []
        self.value: list[float | None] = []
        self.wall: list[float | None] = []
        self.tag: list[str] = []
        self.events: list[dict[str, Any]] = []
        self.chunks: list[pa.Table] = []
        self.chunk_rows = 0

    def __len__(self) -> int:
        return len(self.step) + self.chunk_rows

    def add_chunk(self, table: pa.Table) -> None:
        """Append rows read in bulk (a table with :data:`METRICS_SCHEMA`); they come after the list rows."""
        if table.num_rows:
            self.chunks.append(table)
            self.chunk_rows += table.num_rows

    def add(self, segment: int, step: int, name: str, value: float | None, tag: str,
            wall_time: float | None = None) -> int:
        """Append one metrics row; returns its index."""
        self.seg.append(segment)
        self.step.append(int(step))
        self.metric.append(name)
        self.value.append(value)
        self.wall.append(wall_time)
        self.tag.append(tag)
        return len(self.step) - 1

    def extend(self, segment: int, step: int, metrics: list[Metric], wall_time: float | None = None) -> None:
        """Append one row per ``(metric, tag, value)`` triple, all at the same step."""
        n = len(metrics)
        self.seg.extend([segment] * n)
        self.step.extend([int(step)] * n)
        self.metric.extend([m for m, _, _ in metrics])
        self.tag.extend([t for _, t, _ in metrics])
        self.value.extend([v for _, _, v in metrics])
        self.wall.extend([wall_time] * n)

    def set_value(self, index: int, value: float | None, wall_time: float | None) -> None:
        """Overwrite the value (and wall time) of row ``index``."""
        self.value[index] = value
        self.wall[index] = wall_time

    def event(self, segment: int, step: int | None, kind: str, message: str) -> None:
        """Append one events row (a step no int64 holds is kept as ``None``)."""
        if step is not None and not _INT64_MIN <= step <= _INT64_MAX:
            step = None
        self.events.append({"run": "", "segment": segment, "step": step, "kind": kind,
                            "message": message, "source": self.source})

    def metrics_table(self, keep: list[bool] | None = None) -> pa.Table:
        """The metrics table (:data:`METRICS_SCHEMA`), optionally only rows where ``keep`` is true.

        ``keep`` covers the rows added one by one; rows added in bulk (:meth:`add_chunk`) are all kept.
        """
        table = self._list_table(keep)
        if not self.chunks:
            return table
        like = self.chunks[0].schema  # bulk chunks may be compact (dictionary text, a null-typed wall_time)
        table = pa.Table.from_arrays([_like(c, like.field(i).type) for i, c in enumerate(table.columns)],
                                     names=table.column_names)
        # chunks shared, not copied (no combine_chunks): a 10M-line log's 20M rows exist once in memory
        return pa.concat_tables([table, *[c.replace_schema_metadata(None) for c in self.chunks]],
                                promote_options="permissive")

    def out_of_range_steps(self) -> int:
        """How many rows carry a step outside int64 (``step 1e30``): they are left out of the table, not a crash."""
        return sum(1 for s in self.step if not _INT64_MIN <= s <= _INT64_MAX)

    def _list_table(self, keep: list[bool] | None) -> pa.Table:
        idx = range(len(self.step)) if keep is None else [i for i, k in enumerate(keep[:len(self.step)]) if k]
        try:
            pa.array(self.step, pa.int64())
        except OverflowError:  # a step that no int64 holds is not a step: leave the row out (counted by the reader)
            idx = [i for i in idx if _INT64_MIN <= self.step[i] <= _INT64_MAX]
            keep = [False] * len(self.step)
            for i in idx:
                keep[i] = True
        pick = (lambda col: [col[i] for i in idx]) if keep is not None else (lambda col: col)
        n = len(idx)
        return pa.Table.from_arrays(
            [pa.array([""] * n, pa.string()), pa.array(pick(self.seg), pa.int32()),
             pa.array(pick(self.step), pa.int64()), _strings(pick(self.metric)),
             pa.array(pick(self.value), pa.float64()), pa.array(pick(self.wall), pa.float64()),
             _strings(pick(self.tag)), pa.array([self.source] * n, pa.string())],
            schema=METRICS_SCHEMA,
        )

    def events_table(self) -> pa.Table:
        """The events table (:data:`EVENTS_SCHEMA`)."""
        if not self.events:
            return EVENTS_SCHEMA.empty_table()
        try:
            return pa.Table.from_pylist(self.events, schema=EVENTS_SCHEMA)
        except UnicodeEncodeError:  # a lone surrogate in a message: kept escaped (issue 16)
            return pa.Table.from_pylist([{k: _safe_text(v) if isinstance(v, str) else v for k, v in e.items()}
                                         for e in self.events], schema=EVENTS_SCHEMA)
