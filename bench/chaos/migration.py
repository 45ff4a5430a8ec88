"""``--migration``: a model migration under chaos, driven the way an operator drives it from the Dagster UI.

Once part of the target is indexed, ``create_profile`` starts a building profile with a really
different model (``fake-b-384``: the fake's vectors salted by the model name) and another chunk size
(64 word pieces against the active 200). A driver thread then sends the UI's own
``launchPartitionBackfill`` mutation to the ``dagster dev`` webserver, tag ``kbindex/profile=NAME``,
over the partitions of the profile's never-attempted REINDEX tasks, in bounded chunks, at most a few
backfills in flight. It relaunches for whatever a finished backfill left never attempted (a run killed
before it claimed, a claim refused while PostgreSQL was down), as an operator would after reading the
coverage. ``--backfill-mode job`` (the default) instead launches the ``backfill_profile`` job once from
the launchpad, the way a migration of any size is started: the claiming sensor then builds the backlog
in ordinary bounded runs beside live work. Publishing goes on meanwhile (new versions get INDEX tasks under both profiles), and the
soak's faults hit sensor runs and backfill runs alike.

At the end (``migration_checks``), besides the soak's own figures and ``kbindex verify``:

- coverage of both profiles is 100% of the current versions;
- every stored chunk obeys its own profile's chunk size: its embed text (heading prefix + text, as the
  chunker builds it) counts at most the profile's ``chunk_tokens`` with the profile model's tokenizer,
  and exactly its stored ``token_count``;
- a random sample of stored vectors, re-embedded with their profile's model, match (cosine >= 0.999),
  and the same texts under the other profile's model do not (so the check can fail);
- no task is DEAD that no run ever started (no 'run' or 'progress' event, no claim by a run).
"""

from __future__ import annotations

import json
import threading
import time
import traceback
import urllib.error
import urllib.request
from collections import Counter
from typing import Any

import numpy as np
import psycopg

from bench.dagster_dev import LAUNCH_BACKFILL, LAUNCH_RUN, REPOSITORY
from bench.dagster_dev import UI_ASSETS as ASSETS
from sql import queries

PARTITIONS_DEF = "document_versions"
PROFILE_TAG = "kbindex/profile"
COSINE_MIN = 0.999

BACKFILL_STATUS = """
query($id: String!) {
  partitionBackfillOrError(backfillId: $id) { ... on PartitionBackfill { id status } }
}"""
BACKFILL_JOB = "backfill_profile"
TERMINAL_BACKFILL = {"COMPLETED", "COMPLETED_SUCCESS", "COMPLETED_FAILED", "FAILED", "CANCELED", "FAILING"}


def _sql(url: str, name: str, params: dict[str, Any] | None = None) -> list[tuple[Any, ...]]:
    from bench.chaos import _sql as run

    return run(url, name, params)


class MigrationDriver:
    """Starts the migration at a set point and backfills it from the UI until nothing is left unattempted."""

    def __init__(self, chaos: Any) -> None:
        self.chaos, self.cfg = chaos, chaos.cfg
        self.name = self.cfg.building_profile
        self.started = threading.Event()
        self.done = threading.Event()
        self.in_flight: dict[str, dict[str, Any]] = {}  # backfill id -> {keys, launched}
        self.figures: Counter = Counter()
        self.statuses: Counter = Counter()
        self.reindex_created = 0
        self.started_at: float | None = None
        self.launch_errors: list[str] = []
        self.requested: set[str] = set()  # every partition key sent in a backfill so far

    # -- GraphQL --------------------------------------------------------------------------------
    def _gql(self, query: str, variables: dict[str, Any]) -> dict[str, Any]:
        body = json.dumps({"query": query, "variables": variables}).encode()
        request = urllib.request.Request(f"http://127.0.0.1:{self.chaos.dagster.port}/graphql", data=body,
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=60) as response:
            out = json.load(response)
        if out.get("errors"):
            raise RuntimeError(f"GraphQL errors: {out['errors']}")
        return out["data"]

    def launch(self, keys: list[str]) -> str:
        """What the asset launchpad sends for several partitions of the four assets, with the profile tag."""
        params = {"tags": [{"key": PROFILE_TAG, "value": self.name}], "assetSelection": [{"path": [a]} for a in ASSETS],
                  "partitionNames": keys, "fromFailure": False}
        out = self._gql(LAUNCH_BACKFILL, {"backfillParams": params})["launchPartitionBackfill"]
        if out["__typename"] != "LaunchBackfillSuccess":
            raise RuntimeError(f"{out['__typename']}: {out.get('message')}")
        return out["backfillId"]

    def launch_backfill_job(self) -> str:
        """The launchpad of the backfill_profile job (what an operator does for a migration of any size):
        the claiming sensor then builds the profile's backlog in ordinary bounded runs."""
        (node,) = self._gql(REPOSITORY, {})["repositoriesOrError"]["nodes"]
        params = {
            "mode": "default",
            "executionMetadata": {"tags": []},
            "runConfigData": json.dumps({"ops": {"request_profile_backfill": {"config": {"profile": self.name}}}}),
            "selector": {"repositoryLocationName": node["location"]["name"], "repositoryName": node["name"],
                         "pipelineName": BACKFILL_JOB},
        }
        out = self._gql(LAUNCH_RUN, {"executionParams": params})["launchPipelineExecution"]
        if out["__typename"] != "LaunchRunSuccess":
            raise RuntimeError(f"{out['__typename']}: {out.get('message') or out.get('errors')}")
        return out["run"]["id"]

    def backfill_status(self, backfill_id: str) -> str | None:
        return (self._gql(BACKFILL_STATUS, {"id": backfill_id})["partitionBackfillOrError"] or {}).get("status")

    # -- the driver -----------------------------------------------------------------------------
    def unattempted_keys(self) -> tuple[int, list[str]]:
        """How many of the profile's REINDEX tasks no run has claimed yet, and the partition keys of
        those Dagster already knows (the sensor adds a version's key when it claims its INDEX task)."""
        rows = _sql(self.chaos.url, "bench_chaos_unattempted_reindex_keys", {"profile": self.name})
        keys = [r[0] for r in rows]
        if not keys:
            return 0, []
        known = {r[0] for r in _sql(self.chaos.dg_url, "bench_dagster_known_partitions",
                                    {"definition": PARTITIONS_DEF, "keys": keys})}
        return len(keys), [k for k in keys if k in known]

    def start_migration(self) -> None:
        from resources.database import Database
        from resources.profiles import create_profile

        db = Database(self.chaos.url, max_size=1)
        try:
            created = create_profile(db, self.name, model=self.cfg.building_model,
                                     chunk_tokens=self.cfg.building_chunk_tokens, overlap=self.cfg.building_overlap)
        finally:
            db.close()
        self.reindex_created = int(created["reindex_tasks"])
        self.started_at = time.monotonic()
        self.started.set()
        self.chaos._note(f"migration: profile {self.name} ({self.cfg.building_model}, {self.cfg.building_chunk_tokens}"
                         f" tokens) created with {self.reindex_created} REINDEX task(s)")

    def loop(self) -> None:
        chaos = self.chaos
        try:
            while not chaos.stop_event.is_set() and chaos._progress() < self.cfg.migration_at:
                time.sleep(0.5)
            while not chaos.stop_event.is_set():
                try:
                    self.start_migration()
                    break
                except (psycopg.Error, OSError) as exc:  # PostgreSQL restarting: try again
                    self.figures["create_retried"] += 1
                    chaos._note(f"migration: create_profile failed ({type(exc).__name__}), retrying")
                    time.sleep(1)
                except Exception as exc:  # noqa: BLE001 - KbindexError(INDEX_WRITE_FAILED) while PostgreSQL is down
                    if getattr(exc, "code", None) != "INDEX_WRITE_FAILED":
                        raise
                    self.figures["create_retried"] += 1
                    time.sleep(1)
            while not chaos.stop_event.is_set():
                if self._step() and chaos.publishing_done.is_set():
                    break
                time.sleep(2)
        except Exception as exc:  # noqa: BLE001 - reported, and the soak fails
            chaos.c.errors.append(f"migration driver: {type(exc).__name__}: {exc}\n{traceback.format_exc()}")
        finally:
            self.done.set()

    def _step(self) -> bool:
        """One round. Job mode: launch backfill_profile once, then wait for the backlog to go. Partitions
        mode: forget finished backfills, launch for unattempted tasks. True when nothing is left."""
        if self.cfg.backfill_mode == "job":
            try:
                if not self.figures["backfill_jobs_launched"]:
                    run_id = self.launch_backfill_job()
                    self.figures["backfill_jobs_launched"] += 1
                    self.chaos._note(f"migration: backfill_profile run {run_id[:8]} launched from the launchpad")
                left, _ = self.unattempted_keys()
            except (psycopg.Error, OSError, RuntimeError) as exc:  # PostgreSQL or the webserver restarting
                self.figures["driver_errors"] += 1
                if len(self.launch_errors) < 5:
                    self.launch_errors.append(f"{type(exc).__name__}: {str(exc)[:200]}")
                return False
            return left == 0
        try:
            for backfill_id, entry in list(self.in_flight.items()):
                status = self.backfill_status(backfill_id)
                if status in TERMINAL_BACKFILL:
                    self.statuses[status] += 1
                    del self.in_flight[backfill_id]
                elif time.monotonic() - entry["launched"] > self.cfg.backfill_timeout:
                    self.statuses["STILL_RUNNING_AT_TIMEOUT"] += 1  # stop waiting for it; its tasks are judged below
                    del self.in_flight[backfill_id]
            left, pending = self.unattempted_keys()
        except (psycopg.Error, OSError, RuntimeError) as exc:  # PostgreSQL or the webserver restarting
            self.figures["driver_errors"] += 1
            if len(self.launch_errors) < 5:
                self.launch_errors.append(f"{type(exc).__name__}: {str(exc)[:200]}")
            return False
        covered = {k for entry in self.in_flight.values() for k in entry["keys"]}
        todo = [k for k in pending if k not in covered]
        while todo and len(self.in_flight) < self.cfg.backfills_in_flight:
            keys, todo = todo[: self.cfg.backfill_partitions], todo[self.cfg.backfill_partitions:]
            try:
                backfill_id = self.launch(keys)
            except (OSError, RuntimeError) as exc:
                self.figures["launch_errors"] += 1
                if len(self.launch_errors) < 5:
                    self.launch_errors.append(f"{type(exc).__name__}: {str(exc)[:200]}")
                return False
            again = sum(1 for k in keys if k in self.requested)
            self.requested.update(keys)
            self.figures["backfills_launched"] += 1
            self.figures["partitions_requested"] += len(keys)
            self.figures["partitions_requested_again"] += again
            self.in_flight[backfill_id] = {"keys": set(keys), "launched": time.monotonic()}
            n = self.figures["backfills_launched"]
            if n <= 3 or n % 5 == 0 or again:
                self.chaos._note(f"migration: backfill {n} ({backfill_id}) over {len(keys)} partition(s)"
                                 + (f", {again} of them again" if again else ""))
        return left == 0 and not self.in_flight


# --------------------------------------------------------------------------------------------------
# the end checks


def _embed_text(heading_path: list[str], text: str, tokenizer: Any, chunk_tokens: int) -> str:
    """The text the chunker embedded and counted: its heading prefix (at most a quarter of the budget) + text."""
    from pipelines.domain.chunking import _heading_prefix  # the chunker's own rule, not a copy of it

    return _heading_prefix(tuple(heading_path), tokenizer, chunk_tokens // 4) + text


def migration_checks(url: str, profiles: list[str], *, sample: int, seed: int) -> dict[str, Any]:
    """Coverage, chunk sizes, re-embedded vectors and never-attempted DEAD tasks, for ``profiles``."""
    from pgvector.psycopg import register_vector

    from resources.database import Database
    from resources.embedder import FakeEmbedder, tokenizer_for_model
    from resources.profiles import coverage

    db = Database(url, max_size=1)
    try:
        cover = {p: coverage(db, p) for p in profiles}
    finally:
        db.close()
    with psycopg.connect(url, autocommit=True) as conn:
        register_vector(conn)
        meta = {name: (model, tokens) for name, model, tokens in conn.execute(
            queries["bench_chaos_profile_models"], {"profiles": profiles}).fetchall()}
        sizes: dict[str, Counter] = {p: Counter() for p in profiles}
        over, miscounted, examples = 0, 0, []
        for profile, heading, text, token_count in conn.execute(
                queries["bench_chaos_chunk_texts"], {"profiles": profiles}):
            model, limit = meta[profile]
            tokenizer = tokenizer_for_model(model)
            n = tokenizer.count(_embed_text(heading, text, tokenizer, limit))
            sizes[profile]["chunks"] += 1
            sizes[profile]["max_tokens"] = max(sizes[profile]["max_tokens"], n)
            over += n > limit
            miscounted += n != token_count
            if (n > limit or n != token_count) and len(examples) < 5:
                examples.append({"profile": profile, "tokens": n, "stored": token_count, "limit": limit,
                                 "text": text[:80]})
        rows = conn.execute(queries["bench_chaos_chunk_sample"],
                            {"seed": str(seed), "profiles": profiles, "sample": sample}).fetchall()
        dead = conn.execute(queries["bench_chaos_dead_by_profile"], {}).fetchall()  # {}: 'run-%%' unescaped
        states = conn.execute(queries["bench_chaos_states_by_profile"]).fetchall()
    own_min, cross_max, below = 1.0, -1.0, 0
    models = {p: meta[p][0] for p in profiles}
    for profile, heading, text, stored in rows:
        model, limit = meta[profile]
        embed_text = _embed_text(heading, text, tokenizer_for_model(model), limit)
        vector = np.asarray(stored.to_numpy() if hasattr(stored, "to_numpy") else stored, dtype=np.float32)
        vector /= np.linalg.norm(vector)
        own = float(FakeEmbedder(model_name=model).embed([embed_text])[0] @ vector)
        own_min, below = min(own_min, own), below + (own < COSINE_MIN)
        for other in {m for m in models.values() if m != model}:
            cross_max = max(cross_max, float(FakeEmbedder(model_name=other).embed([embed_text])[0] @ vector))
    never_attempted = sum(int(r[4]) for r in dead)
    return {
        "coverage": cover,
        "coverage_complete": all(c["ratio"] == 1.0 for c in cover.values()),
        "chunks": {p: dict(c) | {"limit": meta[p][1], "model": meta[p][0]} for p, c in sizes.items()},
        "chunks_over_their_profile_size": over,
        "chunks_token_count_mismatch": miscounted,
        "chunk_size_examples": examples,
        "vectors_re_embedded": len(rows),
        "vectors_below_cosine_0_999": below,
        "own_model_cosine_min": round(own_min, 6) if rows else None,
        "other_model_cosine_max": round(cross_max, 4) if rows and len(models) > 1 else None,
        "dead_by_profile_type_code": [{"profile": p, "type": t, "code": c, "n": int(n), "never_attempted": int(na)}
                                      for p, t, c, n, na in dead],
        "dead_never_attempted": never_attempted,
        "tasks_by_profile_type_status": [{"profile": p, "type": t, "status": s, "n": int(n), "max_attempts": int(a)}
                                         for p, t, s, n, a in states],
    }


def failures(checks: dict[str, Any]) -> dict[str, int]:
    """The migration figures that must be 0."""
    return {
        "profiles_not_fully_covered": sum(1 for c in checks["coverage"].values() if c["ratio"] != 1.0),
        "chunks_over_their_profile_size": checks["chunks_over_their_profile_size"],
        "chunks_token_count_mismatch": checks["chunks_token_count_mismatch"],
        "vectors_not_their_profile_model": checks["vectors_below_cosine_0_999"],
        "dead_never_attempted": checks["dead_never_attempted"],
    }
