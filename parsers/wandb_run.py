"""W&B run folders: the binary ``run-<id>.wandb`` transaction log, read without the wandb SDK.

Framing (``formats.md`` section 2.2; ``wandb/sdk/internal/datastore.py``, ``core/pkg/leveldb``): a
7-byte header ``:W&B`` + uint16 LE ``0xBEE1`` + version 0, then LevelDB-log-style 32 KiB blocks counted
from file offset 0. A chunk is ``uint32 LE crc | uint16 LE length | uint8 type | payload`` and never
straddles a block (fewer than 7 bytes left = zero padding); the CRC is the plain IEEE CRC-32 (zlib) of
``type byte + payload``. A record is one FULL chunk or FIRST + MIDDLE* + LAST. A bad chunk (CRC,
type, length) skips to the next block (the damage is listed with its byte offset); a cut tail ends the
walk with a ``Skip``. Each record is one ``wandb_internal.Record`` protobuf, decoded here by a minimal
wire decoder for the fields below (history, summary, config, run, output, exit, preempting).

Run folders (``wandb/offline-run-<ts>-<id>/``, ``wandb/run-<ts>-<id>/``; a resume is a new folder
with the same run id, grouped by :mod:`parsers.discover`) may also hold ``files/config.yaml``,
``files/wandb-summary.json`` and ``files/output.log``: they are read with the binary (config and
summary when the binary has none; ``output.log`` lines when the binary has no console output or lost
its end). Those side files and W&B's own ``debug*.log`` are claimed here so that no other parser reads
them twice; they return an empty result that names the ``.wandb`` file that covered them.
"""

from __future__ import annotations

import json
import struct
import zlib
from collections import Counter
from pathlib import Path
from typing import Any

from forensics.errors import ParseError
from forensics.model import ParseResult, Skip
from forensics.schema import canonical_metric
from parsers.lines import Rows, common

FORMAT = "wandb"
MAGIC = b":W&B\xe1\xbe\x00"  # ":W&B", uint16 LE 0xBEE1, version 0
BLOCK = 32768  # bytes per block, counted from offset 0 (the header lives in block 0)
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4
_CHUNK = struct.Struct("<IHB")
_TYPE_CRC = {t: zlib.crc32(bytes([t])) for t in (FULL, FIRST, MIDDLE, LAST)}
_F64 = struct.Struct("<d")

# Protobuf field numbers, from wandb/proto/wandb_internal.proto as shipped in wandb 0.31.0
# (site-packages/wandb/proto/v6/wandb_internal_pb2.py; identical in v5/ and v7/).
REC_NUM, REC_HISTORY, REC_SUMMARY, REC_OUTPUT, REC_CONFIG = 1, 2, 3, 4, 5  # Record
REC_OUTPUT_RAW, REC_RUN, REC_EXIT, REC_FINAL, REC_HEADER, REC_PREEMPTING = 13, 17, 18, 20, 21, 23
_REC_NAMES = {2: "history", 3: "summary", 4: "output", 5: "config", 6: "files", 7: "stats", 8: "artifact",
              9: "tbrecord", 10: "alert", 11: "telemetry", 12: "metric", 13: "output_raw", 17: "run",
              18: "exit", 20: "final", 21: "header", 22: "footer", 23: "preempting", 25: "use_artifact",
              26: "environment", 27: "output_logger"}
HIST_ITEM, HIST_STEP, STEP_NUM = 1, 2, 1  # HistoryRecord{item, step}; HistoryStep{num}
ITEM_KEY, ITEM_NESTED, ITEM_VALUE_JSON = 1, 2, 16  # HistoryItem / SummaryItem / ConfigItem
ITEM_BOOL, ITEM_INT, ITEM_NUMBER = 4, 5, 6  # HistoryItem typed values (bool, sint64, double), 0.31.0+
UPDATE, REMOVE = 1, 2  # SummaryRecord / ConfigRecord
RUN_ID, RUN_ENTITY, RUN_PROJECT, RUN_CONFIG, RUN_GROUP, RUN_JOB_TYPE = 1, 2, 3, 4, 6, 7  # RunRecord
RUN_NAME, RUN_HOST, RUN_STARTING_STEP, RUN_START_TIME, RUN_RESUMED = 8, 13, 14, 17, 18
RUN_FORKED, RUN_BRANCH_POINT, RUN_RESUME = 22, 23, 24
BRANCH_RUN, BRANCH_VALUE, BRANCH_METRIC = 1, 2, 3  # BranchPoint
OUT_TYPE, OUT_LINE = 1, 3  # OutputRawRecord / OutputRecord (0 = stderr, 1 = stdout)
EXIT_CODE, EXIT_RUNTIME, EXIT_NOT_COMPLETE = 1, 2, 3  # RunExitRecord
HEADER_VERSION, VERSION_PRODUCER = 1, 1  # HeaderRecord{version_info{producer}}
TS_SECONDS, TS_NANOS = 1, 2  # google.protobuf.Timestamp

_SPECIAL = ("_step", "_runtime", "_timestamp")
_SIDE_FILES = {"output.log", "wandb-summary.json"}
_DEBUG_LOGS = {"debug.log", "debug-internal.log", "debug-core.log"}


class _Corrupt(Exception):
    """A payload whose chunks were intact but that does not decode as a Record."""


def _run_dir_of(path: Path) -> Path | None:
    """The W&B run folder of a side file (``files/…``, ``logs/…``), if it holds a ``run-*.wandb``."""
    d = path.parent.parent if path.parent.name in ("files", "logs") else path.parent
    return d if any(d.glob("run-*.wandb")) else None


def sniff(path: Path) -> bool:
    """True for ``run-*.wandb`` (empty, or starting with ``:W&B``) and for a W&B run folder's side files.

    Side files: ``files/output.log``, ``files/wandb-summary.json``, ``logs/debug*.log`` of a folder
    that holds a ``run-*.wandb``, and the ``wandb/debug*.log`` links. Never raises.
    """
    try:
        name = path.name
        if name.startswith("run-") and name.endswith(".wandb"):
            with open(path, "rb") as fh:
                head = fh.read(4)
            return head in (b"", MAGIC[:4])
        if name in _DEBUG_LOGS and path.parent.name == "wandb":
            return any(path.parent.glob("*run-*/run-*.wandb"))
        if name in _SIDE_FILES and path.parent.name == "files" or name in _DEBUG_LOGS and path.parent.name == "logs":
            return _run_dir_of(path) is not None
    except OSError:
        return False
    return False


# -- protobuf wire format ------------------------------------------------------------------------
def _varint(b: bytes, i: int) -> tuple[int, int]:
    val = shift = 0
    while True:
        x = b[i]
        i += 1
        val |= (x & 0x7F) << shift
        if x < 0x80:
            return val, i
        shift += 7
        if shift > 63:
            raise _Corrupt("varint too long")


def _fields(b: bytes, i: int = 0, end: int | None = None):
    """Yield ``(field number, value)`` of a message: an int for varint/fixed fields, bytes for length-delimited."""
    end = len(b) if end is None else end
    while i < end:
        key = b[i]
        i += 1
        if key >= 0x80:
            key, i = _varint(b, i - 1)
        wt = key & 7
        if wt == 2:
            n = b[i]
            i += 1
            if n >= 0x80:
                n, i = _varint(b, i - 1)
            if i + n > end:
                raise _Corrupt("field runs past the end of its message")
            yield key >> 3, b[i:i + n]
            i += n
        elif wt == 0:
            v, i = _varint(b, i)
            yield key >> 3, v
        elif wt in (1, 5):
            w = 8 if wt == 1 else 4
            yield key >> 3, int.from_bytes(b[i:i + w], "little")
            i += w
        else:
            raise _Corrupt(f"unsupported wire type {wt}")
    if i != end:
        raise _Corrupt("message runs past its end")


def _text(b: bytes) -> str:
    return b.decode("utf-8", "replace")


def _item(b: bytes) -> tuple[str, Any, bool]:
    """``(key joined with '/', value, is_json_text)`` of a History/Summary/ConfigItem."""
    key, nested, value, is_json = "", [], None, True
    for f, v in _fields(b):
        if f == ITEM_VALUE_JSON:
            value = _text(v)
        elif f == ITEM_NESTED:
            nested.append(_text(v))
        elif f == ITEM_KEY:
            key = _text(v)
        elif f == ITEM_NUMBER:
            value, is_json = _F64.unpack(v.to_bytes(8, "little"))[0], False
        elif f == ITEM_INT:
            value, is_json = float((v >> 1) ^ -(v & 1)), False
        elif f == ITEM_BOOL:
            value, is_json = float(bool(v)), False
    return ("/".join(nested) if nested else key), value, is_json


def _json(text: str | None) -> Any:
    """JSON value text (``NaN``/``Infinity`` accepted); undecodable text is kept as a string."""
    try:
        return json.loads(text) if text is not None else None
    except ValueError:
        return text


def _number(text: str) -> float | None | str:
    """A history value: float (NaN/inf kept), ``None`` for JSON null, else ``"odd"`` (not a number)."""
    try:
        return float(text)  # the Go encoder writes numbers, NaN, Infinity, -Infinity
    except ValueError:
        v = _json(text)
    if v is None or isinstance(v, bool):
        return None if v is None else float(v)
    return "odd"


def _set_nested(d: dict[str, Any], key: str, value: Any, remove: bool = False) -> None:
    *head, last = key.split("/")
    for k in head:
        d = d.setdefault(k, {}) if isinstance(d.get(k, {}), dict) else d.setdefault(f"{k}~", {})
    if remove:
        d.pop(last, None)
    else:
        d[last] = value


def _update(target: dict[str, Any], b: bytes) -> None:
    """Apply a SummaryRecord/ConfigRecord (``update`` items, then ``remove`` items) to ``target``."""
    for f, v in _fields(b):
        if f in (UPDATE, REMOVE):
            key, text, is_json = _item(v)
            _set_nested(target, key, _json(text) if is_json else text, remove=f == REMOVE)


def _flat(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        out.update(_flat(v, f"{prefix}{k}/") if isinstance(v, dict) else {f"{prefix}{k}": v})
    return out


# -- the file ------------------------------------------------------------------------------------
class _State:
    """Everything read from one ``.wandb`` file."""

    def __init__(self, rel: str) -> None:
        self.rows = Rows(rel)
        self.meta: dict[str, Any] = {"run_id": None, "exit": None}
        self.config: dict[str, Any] = {}
        self.summary: dict[str, Any] = {}
        self.counts: Counter[str] = Counter()
        self.media: dict[str, dict[str, Any]] = {}
        self.non_numeric: Counter[str] = Counter()
        self.step: int | None = None  # the last history step
        self.start: float | None = None  # run start, s since epoch
        self.out: list[tuple[int | None, str]] = []  # console lines with the step they were printed at
        self.partial: dict[int, str] = {}  # console text after the last newline, per stream
        self.events: list[tuple[int | None, str, str]] = []

    def history(self, b: bytes) -> None:
        step = wall = runtime = None
        vals: list[tuple[str, float | None]] = []
        odd: list[tuple[str, str]] = []
        for f, v in _fields(b):
            if f == HIST_ITEM:
                key, text, is_json = _item(v)
                x = _number(text) if is_json and text is not None else text
                if key in _SPECIAL:
                    if isinstance(x, float):
                        step, wall, runtime = ((int(x) if key == "_step" else step), (x if key == "_timestamp"
                                               else wall), (x if key == "_runtime" else runtime))
                elif x == "odd":
                    odd.append((key, text))
                else:
                    vals.append((key, x))
            elif f == HIST_STEP and step is None:
                step = next((n for g, n in _fields(v) if g == STEP_NUM), 0)
        step = 0 if step is None else step
        if wall is None and runtime is not None and self.start is not None:
            wall = self.start + runtime
        self.rows.extend(0, step, [(canonical_metric(k), k, x) for k, x in vals], wall)
        self.step = step
        if odd:
            self._odd(odd)

    def _odd(self, odd: list[tuple[str, str]]) -> None:
        """Count non-numeric items: media (``<key>/_type`` items or ``{"_type": …}`` values) and the rest."""
        kinds = {k[:-6]: _json(t) for k, t in odd if k.endswith("/_type")}
        for k, t in odd:
            v = _json(t)
            if isinstance(v, dict) and isinstance(v.get("_type"), str):
                kinds[k] = v["_type"]
            elif isinstance(v, dict):  # a dict logged as one JSON value: its numeric leaves are metrics
                nums = [(f"{k}/{kk}", x) for kk, x in _flat(v).items()
                        if isinstance(x, (int, float)) and not isinstance(x, bool)]
                self.rows.extend(0, self.step or 0, [(canonical_metric(n), n, float(x)) for n, x in nums])
                if not nums:
                    self.non_numeric[k] += 1
        for k, kind in kinds.items():
            m = self.media.setdefault(k, {"type": str(kind), "rows": 0})
            m["rows"] += 1
        for k, t in odd:
            if not any(k == p or k.startswith(p + "/") for p in kinds) and not isinstance(_json(t), dict):
                self.non_numeric[k] += 1

    def output(self, b: bytes) -> None:
        stream, text = 0, ""
        for f, v in _fields(b):
            if f == OUT_TYPE:
                stream = v
            elif f == OUT_LINE:
                text = _text(v)
        *lines, self.partial[stream] = (self.partial.get(stream, "") + text).replace("\r\n", "\n").split("\n")
        self.out.extend((self.step, ln) for ln in lines)

    def run(self, b: bytes) -> None:
        m = self.meta
        names = {RUN_ID: "run_id", RUN_ENTITY: "entity", RUN_PROJECT: "project", RUN_GROUP: "group",
                 RUN_JOB_TYPE: "job_type", RUN_NAME: "run_name", RUN_HOST: "host"}
        for f, v in _fields(b):
            if f in names:
                m[names[f]] = _text(v)
            elif f == RUN_CONFIG:
                _update(self.config, v)
            elif f == RUN_STARTING_STEP:
                m["starting_step"] = v
            elif f == RUN_START_TIME:
                ts = dict(_fields(v))
                self.start = m["start_time"] = ts.get(TS_SECONDS, 0) + ts.get(TS_NANOS, 0) / 1e9
            elif f in (RUN_RESUMED, RUN_RESUME):
                m["resumed"] = m.get("resumed", False) or bool(v)
            elif f == RUN_FORKED:
                m["forked"] = bool(v)
            elif f == RUN_BRANCH_POINT:
                bp = dict(_fields(v))
                m["branch_point"] = {"run": _text(bp.get(BRANCH_RUN, b"")), "metric": _text(bp.get(
                    BRANCH_METRIC, b"")), "value": _F64.unpack(bp.get(BRANCH_VALUE, 0).to_bytes(8, "little"))[0]}

    def record(self, b: bytes) -> None:
        for f, v in _fields(b):
            if f not in _REC_NAMES:  # num, control, uuid, _info
                continue
            self.counts[_REC_NAMES[f]] += 1
            if f == REC_HISTORY:
                self.history(v)
            elif f == REC_SUMMARY:
                _update(self.summary, v)
            elif f in (REC_OUTPUT_RAW, REC_OUTPUT):
                self.output(v)
            elif f == REC_CONFIG:
                _update(self.config, v)
            elif f == REC_RUN:
                self.run(v)
            elif f == REC_EXIT:
                ex = dict(_fields(v))
                code = ex.get(EXIT_CODE, 0)
                code = code - (1 << 64) if code >= 1 << 63 else code  # int32 varints are sign-extended
                self.meta["exit"] = {"exit_code": code, "runtime_s": ex.get(EXIT_RUNTIME, 0),
                                     "not_complete": bool(ex.get(EXIT_NOT_COMPLETE, 0))}
                if code:
                    self.events.append((self.step, "error", f"W&B exit record: the run exited with code {code}"))
            elif f == REC_PREEMPTING:
                self.events.append((self.step, "job_end", "W&B preempting record: the job was preempted"))
            elif f == REC_HEADER:
                ver = dict(_fields(v)).get(HEADER_VERSION, b"")
                self.meta["producer"] = _text(dict(_fields(ver)).get(VERSION_PRODUCER, b""))


def _walk(data: bytes, rel: str, st: _State, skipped: list[Skip]) -> int:
    """Walk the blocks and chunks of ``data``, feeding each reassembled record to ``st``; returns damaged bytes."""
    n, pos, damaged = len(data), len(MAGIC), 0
    parts: list[bytes] | None = None
    start, resynced = 0, False
    while pos < n:
        left = BLOCK - pos % BLOCK
        if left < _CHUNK.size:  # block trailer: zero padding
            pos += left
            continue
        if pos + _CHUNK.size > n:
            skipped.append(Skip(f"{rel}:{pos}", f"truncated chunk header at end of file ({n - pos} bytes; killed job?)"))
            break
        crc, length, typ = _CHUNK.unpack_from(data, pos)
        end = pos + _CHUNK.size + length
        if end > n and length <= left - _CHUNK.size and typ in _TYPE_CRC:
            skipped.append(Skip(f"{rel}:{pos}", f"truncated chunk at end of file ({n - pos} of "
                                                f"{end - pos} bytes; killed job?)"))
            break
        if crc == length == typ == 0 and not any(data[pos:min(n, pos + left)]):
            why = "zeroed block" if pos % BLOCK == 0 or pos == len(MAGIC) else "zeroed rest of block"
        elif typ not in _TYPE_CRC or length > left - _CHUNK.size:
            why = f"bad chunk header (type {typ}, length {length})"
        elif zlib.crc32(data[pos + _CHUNK.size:end], _TYPE_CRC[typ]) != crc:
            why = "bad chunk CRC"
        else:
            why = ""
        if why:
            nxt = min(n, pos + left)
            damaged += nxt - pos
            lost = f"; the record started at {start} is lost" if parts is not None else ""
            skipped.append(Skip(f"{rel}:{pos}", f"{why}; skipped to the next block at {nxt}{lost}"))
            pos, parts, resynced = nxt, None, True
            continue
        payload = data[pos + _CHUNK.size:end]
        if typ in (FULL, FIRST) and parts is not None:
            skipped.append(Skip(f"{rel}:{start}", "record without its LAST chunk; dropped"))
        if typ == FULL:
            parts, whole, start = None, payload, pos
        elif typ == FIRST:
            parts, start, whole = [payload], pos, None
        elif parts is None:  # MIDDLE/LAST whose FIRST was lost
            if not resynced:
                skipped.append(Skip(f"{rel}:{pos}", "continuation chunk without its FIRST chunk; dropped"))
            whole = None
        else:
            parts.append(payload)
            whole = b"".join(parts) if typ == LAST else None
            parts = None if typ == LAST else parts
        pos = end
        if whole is None:
            continue
        resynced = False
        try:
            st.record(whole)
        except (_Corrupt, IndexError, ValueError) as exc:
            skipped.append(Skip(f"{rel}:{start}", f"undecodable record ({exc}); skipped"))
    if parts is not None:
        skipped.append(Skip(f"{rel}:{start}", "truncated record at end of file (FIRST chunk without LAST; "
                                              "killed job?)"))
    return damaged


def _console(st: _State, rel: str, log: Path) -> tuple[Rows, dict[str, Any]]:
    """Console lines (binary output records, else or after them ``files/output.log``) through the text-log rules.

    Returns the text-log rows (events and stdout metrics) and ``meta["console"]``.
    """
    from parsers import textlog  # its line assembler: errors, tracebacks, NaN notices, overflows, resumes

    lines = st.out + [(st.step, p) for p in st.partial.values() if p.strip()]
    info: dict[str, Any] = {"source": "binary" if lines else None, "lines": len(lines)}
    if log.is_file() and (not lines or st.meta["exit"] is None):  # no console in the binary, or it lost its end
        text = log.read_text(encoding="utf-8", errors="replace").replace("\r\n", "\n")
        log_lines = text.split("\n")[:-1] if text.endswith("\n") else text.split("\n")
        if not lines:
            lines, info["source"] = [(None, ln) for ln in log_lines], "files/output.log"
        else:
            last = next((ln.strip() for _, ln in reversed(lines) if ln.strip()), None)
            j = next((j for j in range(len(log_lines) - 1, -1, -1) if log_lines[j].strip() == last), None)
            if j is not None and j + 1 < len(log_lines):
                lines += [(st.step, ln) for ln in log_lines[j + 1:]]
                info.update(source="binary + files/output.log tail", tail_lines=len(log_lines) - j - 1)
        info["lines"] = len(lines)
    asm = textlog._Assembler(rel)
    for lineno, (step, line) in enumerate(lines, 1):
        seen = len(asm.rows.events)
        asm.line(common.clean(line), lineno)
        for ev in asm.rows.events[seen:]:
            ev["step"] = step if ev["step"] is None else ev["step"]
    keep, meta = asm.finish(len(lines))
    for ev in asm.rows.events:
        ev["segment"] = 0
        ev["step"] = st.step if ev["step"] is None else ev["step"]
    if meta.get("framework") not in (None, "generic"):
        info["framework"] = meta["framework"]
    asm.rows.seg = [0] * len(asm.rows.seg)
    return asm.rows, info | ({"keep": keep} if keep else {})


def _load_yaml_config(path: Path) -> dict[str, Any]:
    """``files/config.yaml`` as W&B writes it (``key: {desc, value}``), unwrapped; ``{}`` when unreadable."""
    try:
        import yaml

        raw = yaml.safe_load(path.read_text(encoding="utf-8", errors="replace"))
    except (OSError, ValueError, ImportError, Exception):  # noqa: BLE001 - a bad side file is not fatal
        return {}
    if not isinstance(raw, dict):
        return {}
    return {str(k): (v["value"] if isinstance(v, dict) and "value" in v else v)
            for k, v in raw.items() if k not in ("wandb_version", "_wandb")}


def _side(path: Path, root: Path, rel: str) -> ParseResult:
    """An empty result for a side file this module covers (or the text-log reading of an orphan output.log)."""
    if path.name in _DEBUG_LOGS:
        return ParseResult(format=FORMAT, path=rel, meta={"side_file": "W&B client debug log; not training "
                                                                       "output, not read"})
    run_dir = _run_dir_of(path)
    wb = sorted(run_dir.glob("run-*.wandb")) if run_dir else []
    ok = [p for p in wb if p.read_bytes()[:len(MAGIC)] == MAGIC]
    if not ok and path.name == "output.log":
        from parsers import textlog

        return textlog.read(path, root)
    by = ok[0] if ok else (wb[0] if wb else path)
    return ParseResult(format=FORMAT, path=rel, meta={"side_file": "read with the W&B transaction log",
                                                      "read_with": _rel(by, root)})


def _rel(path: Path, root: Path) -> str:
    return path.relative_to(root).as_posix() if path.is_relative_to(root) else path.name


def read(path: Path, root: Path) -> ParseResult:
    """Read a W&B run: its ``run-<id>.wandb`` transaction log and the side files of its folder.

    Args:
        path: The ``run-<id>.wandb`` file (or a side file claimed by :func:`sniff`: empty result).
        root: The run folder; ``source`` and ``Skip.what`` are relative to it.

    Returns:
        Metrics: one row per numeric history item (``tag`` = key, nested keys joined with ``/``;
        ``step`` = the ``_step`` item, else ``HistoryStep.num``; ``wall_time`` = ``_timestamp`` in s
        since epoch, else run start + ``_runtime``; value float64, NaN/inf kept, JSON null -> null),
        plus stdout metric lines for metrics the history lacks. Events: console lines through the
        text-log rules (errors, hardware errors, NaN notices, checkpoints; ``step`` = the history step
        at which the line was printed), a ``restart`` for a resumed or forked run, an ``error`` for a
        non-zero exit code, ``job_end`` for a preemption. ``meta``: ``run_id``, ``run_name``,
        ``project``, ``entity``, ``host``, ``start_time`` (s since epoch), ``starting_step``,
        ``resumed``, ``forked``/``branch_point``, ``config``, ``hparams`` (flat scalars), ``summary``,
        ``exit`` (``None``: no exit record, the process died before ``finish``), ``finished``,
        ``records`` (counts by type), ``media`` and ``non_numeric`` (non-scalar history keys),
        ``console``, ``damaged_bytes``, ``producer``. ``skipped``: each damaged or cut chunk with
        its byte offset (``<rel>:<offset>``).

    Raises:
        ParseError: The file is empty, or does not start with the ``:W&B`` header.
    """
    rel = _rel(path, root)
    if not path.name.endswith(".wandb"):
        return _side(path, root, rel)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ParseError(rel, f"unreadable: {exc.strerror or exc}") from exc
    if not data:
        raise ParseError(rel, "empty .wandb file (the run wrote nothing)")
    if data[:len(MAGIC)] != MAGIC:
        raise ParseError(rel, f"not a W&B transaction log: header {data[:len(MAGIC)]!r}, expected {MAGIC!r}")
    st, skipped = _State(rel), []
    damaged = _walk(data, rel, st, skipped)
    files = path.parent / "files"
    config = {k: v for k, v in st.config.items() if k != "_wandb"}
    if not config and (files / "config.yaml").is_file():
        config = _load_yaml_config(files / "config.yaml")
    summary = {k: v for k, v in st.summary.items() if k != "_wandb"}
    if not summary and (files / "wandb-summary.json").is_file():
        try:
            loaded = json.loads((files / "wandb-summary.json").read_text(encoding="utf-8", errors="replace"))
            summary = {k: v for k, v in loaded.items() if k != "_wandb"} if isinstance(loaded, dict) else {}
        except (OSError, ValueError):
            skipped.append(Skip(_rel(files / "wandb-summary.json", root), "not valid JSON; summary not read"))
    crows, console = _console(st, rel, files / "output.log")
    rows, keep = st.rows, console.pop("keep", None)
    logged = set(rows.metric)
    for i in range(len(crows)):
        if crows.metric[i] not in logged and (keep is None or keep[i]):
            rows.add(0, crows.step[i], crows.metric[i], crows.value[i], crows.tag[i], crows.wall[i])
    m = st.meta
    steps = [s for s in rows.step]
    if m.get("resumed") or m.get("forked"):
        how = f"forked from {m['branch_point']}" if m.get("forked") else "resumed (a new run folder)"
        rows.event(0, min(steps) if steps else m.get("starting_step"), "restart", f"W&B run {m['run_id']} {how}")
    for step, kind, msg in st.events:
        rows.event(0, step, kind, msg)
    rows.events.extend(crows.events)
    m.update(config=config, hparams={k: v for k, v in _flat(config).items()
                                     if isinstance(v, (int, float, str, bool)) or v is None},
             summary=summary, finished=m["exit"] is not None or st.counts["final"] > 0,
             records=dict(st.counts), history_rows=st.counts["history"], metric_rows=len(rows),
             first_step=min(steps) if steps else None, last_step=max(steps) if steps else None,
             media=st.media, non_numeric=dict(st.non_numeric), console=console, damaged_bytes=damaged,
             run_dir=path.parent.name)
    if "framework" in console:
        m["framework"] = console["framework"]
    if not st.counts:
        raise ParseError(rel, "no readable record in the file" + (f" ({skipped[0].reason})" if skipped else ""))
    return ParseResult(format=FORMAT, path=rel, metrics=rows.metrics_table(), events=rows.events_table(),
                       meta=m, skipped=tuple(skipped), precision="float64")
