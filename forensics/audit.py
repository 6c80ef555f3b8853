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
is :func:`forensics.audit_worker.work`.
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import multiprocessing
import statistics
import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from forensics import atomic
from forensics.audit_runs import RunTask, find_runs, list_runs
from forensics.audit_worker import error_row, work
from forensics.errors import InputError

__all__ = ["COLUMNS", "AuditResult", "audit", "find_runs", "load_baseline"]

COLUMNS: dict[str, str] = {
    "run": "string", "path": "string", "verdict": "string", "cause": "string", "mechanism": "string",
    "onset_step": "int64", "onset_segment": "int64", "confidence": "float64", "last_step": "int64",
    "n_sources": "int64", "error": "string", "fingerprint": "string", "status": "string",
    "cohort": "string", "spike_count": "int64", "onset_z": "float64", "spikes_z": "float64",
    "report": "string", "cached": "bool", "seconds": "float64",
}
"""Columns of ``summary.parquet`` / ``summary.json`` rows and their Arrow types."""

MIN_COHORT = 3
"""Fewest runs with a value in a cohort before a robust z is given (else ``None``)."""
_EXT = {"html": "html", "json": "json", "markdown": "md", "text": "txt"}


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
        bad = [r for r in self.rows if r["verdict"] == "anomaly" and (not fail_on_new or r["status"] == "new")]
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
    bad = [f for f in formats if f not in _EXT]
    if bad or not formats:
        raise InputError(None, f"unknown report format(s) {bad}; use {sorted(_EXT)}")
    tasks = list_runs(root, exclude=out, storage_options=storage_options, formats=tuple(formats))
    if not tasks:
        raise InputError(root, "no run folders found (no training logs under this root)")
    (out / ".cache").mkdir(parents=True, exist_ok=True)
    rows: dict[str, dict[str, Any]] = {}
    todo = []
    for t in tasks:
        hit = _cache_get(out, t) if use_cache else None
        if hit is None:
            todo.append(t)
        else:
            rows[t.run] = hit
    result = AuditResult(root=str(root), out_dir=out, analysed=len(todo), cached=len(rows))
    with _Progress(len(tasks), enabled=progress) as bar:
        bar.advance(len(rows))
        for task, res in _execute(todo, jobs, scheduler, run_timeout, run_memory):
            rows[task.run] = _store(out, task, res)
            bar.advance(1)
    result.rows = sorted(rows.values(), key=lambda r: r["run"])
    _mark_status(result.rows, base)
    _cohort_z(result.rows)
    _write_outputs(result)
    result.seconds = time.perf_counter() - t0
    return result


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


# --------------------------------------------------------------------------- execution


def _execute(tasks: list[RunTask], jobs: int, scheduler: str | None, timeout: float | None = None,  # noqa: ANN202
             memory: int | None = None):
    """Yield ``(task, result)`` as analyses finish: in process, in a process pool, under limits, or on Dask."""
    if not tasks:
        return
    if scheduler:
        yield from _execute_dask(tasks, scheduler)
        return
    if timeout is not None or memory is not None:
        from forensics.run_limits import run_limited

        for t, status, res in run_limited(tasks, work, jobs=jobs, timeout=timeout, memory=memory):
            yield t, res if status == "ok" else _failed(t, res)
        return
    if jobs <= 1 or len(tasks) == 1:
        for t in tasks:
            yield t, work(t)
        return
    ctx = multiprocessing.get_context("spawn")  # fork after polars/rayon threads started is unsafe
    pending = list(tasks)
    for attempt in range(2):  # a pool that breaks (a worker killed, e.g. out of memory) is rebuilt once
        broken: list[RunTask] = []
        # one run at a time per worker bounds its memory; no max_tasks_per_child: it can hang on Python 3.11
        with cf.ProcessPoolExecutor(max_workers=min(jobs, len(pending)), mp_context=ctx) as pool:
            futs = {pool.submit(work, t): t for t in pending}
            for fut in cf.as_completed(futs):
                t = futs[fut]
                try:
                    yield t, fut.result()
                except cf.process.BrokenProcessPool as exc:
                    if attempt == 0:
                        broken.append(t)
                    else:
                        yield t, _failed(t, f"the analysis process died ({exc})")
                except Exception as exc:  # noqa: BLE001 - one run never stops the audit
                    yield t, _failed(t, f"{type(exc).__name__}: {exc}")
        if not broken:
            return
        pending = broken


def _execute_dask(tasks: list[RunTask], scheduler: str):  # noqa: ANN202 - generator
    try:
        from distributed import Client, as_completed
    except ImportError as exc:
        raise InputError(None, "--scheduler needs Dask: pip install 'train-forensics[distributed]'") from exc
    try:
        client = Client(scheduler, timeout="10s")
    except (OSError, TimeoutError) as exc:
        raise InputError(scheduler, f"cannot reach the Dask scheduler: {exc}") from exc
    with client:
        futs = client.map(work, tasks, pure=False)
        by_key = {f.key: t for f, t in zip(futs, tasks, strict=True)}
        for fut in as_completed(futs):
            t = by_key[fut.key]
            try:
                yield t, fut.result()
            except Exception as exc:  # noqa: BLE001 - a lost worker becomes an error row
                yield t, _failed(t, f"{type(exc).__name__}: {exc}")
            fut.release()


def _failed(task: RunTask, message: str) -> dict[str, Any]:
    return {"row": error_row(task, message), "reports": {}, "cacheable": False}


# --------------------------------------------------------------------------- cache and reports


def _cache_path(out: Path, task: RunTask) -> Path:
    return out / ".cache" / f"{task.name}.json"


def _whole(path: Path) -> bool:
    """A report the cache may serve: a regular, non-empty file (a 0-byte one is a killed write)."""
    try:
        return path.is_file() and path.stat().st_size > 0
    except OSError:
        return False


def _cache_get(out: Path, task: RunTask) -> dict[str, Any] | None:
    try:
        entry = json.loads(_cache_path(out, task).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(entry, dict) or entry.get("key") != task.key or not isinstance(entry.get("row"), dict):
        return None
    if not all(_whole(out / "runs" / task.name / f"report.{_EXT[f]}") for f in entry.get("formats", [])):
        return None
    if set(task.formats) - set(entry.get("formats", [])) and not entry["row"].get("error"):
        return None
    row = dict(entry["row"], path=task.path, cached=True)
    return row


def _store(out: Path, task: RunTask, res: Mapping[str, Any]) -> dict[str, Any]:
    """Write the run's reports and its cache entry; return its row."""
    row = dict(res["row"], cached=False)
    folder = out / "runs" / task.name
    written = []
    if res.get("reports"):
        folder.mkdir(parents=True, exist_ok=True)
        for fmt, text in res["reports"].items():
            atomic.write_text(folder / f"report.{_EXT[fmt]}", text)  # a killed write leaves no cut report
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
            return f"runs/{name}/report.{_EXT[fmt]}"
    return None


# --------------------------------------------------------------------------- baseline and cohorts


def _mark_status(rows: list[dict[str, Any]], base: Mapping[str, str | None] | None) -> None:
    """``new`` / ``known`` for a finding (by fingerprint); ``resolved`` when a baseline finding is gone."""
    for r in rows:
        fp, before = r["fingerprint"], (base or {}).get(r["run"])
        if fp:
            r["status"] = "known" if base is not None and before == fp else "new"
        elif before and r["verdict"] == "healthy":
            r["status"] = "resolved"
        else:
            r["status"] = None


def robust_z(values: Sequence[float]) -> list[float | None]:
    """Robust z of each value against the others: ``(x - median) / (1.4826 * MAD)``.

    When the MAD is 0 the mean absolute deviation (x 1.2533) is used; ``None`` for fewer than
    :data:`MIN_COHORT` values; 0 when every value is equal.
    """
    if len(values) < MIN_COHORT:
        return [None] * len(values)
    med = statistics.median(values)
    dev = [abs(v - med) for v in values]
    scale = 1.4826 * statistics.median(dev) or 1.2533 * statistics.fmean(dev)
    return [0.0 if not scale else round((v - med) / scale, 3) for v in values]


def _cohort_z(rows: list[dict[str, Any]]) -> None:
    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        r["onset_z"] = r["spikes_z"] = None
        if not r["error"]:
            groups[r["cohort"]].append(r)
    for members in groups.values():
        for r, z in zip(members, robust_z([float(r["spike_count"] or 0) for r in members]), strict=True):
            r["spikes_z"] = z
        onset = [r for r in members if r["onset_step"] is not None]
        for r, z in zip(onset, robust_z([float(r["onset_step"]) for r in onset]), strict=True):
            r["onset_z"] = z


# --------------------------------------------------------------------------- outputs


def _write_outputs(result: AuditResult) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from forensics import SCHEMA_VERSION
    from parsers.file_policy import display
    from reports._common import environment

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
    html = environment(True).get_template("audit_index.html.j2").render(
        root=result.root, rows=rows, counts=dict(counts), generated=time.strftime("%Y-%m-%d %H:%M:%S"),
        outlier=3.5)
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
