"""Issue #31 finding 10: security headers on every response, a CSP that lets only the status page's own
script run, no Swagger UI from a CDN by default, and a token kept in the tab (sessionStorage), not localStorage."""

from __future__ import annotations

import base64
import hashlib
import re

from tests.api.conftest import ACME, publish

COMMON = {"x-content-type-options": "nosniff", "x-frame-options": "DENY", "referrer-policy": "no-referrer"}


def policy(response) -> dict[str, str]:
    csp = response.headers.get("content-security-policy", "")
    return {d.split(" ", 1)[0]: d.split(" ", 1)[1] if " " in d else "" for d in (p.strip() for p in csp.split(";")) if d}


def assert_common(response) -> None:
    for name, value in COMMON.items():
        assert response.headers.get(name) == value, (name, response.status_code, dict(response.headers))
    assert policy(response).get("frame-ancestors") == "'none'"


def test_the_page_json_routes_and_errors_carry_the_security_headers(client):
    publish(client, "a.md", b"# A\n\nalpha")
    responses = {
        "/": client.get("/"),
        "/search": client.get("/search", params={"q": "alpha"}, headers=ACME),
        "401": client.get("/search", params={"q": "alpha"}),
        "404": client.get("/documents/nope.md", headers=ACME),
        "400": client.get("/search", params={"q": " "}, headers=ACME),
        "/healthz": client.get("/healthz"),
    }
    assert [r.status_code for r in responses.values()] == [200, 200, 401, 404, 400, 200]
    for response in responses.values():
        assert_common(response)
    for name in ("/search", "401", "404", "400", "/healthz"):  # JSON: nothing may run or load
        assert policy(responses[name])["default-src"] == "'none'"


def test_the_page_policy_allows_its_own_inline_script_and_nothing_from_elsewhere(client):
    response = client.get("/")
    csp = policy(response)
    (script,) = re.findall(r"<script>(.*?)</script>", response.text, re.S)
    digest = base64.b64encode(hashlib.sha256(script.encode()).digest()).decode()
    assert csp["script-src"] == f"'sha256-{digest}'"  # no 'unsafe-inline', no host: an injected script is refused
    assert csp["default-src"] == "'none'" and csp["connect-src"] == "'self'"
    assert "http" not in response.headers["content-security-policy"]


def test_swagger_ui_from_a_cdn_is_off_by_default_and_the_schema_stays(client, make_app, monkeypatch):
    from starlette.testclient import TestClient

    assert client.get("/docs").status_code == 404
    assert client.get("/redoc").status_code == 404
    assert client.get("/openapi.json").status_code == 200
    monkeypatch.setenv("KBINDEX_API_DOCS", "1")
    docs = TestClient(make_app()).get("/docs")
    assert docs.status_code == 200 and "cdn.jsdelivr.net" in docs.text
    assert policy(docs)["frame-ancestors"] == "'none'"


def test_the_page_keeps_the_token_in_the_tab_not_in_local_storage(client):
    html = client.get("/").text
    assert 'sessionStorage.setItem("kbindex.token", token)' in html
    assert not re.search(r"localStorage\.(getItem|setItem)", html)  # only the removal of an old copy is left
