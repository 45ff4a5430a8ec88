"""Delete latency through the real daemon and claiming sensor (issue #29's target: tombstone publish -> gone from
every search mode, idle, p50 <= 5 s), beside the same measurement for a publish of a one-page document.

Set-up is bench/chaos's (its own embedded PostgreSQL, ``dagster dev``, the fake-384 embedder), without faults.
Each document is published and timed until dense, lexical and hybrid search all return it; then each is deleted
(``Publisher.delete``), one at a time, and timed until none of the three modes returns it. Both paths are the
same: a PENDING task, a sensor tick that claims it, a run, a fenced publish.
"""

from __future__ import annotations

import statistics
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.chaos import Chaos, ChaosConfig

MODES = ("dense", "lexical", "hybrid")
TENANT = "deletes"


@dataclass
class DeleteConfig:
    documents: int = 10
    timeout: float = 120.0
    """Seconds one publish or delete may take to show in (or leave) search before the bench gives up."""
    poll: float = 0.1
    keep: bool = False


def _page(n: int) -> tuple[str, bytes]:
    phrase = f"zebulon{n}quartz"
    text = (f"# Policy {n}\n\nThe {phrase} rule says how the team files expense reports for trip {n}. "
            "Receipts go in the shared folder within a week; the approver checks each line. ") * 6
    return phrase, text.encode()


def percentile(values: list[float], p: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, max(0, round(p / 100 * len(ordered) + 0.5) - 1))], 2)


def summary(values: list[float]) -> dict[str, Any]:
    return {"n": len(values), "p50": round(statistics.median(values), 2) if values else None,
            "p95": percentile(values, 95), "max": round(max(values), 2) if values else None,
            "seconds": [round(v, 2) for v in values]}


class DeleteBench(Chaos):
    def __init__(self, config: DeleteConfig, out: Callable[[str], None] = print) -> None:
        super().__init__(ChaosConfig(tasks=0, kills=0, stops=0, pg_restarts=0, faults="", fake_delay=0.0,
                                     run_batch=8, run_batch_min=1, keep=config.keep), out)
        self.dcfg = config

    def _modes_with(self, phrase: str, document_id: str) -> set[str]:
        from resources.search import search

        return {m for m in MODES
                if any(h.document_id == document_id
                       for h in search(self.db, self.embedder, phrase, tenant_id=TENANT, k=10, mode=m))}

    def _until(self, phrase: str, document_id: str, want_all: bool) -> float:
        started = time.monotonic()
        while time.monotonic() - started < self.dcfg.timeout:
            found = self._modes_with(phrase, document_id)
            if (found == set(MODES)) if want_all else not found:
                return time.monotonic() - started
            time.sleep(self.dcfg.poll)
        raise TimeoutError(f"{document_id}: not {'searchable' if want_all else 'gone'} after {self.dcfg.timeout} s"
                           f" (modes returning it: {sorted(self._modes_with(phrase, document_id))})")

    def run(self) -> dict[str, Any]:
        from resources.blob_store import BlobStore
        from resources.database import Database
        from resources.embedder import embedder_for_model
        from resources.publisher import Publisher

        root = Path(tempfile.mkdtemp(prefix="kbindex-delete-"))
        self.t0 = time.monotonic()
        report: dict[str, Any] = {"ok": False}
        try:
            self._prepare(root)
            self.dagster.start()
            self._note(f"dagster dev answered in {self.dagster.wait_ready():.1f} s")
            self.db = Database(self.url, max_size=2)
            self.embedder = embedder_for_model(self.model)
            publisher = Publisher(self.db, BlobStore(str(self.blobs)))
            publish_s, delete_s, still_found = [], [], []
            docs = [(f"policy-{n}", *_page(n)) for n in range(self.dcfg.documents)]
            for doc, phrase, data in docs:
                publisher.publish(TENANT, doc, data, f"{doc}.md")
                publish_s.append(self._until(phrase, doc, want_all=True))
                self._note(f"publish {doc}: searchable in every mode after {publish_s[-1]:.2f} s")
            for doc, phrase, _ in docs:
                publisher.delete(TENANT, doc)
                delete_s.append(self._until(phrase, doc, want_all=False))
                self._note(f"delete {doc}: gone from every mode after {delete_s[-1]:.2f} s")
            for doc, phrase, _ in docs:  # none comes back once later runs have published
                if self._modes_with(phrase, doc):
                    still_found.append(doc)
            report = {"ok": not still_found, "documents": len(docs), "publish": summary(publish_s),
                      "delete": summary(delete_s), "found_after_delete": still_found}
        except Exception as exc:  # noqa: BLE001
            report = {"ok": False, "errors": [f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"]}
        finally:
            if hasattr(self, "db"):
                self.db.close()
            if hasattr(self, "dagster"):
                if not report.get("ok"):
                    report["dagster_log_tail"] = self.dagster.log_tail()
                self.dagster.stop()
            if hasattr(self, "pg"):
                if self.dcfg.keep:
                    self.out(f"kept {root}")
                else:
                    self.pg.cleanup()
        return report


def format_report(report: dict[str, Any]) -> str:
    if "delete" not in report:
        return "no figures: " + "; ".join(report.get("errors", []))
    rows = [("publish -> searchable in dense, lexical and hybrid", report["publish"]),
            ("delete -> gone from dense, lexical and hybrid", report["delete"])]
    lines = [f"{'measure (idle, through the daemon and claiming sensor)':<56} {'n':>3} {'p50 s':>7} {'p95 s':>7} {'max s':>7}"]
    for name, s in rows:
        lines.append(f"{name:<56} {s['n']:>3} {s['p50']:>7} {s['p95']:>7} {s['max']:>7}")
    target = report["delete"]["p50"] is not None and report["delete"]["p50"] <= 5
    lines.append(f"target delete p50 <= 5 s: {'met' if target else 'MISSED'}")
    return "\n".join(lines)


def run_delete(config: DeleteConfig, out: Callable[[str], None] = print) -> dict[str, Any]:
    return DeleteBench(config, out).run()
