"""The analysis side of the service: functions that run in worker processes, and the pool that routes to them.

Analyses never run in the web process. :class:`WorkerPool` holds ``n`` single-process executors
(``concurrent.futures.ProcessPoolExecutor(max_workers=1)``, started with ``spawn``) and sends every
job for one run to the same one (the run's path hashed), so each worker keeps that run's
:class:`parsers.incremental.IncrementalReader` state and its last loaded tables: an update costs the
appended records, and a report request renders from tables already in memory. A job that runs past
its time limit, whose worker's resident memory goes past the memory limit (sampled every
:data:`forensics.run_limits.POLL_S` seconds, as ``audit`` does), or a worker that dies (a parser crash),
is ended by killing that worker's process; the executor is replaced and the job reports an error
("over budget: ..."), which the service turns into an ``unreadable`` incident.
"""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing as mp
import os
import threading
import time
import zlib
from collections import OrderedDict
from pathlib import Path
from typing import Any

_READER: Any = None
_CACHE: OrderedDict[str, tuple[Any, Any]] = OrderedDict()  # path -> (RunData, Analysis)
_CACHE_RUNS = 8
"""Loaded runs a worker keeps for report rendering (memory bound: the newest 8 per worker)."""
_FOLLOWED: OrderedDict[str, None] = OrderedDict()
_FOLLOW_RUNS = 64
"""Runs whose incremental state (offsets and tables read so far) a worker keeps; the least recently
analysed beyond these are forgotten and read in full at their next change (memory bound)."""


class JobError(Exception):
    """A job that did not finish: time or memory limit, dead worker, or an error inside it (``str`` says which)."""


class _OverMemory(Exception):
    def __init__(self, rss: int) -> None:
        super().__init__(rss)
        self.rss = rss


def _reader() -> Any:
    global _READER
    if _READER is None:
        from parsers.incremental import IncrementalReader

        _READER = IncrementalReader()
    return _READER


def _confined(root: Path):  # noqa: ANN202
    """A per-file reader that refuses files whose real path leaves ``root`` (a symlink out of the root)."""
    from forensics.errors import ParseError

    real_root = root.resolve()
    read = _reader().read

    def read_confined(path: Path, mod: Any, run_root: Path) -> Any:
        if not path.resolve().is_relative_to(real_root):
            raise ParseError(path.relative_to(run_root).as_posix(), "symlink out of the watched root: not read")
        return read(path, mod, run_root)

    return read_confined


def analyze_job(path: str, root: str) -> dict[str, Any]:
    """Load (incrementally) and analyse the run at ``path`` (inside ``root``); runs in a worker.

    Returns:
        ``{"ok": True, "json": the JSON contract as text, "last_step", "records", "max_mtime",
        "duration_s", "full_reads", "piece_reads"}`` or ``{"ok": False, "error": one line}``.
    """
    from forensics.api import analyze_run, load
    from forensics.errors import ForensicsError
    from reports import render

    t0 = time.perf_counter()
    try:
        run = load(path, reader=_confined(Path(root)))
        analysis = analyze_run(run)
    except ForensicsError as exc:
        _CACHE.pop(path, None)
        _reader().forget(path)
        return {"ok": False, "error": str(exc)}
    except Exception as exc:  # noqa: BLE001 - one bad run never stops the service
        _CACHE.pop(path, None)
        _reader().forget(path)
        return {"ok": False, "error": f"{path}: internal error {type(exc).__name__}: {exc}"}
    _CACHE[path] = (run, analysis)
    _CACHE.move_to_end(path)
    while len(_CACHE) > _CACHE_RUNS:
        _CACHE.popitem(last=False)
    _FOLLOWED[path] = None
    _FOLLOWED.move_to_end(path)
    while len(_FOLLOWED) > _FOLLOW_RUNS:
        old, _ = _FOLLOWED.popitem(last=False)
        _reader().forget(old)
    last_step = int(run.metrics["step"].max()) if run.metrics.height else None
    mtimes = []
    for s in run.sources:
        try:
            mtimes.append(os.stat(Path(path) / s.path).st_mtime)
        except OSError:
            pass
    files = _reader().files
    prefix = str(Path(path).resolve()) + os.sep
    mine = [f for k, f in files.items() if k.startswith(prefix)]
    return {"ok": True, "json": render(analysis, None, "json"), "last_step": last_step,
            "records": run.metrics.height, "max_mtime": max(mtimes) if mtimes else None,
            "duration_s": time.perf_counter() - t0, "full_reads": sum(f.full_reads for f in mine),
            "piece_reads": sum(f.piece_reads for f in mine)}


def report_job(path: str, root: str, fmt: str, link: str | None = None) -> str:
    """Render the run's report (``html`` or ``markdown``) from the tables in memory (loaded when absent)."""
    from forensics.api import analyze_run, load
    from reports import render

    got = _CACHE.get(path)
    if got is None:
        run = load(path, reader=_confined(Path(root)))
        got = (run, analyze_run(run))
        _CACHE[path] = got
    run, analysis = got
    if fmt == "html":
        return render(analysis, run, "html")
    return render(analysis, None, "markdown", html_path=link)


def compare_job(proxy: str, proxy_root: str, target: str, target_root: str) -> str:
    """The compare report (HTML) of two runs (``forensics compare`` through its public functions).

    ``forensics.compare`` reads the runs itself, so a run holding a symlink out of its root is refused first.

    Raises:
        forensics.errors.InputError: A file of either run leaves its root.
    """
    from forensics.compare import compare
    from forensics.errors import InputError
    from reports.compare_report import render_html

    for run, root in ((proxy, proxy_root), (target, target_root)):
        real_root = Path(root).resolve()
        for p in Path(run).rglob("*"):
            if p.is_symlink() and not p.resolve().is_relative_to(real_root):
                raise InputError(p, "symlink out of the watched root: not compared")
    from forensics.api import load

    return render_html(compare(proxy, target), load(proxy), load(target))


def _warm() -> int:
    import forensics.api  # noqa: F401 - import the analyzer once, before the first job
    import reports  # noqa: F401

    return os.getpid()


class WorkerPool:
    """``n`` single-process executors; jobs for one run always go to the same one.

    Args:
        n: Worker processes.
        timeout_s: Time limit of one job (analysis or render), seconds.
        memory: Resident bytes one worker may hold while it runs a job (``None``: no limit).
    """

    def __init__(self, n: int = 2, timeout_s: float = 120.0, memory: int | None = None) -> None:
        self.n = max(1, n)
        self.timeout_s = timeout_s
        self.memory = memory
        self._ctx = mp.get_context("spawn")
        self._slots = [self._new() for _ in range(self.n)]
        self._locks = [threading.Lock() for _ in range(self.n)]
        for ex in self._slots:
            ex.submit(_warm)

    def _new(self) -> cf.ProcessPoolExecutor:
        return cf.ProcessPoolExecutor(max_workers=1, mp_context=self._ctx)

    def slot(self, key: str) -> int:
        """The worker index for a run path (stable)."""
        return zlib.crc32(key.encode("utf-8", "surrogatepass")) % self.n  # a name that is not UTF-8 too

    def run(self, key: str, fn: Any, *args: Any, timeout_s: float | None = None) -> Any:
        """Run ``fn(*args)`` on the run's worker and wait (call from a thread, never the event loop).

        Raises:
            JobError: The time or memory limit passed (the worker is killed and replaced), the worker
                died, or ``fn`` raised (its message kept).
        """
        i = self.slot(key)
        limit = self.timeout_s if timeout_s is None else timeout_s
        ex = self._slots[i]
        try:
            fut = ex.submit(fn, *args)
        except (cf.BrokenExecutor, RuntimeError):
            self._replace(i, ex)
            fut = self._slots[i].submit(fn, *args)
            ex = self._slots[i]
        try:
            return self._wait(fut, ex, limit)
        except cf.TimeoutError:
            self._replace(i, ex, kill=True)
            raise JobError(f"{key}: analysis stopped after {limit:g} s (time limit)") from None
        except _OverMemory as exc:
            self._replace(i, ex, kill=True)
            raise JobError(f"{key}: over budget: the analysis held {exc.rss / 2**20:.0f} MiB (limit "
                           f"{self.memory / 2**20:.0f} MiB) and was stopped") from None
        except cf.BrokenExecutor:
            self._replace(i, ex)
            raise JobError(f"{key}: the worker process died while reading this run") from None
        except Exception as exc:  # noqa: BLE001 - the job's own error, one line
            raise JobError(f"{key}: {type(exc).__name__}: {exc}") from None

    def _wait(self, fut: cf.Future, ex: cf.ProcessPoolExecutor, limit: float) -> Any:
        """The job's result; its worker's memory sampled while it runs (when a limit is set).

        Raises:
            concurrent.futures.TimeoutError: ``limit`` seconds passed.
            _OverMemory: The worker held more than :attr:`memory` bytes.
        """
        if not self.memory:
            return fut.result(timeout=limit)
        from forensics.run_limits import POLL_S, rss_bytes

        end = time.monotonic() + limit
        while True:
            try:
                return fut.result(timeout=max(0.0, min(POLL_S, end - time.monotonic())))
            except cf.TimeoutError:
                if time.monotonic() >= end:
                    raise
            for pid in list(getattr(ex, "_processes", {})):
                rss = rss_bytes(int(pid))
                if rss is not None and rss > self.memory:
                    raise _OverMemory(rss)

    def _replace(self, i: int, old: cf.ProcessPoolExecutor, kill: bool = False) -> None:
        with self._locks[i]:
            if self._slots[i] is not old:
                return
            if kill:
                for p in list(getattr(old, "_processes", {}).values()):
                    try:
                        p.kill()
                    except Exception:  # noqa: BLE001, S110 - already gone
                        pass
            old.shutdown(wait=False, cancel_futures=True)
            self._slots[i] = self._new()

    def pids(self) -> list[int]:
        """Process ids of the live workers (for RSS accounting)."""
        out = []
        for ex in self._slots:
            out.extend(int(p) for p in getattr(ex, "_processes", {}))
        return out

    def close(self) -> None:
        """Stop every worker (running jobs are killed)."""
        for i, ex in enumerate(self._slots):
            for p in list(getattr(ex, "_processes", {}).values()):
                try:
                    p.kill()
                except Exception:  # noqa: BLE001, S110
                    pass
            ex.shutdown(wait=False, cancel_futures=True)
            self._slots[i] = ex
