"""``GET /metrics``: the service's Prometheus metrics (prometheus_client, one private registry).

- ``forensics_runs{verdict}``: runs by latest verdict (read from the database at scrape time).
- ``forensics_incidents_open{kind}``: incidents not resolved, by kind.
- ``forensics_outbox{status}``: webhook bodies pending, sent, failed.
- ``forensics_analysis_seconds``: analysis latency (load + analyse in the worker), histogram.
- ``forensics_watcher_lag_seconds``: from the first change of a run not yet analysed (as the watcher
  noticed it) to the end of the analysis that read it, histogram (only for data written while the
  service runs).
- ``forensics_analyses_total{outcome}``: analyses done (``ok``, ``error``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from forensics.service.db import Database

_LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120)


class _DbCollector(Collector):
    def __init__(self, db: Database) -> None:
        self.db = db

    def collect(self) -> Iterator[Any]:
        runs = GaugeMetricFamily("forensics_runs", "Runs under the roots by latest verdict.", labels=["verdict"])
        for r in self.db.all("SELECT COALESCE(verdict, 'pending') AS v, COUNT(*) AS n FROM runs GROUP BY v"):
            runs.add_metric([r["v"]], r["n"])
        yield runs
        inc = GaugeMetricFamily("forensics_incidents_open", "Incidents not resolved, by kind.", labels=["kind"])
        for r in self.db.all("SELECT kind, COUNT(*) AS n FROM incidents WHERE status != 'resolved' GROUP BY kind"):
            inc.add_metric([r["kind"]], r["n"])
        yield inc
        out = GaugeMetricFamily("forensics_outbox", "Webhook bodies by delivery status.", labels=["status"])
        for r in self.db.all("SELECT status, COUNT(*) AS n FROM outbox GROUP BY status"):
            out.add_metric([r["status"]], r["n"])
        yield out


class ServiceMetrics:
    """The registry and the instruments the scheduler updates."""

    def __init__(self, db: Database) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(_DbCollector(db))
        self.analysis_seconds = Histogram("forensics_analysis_seconds", "Analysis latency (load + analyse).",
                                          buckets=_LATENCY_BUCKETS, registry=self.registry)
        self.watcher_lag = Histogram("forensics_watcher_lag_seconds",
                                     "From the first unanalysed change of a run to the end of its analysis.",
                                     buckets=_LATENCY_BUCKETS, registry=self.registry)
        self.analyses = Counter("forensics_analyses", "Analyses done.", ["outcome"], registry=self.registry)

    def text(self) -> bytes:
        """The Prometheus text exposition."""
        return generate_latest(self.registry)
