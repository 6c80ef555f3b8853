"""W&B run folders: the binary ``run-<id>.wandb`` transaction log, read without the wandb SDK.

The blocks, chunks, CRCs and protobuf wire format are :mod:`parsers.wandb_log`'s (a bad chunk skips to
the next 32 KiB block, a cut tail ends the walk; both become a ``Skip`` naming the byte offset). This
module decodes the ``wandb_internal.Record`` messages: history rows (metrics), summary, config, run
(id, name, start time, resume/fork), console output (events by the text-log rules), exit, preemption.

A run folder (``wandb/offline-run-<ts>-<id>/``, ``wandb/run-<ts>-<id>/``; each resume is a new folder
with the same run id, grouped by :mod:`parsers.discover`) may also hold ``files/config.yaml``,
``files/wandb-summary.json`` and ``files/output.log``: they are read with the binary. These side files
and W&B's own ``debug*.log`` are claimed here (empty result) so that no other parser reads them twice.
"""

from __future__ import annotations

import json
import mmap
import os
from collections import Counter
from pathlib import Path
from typing import Any

import yaml

from forensics.errors import ParseError
from forensics.model import ParseResult, Skip
from forensics.schema import canonical_metric
from parsers import file_policy, safe_yaml
from parsers.lines import Rows, common
from parsers.wandb_log import MAGIC, fields, items, msg, walk

FORMAT = "wandb"

# Protobuf field numbers of wandb/proto/wandb_internal.proto, read from the wandb 0.31.0 wheel
# (site-packages/wandb/proto/v6/wandb_internal_pb2.py, the same in v5/ and v7/).
REC_HISTORY, REC_SUMMARY, REC_OUTPUT, REC_CONFIG, REC_OUTPUT_RAW = 2, 3, 4, 5, 13  # Record (num = 1)
REC_RUN, REC_EXIT, REC_HEADER, REC_PREEMPTING = 17, 18, 21, 23
_REC_NAMES = {2: "history", 3: "summary", 4: "output", 5: "config", 6: "files", 7: "stats", 8: "artifact",
              9: "tbrecord", 10: "alert", 11: "telemetry", 12: "metric", 13: "output_raw", 17: "run",
              18: "exit", 20: "final", 21: "header", 22: "footer", 23: "preempting", 24: "noop_link_artifact",
              25: "use_artifact", 26: "environment", 27: "output_logger"}  # not 1 num, 16 control, 19, 200
HIST_ITEM, HIST_STEP, STEP_NUM = 1, 2, 1  # HistoryRecord{item, step}, HistoryStep{num}; items: see wandb_log
UPDATE, REMOVE = 1, 2  # SummaryRecord, ConfigRecord
RUN_TEXT = {1: "run_id", 2: "entity", 3: "project", 6: "group", 7: "job_type", 8: "run_name", 13: "host"}
RUN_CONFIG, RUN_STARTING_STEP, RUN_START_TIME, RUN_RESUMED, RUN_FORKED, RUN_RESUME = 4, 14, 17, 18, 22, 24
RUN_BRANCH_POINT, BRANCH_RUN = 23, 1  # RunRecord.branch_point: BranchPoint{run = 1, value = 2, metric = 3}
OUT_TYPE, OUT_LINE = 1, 3  # OutputRawRecord and OutputRecord (type 0 = stderr, 1 = stdout)
EXIT_CODE, EXIT_RUNTIME, EXIT_NOT_COMPLETE = 1, 2, 3  # RunExitRecord
HEADER_VERSION, VERSION_PRODUCER = 1, 1  # HeaderRecord{version_info{producer}}
TS_SECONDS, TS_NANOS = 1, 2  # google.protobuf.Timestamp

_SPECIAL = ("_step", "_runtime", "_timestamp")
_SIDE_FILES = {"output.log", "wandb-summary.json"}
DEBUG_LOGS = frozenset({"debug.log", "debug-internal.log", "debug-core.log"})
"""The W&B client's own debug logs (no metrics; never read, and their links into ~/.cache are no skipped input)."""
_MAX_SIDE_BYTES = 16 << 20
"""``files/config.yaml`` / ``wandb-summary.json`` larger than this are not read (real ones: kilobytes)."""
_MAX_OUTPUT_LOG = 256 << 20
"""``files/output.log`` read for console lines up to this size."""
_ODD = object()  # a history value that is not a number (list, string, object)
_DROP_EVERY = 64 << 20
"""The pages of the memory map behind the walk are dropped each time it moves on this many bytes."""


class _Map(mmap.mmap):
    """A read-only memory map that drops its pages behind the reader (bounded RSS for large files).

    ``parsers.wandb_log.walk`` reads forward with slices; each time a slice starts :data:`_DROP_EVERY`
    bytes past the last drop, the pages before it are released (``MADV_DONTNEED``: a later read of
    them faults them in again from the page cache, so nothing is lost).
    """

    _next = _DROP_EVERY

    def __getitem__(self, key):  # noqa: ANN001, ANN204 - mmap's own signature
        if isinstance(key, slice) and (key.start or 0) >= self._next and hasattr(mmap, "MADV_DONTNEED"):
            self.madvise(mmap.MADV_DONTNEED, 0, key.start - key.start % mmap.PAGESIZE)
            self._next = key.start + _DROP_EVERY
        return super().__getitem__(key)


def _has_log(folder: Path, pattern: str = "run-*.wandb") -> Path | None:
    """The first ``run-*.wandb`` under ``folder`` (glob ``pattern``) that starts with the ``:W&B`` header."""
    for p in sorted(folder.glob(pattern)):
        if file_policy.why_not(p) is not None:  # a FIFO or a device named run-*.wandb is never opened
            continue
        with file_policy.open_file(p) as fh:
            if fh.read(len(MAGIC)) == MAGIC:
                return p
    return None


def sniff(path: Path) -> bool:
    """True for ``run-*.wandb`` (empty or starting with ``:W&B``) and for a W&B run folder's side files.

    Side files, claimed when the folder's transaction log has a valid header (else ``output.log`` is
    left to the text-log parser): ``files/output.log``, ``files/wandb-summary.json``,
    ``logs/debug*.log``, and the ``wandb/debug*.log`` links of the latest run. Never raises.
    """
    try:
        name, parent = path.name, path.parent.name
        if name.startswith("run-") and name.endswith(".wandb"):
            with open(path, "rb") as fh:
                return fh.read(4) in (b"", MAGIC[:4])
        if name in DEBUG_LOGS and parent == "wandb":
            return _has_log(path.parent, "*run-*/run-*.wandb") is not None
        if (name in _SIDE_FILES and parent == "files") or (name in DEBUG_LOGS and parent == "logs"):
            return _has_log(path.parent.parent) is not None
    except OSError:
        pass
    return False


def _text(b: bytes) -> str:
    return b.decode("utf-8", "replace")


def _json(raw: bytes | None) -> Any:
    """JSON value text (``NaN``/``Infinity`` accepted) as data; undecodable text is kept as a string."""
    try:
        return json.loads(raw) if raw is not None else None
    except ValueError:
        return _text(raw)


def _nest(store: dict[tuple[str, ...], Any]) -> dict[str, Any]:
    """Flat ``{key parts: value_json}`` (summary, config) as nested dicts of parsed values, ``_wandb`` left out."""
    out: dict[str, Any] = {}
    for parts, raw in store.items():
        d = out
        for k in parts[:-1]:
            d[k] = d[k] if isinstance(d.get(k), dict) else {}
            d = d[k]
        d[parts[-1]] = _json(raw)
    out.pop("_wandb", None)
    return out


# -- records -------------------------------------------------------------------------------------
class _State:
    """Everything read from one ``.wandb`` file."""

    def __init__(self, rel: str) -> None:
        self.rows = Rows(rel)
        self.meta: dict[str, Any] = {"run_id": None, "exit": None}
        self.config: dict[tuple[str, ...], Any] = {}  # key parts -> value_json, updates applied in order
        self.summary: dict[tuple[str, ...], Any] = {}
        self.counts: Counter[str] = Counter()  # records by type
        self.media: dict[str, dict[str, Any]] = {}
        self.non_numeric: Counter[str] = Counter()
        self.keys: dict[bytes, tuple[tuple[str, ...], str]] = {}  # item key bytes -> (parts, joined)
        self.canon: dict[str, str] = {}  # key -> canonical metric name
        self.partial: dict[int, str] = {}  # console text after the last newline, per stream
        self.step: int | None = None  # the last history step
        self.start: float | None = None  # run start, s since epoch
        self.out: list[tuple[int | None, str]] = []  # console lines, with the last history step before them
        self.events: list[tuple[int | None, str, str]] = []

    def record(self, b: bytes) -> None:
        for f, a, e in fields(b):
            if f not in _REC_NAMES or e < 0:
                continue
            self.counts[_REC_NAMES[f]] += 1
            m = msg(b, a, e) if f in (REC_OUTPUT_RAW, REC_OUTPUT, REC_EXIT, REC_HEADER) else {}
            if f == REC_HISTORY:
                self.history(b, a, e)
            elif f in (REC_SUMMARY, REC_CONFIG):
                self.update(self.summary if f == REC_SUMMARY else self.config, b, a, e)
            elif f == REC_RUN:
                self.run(b, a, e)
            elif f in (REC_OUTPUT_RAW, REC_OUTPUT):  # a piece of console text; lines end at "\n"
                stream = m.get(OUT_TYPE, (0,))[0]
                text = self.partial.get(stream, "") + (_text(b[slice(*m[OUT_LINE])]) if OUT_LINE in m else "")
                *lines, self.partial[stream] = text.replace("\r\n", "\n").split("\n")
                self.out.extend((self.step, ln) for ln in lines)
            elif f == REC_EXIT:
                code = m.get(EXIT_CODE, (0,))[0]
                code = code - (1 << 64) if code >= 1 << 63 else code  # negative int32 varints are sign-extended
                self.meta["exit"] = {"exit_code": code, "runtime_s": m.get(EXIT_RUNTIME, (0,))[0],
                                     "not_complete": bool(m.get(EXIT_NOT_COMPLETE, (0,))[0])}
                if code:
                    self.events.append((self.step, "error", f"W&B exit record: the run exited with code {code}"))
            elif f == REC_PREEMPTING:
                self.events.append((self.step, "job_end", "W&B preempting record: the job was preempted"))
            elif f == REC_HEADER and HEADER_VERSION in m:
                prod = msg(b, *m[HEADER_VERSION]).get(VERSION_PRODUCER)
                self.meta["producer"] = _text(b[slice(*prod)]) if prod else None

    def history(self, b: bytes, a: int, e: int) -> None:
        special: dict[str, float] = {}  # _step, _runtime, _timestamp
        step_num, vals, odd = 0, [], []  # HistoryStep.num: proto3 leaves out 0
        canon = self.canon
        for f, k, raw in items(b, a, e, self.keys, (HIST_ITEM,)):
            if k is None:
                if f == HIST_STEP and raw[1] >= 0:
                    step_num = msg(b, *raw).get(STEP_NUM, (0,))[0]
                continue
            try:
                v = float(raw)  # numbers as the Go encoder writes them, NaN, Infinity, -Infinity
            except (TypeError, ValueError):
                j = _json(raw)
                v = j if j is None else float(j) if isinstance(j, bool) else _ODD
            key = k[1]
            if v is _ODD:
                odd.append((key, raw))
            elif key not in _SPECIAL:
                vals.append((canon.get(key) or canon.setdefault(key, canonical_metric(key)), key, v))
            elif v is not None and abs(v) < float("inf"):
                special[key] = v
        self.step = step = int(special["_step"]) if "_step" in special else step_num
        wall = special.get("_timestamp")
        if wall is None and "_runtime" in special and self.start is not None:
            wall = self.start + special["_runtime"]
        self.rows.extend(0, step, vals, wall)
        if odd:  # media (``<key>/_type`` items or {"_type": ...} values) and other non-numeric values
            parsed = [(k, _json(raw)) for k, raw in odd]
            kinds = {k[:-6]: str(v) for k, v in parsed if k.endswith("/_type")}
            kinds.update({k: str(v["_type"]) for k, v in parsed if isinstance(v, dict) and "_type" in v})
            for k, kind in kinds.items():
                self.media.setdefault(k, {"type": kind, "rows": 0})["rows"] += 1
            self.non_numeric.update(k for k, _ in parsed if not any(k == p or k.startswith(p + "/") for p in kinds))

    def update(self, store: dict[tuple[str, ...], Any], b: bytes, a: int, e: int) -> None:
        """Apply a SummaryRecord or ConfigRecord (``update`` and ``remove`` items) to ``store``."""
        for f, k, raw in items(b, a, e, self.keys, (UPDATE, REMOVE)):
            if f == UPDATE:
                store[k[0]] = raw
            elif f == REMOVE:
                for old in [old for old in store if old[:len(k[0])] == k[0]]:
                    del store[old]

    def run(self, b: bytes, a: int, e: int) -> None:
        m = self.meta
        for f, x, y in fields(b, a, e):
            if f in RUN_TEXT and y >= 0:
                m[RUN_TEXT[f]] = _text(b[x:y])
            elif f == RUN_CONFIG:
                self.update(self.config, b, x, y)
            elif f == RUN_STARTING_STEP:
                m["starting_step"] = x
            elif f == RUN_START_TIME:
                ts = msg(b, x, y)
                self.start = m["start_time"] = ts.get(TS_SECONDS, (0,))[0] + ts.get(TS_NANOS, (0,))[0] / 1e9
            elif f in (RUN_RESUMED, RUN_RESUME, RUN_FORKED):
                name = "forked" if f == RUN_FORKED else "resumed"
                m[name] = m.get(name, False) or bool(x)
            elif f == RUN_BRANCH_POINT:
                m["branch_point"] = _text(b[slice(*msg(b, x, y).get(BRANCH_RUN, (0, 0)))])


def _console(st: _State, rel: str, log: Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Events of the console lines, by the text-log rules (errors, tracebacks, NaN notices, checkpoints).

    Metric lines the text-log rules recognise add rows to ``st.rows`` only for metrics the history
    lacks (a loss that was printed, never logged); the others are counted in ``stdout_metric_rows_ignored``.

    Lines: the binary's output records; ``files/output.log`` when the binary has none, or its lines
    after the binary's last one when the binary lost its end (no exit record). An event's step is the
    last history step written before its line (W&B writes a row when the next step starts: it may lag
    by one), else the step the line names, else ``None``.
    """
    from parsers import textlog

    lines = st.out + [(st.step, p) for p in st.partial.values() if p.strip()]
    info: dict[str, Any] = {"source": "binary" if lines else None}
    if file_policy.is_readable_file(log) and (not lines or st.meta["exit"] is None):
        try:
            text = file_policy.read_text(log, _MAX_OUTPUT_LOG, encoding="utf-8")
        except OSError:
            text = ""
        log_lines = text.replace("\r\n", "\n").split("\n")
        if not lines:
            lines, info["source"] = [(None, ln) for ln in log_lines], "files/output.log"
        else:  # the lines after the last occurrence of the binary's last non-blank line
            last = next((ln.strip() for _, ln in reversed(lines) if ln.strip()), None)
            j = next((j for j in range(len(log_lines) - 1, -1, -1) if log_lines[j].strip() == last), None)
            if j is not None and any(ln.strip() for ln in log_lines[j + 1:]):
                lines += [(st.step, ln) for ln in log_lines[j + 1:]]
                info["source"] = "binary + files/output.log tail"
    asm = textlog._Assembler(rel)  # the text-log parser's line rules; its metric rows are not used
    for lineno, (step, line) in enumerate(lines, 1):
        seen = len(asm.rows.events)
        asm.line(common.clean(line), lineno)
        for ev in asm.rows.events[seen:]:
            ev["step"] = step if step is not None else ev["step"]
    keep, _ = asm.finish(len(lines))
    for ev in asm.rows.events:
        ev["segment"] = 0
    logged, added, r = set(st.rows.metric), 0, asm.rows
    for i, name in enumerate(r.metric):
        if name not in logged and (keep is None or keep[i]):
            st.rows.add(0, r.step[i], name, r.value[i], r.tag[i], r.wall[i])
            added += 1
    return r.events, info | {"lines": len(lines), "stdout_metric_rows": added, "stdout_metric_rows_ignored":
                             len(r) - added}


def _side_files(files: Path, root: Path, st: _State, skipped: list[Skip]) -> tuple[dict, dict]:
    """Config and summary: the binary's, else ``files/config.yaml`` and ``files/wandb-summary.json``."""
    found = {"config.yaml": _nest(st.config), "wandb-summary.json": _nest(st.summary)}
    for name in [k for k, v in found.items() if not v and (files / k).exists()]:
        try:
            text = file_policy.read_text(files / name, _MAX_SIDE_BYTES, encoding="utf-8")
            raw = safe_yaml.load(text) if name.endswith(".yaml") else json.loads(text)
        except OSError as exc:
            skipped.append(Skip(file_policy.rel(files / name, root), f"not read: {exc.strerror or exc}"))
            continue
        except (ValueError, yaml.YAMLError) as exc:
            skipped.append(Skip(file_policy.rel(files / name, root), f"not readable ({exc}); ignored"))
            continue
        raw = {k: v for k, v in (raw if isinstance(raw, dict) else {}).items() if k not in ("wandb_version", "_wandb")}
        found[name] = {str(k): v["value"] if name == "config.yaml" and isinstance(v, dict) and "value" in v else v
                       for k, v in raw.items()}  # config.yaml is {key: {desc: ..., value: ...}}
    return found["config.yaml"], found["wandb-summary.json"]


def _walk_file(path: Path, rel: str, st: _State, skipped: list[Skip]) -> int:
    """Walk the transaction log into ``st``; returns the damaged byte count (memory-mapped, pages dropped behind)."""
    try:
        with file_policy.open_file(path) as fh:
            size = os.fstat(fh.fileno()).st_size
            if size == 0:
                raise ParseError(rel, "empty .wandb file (the run wrote nothing)")
            with _Map(fh.fileno(), 0, access=mmap.ACCESS_READ) as data:
                if data[:len(MAGIC)] != MAGIC:
                    raise ParseError(rel, f"not a W&B transaction log: header {data[:len(MAGIC)]!r}, "
                                          f"expected {MAGIC!r}")
                return walk(data, rel, st.record, skipped)
    except OSError as exc:
        raise ParseError(rel, f"unreadable: {exc.strerror or exc}") from exc


def read(path: Path, root: Path) -> ParseResult:
    """Read a W&B run: its ``run-<id>.wandb`` transaction log and the side files of its folder.

    Args:
        path: The ``run-<id>.wandb`` file (a side file claimed by :func:`sniff` gives an empty result).
        root: The run folder; ``source`` and ``Skip.what`` are relative to it.

    Returns:
        Metrics: one row per numeric history item (``tag`` = key, nested keys joined with ``/``; ``step`` =
        the ``_step`` item, else ``HistoryStep.num``; ``wall_time`` = ``_timestamp`` in s since epoch,
        else run start + ``_runtime``; float64, NaN/inf kept, JSON null -> null, true/false -> 1/0).
        Events: console lines (:func:`_console`), ``restart`` for a resumed or forked run, ``error`` for a
        non-zero exit code, ``job_end`` for a preemption. ``meta``: ``run_id``, ``run_name``, ``project``,
        ``entity``, ``host``, ``start_time`` (s since epoch), ``starting_step``, ``resumed``, ``forked``/
        ``branch_point``, ``config`` (also as ``hparams``), ``summary``, ``exit`` (None: no exit record, the
        process died before ``finish``), ``finished``, ``records`` (counts by type), ``media`` and
        ``non_numeric`` (non-scalar history keys), ``console``, ``damaged_bytes``, ``producer``.
        ``skipped``: damaged or cut chunks as ``<rel>:<byte offset>``.

    Raises:
        ParseError: Empty or unreadable file, no ``:W&B`` header, or no readable record.
    """
    rel = file_policy.rel(path, root)
    if not path.name.endswith(".wandb"):  # a side file (see sniff)
        if path.name in DEBUG_LOGS:
            return ParseResult(format=FORMAT, path=rel, meta={"side_file": "W&B client debug log; not read"})
        log = _has_log(path.parent.parent)
        return ParseResult(format=FORMAT, path=rel, meta={"side_file": f"read with {log.name if log else '?'}"})
    sparse = file_policy.sparse_problem(path)
    if sparse:
        raise ParseError(rel, sparse)
    st, skipped = _State(rel), []
    damaged = _walk_file(path, rel, st, skipped)
    if not st.counts:
        raise ParseError(rel, "no readable record" + (f" ({skipped[0].reason})" if skipped else ""))
    config, summary = _side_files(path.parent / "files", root, st, skipped)
    events, console = _console(st, rel, path.parent / "files" / "output.log")
    rows, m, steps = st.rows, st.meta, st.rows.step
    if m.get("resumed") or m.get("forked"):
        how = f"forked from run {m.get('branch_point')!r}" if m.get("forked") else "resumed (a new run folder)"
        rows.event(0, min(steps) if steps else m.get("starting_step"), "restart", f"W&B run {m['run_id']} {how}")
    for step, kind, message in st.events:
        rows.event(0, step, kind, message)
    rows.events.extend(events)
    m.update(config=config, hparams=config, summary=summary, records=dict(st.counts),
             finished=m["exit"] is not None or st.counts["final"] > 0,
             metric_rows=len(rows), first_step=min(steps, default=None), last_step=max(steps, default=None),
             media=st.media, non_numeric=dict(st.non_numeric), console=console, damaged_bytes=damaged,
             run_dir=path.parent.name)
    return ParseResult(format=FORMAT, path=rel, metrics=rows.metrics_table(), events=rows.events_table(),
                       meta=m, skipped=tuple(skipped), precision="float64")
