"""bench/chaos's end checks on documents (bench/chaos/end_state.py) find what they are there for: on a clean
state built through the real publisher and indexing run (documents as the soak generates them, one deleted)
they report nothing; a pointer left behind its document's tombstone, a deleted document's chunks searchable,
and a current document's chunks gone are each reported by their own figure; a document whose newest version
is not the one the bench was acknowledged is reported by the ledger check."""

from __future__ import annotations

import random

import pytest

from bench.chaos import LEXICAL_QUERY, Documents, end_state
from resources.embedder import DEFAULT_MODEL_NAME
from tests.integration.test_delete import index, kb, rows  # noqa: F401 - kb is the fixture these tests use
from tests.integration.test_verify import insert_chunk, sql


def build(db, db_url, kb) -> list[str]:  # noqa: F811 - kb: the fixture's value
    """Three generated documents indexed, the first then deleted (its tombstone indexed too)."""
    docs = Documents(random.Random(5), None)
    made = []
    for n in range(1, 4):
        document_id, data, filename = docs.new(n)
        result = kb["publisher"].publish("acme", document_id, data, filename)
        index(db, db_url, kb, result.task_id, document_id, 1)
        made.append(document_id)
    deleted = kb["publisher"].delete("acme", made[0])
    index(db, db_url, kb, deleted.task_id, made[0], 2)
    return made


def sweep(db_url: str) -> dict:
    return end_state.search_sweep(db_url, DEFAULT_MODEL_NAME, ["acme"], LEXICAL_QUERY, lexical_complete=True)


def test_a_clean_state_with_a_deleted_document_reports_nothing(db, db_url, kb):  # noqa: F811
    made = build(db, db_url, kb)
    pointers = end_state.pointers(db_url)
    assert pointers["pointer_not_at_newest_succeeded"] == 0, pointers
    assert pointers["documents_at_newest_version_by_kind"] == {"content": 2, "tombstone": 1}
    got = sweep(db_url)
    assert got["complete"] and got["lexical_presence_checked"], got
    figures = dict(got["figures"])
    assert figures.pop("hits") > 0, got
    assert figures == {"searches": 3, "current_documents": 2, "deleted_documents": 1, "deleted_documents_shown": 0,
                       "current_documents_missing": 0, "hits_not_at_pointer": 0}, got
    assert {doc for (_, doc), modes in got["found"].items() if modes == set(end_state.MODES)} == set(made[1:])

    newest = end_state.newest_versions(db_url)
    acknowledged = {("acme", made[0]): (2, True), ("acme", made[1]): (1, False), ("acme", made[2]): (1, False)}
    assert end_state.ledger(newest, acknowledged)["newest_not_acknowledged"] == 0
    wrong = end_state.ledger(newest, acknowledged | {("acme", made[0]): (1, False)})  # the bench thought it live
    assert wrong["newest_not_acknowledged"] == 1 and wrong["examples"][0]["newest"] == (2, "tombstone")


@pytest.mark.parametrize("corruption", ["pointer_back_before_tombstone", "tombstone_with_chunks", "current_chunks_gone"])
def test_each_corruption_is_reported_by_its_own_figure(db, db_url, kb, corruption):  # noqa: F811
    made = build(db, db_url, kb)
    if corruption == "pointer_back_before_tombstone":
        chunks = rows(db_url, "SELECT count(*) FROM chunk WHERE document_id = %s AND version_number = 1", [made[0]])[0][0]
        sql(db_url, "UPDATE search_pointer SET version_number = 1, chunk_count = %s WHERE document_id = %s",
            (chunks, made[0]))
        assert end_state.pointers(db_url)["pointer_not_at_newest_succeeded"] == 1
    elif corruption == "tombstone_with_chunks":  # search would show the deleted document
        insert_chunk(db_url, "acme", made[0], 2, 0, "refund receipt credit invoice policy")
        got = sweep(db_url)["figures"]
        assert got["deleted_documents_shown"] >= 2, got  # dense and hybrid at least (its lexical row is made up)
        assert got["current_documents_missing"] == 0
    else:  # a current document's chunks gone: missing from every mode
        sql(db_url, "DELETE FROM lexical_chunk WHERE document_id = %s", (made[1],))
        sql(db_url, "DELETE FROM chunk WHERE document_id = %s", (made[1],))
        got = sweep(db_url)["figures"]
        assert got["current_documents_missing"] == 3 and got["deleted_documents_shown"] == 0, got
