"""The title in the lexical index of a context profile (issue #35, migration 0049), on the real database.

One Markdown version is indexed in one run under the active profile (no context) and a context profile of the
same model. A word that appears only in the document's title (its file name) is found by the context profile's
lexical search and not by the plain one's. Every path that writes lexical rows writes the same rows: the fenced
publish of a run, a metadata-only version that copies its chunks (no parse: the title comes back from the chunk
rows), and the lexical backfill from stored chunk rows. The plain profile's rows are byte for byte what the
lexical index read before the title reached it (heading path + text)."""

from __future__ import annotations

import numpy as np
import psycopg
import pytest

from pipelines.domain.chunking import Chunk, VersionIdentity, chunk_id, content_digest
from pipelines.domain.errors import InternalError
from resources.embedder import FakeEmbedder
from resources.index_sink import IndexSink
from resources.lexical import analyzer_for, backfill_lexical_index
from resources.profiles import activate_profile
from resources.search import search
from tests.integration.context_profiles import MODEL, index_both, markdown, rows, two_profiles
from resources.verifier import verify

FILENAME = "zebra_handbook.md"
TITLE = "zebra handbook"  # no lone top heading: the file name, '_' read as a space
SECTIONS = {  # "zebra" is in no heading and no text: only the title says it
    "Eligibility": "Goods bought in the last thirty days may be returned unused.",
    "Payment": "Refunds are paid to the original card within five working days.",
}


@pytest.fixture
def world(db, db_url, tmp_path):
    return two_profiles(db, db_url, tmp_path)


def index(world, metadata: dict | None = None) -> dict[str, dict]:
    """Publish a version (no fast path) and index it under both profiles in one run; each chunk step's details."""
    return index_both(world, "handbook", markdown(SECTIONS), FILENAME, "ctx-lexical", metadata=metadata)[0]


def lexical(db_url: str, profile: str, version: int) -> list[tuple]:
    """(ordinal, terms, tfs, length) of a version's lexical rows under a profile, in chunk order."""
    return rows(db_url, "SELECT c.ordinal, l.terms, l.tfs, l.length FROM lexical_chunk l JOIN chunk c USING (chunk_id) "
                "WHERE c.profile = %s AND c.version_number = %s ORDER BY c.ordinal", (profile, version))


def titles(db_url: str, profile: str, version: int) -> list:
    return [t for (t,) in rows(db_url, "SELECT context_title FROM chunk WHERE profile = %s AND version_number = %s "
                                       "ORDER BY ordinal", (profile, version))]


def hit_texts(world, query: str) -> list[str]:
    return [h.text for h in search(world["db"], FakeEmbedder(model_name=MODEL), query, tenant_id="acme",
                                   mode="lexical")]


def test_a_title_word_is_found_by_the_context_profile_only(world):
    index(world)
    assert titles(world["db_url"], "ctx", 1) == [TITLE, TITLE]
    assert titles(world["db_url"], "minilm-v1", 1) == [None, None]
    assert hit_texts(world, "zebra") == []  # the active, plain profile: the title is in none of its rows
    assert sorted(hit_texts(world, "zebra refunds")) == [SECTIONS["Payment"]]
    activate_profile(world["db"], "ctx", force=True)
    assert sorted(hit_texts(world, "zebra")) == sorted(SECTIONS.values())  # every chunk, showing only its text
    assert hit_texts(world, "zebra refunds")[0] == SECTIONS["Payment"]
    assert verify(world["db"]).violations == []


def test_the_plain_profile_reads_heading_path_and_text_as_before(world):
    index(world)
    stored = rows(world["db_url"], "SELECT heading_path, text FROM chunk WHERE profile = 'minilm-v1' "
                                   "AND version_number = 1 ORDER BY ordinal")
    analyze = analyzer_for(MODEL, "english")  # the default profile's analyzer on a new install
    expected = []
    for ordinal, (heading, text) in enumerate(stored):
        counts = analyze("\n".join([*heading, text]) if heading else text)  # the formula before issue #35
        terms = sorted(counts)
        expected.append((ordinal, terms, [counts[t] for t in terms], sum(counts.values())))
    assert lexical(world["db_url"], "minilm-v1", 1) == expected
    # ... and the context profile's rows are the same plus the title's terms.
    title = analyze(TITLE)
    for (_, terms, tfs, length), (_, ctx_terms, ctx_tfs, ctx_length) in zip(
            expected, lexical(world["db_url"], "ctx", 1), strict=True):
        assert ctx_length == length + sum(title.values())
        assert dict(zip(ctx_terms, ctx_tfs)) == {t: dict(zip(terms, tfs)).get(t, 0) + title.get(t, 0)
                                                 for t in set(terms) | set(title)}


def test_a_copied_version_gets_the_same_rows_as_the_run_that_parsed(world):
    index(world)
    details = index(world, metadata={"team": "support"})  # same bytes: the run copies v1's chunks, no parse
    assert all(d.get("copied_from") == 1 for d in details.values()), details
    for profile in ("ctx", "minilm-v1"):
        assert lexical(world["db_url"], profile, 2) == lexical(world["db_url"], profile, 1)
        assert titles(world["db_url"], profile, 2) == titles(world["db_url"], profile, 1)
    activate_profile(world["db"], "ctx", force=True)
    assert sorted(hit_texts(world, "zebra")) == sorted(SECTIONS.values())  # v2 is what search reads now
    assert verify(world["db"]).violations == []


def test_the_backfill_from_chunk_rows_writes_what_the_publish_wrote(world):
    index(world)
    db_url = world["db_url"]
    published = {p: lexical(db_url, p, 1) for p in ("ctx", "minilm-v1")}
    stats = rows(db_url, "SELECT profile, term, df FROM lexical_term_stats WHERE df <> 0 ORDER BY 1, 2")
    with psycopg.connect(db_url, autocommit=True) as conn:  # rows re-derived from the chunk rows alone
        conn.execute("DELETE FROM lexical_chunk; DELETE FROM lexical_term_stats; DELETE FROM lexical_document")
        conn.execute("INSERT INTO lexical_backfill DEFAULT VALUES")
    assert backfill_lexical_index(world["db"], batch=3) == 4
    assert {p: lexical(db_url, p, 1) for p in published} == published
    assert rows(db_url, "SELECT profile, term, df FROM lexical_term_stats WHERE df <> 0 ORDER BY 1, 2") == stats
    assert verify(world["db"]).violations == []


def test_the_sink_refuses_titled_chunks_under_a_profile_without_context(world):
    world["publisher"].publish("acme", "handbook", markdown(SECTIONS), FILENAME)
    task = next(c for c in world["queue"].claim("ctx-lexical", limit=10) if c.profile == "minilm-v1")
    identity = VersionIdentity("acme", "handbook", 1, "minilm-v1")
    text = SECTIONS["Payment"]
    digest = content_digest(text)
    chunk = Chunk(chunk_id(identity, 0, (), digest), 0, (), None, text, text, 12, digest, context_title=TITLE)
    vector = FakeEmbedder(model_name=MODEL).embed([text]).astype(np.float32)
    with pytest.raises(InternalError, match="embeds no context"):
        IndexSink(world["db"], world["queue"]).publish(task.lease, [chunk], vector)
    assert rows(world["db_url"], "SELECT count(*) FROM chunk UNION ALL SELECT count(*) FROM lexical_chunk") == [
        (0,), (0,)]
