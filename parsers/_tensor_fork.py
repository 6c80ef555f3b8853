"""Run a batch of reduction tasks in this process and forked copies of it (no GIL shared between them).

Why processes: each task of :mod:`parsers.tensors` is a loop of short numpy/numkong calls (a few microseconds
each, cache-sized blocks), and every call releases and takes back the GIL. Two threads doing that hand the GIL
to each other thousands of times a second; on a virtual machine whose idle cores halt, every hand-over that
finds the GIL taken puts a thread to sleep and wakes it through the hypervisor. Measured on the 2-core machine
(``benchmarks/bench_checkpoint.py``, quiet): BF16 with two threads took 0.177 s and 0.215 CPU seconds against
0.113 s with one (5,298 voluntary context switches against 0). Forked workers share no GIL: the only hand-over
is one pipe read per worker at the end.

The tasks are claimed one at a time from a pipe holding their indices (4 bytes each; a read of 4 bytes from a
pipe is taken whole, so no two processes get the same task), so a worker slowed by other load takes fewer. A
worker sends its results back pickled (this process's own objects, never a file's) when it has no task left.
A task whose result does not come back (a worker killed, a result that cannot be pickled) is run again here,
so the outcome never depends on the workers. Linux only (``os.fork`` of a process that may hold other
threads: the child runs only the reduction, which takes no lock another thread could hold, and leaves with
``os._exit``); elsewhere the caller keeps its threads.
"""

from __future__ import annotations

import os
import pickle
import signal
import struct
import sys
import warnings
from collections.abc import Callable, Sequence
from typing import Any

AVAILABLE = sys.platform.startswith("linux") and hasattr(os, "fork")
"""Whether :func:`run_forked` may be used here."""
MAX_TASKS = 4096 // 4
"""Most tasks in one batch: their indices are written to the pipe before anyone reads it, so they must fit in the
smallest capacity a pipe may get (one page, when the user's pipe quota is spent; 64 KiB otherwise)."""


def _claims(fd: int) -> Any:
    """The task indices this process takes from the claim pipe, one at a time, until it is empty."""
    while True:
        b = os.read(fd, 4)
        if len(b) < 4:
            return
        yield struct.unpack("<I", b)[0]


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _read_all(fd: int) -> bytes:
    parts = []
    while chunk := os.read(fd, 1 << 16):
        parts.append(chunk)
    return b"".join(parts)


def _child(tasks: Sequence[Callable[[], Any]], run: Callable[[Any], Any], claim: int, out: int) -> None:
    """A forked worker: run what it claims, send ``{index: result}`` back, leave without any cleanup."""
    code = 1
    try:
        signal.signal(signal.SIGINT, signal.SIG_DFL)  # a Ctrl-C ends the worker quietly with the parent
        done = {i: run(tasks[i]) for i in _claims(claim)}
        _write_all(out, pickle.dumps(done, protocol=pickle.HIGHEST_PROTOCOL))
        code = 0
    finally:
        os._exit(code)


def run_forked(tasks: Sequence[Callable[[], Any]], run: Callable[[Any], Any], workers: int) -> list[Any]:
    """``[run(t) for t in tasks]``, the tasks shared between this process and ``workers - 1`` forked ones.

    Args:
        tasks: At most :data:`MAX_TASKS` callables, reduced in any order (each result must be picklable).
        run: Called on each task, in whichever process claims it; must not raise.
        workers: Processes in all, this one included (at least 2).

    Returns:
        The results in task order.
    """
    n = len(tasks)
    claim_r, claim_w = os.pipe()
    kids: list[tuple[int, int]] = []
    results: dict[int, Any] = {}
    try:
        os.write(claim_w, struct.pack(f"<{n}I", *range(n)))  # n * 4 bytes <= the pipe's capacity: never blocks
        os.close(claim_w)
        claim_w = -1
        for _ in range(workers - 1):
            res_r, res_w = os.pipe()
            try:
                with warnings.catch_warnings():  # Python >= 3.12 warns about forking a process with threads
                    warnings.simplefilter("ignore", DeprecationWarning)
                    pid = os.fork()
            except OSError:  # no process to be had (limits, memory): the ones started and this one do it all
                os.close(res_r)
                os.close(res_w)
                break
            if pid == 0:
                os.close(res_r)
                _child(tasks, run, claim_r, res_w)
            os.close(res_w)
            kids.append((pid, res_r))
        results.update((i, run(tasks[i])) for i in _claims(claim_r))
        for _, res_r in kids:
            data = _read_all(res_r)
            try:
                results.update(pickle.loads(data))  # noqa: S301 - our own child's results, not a file's bytes
            except Exception:  # noqa: BLE001 - a worker that died mid-write: its tasks are run again below
                pass
    except BaseException:
        for pid, _ in kids:
            os.kill(pid, signal.SIGKILL)
        raise
    finally:
        for pid, res_r in kids:
            os.close(res_r)
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:  # reaped already (SIGCHLD ignored, or a watcher that waits for any child)
                pass
        os.close(claim_r)
        if claim_w >= 0:
            os.close(claim_w)
    return [results[i] if i in results else run(tasks[i]) for i in range(n)]
