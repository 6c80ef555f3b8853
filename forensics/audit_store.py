"""An audit's per-run outputs: the reports under ``OUT/runs/<name>/`` and the incremental cache ``OUT/.cache``.

A cache entry is keyed by the run's files (relative paths, sizes, modification times) and the analyser
version; it is served only while every report it lists is a whole file. Every write is atomic
(:mod:`forensics.atomic`: a unique temporary in the same folder, renamed).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from forensics import atomic
from forensics.audit_runs import RunTask

EXT = {"html": "html", "json": "json", "markdown": "md", "text": "txt"}
"""Report format -> file extension of ``OUT/runs/<name>/report.<ext>``."""


def _cache_path(out: Path, task: RunTask) -> Path:
    return out / ".cache" / f"{task.name}.json"


def _whole(path: Path) -> bool:
    """A report the cache may serve: a regular, non-empty file (a 0-byte one is a killed write)."""
    try:
        return path.is_file() and path.stat().st_size > 0
    except OSError:
        return False


def cache_get(out: Path, task: RunTask) -> dict[str, Any] | None:
    """The cached row of an unchanged run whose reports are all whole, else ``None``."""
    try:
        entry = json.loads(_cache_path(out, task).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(entry, dict) or entry.get("key") != task.key or not isinstance(entry.get("row"), dict):
        return None
    if not all(_whole(out / "runs" / task.name / f"report.{EXT[f]}") for f in entry.get("formats", [])):
        return None
    if set(task.formats) - set(entry.get("formats", [])) and not entry["row"].get("error"):
        return None
    row = dict(entry["row"], path=task.path, cached=True)
    return row


def store(out: Path, task: RunTask, res: Mapping[str, Any]) -> dict[str, Any]:
    """Write the run's reports and its cache entry; return its row."""
    row = dict(res["row"], cached=False)
    folder = out / "runs" / task.name
    written = []
    if res.get("reports"):
        folder.mkdir(parents=True, exist_ok=True)
        for fmt, text in res["reports"].items():
            atomic.write_text(folder / f"report.{EXT[fmt]}", text)  # a killed write leaves no cut report
            written.append(fmt)
    row["report"] = _link(task.name, written)
    if not res.get("cacheable"):  # a lost worker or a failed download: try again next time
        _cache_path(out, task).unlink(missing_ok=True)
        return row
    entry = {"key": task.key, "formats": written, "row": row}
    atomic.write_text(_cache_path(out, task), json.dumps(entry, allow_nan=False))  # unique temporary, renamed
    return row


def _link(name: str, formats: Sequence[str]) -> str | None:
    for fmt in ("html", "json", "markdown", "text"):
        if fmt in formats:
            return f"runs/{name}/report.{EXT[fmt]}"
    return None
