"""Watching the roots: which run folders exist, and which changed.

Two sources, both feeding ``on_dirty(root, run_path)``:

- filesystem events through ``watchfiles`` (inotify/FSEvents/ReadDirectoryChangesW, in a thread): a
  changed file inside a known run marks that run; a change anywhere else asks for a rescan (a new run);
- a periodic rescan (``rescan_s``, for network filesystems that deliver no events): run discovery as
  ``forensics audit`` does it (:func:`forensics.audit_runs.list_runs`), each run's key being its files'
  paths, sizes and mtimes; a run whose key changed, or a new one, is marked.

Runs are confined to their root: discovery leaves out symlinked folders, and a run whose real path is
not inside the root's real path is ignored. Roots are never written to.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

from forensics.audit_runs import list_runs


class Watcher:
    """Follows the run folders under ``roots``.

    Args:
        roots: Root folders (resolved).
        on_dirty: Called as ``on_dirty(root, run_path)`` from a watcher thread for each run that is new
            or changed.
        rescan_s: Seconds between full rescans.
        events: Use filesystem events (``watchfiles``) as well as rescans.
        exclude: Paths never treated as runs (the database file when it lies under a root).
    """

    def __init__(self, roots: list[Path], on_dirty: Callable[[str, str], None], rescan_s: float = 30.0,
                 events: bool = True, exclude: tuple[Path, ...] = ()) -> None:
        self.roots = [Path(r).resolve() for r in roots]
        self.on_dirty = on_dirty
        self.rescan_s = rescan_s
        self.events = events
        self.exclude = tuple(Path(p).resolve() for p in exclude)
        self.keys: dict[str, str] = {}  # run path -> files key
        self.run_root: dict[str, str] = {}
        self._stop = threading.Event()
        self._rescan_now = threading.Event()
        self._threads: list[threading.Thread] = []
        self.scans = 0
        self.last_scan_s = 0.0

    def start(self) -> None:
        """Scan once (synchronously) and start the rescan and event threads."""
        self.scan()
        t = threading.Thread(target=self._rescan_loop, name="forensics-rescan", daemon=True)
        t.start()
        self._threads.append(t)
        if self.events:
            t = threading.Thread(target=self._event_loop, name="forensics-watch", daemon=True)
            t.start()
            self._threads.append(t)

    def stop(self) -> None:
        """Stop the threads (returns within about a second)."""
        self._stop.set()
        self._rescan_now.set()
        for t in self._threads:
            t.join(timeout=3)

    def scan(self) -> int:
        """Discover runs under every root and mark the new and changed ones; returns how many were marked."""
        t0 = time.perf_counter()
        marked = 0
        seen: set[str] = set()
        for root in self.roots:
            try:
                tasks = list_runs(root, formats=())
            except Exception:  # noqa: BLE001 - a root that vanished or cannot be listed: try again later
                continue
            for task in tasks:
                real = Path(task.path).resolve()
                if not real.is_relative_to(root) or real in self.exclude:
                    continue
                path = str(real)
                seen.add(path)
                self.run_root[path] = str(root)
                if self.keys.get(path) != task.key:
                    self.keys[path] = task.key
                    marked += 1
                    self.on_dirty(str(root), path)
        for gone in set(self.keys) - seen:
            self.keys.pop(gone, None)
        self.scans += 1
        self.last_scan_s = time.perf_counter() - t0
        return marked

    def run_of(self, changed: str) -> str | None:
        """The known run folder that holds ``changed`` (the longest match), or None."""
        best = None
        for path in self.keys:
            if (changed == path or changed.startswith(path + "/")) and (best is None or len(path) > len(best)):
                best = path
        return best

    def _rescan_loop(self) -> None:
        while not self._stop.is_set():
            self._rescan_now.wait(timeout=self.rescan_s)
            if self._stop.is_set():
                return
            self._rescan_now.clear()
            try:
                self.scan()
            except Exception:  # noqa: BLE001, S110 - the next rescan tries again
                pass

    def _event_loop(self) -> None:
        try:
            import watchfiles
        except ImportError:
            return
        try:
            for changes in watchfiles.watch(*self.roots, stop_event=self._stop, debounce=200, step=50,
                                            rust_timeout=1000, yield_on_timeout=False, raise_interrupt=False):
                unknown = False
                for _, p in changes:
                    if any(Path(p) == e for e in self.exclude) or Path(p).name.endswith(("-wal", "-shm", "-journal")):
                        continue
                    run = self.run_of(p)
                    if run is None:
                        unknown = True
                    else:
                        self.on_dirty(self.run_root.get(run, ""), run)
                if unknown:
                    self._rescan_now.set()
        except Exception:  # noqa: BLE001, S110 - events are an optimisation; rescans still run
            pass
