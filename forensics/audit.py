"""Batch audit of many runs: ``forensics audit ROOT -o OUT`` (DESIGN.md section 6, STYLE.md item 10).

Every run folder under ROOT (a local folder or an fsspec URL such as ``s3://bucket/runs``) is
analysed by the same :func:`forensics.api.analyze` path (``load`` + ``analyze_run``) in parallel
processes (``concurrent.futures``) or on an existing Dask cluster (``scheduler="tcp://host:port"``).
The audit writes one report per run (``OUT/runs/<name>/report.html`` and ``report.json``),
``OUT/index.html`` (a sortable, filterable table), ``OUT/summary.parquet`` and ``OUT/summary.json``
(one row per run, columns :data:`COLUMNS`). A run that cannot be read becomes a row with its error.

Incremental: ``OUT/.cache/<name>.json`` keeps each run's row keyed by its files (relative paths,
sizes, modification times) and the analyser version; an unchanged run is not analysed again.
With a baseline (a previous ``summary.json``) each finding is ``new``, ``known`` or ``resolved`` by
its fingerprint ``cause/mechanism/@onset-bucket``. Runs of one configuration (a cohort) are
compared: onset step and spike count (``SP01`` findings) as a robust z (median/MAD) in the cohort.

Run discovery (:func:`forensics.audit_runs.find_runs`) is documented there; the analysis of one run
is :func:`forensics.audit_worker.work`; how the analyses run (pool, limits, Dask) is
:mod:`forensics.audit_execute`; the per-run reports and the cache :mod:`forensics.audit_store`; baseline
status and cohort z :mod:`forensics.audit_cohort`; the index page :func:`reports.audit_report.render_index`.
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from forensics import atomic
from forensics.audit_cohort import MIN_COHORT, cohort_z, mark_status, robust_z
from forensics.audit_execute import execute
from forensics.audit_runs import find_runs, list_runs
from forensics.audit_store import EXT, cache_get, store
from forensics.audit_worker import error_row
from forensics.errors import InputError
from forensics.model import Verdict

__all__ = ["COLUMNS", "MIN_COHORT", "AuditResult", "audit", "find_runs", "load_baseline", "robust_z"]

COLUMNS: dict[str, str] = {
    "run": "string", "path": "string", "verdict": "string", "cause": "string", "mechanism": "string",
    "onset_step": "int64", "onset_segment": "int64", "confidence": "float64", "last_step": "int64",
    "n_sources": "int64", "error": "string", "fingerprint": "string", "status": "string",
    "cohort": "string", "spike_count": "int64", "onset_z": "float64", "spikes_z": "float64",
    "report": "string", "cached": "bool", "seconds": "float64",
}
"""Columns of ``summary.parquet`` / ``summary.json`` rows and their Arrow types."""


@dataclass
class AuditResult:
    """What an audit found and wrote.

    Attributes:
        root: The audited root (path or URL) as given.
        out_dir: The output folder.
        rows: One row per run (keys :data:`COLUMNS`), sorted by run name.
        analysed: Runs analysed in this audit.
        cached: Runs served from the cache.
        seconds: Wall time of the whole audit.
    """

    root: str
    out_dir: Path
    rows: list[dict[str, Any]] = field(default_factory=list)
    analysed: int = 0
    cached: int = 0
    seconds: float = 0.0

    @property
    def index(self) -> Path:
        """``OUT/index.html``."""
        return self.out_dir / "index.html"

    @property
    def errors(self) -> list[dict[str, Any]]:
        """Rows of runs that could not be analysed."""
        return [r for r in self.rows if r["error"]]

    def exit_code(self, fail_on_new: bool = False) -> int:
        """1 when a run has an anomaly (with ``fail_on_new``: a ``new`` one), else 0."""
        bad = [r for r in self.rows if r["verdict"] == Verdict.ANOMALY and (not fail_on_new or r["status"] == "new")]
        return 1 if bad else 0


def audit(
    root: str | Path,
    out_dir: str | Path,
    jobs: int = 1,
    scheduler: str | None = None,
    baseline: str | Path | Sequence[Mapping[str, Any]] | None = None,
    formats: Sequence[str] = ("html", "json"),
    *,
    use_cache: bool = True,
    progress: bool = True,
    storage_options: Mapping[str, Any] | None = None,
    run_timeout: float | None = None,
    run_memory: int | None = None,
) -> AuditResult:
    """Analyse every run under ``root`` and write the reports, the index and the summary.

    Args:
        root: A folder, or an fsspec URL (``s3://bucket/runs``) when fsspec is installed.
        out_dir: Output folder (created); ``OUT/.cache`` holds the incremental cache.
        jobs: Worker processes on this machine (1: in this process).
        scheduler: Address of an existing Dask distributed scheduler (``tcp://host:port``); the
            analyses then run on its workers and ``jobs`` is ignored.
        baseline: A previous ``summary.json`` (path) or its rows, to mark findings new/known/resolved.
        formats: Report formats written per run (``html``, ``json``, ``markdown``, ``text``).
        use_cache: False re-analyses every run (the cache is still refreshed).
        progress: Show a progress bar on stderr.
        storage_options: Extra fsspec options for a URL root (credentials, ``endpoint_url``...).
        run_timeout: Seconds one run may take; past it the run is stopped and becomes an error row
            (:mod:`forensics.run_limits`; each run then goes to a worker process, also with ``jobs=1``).
        run_memory: Resident bytes one run's worker may hold; past it, likewise an error row.

    Returns:
        The :class:`AuditResult`; it always completes, a failed run is a row with ``error``.

    Raises:
        InputError: ``root`` does not exist, holds no run, or the baseline cannot be read.
    """
    t0 = time.perf_counter()
    out = Path(out_dir)
    base = load_baseline(baseline) if baseline is not None else None
    _check_formats(formats)
    tasks = list_runs(root, exclude=out, storage_options=storage_options, formats=tuple(formats))
    if not tasks:
        raise InputError(root, "no run folders found (no training logs under this root)")
    (out / ".cache").mkdir(parents=True, exist_ok=True)
    rows = {t.run: hit for t in tasks if use_cache and (hit := cache_get(out, t)) is not None}
    todo = [t for t in tasks if t.run not in rows]
    result = AuditResult(root=str(root), out_dir=out, analysed=len(todo), cached=len(rows))
    with _Progress(len(tasks), enabled=progress) as bar:
        bar.advance(len(rows))
        for task, res in execute(todo, jobs, scheduler, run_timeout, run_memory):
            rows[task.run] = _stored(out, task, res)
            bar.advance(1)
    result.rows = sorted(rows.values(), key=lambda r: r["run"])
    mark_status(result.rows, base)
    cohort_z(result.rows)
    _write_outputs(result)
    result.seconds = time.perf_counter() - t0
    return result


def _stored(out: Path, task: Any, res: Mapping[str, Any]) -> dict[str, Any]:
    """The run's row after writing its outputs; outputs that cannot be written make it an error row, not the audit's."""
    try:
        return store(out, task, res)
    except OSError as exc:
        return dict(error_row(task, f"its report could not be written: {exc}"), cached=False)


def _check_formats(formats: Sequence[str]) -> None:
    bad = [f for f in formats if f not in EXT]
    if bad or not formats:
        raise InputError(None, f"unknown report format(s) {bad}; use {sorted(EXT)}")


def load_baseline(baseline: str | Path | Sequence[Mapping[str, Any]]) -> dict[str, str | None]:
    """Read a previous ``summary.json`` (or its rows) into ``{run: fingerprint}``.

    Raises:
        InputError: The file is missing or is not an audit summary.
    """
    if isinstance(baseline, str | Path):
        try:
            data = json.loads(Path(baseline).read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise InputError(baseline, f"cannot read the baseline: {getattr(exc, 'strerror', None) or exc}") from exc
        rows = data.get("rows") if isinstance(data, dict) else data
        if not isinstance(rows, list) or not all(isinstance(r, dict) and "run" in r for r in rows):
            raise InputError(baseline, "not an audit summary.json (no 'rows' with 'run')")
    else:
        rows = list(baseline)
    return {str(r["run"]): r.get("fingerprint") for r in rows}


# --------------------------------------------------------------------------- outputs


def _write_outputs(result: AuditResult) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from forensics import SCHEMA_VERSION
    from parsers.file_policy import display
    from reports.audit_report import render_index

    # a folder name that is not UTF-8 stays readable (escaped) and cannot break the parquet or JSON writer
    rows = [{k: display(v) if isinstance(v, str) else v for k in COLUMNS for v in [r.get(k)]} for r in result.rows]
    counts: dict[str, int] = defaultdict(int)
    for r in rows:
        counts[r["verdict"] or "error"] += 1
        if r["status"]:
            counts[r["status"]] += 1
    summary = {"schema_version": SCHEMA_VERSION, "root": result.root, "runs": len(rows),
               "counts": dict(counts), "rows": rows}
    out = result.out_dir
    atomic.write_text(out / "summary.json", json.dumps(summary, indent=1, allow_nan=False) + "\n")
    schema = pa.schema([(k, getattr(pa, {"bool": "bool_"}.get(t, t))()) for k, t in COLUMNS.items()])
    table = pa.Table.from_pylist(rows, schema=schema)
    atomic.write_with(out / "summary.parquet", lambda tmp: pq.write_table(table, tmp))
    html = render_index(result.root, rows, dict(counts), generated=time.strftime("%Y-%m-%d %H:%M:%S"))
    atomic.write_text(out / "index.html", html)


class _Progress:
    """A rich progress bar on stderr (a no-op when disabled)."""

    def __init__(self, total: int, enabled: bool) -> None:
        self.total, self.enabled, self._p, self._id = total, enabled, None, None

    def __enter__(self) -> _Progress:
        if self.enabled:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn

            self._p = Progress("[progress.description]{task.description}", BarColumn(), MofNCompleteColumn(),
                               TimeRemainingColumn(), console=Console(stderr=True), transient=False)
            self._p.start()
            self._id = self._p.add_task("auditing runs", total=self.total)
        return self

    def advance(self, n: int) -> None:
        """Count ``n`` more runs as done."""
        if self._p is not None and n:
            self._p.advance(self._id, n)

    def __exit__(self, *exc: object) -> None:
        if self._p is not None:
            self._p.stop()
