"""MLflow tracking stores: the file store (``mlruns/``) and the SQLite store (``mlflow.db``).

- File store: ``mlruns/<experiment_id>/<run_id>/{meta.yaml, metrics/, params/, tags/}``. One file per
  metric key under ``metrics/`` (a key with ``/`` is a sub-folder); each line is
  ``"<timestamp_ms> <value> <step>"`` (old files: ``"<timestamp_ms> <value>"``, step 0). Each metric
  file is a source of its own; its metric name is its path relative to ``metrics/``. The run's
  ``meta.yaml``, ``params/`` and ``tags/`` go to ``meta``. A last line without a newline may be cut
  inside its value and is dropped (a ``Skip`` naming ``path:line``); ``nan``/``inf`` are kept.
  The step going back starts a new local segment. A metric file outside a run folder (copied out
  of ``mlruns/``) is still read by ``read`` with its file name as key, but ``sniff`` does not claim it.
- SQLite store: table ``metrics(key, value, timestamp, step, is_nan, run_uuid)`` read with the stdlib
  ``sqlite3`` (read-only). ``is_nan=1`` is NaN (stored as value 0) and ``+-1.7976931348623157e308``
  is ``+-inf``. Several runs in one database are not segments of one run: every row stays in
  segment 0, ``meta["runs"]`` lists the run ids, and with more than one run the ``tag`` is
  ``"<key>@<run_uuid[:8]>"`` (one run: the plain key).

See ``docs/formats.md#mlflow``.
"""

from __future__ import annotations

import math
import sqlite3
from pathlib import Path
from typing import Any

from forensics.errors import ParseError
from forensics.model import ParseResult, Skip
from parsers import file_policy, safe_yaml
from parsers._io import read_table_bytes
from parsers.lines import Rows, metric
from parsers.mlflow_sqlite import FORMAT, SQLITE_MAGIC, param, read_sqlite, sniff_sqlite

__all__ = ["FORMAT", "read", "sniff"]
_DBL_MAX = 1.7976931348623157e308
_MAX_DEPTH = 12  # how many folders above a metric file to look for ``metrics/``
_MAX_SIDE_FILES = 500
_MAX_SIDE_BYTES = 64 * 1024
_INT64 = 1 << 63
_METRIC_COLS = {"key", "value", "timestamp", "step", "run_uuid"}


# ----------------------------------------------------------------------------------------- file store

def _metrics_dir(path: Path) -> Path | None:
    """The ``metrics/`` folder above ``path`` whose parent (the run folder) holds ``meta.yaml``."""
    for i, folder in enumerate(path.parents):
        if i >= _MAX_DEPTH:
            break
        if folder.name == "metrics" and (folder.parent / "meta.yaml").exists():
            return folder
    return None


def _parse_line(line: str) -> tuple[float, float, int] | None:
    """``(timestamp_ms, value, step)`` of one metric line, or ``None`` when it is not one."""
    parts = line.split()
    if len(parts) not in (2, 3):
        return None
    try:
        ts, value = float(parts[0]), float(parts[1])
        step = 0
        if len(parts) == 3:
            try:
                step = int(parts[2])
            except ValueError:
                step = int(float(parts[2]))
    except (ValueError, OverflowError):
        return None
    if not math.isfinite(ts) or not -_INT64 <= step < _INT64:
        return None
    return ts, value, step


def _sniff_file_store(path: Path) -> bool:
    if _metrics_dir(path) is None or not file_policy.is_readable_file(path):
        return False
    with file_policy.open_file(path) as fh:
        head = fh.read(256)
    first = head.split(b"\n", 1)[0].decode("utf-8", errors="replace")
    if not head:
        return True  # an empty metric file: read() reports it
    return _parse_line(first) is not None or b"\n" not in head and len(head) < 256


def _read_side(folder: Path, skipped: list[Skip], root_rel: str) -> dict[str, str]:
    """``params/`` or ``tags/``: ``{key: text}`` (keys with ``/`` are sub-folders)."""
    out: dict[str, str] = {}
    if not folder.is_dir():
        return out
    try:
        files = sorted(p for p in folder.rglob("*") if not p.is_dir())
    except OSError:
        return out
    for p in files[:_MAX_SIDE_FILES]:
        key = file_policy.display(p.relative_to(folder).as_posix())
        try:
            if p.stat().st_size > _MAX_SIDE_BYTES:
                out[key] = f"<not loaded: {p.stat().st_size} bytes>"
                continue
            out[key] = file_policy.read_text(p, _MAX_SIDE_BYTES, encoding="utf-8")
        except OSError as exc:
            skipped.append(Skip(f"{root_rel}/{folder.name}/{key}", f"not read: {exc.strerror or exc}"))
    return out


def _run_meta(run_dir: Path, skipped: list[Skip], rel_run: str) -> dict[str, Any]:
    meta: dict[str, Any] = {}
    try:
        info = safe_yaml.load(file_policy.read_text(run_dir / "meta.yaml", _MAX_SIDE_BYTES, encoding="utf-8"))
    except OSError as exc:  # a FIFO, a device, a link out of the run: never opened
        skipped.append(Skip(f"{rel_run}/meta.yaml", f"not read: {exc.strerror or exc}"))
        info = None
    except Exception as exc:  # noqa: BLE001 - meta.yaml is a side file; a broken one costs only the run info
        if isinstance(exc, safe_yaml.TooLarge):
            skipped.append(Skip(f"{rel_run}/meta.yaml", f"not loaded: YAML {exc}"))
        info = None
    if isinstance(info, dict):
        for k in ("run_id", "run_uuid", "experiment_id", "run_name", "status", "start_time", "end_time",
                  "lifecycle_stage", "user_id"):
            if info.get(k) is not None:
                meta[k] = info[k] if isinstance(info[k], (int, float, bool)) else str(info[k])
    meta.setdefault("run_id", meta.get("run_uuid") or run_dir.name)
    meta.setdefault("experiment_id", run_dir.parent.name)
    params = _read_side(run_dir / "params", skipped, rel_run)
    if params:
        meta["params"] = params
        meta["hparams"] = {k: param(v) for k, v in params.items()}
    tags = _read_side(run_dir / "tags", skipped, rel_run)
    if tags:
        meta["tags"] = tags
        if "mlflow.runName" in tags:
            meta.setdefault("run_name", tags["mlflow.runName"].strip())
    return meta


def _read_metric_file(path: Path, root: Path, rel: str, mdir: Path | None) -> ParseResult:
    key = path.relative_to(mdir).as_posix() if mdir is not None else path.name
    name = metric(key, None)[0]
    rows = Rows(rel)
    skipped: list[Skip] = []
    try:
        data, cut = read_table_bytes(path)
    except OSError as exc:
        raise ParseError(rel, f"unreadable MLflow metric file: {exc.strerror or exc}") from exc
    if cut:
        skipped.append(Skip(rel, cut))
    text = data.decode("utf-8-sig", errors="replace")
    lines = text.splitlines(keepends=True)
    segment, last = 0, None
    for lineno, raw in enumerate(lines, 1):
        line = raw.strip()
        if not line:
            continue
        if lineno == len(lines) and not raw.endswith(("\n", "\r")):
            # MLflow writes each line with its newline: one without may be cut inside its value
            skipped.append(Skip(f"{rel}:{lineno}", "torn last line (no newline; the writer was killed "
                                "mid-line?); dropped because its value or step may be cut short"))
            continue
        rec = _parse_line(line)
        if rec is None:
            skipped.append(Skip(f"{rel}:{lineno}", "not a '<timestamp_ms> <value> [<step>]' line"))
            continue
        ts, value, step = rec
        if last is not None and step < last:
            segment += 1
        last = step
        rows.add(segment, step, name, value, key, ts / 1000.0)
    if not len(rows) and not skipped:
        raise ParseError(rel, "empty MLflow metric file")
    if not len(rows):
        raise ParseError(rel, f"no readable line in the MLflow metric file ({skipped[0].reason})")
    meta: dict[str, Any] = {}
    if mdir is not None:
        run_dir = mdir.parent
        rel_run = run_dir.relative_to(root).as_posix() if run_dir.is_relative_to(root) else run_dir.name
        meta = _run_meta(run_dir, skipped, rel_run)
    meta.update({"store": "file", "key": key, "segments": segment + 1, "framework": "mlflow"})
    return ParseResult(format=FORMAT, path=rel, metrics=rows.metrics_table(), events=rows.events_table(),
                       meta=meta, skipped=tuple(skipped), precision="float64")


# --------------------------------------------------------------------------------------- SQLite store


# ------------------------------------------------------------------------------------------ contract

def sniff(path: Path) -> bool:
    """True for a metric file of an MLflow file store, or an MLflow SQLite store (never raises)."""
    try:
        if path.name.lower().endswith((".db", ".sqlite", ".sqlite3")):
            return sniff_sqlite(path)
        return _sniff_file_store(path)
    except (OSError, ValueError, sqlite3.Error):
        return False


def read(path: Path, root: Path) -> ParseResult:
    """Read one MLflow metric file (file store) or one ``mlflow.db`` (SQLite store).

    Args:
        path: ``.../metrics/<key>`` of a file-store run, or the SQLite database.
        root: The run folder; ``source`` is relative to it.

    Returns:
        A :class:`ParseResult` (canonical metric names, the key as ``tag``, ``wall_time`` from the
        millisecond timestamps); damaged lines or rows are listed in ``skipped``.

    Raises:
        ParseError: The file holds no readable metric record.
    """
    rel = file_policy.rel(path, root)
    try:
        with open(path, "rb") as fh:
            magic = fh.read(16)
    except OSError as exc:
        raise ParseError(rel, f"unreadable file: {exc.strerror or exc}") from exc
    if magic == SQLITE_MAGIC:
        return read_sqlite(path, rel)
    # a metric file outside a run folder (copied out of mlruns/) is read with its file name as key
    return _read_metric_file(path, root, rel, _metrics_dir(path))
