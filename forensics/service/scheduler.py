"""The service's core loop: changed runs -> worker analyses -> database, incidents, outbox.

:class:`Service` owns the database, the worker pool, the watcher and two asyncio tasks (the
scheduler and the webhook delivery). The watcher marks runs dirty from its threads; the scheduler
sends each dirty run to its worker once the changes have settled for ``debounce_s`` (one analysis
per run at a time; a run that changes during its analysis is analysed again afterwards), stores the
result, records incidents and writes the outbox. Nothing here blocks the event loop: worker jobs and
database writes run in threads.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from forensics.service import incidents as inc
from forensics.service import webhooks
from forensics.service.db import Database
from forensics.service.metrics import ServiceMetrics
from forensics.service.watcher import Watcher
from forensics.service.worker import JobError, WorkerPool, analyze_job

LOOPBACK = ("127.0.0.1", "::1", "localhost")


@dataclass
class ServiceConfig:
    """Settings of ``forensics serve`` (the CLI options).

    Attributes:
        roots: Folders whose runs are watched (resolved on start).
        host: Bind address; anything but loopback requires ``token``.
        port: TCP port.
        db: The SQLite file.
        webhooks: Webhook URLs (``slack:URL`` for a Slack body).
        token: The bearer token (generated when None and the bind is loopback).
        base_url: The URL links in webhook bodies start with (default ``http://host:port``).
        workers: Worker processes for analyses.
        analysis_timeout_s: Time limit of one analysis or report.
        analysis_memory: Resident bytes one worker may hold during an analysis or report (``None``: no
            limit); past it the worker is killed and the run becomes an ``unreadable`` incident, as a run
            over the time limit does.
        rescan_s: Seconds between full rescans of the roots.
        events: Use filesystem events as well as rescans.
        debounce_s: Quiet time after a change before a run is analysed.
        unreadable_grace_s: A run that cannot be read is an ``unreadable`` incident only once it has
            existed this long (a live run's first seconds may hold no complete record yet).
        max_body_bytes: Largest request body accepted.
        settle_s: A run whose newest log is older than this has stopped changing: its alerts are final
            (:class:`forensics.service.incidents.Confirmer`); a run with an alert still waiting for
            confirmation is looked at again once this long has passed without a change.
    """

    roots: list[Path]
    host: str = "127.0.0.1"
    port: int = 8765
    db: Path = Path("forensics-service.db")
    webhooks: list[str] = field(default_factory=list)
    token: str | None = None
    base_url: str | None = None
    workers: int = 2
    analysis_timeout_s: float = 120.0
    analysis_memory: int | None = 8 << 30
    rescan_s: float = 30.0
    events: bool = True
    debounce_s: float = 0.3
    unreadable_grace_s: float = 30.0
    max_body_bytes: int = 64 * 1024
    settle_s: float = 60.0

    def __post_init__(self) -> None:
        self.roots = [Path(r).expanduser().resolve() for r in self.roots]
        if self.token is None:
            self.token = secrets.token_urlsafe(24)
            self.token_generated = True
        else:
            self.token_generated = False
        if self.base_url is None:
            host = f"[{self.host}]" if ":" in self.host else self.host
            self.base_url = f"http://{host}:{self.port}"

    @property
    def loopback(self) -> bool:
        """True when bound to a loopback address only."""
        return self.host in LOOPBACK or self.host.startswith("127.")


class Service:
    """The running service (created by :func:`forensics.service.app.create_app`)."""

    def __init__(self, cfg: ServiceConfig) -> None:
        self.cfg = cfg
        self.db = Database(cfg.db)
        self.metrics = ServiceMetrics(self.db)
        self.started = time.time()
        self.pool: WorkerPool | None = None
        self.watcher: Watcher | None = None
        self._dirty: dict[str, tuple[str, float, float]] = {}  # path -> (root, monotonic, wall) of the first change
        self._inflight: set[str] = set()
        self._last_mtime: dict[str, float] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake = asyncio.Event()
        self._deliver_wake = asyncio.Event()
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task] = []
        self._jobs: set[asyncio.Task] = set()  # running analyses (a reference keeps each task alive)
        self._sem: asyncio.Semaphore | None = None
        self.analyses_done = 0
        self.confirmer = inc.Confirmer()
        self._real: dict[str, str] = {}  # path as stored (escaped) -> the real path, for a name that is not UTF-8

    # -- lifecycle ---------------------------------------------------------------------------------
    async def start(self) -> None:
        """Start the workers, the watcher, the scheduler and the delivery loop."""
        self._loop = asyncio.get_running_loop()
        self._sem = asyncio.Semaphore(max(2, 2 * self.cfg.workers))
        self.pool = await asyncio.to_thread(WorkerPool, self.cfg.workers, self.cfg.analysis_timeout_s,
                                            self.cfg.analysis_memory)
        self.watcher = Watcher(self.cfg.roots, self.mark_dirty, rescan_s=self.cfg.rescan_s, events=self.cfg.events,
                               exclude=(self.cfg.db.resolve(),))
        await asyncio.to_thread(self.watcher.start)
        self._tasks = [asyncio.create_task(self._schedule(), name="forensics-scheduler"),
                       asyncio.create_task(webhooks.deliver_forever(self.db, self._deliver_wake, self._stop),
                                           name="forensics-webhooks")]

    async def stop(self) -> None:
        """Stop everything (running analyses are abandoned; the database stays consistent)."""
        self._stop.set()
        self._wake.set()
        self._deliver_wake.set()
        if self.watcher:
            await asyncio.to_thread(self.watcher.stop)
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.pool:
            self.pool.close()
        self.db.close()

    # -- watching ----------------------------------------------------------------------------------
    def mark_dirty(self, root: str, path: str) -> None:
        """Mark a run changed (thread-safe: the watcher threads call it)."""
        if self._loop is None:
            return
        self._loop.call_soon_threadsafe(self._mark, root, path)

    def _mark(self, root: str, path: str) -> None:
        # the first unprocessed change counts: a run written to without pause is still analysed every debounce_s
        self._dirty.setdefault(path, (root, time.monotonic(), time.time()))
        self._wake.set()

    async def _schedule(self) -> None:
        while not self._stop.is_set():
            try:
                await asyncio.wait_for(self._wake.wait(), timeout=0.25)
            except TimeoutError:
                pass
            self._wake.clear()
            now = time.monotonic()
            for path, (root, t, wall) in list(self._dirty.items()):
                if path in self._inflight or now - t < self.cfg.debounce_s:
                    continue
                del self._dirty[path]
                self._inflight.add(path)
                job = asyncio.create_task(self._analyze_task(root, path, wall))
                self._jobs.add(job)
                job.add_done_callback(self._jobs.discard)

    async def _analyze_task(self, root: str, path: str, changed_at: float) -> None:
        try:
            assert self._sem is not None
            async with self._sem:
                await self.analyze(root, path, changed_at)
        except Exception:  # noqa: BLE001, S110 - the next change retries
            pass
        finally:
            self._inflight.discard(path)
            self._wake.set()

    # -- one analysis ------------------------------------------------------------------------------
    def root_of(self, path: Path) -> Path | None:
        """The configured root that holds ``path`` (already resolved), or None."""
        for r in self.cfg.roots:
            if path == r or path.is_relative_to(r):
                return r
        return None

    async def analyze(self, root: str, path: str, changed_at: float | None = None) -> dict[str, Any]:
        """Analyse one run now in its worker and record the result; returns the run's row.

        Args:
            root: The configured root that holds the run.
            path: The run's real path.
            changed_at: When the first change not yet analysed was noticed (wall clock); the watcher lag
                observed is from then, or from the file's write when that is later, to the end of this analysis.
        """
        assert self.pool is not None
        t0 = time.perf_counter()
        try:
            result = await asyncio.to_thread(self.pool.run, path, analyze_job, path, root)
        except JobError as exc:
            result = {"ok": False, "error": str(exc)}
        elapsed = time.perf_counter() - t0
        row = await asyncio.to_thread(self._record, root, path, result, elapsed, changed_at)
        self._deliver_wake.set()
        return row

    def stored(self, path: str) -> str:
        r"""``path`` as the database keeps it: valid UTF-8 (bytes that are not UTF-8 escaped as ``\xNN``).

        The real path of an escaped one is remembered for :meth:`real_path` (the watcher finds it again
        after a restart).
        """
        from parsers.file_policy import display

        shown = display(path)
        if shown != path:
            self._real[shown] = path
        return shown

    def real_path(self, stored: str) -> str:
        """The real path of a path as the database keeps it (the same string unless it was escaped)."""
        return self._real.get(stored, stored)

    def _record(self, root: str, path: str, result: dict[str, Any], elapsed: float,
                changed_at: float | None) -> dict[str, Any]:
        name = Path(path).relative_to(Path(root).parent).as_posix() if Path(path) != Path(root) else Path(path).name
        run_id = self.db.upsert_run(self.stored(root), self.stored(path), self.stored(name))
        if not result.get("ok"):  # the message names the path: escaped like it
            from parsers.file_policy import display

            result = dict(result, error=display(str(result.get("error"))))
        self.metrics.analysis_seconds.observe(elapsed)
        self.metrics.analyses.labels("ok" if result.get("ok") else "error").inc()
        self.analyses_done += 1
        body: dict[str, Any] | None = None
        if result.get("ok"):
            body = json.loads(result["json"])
            aid = self.db.store_analysis(run_id, body, result["json"], result.get("last_step"), result["duration_s"])
            mt = result.get("max_mtime")
            final = mt is None or time.time() - mt >= self.cfg.settle_s
            alerts = self.confirmer.update(path, inc.alerts_of(body), body, result.get("last_step"), final=final)
            if self.confirmer.pending(path) and self._loop is not None and mt is not None:
                wait = max(0.1, self.cfg.settle_s - (time.time() - mt) + 0.1)  # final by then, unless it changes
                self._loop.call_soon_threadsafe(self._loop.call_later, wait, self._mark, root, path)
            if (changed_at is not None and mt is not None and mt > self.started
                    and mt > self._last_mtime.get(path, 0.0)):
                # new data: from the first unanalysed change (noticed, or written if the notice came first)
                self.metrics.watcher_lag.observe(max(0.0, time.time() - changed_at))
            if mt is not None:
                self._last_mtime[path] = mt
        else:
            aid = None
            self.db.store_error(run_id, result["error"])
            run = self.db.one("SELECT first_seen FROM runs WHERE id = ?", (run_id,))
            age = time.time() - (run or {}).get("first_seen", time.time())
            if age >= self.cfg.unreadable_grace_s:
                alerts = [inc.unreadable(result["error"])]
            else:
                alerts = []
                if self._loop is not None:  # look again once the grace period is over
                    self._loop.call_soon_threadsafe(
                        self._loop.call_later, self.cfg.unreadable_grace_s - age + 0.1, self._mark, root, path)
        def outbox(conn: Any, iid: int) -> None:
            incident = inc.get(self.db, iid, conn)
            if incident is not None and self.cfg.webhooks:
                webhooks.enqueue(conn, incident, body, self.cfg.base_url or "", self.cfg.webhooks)

        inc.record(self.db, run_id, self.stored(path), alerts, aid, result.get("last_step"), on_open=outbox)
        return self.db.one("SELECT * FROM runs WHERE id = ?", (run_id,)) or {}
