"""How an audit runs its analyses: in this process, in a process pool, under per-run limits, or on Dask.

Every way yields ``(task, result)`` as analyses finish; a run that crashes, dies or runs over its limits
becomes an error row (:func:`forensics.audit_worker.error_row`), never the end of the audit.
"""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing
from typing import Any

from forensics.audit_runs import RunTask
from forensics.audit_worker import error_row, work
from forensics.errors import InputError


def execute(tasks: list[RunTask], jobs: int, scheduler: str | None, timeout: float | None = None,  # noqa: ANN202
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
            yield t, res if status == "ok" else failed(t, res)
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
                        yield t, failed(t, f"the analysis process died ({exc})")
                except Exception as exc:  # noqa: BLE001 - one run never stops the audit
                    yield t, failed(t, f"{type(exc).__name__}: {exc}")
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
                yield t, failed(t, f"{type(exc).__name__}: {exc}")
            fut.release()


def failed(task: RunTask, message: str) -> dict[str, Any]:
    """The result of a run that could not be analysed: its error row, no reports, not cached."""
    return {"row": error_row(task, message), "reports": {}, "cacheable": False}
