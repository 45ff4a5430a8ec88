"""Context in chunks per profile (issue #35, migration 0046) on the real database and the real run path.

One Markdown version is indexed in one run under the active profile (no context) and a context profile of the
SAME model: the context profile's vectors are those of title + heading path + text, the plain one's of heading
path + text; both store and show the same chunk text; a later version reuses only its own profile's vectors;
the flag cannot change after creation; the CLI sets and shows it."""

from __future__ import annotations

import json

import numpy as np
import psycopg
import pytest
from typer.testing import CliRunner

from pipelines.cli import app
from resources.embedder import FakeEmbedder, fake_vector
from resources.embedding_reuse import embed_digest, stored_vectors
from resources.profiles import activate_profile, list_profiles
from resources.search import search
from tests.integration.context_profiles import MODEL, index_both, markdown, rows, two_profiles

FILENAME = "refund_policy.md"
TITLE = "refund policy"  # no lone top heading: the file name, '_' read as a space
SECTIONS = {
    "Eligibility": "Goods bought in the last thirty days may be returned unused.",
    "Payment": "Refunds are paid to the original card within five working days.",
}


def vector(text: str) -> np.ndarray:
    return np.array([float(x) for x in text.strip("[]").split(",")], dtype=np.float32)


@pytest.fixture
def world(db, db_url, tmp_path):
    return two_profiles(db, db_url, tmp_path)


def index(world, sections: dict[str, str]) -> dict[str, dict]:
    """Publish a version and index it under both profiles in one run; each profile's embed step details."""
    chunked, embedded = index_both(world, "refunds", markdown(sections), FILENAME, "ctx-test")
    assert (chunked["ctx"].get("embed_context"), chunked["minilm-v1"].get("embed_context")) == (True, None)
    return embedded


def chunks(world, profile: str, version: int) -> list[tuple]:
    return rows(world["db_url"], "SELECT heading_path, text, embed_digest, embedding::text FROM chunk WHERE profile = %s "
                "AND version_number = %s ORDER BY ordinal", (profile, version))



def test_a_context_profile_embeds_title_and_headings_and_shows_the_plain_text(world):
    index(world, SECTIONS)
    plain, ctx = chunks(world, "minilm-v1", 1), chunks(world, "ctx", 1)
    assert [(h, t) for h, t, _, _ in plain] == [(h, t) for h, t, _, _ in ctx] == [([h], t) for h, t in SECTIONS.items()]
    for (heading, text, digest, stored), (_, _, ctx_digest, ctx_stored) in zip(plain, ctx, strict=True):
        plain_text = f"{heading[0]}\n{text}"
        ctx_text = f"{TITLE} > {heading[0]}\n{text}"
        assert digest == embed_digest(plain_text) and ctx_digest == embed_digest(ctx_text)
        assert np.allclose(vector(stored), fake_vector(plain_text, model=MODEL), atol=1e-5)
        assert np.allclose(vector(ctx_stored), fake_vector(ctx_text, model=MODEL), atol=1e-5)
    # What search shows under the context profile is the chunk text, not the embedded prefix.
    activate_profile(world["db"], "ctx", force=True)
    hits = search(world["db"], FakeEmbedder(model_name=MODEL), "refund", tenant_id="acme", mode="dense")
    assert sorted(h.text for h in hits) == sorted(SECTIONS.values())
    assert all(h.heading_path in {(h2,) for h2 in SECTIONS} for h in hits)


def test_reuse_never_crosses_the_context_flag(world):
    index(world, SECTIONS)
    plain = [d for _, _, d, _ in chunks(world, "minilm-v1", 1)]
    ctx = [d for _, _, d, _ in chunks(world, "ctx", 1)]
    assert not set(plain) & set(ctx)
    lookup = {"tenant_id": "acme", "model": MODEL, "dimension": 384}
    assert not stored_vectors(world["db"], profile="ctx", digests=plain, **lookup)
    assert not stored_vectors(world["db"], profile="minilm-v1", digests=ctx, **lookup)
    # v2 changes one section: each profile reuses its own vector of the other, and embeds the changed one.
    details = index(world, {**SECTIONS, "Payment": "Refunds are paid by bank transfer within ten days."})
    assert {p: (d["reused"], d["embedded"] + d["shared"]) for p, d in details.items()} == {
        "minilm-v1": (1, 1), "ctx": (1, 1)}
    for profile in ("minilm-v1", "ctx"):
        (_, _, d1, v1), _ = chunks(world, profile, 1)
        (_, _, d2, v2), _ = chunks(world, profile, 2)
        assert d1 == d2 and v1 == v2  # the unchanged section: the profile's own stored vector, byte for byte


def test_the_flag_is_fixed_at_creation(world):
    with pytest.raises(psycopg.errors.CheckViolation, match="fixed at creation"):
        rows(world["db_url"], "UPDATE index_profile SET embed_context = false WHERE name = 'ctx'")
    rows(world["db_url"], "UPDATE index_profile SET embed_context = true WHERE name = 'ctx'")  # no change: allowed
    assert {p["name"]: p["embed_context"] for p in list_profiles(world["db"])} == {"minilm-v1": False, "ctx": True}


def test_the_cli_creates_a_context_profile_and_lists_it(db, db_url, monkeypatch):
    monkeypatch.setenv("KBINDEX_DATABASE_URL", db_url)
    runner = CliRunner()
    created = runner.invoke(app, ["profile", "create", "ctx-cli", "--model", "fake-384", "--context", "--json"])
    assert created.exit_code == 0, created.output
    assert json.loads(created.output)["embed_context"] is True
    plain = runner.invoke(app, ["profile", "create", "plain-cli", "--model", "fake-384"], env={"COLUMNS": "200"})
    assert plain.exit_code == 0 and "chunks embedded with headings" in plain.output
    listed = runner.invoke(app, ["profile", "list", "--json"])
    assert {p["name"]: p["embed_context"] for p in json.loads(listed.output)} == {
        "minilm-v1": False, "ctx-cli": True, "plain-cli": False}
    table = runner.invoke(app, ["profile", "list"], env={"COLUMNS": "200"})
    assert "ctx-cli: search hybrid" in table.output  # each profile's recipe line below the table
    assert "lexical analyzer english, chunks embedded with title + headings" in table.output
