"""The audit's worker side: analyse one run folder (local, or downloaded from an fsspec URL) into a row.

:func:`work` runs in a worker process or on a Dask worker; it never raises for a bad run (the row
then carries the error). The row's keys are :data:`forensics.audit.COLUMNS`.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path, PurePosixPath
from typing import Any

from forensics.audit_runs import RunTask, remote_fs
from forensics.errors import InputError
from forensics.model import Verdict

_IDENTITY_KEYS = {"seed", "data_seed", "run_name", "run_id", "id", "name", "output_dir", "logging_dir",
                  "resume_from_checkpoint", "hub_model_id", "timestamp", "date", "host", "hostname"}
"""Configuration keys that differ between runs of one configuration (left out of the cohort hash)."""


def work(task: RunTask) -> dict[str, Any]:
    """Analyse one run (in a worker process or on a Dask worker): the row and the rendered reports.

    Never raises for a bad run: the row then carries the error and no report is rendered.

    Returns:
        ``{"row": {...}, "reports": {format: text}, "cacheable": bool}``; ``cacheable`` is False
        when the failure may not come from the run's files (a download or an unexpected error).
    """
    from forensics.errors import ForensicsError

    t0 = time.perf_counter()
    tmp, cacheable = None, True
    try:
        local = task.path
        if task.remote:
            tmp = tempfile.mkdtemp(prefix="forensics-audit-")
            local = str(Path(tmp) / (PurePosixPath(task.path).name or "run"))
            _download(task, local)
        row, reports = _analyse(task, local)
    except Exception as exc:  # noqa: BLE001 - a run that cannot be read is a row, never a crash
        cacheable = isinstance(exc, ForensicsError)
        msg = exc.message if isinstance(exc, ForensicsError) else f"{type(exc).__name__}: {exc}"
        row, reports = error_row(task, " ".join(str(msg).split())[:500]), {}
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    row["seconds"] = round(time.perf_counter() - t0, 3)
    return {"row": row, "reports": reports, "cacheable": cacheable}


def _download(task: RunTask, local: str) -> None:
    fs, top = remote_fs(task.path, task.storage_options)
    top = top.rstrip("/")
    rpaths = [f"{top}/{rel}" for rel, _ in task.files]
    lpaths = [os.path.join(local, *rel.split("/")) for rel, _ in task.files]
    for p in {os.path.dirname(p) for p in lpaths} | {local}:
        os.makedirs(p, exist_ok=True)
    if rpaths:
        fs.get(rpaths, lpaths)


def error_row(task: RunTask, message: str) -> dict[str, Any]:
    """The summary row of a run that could not be analysed."""
    return {"run": task.run, "path": task.path, "verdict": None, "cause": None, "mechanism": None,
            "onset_step": None, "onset_segment": None, "confidence": None, "last_step": None, "n_sources": 0,
            "error": message, "fingerprint": None, "status": None, "cohort": f"folder:{task.parent}",
            "spike_count": 0, "onset_z": None, "spikes_z": None, "report": None, "seconds": 0.0}


def fingerprint(cause: str | None, mechanism: str | None, onset_step: int | None) -> str:
    """``cause/mechanism/@bucket``: the onset step kept to two significant digits (1234 -> 1200)."""
    if onset_step is None:
        bucket = "none"
    else:
        step = max(int(onset_step), 0)
        unit = 10 ** max(len(str(step)) - 2, 0)
        bucket = str(step // unit * unit)
    return f"{cause or 'unknown'}/{mechanism or '-'}/@{bucket}"


def config_cohort(meta: Mapping[str, Any], parent: str) -> str:
    """``config:<hash>`` of the run's config files and hparams (seeds, names, paths left out), else the folder."""

    def strip(v: Any) -> Any:
        if isinstance(v, Mapping):
            return {str(k): strip(x) for k, x in v.items() if str(k).lower() not in _IDENTITY_KEYS}
        return [strip(x) for x in v] if isinstance(v, list | tuple) else v

    configs = {PurePosixPath(k).name: strip(v) for k, v in sorted((meta.get("config_files") or {}).items())}
    hp = strip(meta.get("hparams") or {})
    if not configs and not hp:
        return f"folder:{parent}"
    blob = json.dumps([configs, hp], sort_keys=True, default=str)
    return "config:" + hashlib.sha1(blob.encode()).hexdigest()[:12]


def _analyse(task: RunTask, local: str) -> tuple[dict[str, Any], dict[str, str]]:
    from forensics.api import analyze_run, load
    from reports import render

    run = load(local)  # forensics.api.analyze(path) == analyze_run(load(path)); the HTML needs the run's data
    if run.metrics.height == 0:  # "healthy" on no data would hide an unreadable run
        why = "; ".join(f"{s.what}: {s.reason}" for s in run.skipped[:3])
        raise InputError(local, "no metric could be read" + (f" ({why})" if why else ""))
    analysis = analyze_run(run)
    if task.remote:
        analysis = replace(analysis, run=task.path)
    reports = {fmt: render(analysis, run, fmt) for fmt in task.formats}
    onset = analysis.onset or {}
    last = run.metrics.get_column("step").max() if run.metrics.height else None
    finding = analysis.verdict in (Verdict.ANOMALY, Verdict.TRANSIENT)
    row = {
        "run": task.run, "path": task.path, "verdict": analysis.verdict, "cause": analysis.cause,
        "mechanism": analysis.mechanism, "onset_step": onset.get("step"), "onset_segment": onset.get("segment"),
        "confidence": round(float(analysis.confidence), 3), "last_step": None if last is None else int(last),
        "n_sources": len(analysis.sources), "error": None,
        "fingerprint": fingerprint(analysis.cause, analysis.mechanism, onset.get("step")) if finding else None,
        "status": None, "cohort": config_cohort(analysis.meta, task.parent),
        "spike_count": sum(1 for f in analysis.findings if f.code == "SP01"),
        "onset_z": None, "spikes_z": None, "report": None,
    }
    return row, reports
