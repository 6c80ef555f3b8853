"""Short GIL turns while a reader runs in two threads (the JSONL and text readers' pipelines).

A worker thread that calls polars (which releases the GIL) between bits of Python needs the GIL back after
each call; with Python's default switch interval (5 ms) it waits up to that long each time while the other
thread runs Python, and polars' cores idle meanwhile.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Iterator

SWITCH_INTERVAL = 0.0005
"""Seconds a thread holds the GIL before another that waits for it gets its turn, while a file is read in two
threads (Python's default is 0.005)."""
_turns = threading.Lock()
_readers = [0, 0.0]  # reads in two threads now, and the switch interval before the first of them


@contextlib.contextmanager
def short_gil_turns() -> Iterator[None]:
    """Set :data:`SWITCH_INTERVAL` while a read runs in two threads; the interval before comes back after the last."""
    with _turns:
        if not _readers[0]:
            _readers[1] = sys.getswitchinterval()
            sys.setswitchinterval(min(SWITCH_INTERVAL, _readers[1]))
        _readers[0] += 1
    try:
        yield
    finally:
        with _turns:
            _readers[0] -= 1
            if not _readers[0]:
                sys.setswitchinterval(_readers[1])
