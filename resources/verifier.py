"""The invariant checker behind ``kbindex verify``: every rule of DESIGN.md that the data can show, checked
against the database, each by one named statement of sql/queries/verify.sql.

A check returns the offending rows (the first ``examples`` of them) and how many there are in all.
Violations break an invariant and make ``kbindex verify`` exit 1; warnings are reported but allowed:

    violation  chunk_duplicate_ordinal          two chunk rows at one (tenant, document, profile, version, ordinal)
    violation  search_pointer_unsucceeded       pointer to a version without a SUCCEEDED task, or moved by a task
                                                that is not SUCCEEDED / belongs to another version or profile
    violation  search_pointer_chunk_count       pointed version's chunk rows != count its publish recorded
    violation  chunk_unpointed                  chunks of a version newer than the pointer, or with no pointer
    violation  search_pointer_tombstone_chunks  pointer to a tombstone (a deleted document) that has chunks or
                                                lexical rows: search would return a deleted document
    violation  search_pointer_scope_mismatch    pointer metadata or allow list != its version's: search would
                                                filter or grant reading on what was never published
    violation  index_task_lease_stale           RUNNING, lease expired more than one claim interval ago
    violation  index_task_running_without_lease RUNNING with no lease owner or lease end
    violation  index_task_attempts_exhausted    attempts > max without DEAD; RETRY_WAIT with no attempt left
    violation  index_task_dead_without_code     DEAD without a stable error code
    violation  task_event_status_mismatch       last transition event's to_status != task status
    violation  task_event_attempt_ahead         an event with a higher attempt than the task
    violation  task_event_illegal_transition    a (from, to) pair task_states.TRANSITIONS does not allow
    violation  task_event_chain_broken          a transition not starting where the previous one ended
    violation  document_version_without_task    a published version nothing will ever index
    violation  index_profile_active_count       not exactly one active profile
    violation  lexical_index_mismatch           a chunk's lexical (BM25) row missing, of another version,
                                                built from other content, or its length != sum of its tfs
    violation  lexical_stats_mismatch           BM25 statistics (df, chunks, total length per tenant and
                                                profile) != a recount over the pointed versions' rows
    warning    chunk_duplicate_content          one text (same heading path, page) under two chunk ids of a version
    warning    chunk_retained                   chunks of superseded versions (search never reads them)
    violation  chunk_retained_past_window       ... superseded longer ago than ``retention_seconds``: retention
                                                is not keeping up (checked only when a window is given)

Why two of these are warnings: chunk ids include the ordinal, so a document that repeats a passage
legitimately has the same text under two ids (a real double write shows up as a count mismatch or a
duplicate ordinal). Superseded versions' chunks are kept on purpose for a rollback window, then removed by
retention (resources/retention.py, a scheduled job); they are invisible to search, which joins
search_pointer. Give ``retention_seconds`` (the job's window plus its schedule interval) to have chunks
superseded longer ago than that reported as a violation.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from pipelines.domain.errors import ALL_CODES
from pipelines.domain.task_states import TRANSITIONS
from resources.database import Database

Severity = Literal["violation", "warning"]

DEFAULT_CLAIM_INTERVAL = 30.0
DEFAULT_EXAMPLES = 5


@dataclass(frozen=True)
class Check:
    name: str
    query: str
    severity: Severity
    description: str
    params: dict[str, Any] = field(default_factory=dict)
    """Parameters of this check only (on top of the shared ones)."""


CHECKS: tuple[Check, ...] = (
    Check("chunk_duplicate_ordinal", "verify_chunk_duplicate_ordinal", "violation",
          "two chunk rows at one (tenant, document, profile, version, ordinal)"),
    Check("chunk_duplicate_content", "verify_chunk_duplicate_content", "warning",
          "the same text (heading path, page) under two chunk ids of one version"),
    Check("search_pointer_unsucceeded", "verify_search_pointer_unsucceeded", "violation",
          "a search pointer names a version without a SUCCEEDED task, or was moved by a task that is not SUCCEEDED"),
    Check("search_pointer_chunk_count", "verify_search_pointer_chunk_count", "violation",
          "a pointed version has more or fewer chunk rows than its publish recorded"),
    Check("chunk_unpointed", "verify_chunk_unpointed", "violation",
          "chunk rows of a version newer than its pointer, or of a document with no pointer"),
    Check("search_pointer_tombstone_chunks", "verify_search_pointer_tombstone_chunks", "violation",
          "a search pointer names a tombstone (a deleted document) that has chunk or lexical rows"),
    Check("search_pointer_scope_mismatch", "verify_search_pointer_scope_mismatch", "violation",
          "a search pointer's metadata or allow list differs from the version it names"),
    Check("index_task_lease_stale", "verify_index_task_lease_stale", "violation",
          "RUNNING tasks whose lease expired more than one claim interval ago"),
    Check("index_task_running_without_lease", "verify_index_task_running_without_lease", "violation",
          "RUNNING tasks without a lease owner or lease end"),
    Check("index_task_attempts_exhausted", "verify_index_task_attempts_exhausted", "violation",
          "attempts above max_attempts without DEAD, or RETRY_WAIT with no attempt left"),
    Check("index_task_dead_without_code", "verify_index_task_dead_without_code", "violation",
          "DEAD tasks without a stable error code"),
    Check("task_event_status_mismatch", "verify_task_event_status_mismatch", "violation",
          "the last transition event does not end in the task's status"),
    Check("task_event_attempt_ahead", "verify_task_event_attempt_ahead", "violation",
          "events recording a higher attempt than the task has"),
    Check("task_event_illegal_transition", "verify_task_event_illegal_transition", "violation",
          "transition events the state machine does not allow"),
    Check("task_event_chain_broken", "verify_task_event_chain_broken", "violation",
          "transition events that do not start where the previous one ended"),
    Check("document_version_without_task", "verify_document_version_without_task", "violation",
          "published versions with no index task"),
    Check("index_profile_active_count", "verify_index_profile_active_count", "violation",
          "not exactly one active index profile"),
    Check("lexical_index_mismatch", "verify_lexical_index_mismatch", "violation",
          "chunks whose lexical (BM25) row is missing, of another version, stale, or inconsistent"),
    Check("lexical_stats_mismatch", "verify_lexical_stats_mismatch", "violation",
          "BM25 statistics that differ from a recount over the pointed versions' lexical rows"),
    Check("lexical_bounds_short", "verify_lexical_bounds_short", "violation",
          "BM25 term bounds (largest tf, smallest length / tf) that a pointed version's posting exceeds"),
    Check("chunk_retained", "verify_chunk_retained", "warning",
          "chunk rows of superseded versions, kept for rollback (search never reads them)",
          {"past_window": False}),
)
RETAINED_PAST_WINDOW = Check(
    "chunk_retained_past_window", "verify_chunk_retained", "violation",
    "chunk rows of versions superseded longer ago than the retention window",
    {"past_window": True},
)


@dataclass(frozen=True)
class Violation:
    """One failed check: how many offending rows, and the first few of them."""

    check: str
    count: int
    examples: list[dict[str, Any]]
    severity: Severity = "violation"
    description: str = ""


@dataclass(frozen=True)
class VerifyReport:
    violations: list[Violation]
    checked: list[str]
    warnings: list[Violation] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.violations

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "violations": [asdict(v) for v in self.violations],
            "warnings": [asdict(w) for w in self.warnings],
            "checked": list(self.checked),
        }


def _legal_pairs() -> tuple[list[str | None], list[str]]:
    pairs = sorted(TRANSITIONS, key=lambda p: (p[0] or "", p[1]))
    return [p[0].value if p[0] is not None else None for p in pairs], [p[1].value for p in pairs]


def verify(
    db: Database,
    *,
    claim_interval: float = DEFAULT_CLAIM_INTERVAL,
    retention_seconds: float | None = None,
    examples: int = DEFAULT_EXAMPLES,
) -> VerifyReport:
    """Run every check in one read-only snapshot and report what fails.

    ``claim_interval``: how long past its lease a RUNNING task may wait for the next claim tick.
    ``retention_seconds``: when given, superseded chunks older than this are a violation, not a warning.
    """
    if claim_interval < 0:
        raise ValueError("claim_interval must not be negative")
    if retention_seconds is not None and retention_seconds < 0:
        raise ValueError("retention_seconds must not be negative")
    legal_from, legal_to = _legal_pairs()
    params = {
        "limit": max(1, int(examples)),
        "claim_interval": float(claim_interval),
        "retention_seconds": None if retention_seconds is None else float(retention_seconds),
        "codes": sorted(ALL_CODES),
        "legal_from": legal_from,
        "legal_to": legal_to,
    }
    violations: list[Violation] = []
    warnings: list[Violation] = []
    checked: list[str] = []
    checks = CHECKS + ((RETAINED_PAST_WINDOW,) if retention_seconds is not None else ())
    with db.transaction() as tx:
        tx.execute("verify_snapshot")
        for check in checks:
            rows = tx.fetch_all(check.query, {**params, **check.params})
            checked.append(check.name)
            if rows:
                (violations if check.severity == "violation" else warnings).append(_found(check, rows))
    return VerifyReport(violations=violations, checked=checked, warnings=warnings)


def _found(check: Check, rows: list[dict[str, Any]]) -> Violation:
    total = int(rows[0]["total"])
    examples = [{k: v for k, v in row.items() if k != "total"} for row in rows]
    return Violation(check=check.name, count=total, examples=examples, severity=check.severity,
                     description=check.description)


def all_check_names(*, with_retention: bool = True) -> list[str]:
    names = [c.name for c in CHECKS]
    return names + [RETAINED_PAST_WINDOW.name] if with_retention else names


__all__ = ["CHECKS", "Check", "VerifyReport", "Violation", "all_check_names", "verify"]
