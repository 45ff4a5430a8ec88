"""Prometheus metrics computed from the database (custom collectors), at most once per cache period.

Every API process reports the same numbers because they come from PostgreSQL, not from counters
kept in memory. ``ScrapeCache`` computes them at most once every ``ttl`` seconds (default 15, a
scrape interval), on one thread at a time: any number of scrapers cost the database one set of
counts per period and at most one pool connection, so tenants' requests are not starved.
Families (no tenant labels: aggregates only):

    kbindex_queue_depth{status}               gauge    PENDING / RETRY_WAIT tasks (due or not)
    kbindex_queue_due                         gauge    tasks due now (claimable)
    kbindex_queue_oldest_due_age_seconds      gauge    how long the oldest due task has waited
    kbindex_leases{state}                     gauge    RUNNING leases: active, expiring (<1 min), expired
    kbindex_tasks{status}                     gauge    tasks by status
    kbindex_tasks_dead{code}                  gauge    DEAD tasks by error code
    kbindex_task_failures_total{code}         counter  recorded failures (-> RETRY_WAIT or DEAD) by code
    kbindex_publish_to_searchable_seconds     histogram  created_at -> finished_at of SUCCEEDED tasks
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

from prometheus_client import generate_latest

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from resources.database import Database
from resources.task_queue import TaskQueue

LATENCY_BOUNDS = (1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0, 21600.0, 86400.0)


class KbindexCollector(Collector):
    def __init__(self, db: Database) -> None:
        self.db = db

    def collect(self) -> Iterator[Metric]:
        stats = TaskQueue(self.db).stats()

        depth = GaugeMetricFamily("kbindex_queue_depth", "Tasks waiting to be claimed, by status.", labels=["status"])
        depth.add_metric(["PENDING"], float(stats["pending"]))
        depth.add_metric(["RETRY_WAIT"], float(stats["retry_waiting"]))
        yield depth
        yield GaugeMetricFamily("kbindex_queue_due", "Tasks due now (claimable).", value=float(stats["due_now"]))
        yield GaugeMetricFamily(
            "kbindex_queue_oldest_due_age_seconds",
            "Seconds the oldest due task has been waiting (0 when none is due).",
            value=float(stats["oldest_due_age_seconds"]),
        )
        leases = GaugeMetricFamily("kbindex_leases", "RUNNING tasks by lease state.", labels=["state"])
        expired = float(stats["expired_leases"])
        leases.add_metric(["active"], float(stats["running"]) - expired)
        leases.add_metric(["expiring_within_minute"], float(stats["expiring_within_minute"]))
        leases.add_metric(["expired"], expired)
        yield leases
        tasks = GaugeMetricFamily("kbindex_tasks", "Index tasks by status.", labels=["status"])
        for status, key in (
            ("PENDING", "pending"), ("RUNNING", "running"), ("RETRY_WAIT", "retry_waiting"),
            ("SUCCEEDED", "succeeded"), ("DEAD", "dead"), ("CANCELLED", "cancelled"),
        ):
            tasks.add_metric([status], float(stats[key]))
        yield tasks
        dead = GaugeMetricFamily("kbindex_tasks_dead", "DEAD tasks by error code.", labels=["code"])
        for code, n in sorted(stats["dead_by_code"].items()):
            dead.add_metric([code], float(n))
        yield dead

        failures = CounterMetricFamily(
            "kbindex_task_failures", "Failures recorded (moves to RETRY_WAIT or DEAD), by error code.", labels=["code"]
        )
        for row in self.db.fetch_all("api_task_failures_by_code"):
            failures.add_metric([row["code"]], float(row["n"]))
        yield failures

        row = self.db.fetch_one("api_publish_latency_histogram", {"bounds": list(LATENCY_BOUNDS)})
        assert row is not None
        buckets = [(repr(bound), float(n)) for bound, n in zip(LATENCY_BOUNDS, row["cumulative"], strict=True)]
        buckets.append(("+Inf", float(row["n"])))
        yield HistogramMetricFamily(
            "kbindex_publish_to_searchable_seconds",
            "Seconds from publish (task created) to searchable (task SUCCEEDED).",
            buckets=buckets,
            sum_value=float(row["total_seconds"]),
        )


def build_registry(db: Database) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(KbindexCollector(db))
    return registry


class ScrapeCache:
    """The exposition text, recomputed only when older than ``ttl`` seconds, by one caller at a time."""

    def __init__(self, registry: CollectorRegistry, ttl: float) -> None:
        self.registry, self.ttl = registry, ttl
        self._lock = threading.Lock()
        self._text: bytes | None = None
        self._at = 0.0

    def fresh(self) -> bytes | None:
        """The cached text if it is younger than ``ttl`` (no database work), else None."""
        if self._text is not None and time.monotonic() - self._at < self.ttl:
            return self._text
        return None

    def get(self) -> bytes:
        """The cached text, or a new one (callers that wait for the lock reuse the one just made)."""
        with self._lock:
            text = self.fresh()
            if text is None:
                text = generate_latest(self.registry)
                self._text, self._at = text, time.monotonic()
            return text
