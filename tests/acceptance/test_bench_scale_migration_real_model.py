"""The CI-sized real-model round of bench/scale/migration.py (issue #33): a handful of one-paragraph documents
indexed on the default profile's own model through the warm embedding service, then REINDEXed into a shadow
profile that copies everything the active profile does, so both phases do the same work (the active vectors
moved aside between the phases, so REINDEX's graph inserts are new elements too). Asserts the mechanisms and the
equal work; the ratio is the bench's (``--corpus ../shared/corpus --plain 10000``)."""

from __future__ import annotations

import psycopg
import pytest

from bench.scale.corpus import DagsterUI
from bench.scale.migration import SHADOW, run
from resources.local_postgres import with_database

pytestmark = [pytest.mark.slow]
DOCS = 12
WORDS = ("ledger", "harbour", "invoice", "glacier", "turbine", "orchard", "statute", "violin", "copper", "meadow",
         "quarry", "lantern", "pension", "falcon", "granite", "tariff")


def documents() -> list[tuple[str, bytes]]:
    """Distinct English paragraphs (no two share an embedded text, so nothing can be reused within a profile)."""
    out = []
    for i in range(DOCS):
        words = [WORDS[(i * 7 + j * 3) % len(WORDS)] for j in range(12)]
        text = (f"Paragraph {i} of the handbook explains how the {words[0]} team reviews each {words[1]} before the "
                f"{words[2]} is approved. " + " ".join(f"The {a} depends on the {b}." for a, b in zip(words, words[1:])))
        out.append((f"paragraph-{i}.txt", text.encode()))
    return out


def test_the_real_model_round_reindexes_the_same_versions_with_the_same_work(pg_server_url, tmp_path, monkeypatch):
    for name in ("KBINDEX_DATABASE_URL", "KBINDEX_BLOB_URL", "KBINDEX_ARTIFACTS", "KBINDEX_HOME",
                 "KBINDEX_LEASE_SECONDS", "KBINDEX_EMBED_SERVICE"):
        monkeypatch.setenv(name, "")  # run() points these at its round; restored after the test
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    result = run(pg_server_url, tmp_path, 0, 0, minutes=10, documents=documents())

    model, shadow_model = result.models.split(" -> ")
    assert model == shadow_model and not model.startswith("fake"), result.models  # the real model, both sides
    assert (result.versions, result.plain_tasks, result.reindex_tasks) == (0, DOCS, DOCS)  # the same versions
    assert result.reindex_done == DOCS  # every one REINDEXed ...
    assert result.window_seconds < 10 * 60  # ... and the window ended when the last one did, not at 10 minutes
    assert result.plain_cut_seconds and result.reindex_cut_seconds  # both phases timed to their M-th task
    assert result.backfill_run_status == "SUCCESS" and not result.retried, result.retried
    # Same model, same texts, same vectors: unless the round moves the active ones aside, every REINDEX insert
    # is pgvector's cheaper duplicate path (one more heap TID on an existing graph element).
    assert result.equal_vectors == 0

    with psycopg.connect(with_database(pg_server_url, "mig_kb")) as conn:
        profiles = {row[0]: row[1:] for row in conn.execute(
            "SELECT name, model, chunk_tokens, chunk_overlap, lexical_analyzer, search_mode, fusion, lexical_weight,"
            " embed_context FROM index_profile")}
        active = conn.execute("SELECT name FROM index_profile WHERE is_active").fetchone()[0]
        assert profiles[SHADOW] == profiles[active]  # same model, chunking, analysis, fusion and context
        written = dict(conn.execute("SELECT profile, count(*) FROM chunk GROUP BY profile").fetchall())
        lexical = dict(conn.execute("SELECT profile, count(*) FROM lexical_posting GROUP BY profile").fetchall())
    assert written[SHADOW] == written[active] >= DOCS  # the same chunks embedded and written on both sides
    assert lexical[SHADOW] == lexical[active] > 0  # and the same postings


def test_the_round_hands_its_own_embedding_service_to_dagster_and_never_the_shells(tmp_path, monkeypatch):
    """The real round's runs embed through the service it started (with no local fallback, a run that cannot
    reach it fails its task, which the test above would see as a retry); a service named in the caller's shell
    is never passed on. (A first 10k round ran with its runs embedding in-process: the service it started was
    dropped here.)"""
    monkeypatch.setenv("KBINDEX_EMBED_SERVICE", "/somewhere/else")
    ours = DagsterUI(tmp_path / "a", "postgresql://u@h/db", {"KBINDEX_EMBED_SERVICE": "/round/home"})
    assert ours.dev.env["KBINDEX_EMBED_SERVICE"] == "/round/home"
    assert "KBINDEX_EMBED_SERVICE" not in DagsterUI(tmp_path / "b", "postgresql://u@h/db", {}).dev.env
