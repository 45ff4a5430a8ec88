"""GET /search?mode=hybrid|dense|lexical reaches search() (issue #13); a bad mode is a 400."""

from __future__ import annotations

from tests.api.conftest import ACME


def test_search_mode_is_passed_through_and_validated(make_app):
    from starlette.testclient import TestClient

    from pipelines.domain.metadata import EVERYTHING

    seen: list[str | None] = []

    def recording(db, embedder, q, *, tenant_id, k, mode=None, read=None):
        assert read == EVERYTHING  # a whole-tenant token without as= reads every version
        seen.append(mode)
        return []

    client = TestClient(make_app(search_fn=recording), raise_server_exceptions=False)
    for mode in ("lexical", "dense", "hybrid"):
        body = client.get("/search", params={"q": "refund", "mode": mode}, headers=ACME).json()
        assert body["mode"] == mode and body["hits"] == []
    assert client.get("/search", params={"q": "refund"}, headers=ACME).status_code == 200
    assert seen == ["lexical", "dense", "hybrid", None], "no mode: search uses the profile's (hybrid)"
    bad = client.get("/search", params={"q": "refund", "mode": "fuzzy"}, headers=ACME)
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "INVALID_REQUEST"
