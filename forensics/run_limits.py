"""Per-run time and memory limits for batch analyses (``audit``; the service reuses it).

One hostile run folder must never stall or exhaust a batch: each run is analysed in a worker
process (``spawn``) that this process watches. A run that goes past ``timeout`` seconds, or whose
worker's resident memory goes past ``memory`` bytes (sampled from ``/proc/<pid>/statm`` every
:data:`POLL_S` seconds; where there is no ``/proc`` the worker also gets an address-space limit),
is killed with its worker and becomes an error row ("over budget: ..."); a fresh worker takes the
next run. A worker that dies (killed from outside, a crash) makes an error row too.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import time
from collections.abc import Callable, Iterator, Sequence
from multiprocessing.connection import Connection, wait
from typing import Any

POLL_S = 0.2
"""Seconds between checks of the running workers (time and memory)."""


def _worker(conn: Connection, fn: Callable[[Any], Any], memory: int | None) -> None:  # pragma: no cover - child
    if memory and not os.path.exists("/proc/self/statm"):
        with contextlib.suppress(ImportError, ValueError, OSError):
            import resource

            resource.setrlimit(resource.RLIMIT_AS, (memory * 2, memory * 2))
    while True:
        try:
            item = conn.recv()
        except EOFError:
            return
        if item is None:
            return
        try:
            conn.send(("ok", fn(item)))
        except Exception as exc:  # noqa: BLE001 - reported to the parent as a row
            conn.send(("error", f"{type(exc).__name__}: {exc}"))


def rss_bytes(pid: int) -> int | None:
    """Resident memory of process ``pid`` in bytes (``/proc/<pid>/statm``), or None where unknown."""
    try:
        with open(f"/proc/{pid}/statm", "rb") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


class _Slot:
    def __init__(self, ctx: Any, fn: Callable[[Any], Any], memory: int | None) -> None:
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_worker, args=(child, fn, memory), daemon=True)
        self.proc.start()
        child.close()
        self.item: Any = None
        self.started = 0.0

    def kill(self) -> None:
        with contextlib.suppress(Exception):
            self.proc.kill()
        self.proc.join(5)
        self.conn.close()

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self.conn.send(None)
        self.proc.join(5)
        if self.proc.is_alive():
            self.kill()
        self.conn.close()


def run_limited(items: Sequence[Any], fn: Callable[[Any], Any], *, jobs: int = 1, timeout: float | None = None,
                memory: int | None = None) -> Iterator[tuple[Any, str, Any]]:
    """Run ``fn(item)`` for every item in worker processes, each run under the limits.

    Args:
        items: Picklable work items (``RunTask``).
        fn: A picklable module-level function (``forensics.audit_worker.work``).
        jobs: Worker processes.
        timeout: Seconds one item may take (None: no limit).
        memory: Resident bytes one worker may hold (None: no limit).

    Yields:
        ``(item, "ok", result)``, or ``(item, "error", message)`` when the item went over budget,
        its worker died, or ``fn`` raised.
    """
    ctx = multiprocessing.get_context("spawn")  # fork after polars/rayon threads started is unsafe
    todo = list(items)[::-1]
    slots: list[_Slot] = []
    try:
        while todo or any(s.item is not None for s in slots):
            while todo and (len(slots) < jobs or any(s.item is None for s in slots)):
                slot = next((s for s in slots if s.item is None), None)
                if slot is None:
                    slot = _Slot(ctx, fn, memory)
                    slots.append(slot)
                slot.item, slot.started = todo.pop(), time.monotonic()
                slot.conn.send(slot.item)
            busy = [s for s in slots if s.item is not None]
            ready = wait([s.conn for s in busy] + [s.proc.sentinel for s in busy], timeout=POLL_S)
            for s in busy:
                done: tuple[str, Any] | None = None
                if s.conn in ready:
                    try:
                        done = s.conn.recv()
                    except (EOFError, OSError):
                        done = ("error", f"the analysis process died (exit code {s.proc.exitcode})")
                elif s.proc.sentinel in ready or not s.proc.is_alive():
                    s.proc.join(1)
                    done = ("error", f"the analysis process died (exit code {s.proc.exitcode})")
                else:
                    spent = time.monotonic() - s.started
                    rss = rss_bytes(s.proc.pid) if memory else None
                    if timeout is not None and spent > timeout:
                        done = ("error", f"over budget: the analysis ran past {timeout:g} s and was stopped")
                    elif memory and rss is not None and rss > memory:
                        done = ("error", f"over budget: the analysis held {rss / 2**20:.0f} MiB (limit "
                                f"{memory / 2**20:.0f} MiB) and was stopped")
                if done is None:
                    continue
                item, s.item = s.item, None
                if done[0] == "error" and (not s.proc.is_alive() or "over budget" in done[1]):
                    s.kill()
                    slots.remove(s)
                yield item, done[0], done[1]
    finally:
        for s in slots:
            s.stop() if s.item is None else s.kill()


def parse_bytes(text: str) -> int:
    """``"4GiB"``, ``"512M"``, ``"1e9"`` -> bytes (K/M/G/T are powers of 1024).

    Raises:
        ValueError: Not a size.
    """
    t = text.strip().lower().removesuffix("ib").removesuffix("b")
    mult = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}.get(t[-1:], 1)
    if mult > 1:
        t = t[:-1]
    return int(float(t) * mult)
