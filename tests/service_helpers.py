"""Helpers of the service tests and benchmarks: a real server in a subprocess, a real webhook receiver."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]
SAMPLES = REPO / "sample_logs"


def free_port() -> int:
    """A free TCP port on loopback."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(cond: Callable[[], Any], timeout: float = 30.0, every: float = 0.1, what: str = "condition") -> Any:
    """Poll ``cond()`` until it returns something truthy; fail after ``timeout`` seconds."""
    end = time.monotonic() + timeout
    while True:
        try:
            got = cond()
        except (httpx.HTTPError, OSError):
            got = None
        if got:
            return got
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(every)


class Receiver:
    """A webhook receiver on loopback (a real HTTP server in a thread) recording every POST.

    Args:
        fail_first: Answer the first N requests with HTTP 500 (to exercise retries).
    """

    def __init__(self, fail_first: int = 0) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.attempts = 0
        self.headers: list[dict[str, str]] = []
        self.fail_left = fail_first
        lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                n = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(n)
                with lock:
                    outer.attempts += 1
                    fail = outer.fail_left > 0
                    if fail:
                        outer.fail_left -= 1
                    else:
                        outer.bodies.append(json.loads(raw))
                        outer.headers.append(dict(self.headers))
                self.send_response(500 if fail else 200)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        """Stop the receiver."""
        self.server.shutdown()
        self.server.server_close()


class Server:
    """``forensics serve`` in a subprocess on loopback."""

    def __init__(self, roots: list[Path], db: Path, *, token: str = "test-token", hooks: tuple[str, ...] = (),
                 extra: tuple[str, ...] = (), port: int | None = None, log: Path | None = None) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.token = token
        env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        cmd = [sys.executable, "-c", "from forensics.cli import main; main()", "serve", *map(str, roots),
               "--port", str(self.port), "--db", str(db), "--token", token, *extra]
        for h in hooks:
            cmd += ["--webhook", h]
        self.log = log or db.with_suffix(".log")
        self._fh = open(self.log, "ab")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(cmd, env=env, stdout=self._fh, stderr=subprocess.STDOUT, cwd=REPO)
        self.client = httpx.Client(base_url=self.url, timeout=30.0)
        wait_for(self._up, timeout=60, what=f"the server on {self.url} (log {self.log})")

    def _up(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"server exited with {self.proc.returncode}: {self.log.read_text()[-3000:]}")
        return self.client.get("/healthz").status_code == 200

    @property
    def auth(self) -> dict[str, str]:
        """The Authorization header."""
        return {"Authorization": f"Bearer {self.token}"}

    def stop(self) -> None:
        """SIGTERM, then wait (kill after 20 s)."""
        self.client.close()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._fh.close()


def hold_memory(mib: int, seconds: float) -> int:
    """Hold ``mib`` MiB (touched, so resident) for ``seconds``; a job for the worker-pool memory-limit test."""
    block = bytearray(b"\x01") * (mib << 20)
    time.sleep(seconds)
    return len(block)
