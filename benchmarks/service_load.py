"""Load test of ``forensics serve`` on loopback: 200 runs, 50 of them appending, 20 API clients for 60 s.

The root gets 150 finished runs (copies of the bundled sample and corpus runs) and 50 live ones that
are replayed step by step (:mod:`forensics.service.replay`) at ``--rate`` steps per second each. Once
the finished runs are analysed, 20 client threads (one ``httpx.Client`` each) call a mix of the API and
UI routes as fast as they are answered for ``--seconds``. Printed:

- latency p50/p95/p99 per route and overall, and every non-2xx answer or transport error;
- watcher lag: from the write of a step to the first ``/api/runs`` answer whose ``last_step`` covers
  it (polled every 0.5 s, so the figure is an upper bound by at most that), and the service's own
  ``forensics_watcher_lag_seconds`` histogram;
- memory: RSS of the server and its worker processes (from ``/proc``), at the start, peak and end.

    python benchmarks/service_load.py [--runs 200] [--appending 50] [--clients 20] [--seconds 60]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

from service_helpers import Server, wait_for  # noqa: E402

from forensics.service.replay import plan, steps_of, write_until  # noqa: E402

ROUTES = (  # (weight, name, path template)
    (20, "runs", "/api/runs"),
    (20, "run", "/api/runs/{id}"),
    (15, "analysis", "/api/runs/{id}/analysis"),
    (10, "incidents", "/api/incidents"),
    (10, "healthz", "/healthz"),
    (8, "metrics", "/metrics"),
    (8, "ui_runs", "/runs"),
    (5, "ui_incidents", "/"),
    (3, "ui_run", "/runs/{id}"),
    (1, "report_md", "/api/runs/{id}/report.md"),
)


def _sources() -> list[Path]:
    s = REPO / "sample_logs"
    runs = [d for d in sorted((s / "corpus").iterdir()) if d.is_dir()]
    runs += [s / n for n in ("healthy", "data_batch", "overflow", "update_scale_growth", "lr_schedule_reset")]
    return runs


def _rss_kib(pid: int) -> int:
    """RSS of ``pid`` and its children, KiB (``/proc``)."""
    total = 0
    pids = [pid]
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                for line in (d / "status").read_text().splitlines():
                    if line.startswith("PPid:") and int(line.split()[1]) == pid:
                        pids.append(int(d.name))
            except OSError:
                pass
    for p in pids:
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            pass
    return total


class Appender(threading.Thread):
    """Writes one run into the root step by step; remembers when each step was written."""

    def __init__(self, src: Path, dst: Path, rate: float, stop: threading.Event) -> None:
        super().__init__(daemon=True)
        self.src, self.dst, self.rate, self.stop = src, dst, rate, stop
        self.pieces = plan(src)
        self.steps = steps_of(self.pieces)
        self.written: dict[int, float] = {}  # step (last segment's numbering) -> time written
        self.i = 0
        self.k = 0

    def prefill(self, n: int) -> None:
        """Write the first ``n`` steps at once (so the run exists before the clock starts)."""
        self.dst.mkdir(parents=True, exist_ok=True)
        while self.k < min(n, len(self.steps)):
            self.i = write_until(self.pieces, self.src, self.dst, self.i, self.steps[self.k])
            self.k += 1

    def run(self) -> None:
        """Append one step every ``1/rate`` s until stopped or done."""
        while not self.stop.is_set() and self.k < len(self.steps):
            until = self.steps[self.k]
            self.i = write_until(self.pieces, self.src, self.dst, self.i, until)
            self.written[until[1]] = time.time()
            self.k += 1
            self.stop.wait(1.0 / self.rate)


def _pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q / 100 * (len(xs) - 1))))]


def main() -> None:
    """Command line."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--appending", type=int, default=50)
    ap.add_argument("--clients", type=int, default=20)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--rate", type=float, default=2.0, help="steps per second per appending run")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()

    base = Path(tempfile.mkdtemp(prefix="service-load-"))
    root = base / "root"
    root.mkdir()
    sources = _sources()
    n_static = args.runs - args.appending
    for k in range(n_static):
        src = sources[k % len(sources)]
        shutil.copytree(src, root / f"static_{k:03d}_{src.name}", ignore=shutil.ignore_patterns("expected.json"))
    stop = threading.Event()
    live_src = [s for s in sources if len(steps_of(plan(s))) > 150]
    appenders = [Appender(live_src[k % len(live_src)], root / f"live_{k:02d}_{live_src[k % len(live_src)].name}",
                          args.rate, stop) for k in range(args.appending)]
    for a in appenders:
        a.prefill(10)

    t0 = time.time()
    srv = Server([root], base / "svc.db", extra=("--workers", str(args.workers), "--rescan", "10",
                                                 "--unreadable-grace", "60"))
    rss = [_rss_kib(srv.proc.pid)]
    wait_for(lambda: len(srv.client.get("/api/runs").json()) >= args.runs and all(
        r["last_analyzed"] for r in srv.client.get("/api/runs").json()), timeout=900, every=1.0,
        what="the first analysis of every run")
    initial_s = time.time() - t0
    rss.append(_rss_kib(srv.proc.pid))
    ids = [r["id"] for r in srv.client.get("/api/runs").json()]
    name_of = {r["id"]: r["path"].rpartition("/")[2] for r in srv.client.get("/api/runs").json()}
    by_name = {a.dst.name: a for a in appenders}

    lat: dict[str, list[float]] = {name: [] for _, name, _ in ROUTES}
    errors: list[str] = []
    lags: list[float] = []
    seen_step: dict[str, int] = {}
    end = time.time() + args.seconds
    lock = threading.Lock()
    weights = [w for w, _, _ in ROUTES]

    def client(seed: int) -> None:
        r = random.Random(seed)
        with httpx.Client(base_url=srv.url, timeout=30.0) as c:
            while time.time() < end:
                _, name, tmpl = r.choices(ROUTES, weights)[0]
                path = tmpl.format(id=r.choice(ids))
                t = time.perf_counter()
                try:
                    resp = c.get(path)
                    ok = resp.status_code < 400 or (name in ("analysis", "report_md") and resp.status_code in (404,
                                                                                                             422))
                    if not ok:
                        with lock:
                            errors.append(f"{path}: HTTP {resp.status_code}")
                except httpx.HTTPError as exc:
                    with lock:
                        errors.append(f"{path}: {type(exc).__name__}: {exc}")
                    continue
                with lock:
                    lat[name].append(time.perf_counter() - t)

    def poller() -> None:
        with httpx.Client(base_url=srv.url, timeout=30.0) as c:
            while time.time() < end + 5:
                try:
                    runs = c.get("/api/runs").json()
                except httpx.HTTPError:
                    continue
                now = time.time()
                for row in runs:
                    a = by_name.get(name_of.get(row["id"], ""))
                    if a is None or row["last_step"] is None:
                        continue
                    prev = seen_step.get(a.dst.name, -1)
                    if row["last_step"] > prev:
                        for s, wt in a.written.items():
                            if prev < s <= row["last_step"]:
                                lags.append(now - wt)
                        seen_step[a.dst.name] = row["last_step"]
                time.sleep(0.5)

    def sampler() -> None:
        while time.time() < end:
            rss.append(_rss_kib(srv.proc.pid))
            time.sleep(1.0)

    for a in appenders:
        a.start()
    threads = [threading.Thread(target=client, args=(k,)) for k in range(args.clients)]
    threads += [threading.Thread(target=poller), threading.Thread(target=sampler)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stop.set()
    metrics = srv.client.get("/metrics").text
    rss.append(_rss_kib(srv.proc.pid))
    srv.stop()
    shutil.rmtree(base, ignore_errors=True)

    from prometheus_client.parser import text_string_to_metric_families

    fams = {f.name: f for f in text_string_to_metric_families(metrics)}
    lag_h = {s.name: s.value for s in fams["forensics_watcher_lag_seconds"].samples if not s.labels.get("le")}
    an_h = {s.name: s.value for s in fams["forensics_analysis_seconds"].samples if not s.labels.get("le")}
    allv = [x for v in lat.values() for x in v]
    out: dict[str, Any] = {
        "runs": args.runs, "appending": args.appending, "clients": args.clients, "seconds": args.seconds,
        "rate_steps_per_s": args.rate, "workers": args.workers, "cpus": os.cpu_count(),
        "initial_analysis_s": round(initial_s, 1),
        "requests": len(allv), "requests_per_s": round(len(allv) / args.seconds, 1), "errors": len(errors),
        "error_samples": errors[:5],
        "latency_ms": {"p50": round(1000 * _pct(allv, 50), 1), "p95": round(1000 * _pct(allv, 95), 1),
                       "p99": round(1000 * _pct(allv, 99), 1), "max": round(1000 * max(allv), 1) if allv else None},
        "latency_p95_ms_by_route": {k: round(1000 * _pct(v, 95), 1) for k, v in lat.items() if v},
        "watcher_lag_s": {"samples": len(lags), "p50": round(_pct(lags, 50), 2), "p95": round(_pct(lags, 95), 2),
                          "max": round(max(lags), 2) if lags else None,
                          "mean": round(statistics.fmean(lags), 2) if lags else None},
        "service_watcher_lag_histogram": {"count": lag_h.get("forensics_watcher_lag_seconds_count"),
                                          "mean_s": round(lag_h.get("forensics_watcher_lag_seconds_sum", 0)
                                                          / max(1, lag_h.get("forensics_watcher_lag_seconds_count",
                                                                             1)), 2)},
        "analyses": an_h.get("forensics_analysis_seconds_count"),
        "analysis_mean_s": round(an_h.get("forensics_analysis_seconds_sum", 0)
                                 / max(1, an_h.get("forensics_analysis_seconds_count", 1)), 3),
        "rss_mib": {"after_start": round(rss[0] / 1024), "after_initial": round(rss[1] / 1024),
                    "peak": round(max(rss) / 1024), "end": round(rss[-1] / 1024)},
        "steps_appended": sum(len(a.written) for a in appenders),
    }
    print(json.dumps(out, indent=1))
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
