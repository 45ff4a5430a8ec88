"""`kbindex api` wiring: migrates, builds the app on KBINDEX_DATABASE_URL and hands it to uvicorn."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from pipelines.cli import app as cli


def test_kbindex_api_serves_the_app_on_the_configured_database(db_url, tmp_path, monkeypatch):
    import uvicorn
    from starlette.testclient import TestClient

    tokens = tmp_path / "tokens.json"
    tokens.write_text(json.dumps({"tokens": [{"token": "cli-token", "tenant": "acme"}]}))
    monkeypatch.setenv("KBINDEX_DATABASE_URL", db_url)
    monkeypatch.setenv("KBINDEX_HOME", str(tmp_path / "home"))
    served = {}
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: served.update(app=app, **kw))

    result = CliRunner().invoke(cli, ["api", "--host", "127.0.0.1", "--port", "8123", "--tokens", str(tokens)])
    assert result.exit_code == 0, result.output
    assert (served["host"], served["port"]) == ("127.0.0.1", 8123)
    client = TestClient(served["app"], raise_server_exceptions=False)
    try:
        assert client.get("/healthz").json() == {"status": "ok"}
        response = client.post("/documents/a.md/versions", files={"file": ("a.md", b"hello")},
                               headers={"Authorization": "Bearer cli-token"})
        assert response.status_code == 202 and response.json()["tenant_id"] == "acme"
    finally:
        served["app"].state.close()
