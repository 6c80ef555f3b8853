"""Generic JSONL metric logs: one JSON object per line (``docs/formats.md#jsonl``).

Nested objects are flattened with ``/``; booleans become 0/1; strings and lists are not metrics. A record
that names a module, layer, name or tensor (``{"step": 1, "module": "enc.wo", "absmax": 4.6e4}``) gets
that string as a metric suffix (``absmax/enc.wo``). A half-written last line is dropped and reported;
bad lines in the middle are skipped and reported by line number. A step that goes back (an appended
resume) starts a new local segment. W&B-style ``_runtime`` (seconds since the run started) is wall
time, not a metric: it never becomes a row, and gives ``wall_time`` (run start + ``_runtime``) to
records that have no ``_timestamp`` once one record has shown both.

Two engines give the same table:

- ``"python"``: each line through the stdlib ``json`` (it accepts ``NaN``/``Infinity``).
- ``"auto"`` (the default): the file is streamed in blocks of whole lines (:data:`CHUNK_BYTES`). The
  lines that are plain JSON objects go to ``polars.read_ndjson`` in one call per block (with the schema
  of the blocks before, else inferred); this thread scans block i + 2 (numpy and ``bytes`` passes:
  :mod:`parsers._jsonl_scan`), two worker threads read blocks i + 1 and i + 2 with polars
  (:data:`READERS`), while block i is converted.
  The first block of a plain file is small (:data:`FIRST_BYTES`: the worker starts sooner), and the GIL
  turns are short while both threads run (:data:`parsers._gil.SWITCH_INTERVAL`).
  The lines polars cannot read exactly go through the per-line path: ``NaN``/``Infinity`` tokens
  (polars rejects them), ``null`` (polars cannot tell it from a missing key), lone-surrogate escapes,
  invalid UTF-8, anything that does not start with ``{`` and end with ``}`` (garbage, a BOM, the cut
  last line), a row with fewer keys than its line (duplicate keys, keys polars did not expect: checked
  by counting ``:``), a string that may be a value polars coerced to text, and types polars widens
  (integers beyond int64); and, before a read where polars infers the types, a line with more than 64
  ``{``/``[`` (polars crashes inferring objects nested ~500 deep; with a given schema it does not
  recurse). A block that polars refuses is read again with all rows as schema sample,
  then halved until the pieces read; pieces of at most 32 lines go through the per-line path.
  The polars side lives in :mod:`parsers._jsonl_frames`; the per-line path here is the reference.
  Speed, against ``polars.read_ndjson`` of the same file in the same run (2-core machine under load,
  fresh processes, best of 3): the 1M-line trainer log of ``benchmarks/bench_jsonl.py --issue13`` 1.8x
  its CPU time and 1.9x its wall time (session 6: 2.2x / 2.1x); 1M steps x 50 metrics (2.6 GB) 1.7x
  CPU and wall (2.3x / 1.9x). What is left beyond polars: the newline, token and ``:`` passes over the
  bytes (~10 ms per 16 MiB block), and the long table built from the frames.

Row order (both engines): by line, then, within a line, by the order in which each key first gave a
row in the file (ties by its position in that line). Step, wall time, suffix and segment rules are
applied once, on arrays, to the records of both engines.
"""

from __future__ import annotations

import collections
import itertools
import json
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import IO, Any

from forensics.model import ParseResult, Skip
from parsers import file_policy
from parsers._gil import short_gil_turns
from parsers._io import open_binary
from parsers._jsonl_blocks import MAX_LINE_BYTES, _blocks
from parsers._jsonl_fields import NAME_KEYS, RUNTIME_KEYS, STEP_KEYS, TIME_KEYS
from parsers._jsonl_frames import _auto_block
from parsers._jsonl_lines import _PyRecords
from parsers._jsonl_stage import _Stager
from parsers._jsonl_table import MAX_REPORTED, _State, add_block
from parsers._table_header import step_axis

__all__ = ["CHUNK_BYTES", "ENGINES", "FORMAT", "MAX_LINE_BYTES", "NAME_KEYS", "RUNTIME_KEYS", "STEP_KEYS",
           "TIME_KEYS", "read", "sniff"]

FORMAT = "jsonl"
ENGINES = ("auto", "python")
FALLBACK_SHARE = 0.9
"""A file without a step key is stepped by its epoch (or sample) count when at least this share of its
records holds a whole one (a fractional epoch ``0.25`` is no step: then the line index is the step)."""
READERS = 2
"""Blocks read by polars at once, on as many worker threads (``"auto"`` engine), while this thread scans and
converts: one polars read's serial parts (its frame assembly) overlap the other's parallel parse
(``bench_jsonl.py --issue17``, 1M x 50: 6.2 -> 5.1 s wall; the 1M-line trainer log ~5%)."""
CHUNK_BYTES = 16 << 20
"""Bytes of whole lines read and parsed at a time by the ``"auto"`` engine (memory stays bounded)."""
FIRST_BYTES = 1 << 20
"""About this many bytes make the first block of a plain file (``"auto"`` engine): it is scanned, read and
converted before the pipeline overlaps anything, so a small one starts the worker thread sooner."""
_NOT_METRIC_FILES = {"trainer_state.json", "expected.json"}


def _first_lines(path: Path, limit: int = 1 << 16) -> list[str]:
    """The first two non-empty lines (at most ``limit`` bytes read)."""
    with open_binary(path) as fh:
        head = fh.read(limit)
    return [line.decode("utf-8", "replace") for line in head.splitlines() if line.strip()][:2]


def sniff(path: Path) -> bool:
    """True for a JSON-lines metric log (by name and first line; never raises).

    ``*.jsonl``, ``*.jsonl.gz`` and ``*.ndjson`` always; a ``.json`` or ``.log`` file when its first
    non-empty line is a JSON object with a step key (in a ``.json`` file a second record must follow: one
    object on one line is a config or a summary, user test U16); never ``trainer_state.json`` or ``expected.json``.
    """
    name = path.name.lower()
    if name in _NOT_METRIC_FILES:
        return False
    if name.endswith((".jsonl", ".jsonl.gz", ".ndjson")):
        return True
    if not name.endswith((".json", ".log")):
        return False
    try:
        lines = _first_lines(path)
        line = (lines[0] if lines else "").lstrip("\ufeff \t")
        obj = json.loads(line) if line.startswith("{") else None
    except (OSError, ValueError, EOFError):
        return False
    if name.endswith(".json") and (len(lines) < 2 or not lines[1].lstrip().startswith("{")):
        return False  # one JSON object (a config or summary saved with json.dump) is no log of records
    # a step key holding a dict or list is a column-oriented export (pandas ``to_json()``), not a record
    return isinstance(obj, dict) and any(k in obj and not isinstance(obj[k], dict | list) for k in STEP_KEYS)


def _python_block(st: _State, buf: bytes, first_line: int, tail: tuple[int, bytes, bool] | None) -> int:
    """Read one block line by line with the stdlib ``json``; returns its lines."""
    items = [(first_line + i, raw, False) for i, raw in enumerate(buf.split(b"\n")[:-1])]
    n = len(items)
    if tail is not None:
        items.append(tail)
    add_block(st, [_PyRecords(st, items)], lambda ln: items[ln - first_line][1])
    return n


def _read_blocks(st: _State, fh: IO[bytes], engine: str, chunk_bytes: int,
                 long_lines: list[tuple[int, int]] | None = None) -> tuple[int, str] | None:
    """Read every block of ``fh`` into ``st``; returns (line, message) of a read error, or None.

    With the ``"auto"`` engine this thread scans block i + 2 (:meth:`_Stager.scan`) and :data:`READERS` worker
    threads read blocks i + 1 and i + 2 with polars while this thread converts block i, so at most four blocks
    are held at a time.
    """
    long_lines = [] if long_lines is None else long_lines
    error = _read_all(st, fh, engine, chunk_bytes, long_lines, firsts := [])
    long_lines[:] = [(firsts[block] + 1, nbytes) for block, nbytes in long_lines]  # block index -> line number
    return error


def _read_all(st: _State, fh: IO[bytes], engine: str, chunk_bytes: int, long_lines: list[tuple[int, int]],
              firsts: list[int]) -> tuple[int, str] | None:
    """:func:`_read_blocks`, with ``firsts``: the lines before each block, in block order."""
    done = 0  # lines before the current block
    error: tuple[int, str] | None = None

    def finish(buf: bytes, tail: bytes, err: str | None, lines: Callable[[int, tuple | None], int]) -> None:
        nonlocal done, error
        firsts.append(done)
        cut = (done + buf.count(b"\n") + 1, tail, True) if tail.strip() else None
        done += lines(done + 1, cut)
        if err is not None:
            error = (done + bool(tail), err)

    if engine == "python":
        for buf, tail, err in _blocks(fh, chunk_bytes, long_lines):
            finish(buf, tail, err, lambda first, cut, b=buf: _python_block(st, b, first, cut))
        return error
    stage = _Stager()
    blocks = _blocks(fh, chunk_bytes, long_lines, first=FIRST_BYTES)
    first = next(blocks, None)
    second = next(blocks, None)
    if second is None:  # one block (most files): no worker thread
        if first is not None:
            buf, tail, err = first
            finish(buf, tail, err, lambda line, cut: _auto_block(st, buf, stage(buf), line, cut))
        return error
    with short_gil_turns(), ThreadPoolExecutor(max_workers=READERS, thread_name_prefix="jsonl") as pool:
        ahead: collections.deque[tuple[Future, bytes, bytes, str | None]] = collections.deque()
        for buf, tail, err in itertools.chain([first, second], blocks):
            ahead.append((pool.submit(stage.read, buf, stage.scan(buf)), buf, tail, err))  # the scan here, polars there
            if len(ahead) > READERS:
                fut, b, t, e = ahead.popleft()
                finish(b, t, e, lambda line, cut, f=fut, b=b: _auto_block(st, b, f.result(), line, cut))
        while ahead:
            fut, b, t, e = ahead.popleft()
            finish(b, t, e, lambda line, cut, f=fut, b=b: _auto_block(st, b, f.result(), line, cut))
    return error


# -- entry point -------------------------------------------------------------------------------------


def read(path: Path, root: Path, *, engine: str = "auto", chunk_bytes: int = CHUNK_BYTES) -> ParseResult:
    """Read every numeric field of a JSONL metric log.

    Args:
        path: The ``.jsonl`` (``.jsonl.gz``, ``.ndjson``, or JSON-lines ``.json``/``.log``) file.
        root: The run folder; ``source`` columns and ``Skip.what`` are relative to it.
        engine: ``"auto"`` (polars for plain lines, the per-line path for the rest) or ``"python"``
            (every line through the stdlib ``json``); both give the same result.
        chunk_bytes: Bytes of whole lines parsed at a time (memory stays bounded by a few blocks).

    Returns:
        One metrics row per (line, numeric field): ``value`` float64 as logged (NaN/inf kept, JSON
        ``null`` -> null, integers beyond float range -> +-inf), ``wall_time`` s since epoch when the
        record has one (``wall_time``/``time``/``timestamp``/``_timestamp``; else run start +
        ``_runtime``; else null), ``tag`` the flattened key (``a/b`` for nested; ``key/<module>`` for
        per-module records), local ``segment`` (a new one when the step goes back, or repeats a metric
        already logged at the highest step). ``_runtime`` is never a row. ``meta``: ``step_key``,
        ``records``, ``bad_lines``, ``lines_without_step``, ``engine``, ``python_lines`` (lines read one
        by one), ``runtime_key``/``run_start`` when ``_runtime`` was logged, and ``step_source = "line
        index"`` when the file has no step key at all (steps are then 0, 1, ...). ``skipped``:
        ``"<rel>:<line>"`` per bad line (the first 20, then a summary).

    Raises:
        ValueError: ``engine`` is not one of :data:`ENGINES`.
    """
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {ENGINES}, not {engine!r}")
    rel = file_policy.rel(path, root)
    st = _State(rel)
    skipped = _read_file(st, path, engine, chunk_bytes)
    meta: dict[str, Any] = {"records": st.main.records, "bad_lines": st.n_bad, "lines_without_step": 0}
    stream = st.main
    if st.step_key is None and st.fallback is not None and st.fallback.records >= FALLBACK_SHARE * st.no_step:
        stream = st.fallback
        meta.update(records=stream.records, step_source=f"{st.fallback_key} (the file has no step key)")
        if st.no_step > stream.records:
            meta["lines_without_step"] = st.no_step - stream.records
            skipped.append(Skip(rel, f"{st.no_step - stream.records} record(s) without {st.fallback_key} "
                                     "(the file's step: it has no step key) ignored"))
    elif st.step_key is None and st.indexed is not None:
        stream = st.indexed
        meta.update(records=st.indexed.records, step_source="line index (the file has no step key)")
    elif st.no_step:
        meta["lines_without_step"] = st.no_step
        keys = ", ".join(STEP_KEYS)
        skipped.append(Skip(rel, f"{st.no_step} record(s) without a step key ({keys}) ignored"))
    key = st.step_key or (st.fallback_key if stream is st.fallback else None)
    meta["step_key"] = key
    meta["step_axis"] = {"column": key or "(line index)", "kind": "row_index" if key is None else step_axis(key)}
    meta["engine"], meta["python_lines"] = engine, st.python_lines
    if st.runtime_seen:
        meta["runtime_key"] = "_runtime (s since run start; wall time, not a metric)"
        if st.start is not None:
            meta["run_start"] = st.start
    table = stream.table()
    _lost_values(st, stream, meta, skipped)
    if st.n_bad > len(st.bad):
        st.bad.append(Skip(rel, f"{st.n_bad - len(st.bad)} more bad line(s) not listed"))
    return ParseResult(format=FORMAT, path=rel, metrics=table, meta=meta,
                       skipped=tuple(st.bad + skipped), precision="float64")


def _read_file(st: _State, path: Path, engine: str, chunk_bytes: int) -> list[Skip]:
    """Read every block of ``path`` into ``st``; returns what was not read (overlong lines, a cut stream)."""
    rel = st.rel
    skipped: list[Skip] = []
    try:
        fh = open_binary(path, bounded=False)  # its own line budget (MAX_LINE_BYTES), listed
    except OSError as exc:
        skipped.append(Skip(f"{rel}:0", f"file ends abruptly ({exc}); earlier lines kept"))
        return skipped
    long_lines: list[tuple[int, int]] = []
    with fh:
        error = _read_blocks(st, fh, engine, chunk_bytes, long_lines)
    for line, nbytes in long_lines[:MAX_REPORTED]:
        skipped.append(Skip(f"{rel}:{line}", f"line of {nbytes} bytes (more than {MAX_LINE_BYTES}): not read"))
    if error is not None:
        skipped.append(Skip(f"{rel}:{error[0]}", f"file ends abruptly ({error[1]}); earlier lines kept"))
    return skipped


def _odd_values(st: _State, meta: dict[str, Any], skipped: list[Skip]) -> None:
    """List JSON booleans not read as numbers and integer steps beyond int64 (``parsers._jsonl_lines``)."""
    if st.booleans:
        meta["boolean_values"] = dict(st.booleans)
        keys = ", ".join(f"{k} ({n})" for k, n in sorted(st.booleans.items(), key=lambda kv: -kv[1])[:5])
        skipped.append(Skip(st.rel, f"JSON booleans are not numbers and were not read as metrics: {keys}"))
    if st.big_steps:
        meta["steps_beyond_int64"] = dict(st.big_steps)
        keys = ", ".join(f"{k!r} ({n} records)" for k, n in st.big_steps.items())
        skipped.append(Skip(st.rel, f"step key {keys} holds integers beyond int64: not read as steps"))
        if str(meta.get("step_source", "")).endswith("(the file has no step key)"):
            meta["step_source"] = meta["step_source"].replace(
                "(the file has no step key)", "(its step values are beyond int64)")


def _lost_values(st: _State, stream: Any, meta: dict[str, Any], skipped: list[Skip]) -> None:
    """List text in a key that is numeric elsewhere (a lost value); text-only keys are labels (run names...).

    Booleans and steps beyond int64 are listed too (:func:`_odd_values`).
    """
    _odd_values(st, meta, skipped)
    used = stream.used_tags
    lost = {k: n for k, n in stream.non_numeric.items()
            if (ti := st.tag_index.get(k)) is not None and ti < len(used) and used[ti]}
    if lost:
        meta["non_numeric_values"] = dict(lost)
        worst = ", ".join(f"{k} ({n})" for k, n in sorted(lost.items(), key=lambda kv: -kv[1])[:5])
        skipped.append(Skip(st.rel, f"text values that are not numbers were not read as metrics: {worst}"))
