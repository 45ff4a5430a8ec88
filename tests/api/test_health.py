"""/healthz is liveness (the process answers: no database work), /readyz readiness (the database answers)."""

from __future__ import annotations


def test_healthz_needs_no_database_and_readyz_says_when_it_is_gone(client, app):
    assert client.get("/readyz").json() == {"status": "ok"}
    app.state.db.close()  # as good as unreachable: every statement now fails at once
    assert client.get("/healthz").json() == {"status": "ok"}  # a liveness probe must not restart the API for it
    ready = client.get("/readyz")
    assert ready.status_code == 503 and ready.json()["error"]["code"] == "INDEX_WRITE_FAILED"
