"""Security headers on every response of the API (issue #31, finding 10).

Every response gets ``X-Content-Type-Options: nosniff``, ``X-Frame-Options: DENY``, ``Referrer-Policy:
no-referrer`` and a Content-Security-Policy: the API's JSON, event streams and errors get one that allows
nothing (``default-src 'none'; frame-ancestors 'none'``); the status page gets one that allows exactly its own
inline script and style (by their SHA-256, computed from the page the app serves), requests to its own origin,
and nothing from any other origin: an injected ``<script>`` or a script from a CDN does not run, and no other
site can frame the page to click on it. Swagger UI (``/docs``), which loads its JavaScript from a CDN, is off
unless KBINDEX_API_DOCS=1 (``/openapi.json`` stays).

A pure ASGI middleware: it rewrites the ``http.response.start`` message, so streamed responses (SSE) keep
streaming. Responses Starlette's outermost ``ServerErrorMiddleware`` sends itself (an unhandled exception's 500)
pass outside every user middleware and carry only their JSON body's content type.
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
from collections.abc import Mapping
from typing import Any

DOCS_ENV = "KBINDEX_API_DOCS"

NONE = "'none'"
API_CSP = "default-src 'none'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"

COMMON = (
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"no-referrer"),
    (b"cross-origin-opener-policy", b"same-origin"),
)
_SET = frozenset({name for name, _ in COMMON} | {b"content-security-policy"})


def docs_enabled() -> bool:
    """Whether to serve Swagger UI and ReDoc (KBINDEX_API_DOCS=1): off by default, they load a CDN's script."""
    return os.environ.get(DOCS_ENV, "").lower() in ("1", "true", "yes")


def _hashes(html: str, tag: str) -> str:
    blocks = re.findall(rf"<{tag}>(.*?)</{tag}>", html, re.S)
    return " ".join(f"'sha256-{base64.b64encode(hashlib.sha256(b.encode()).digest()).decode()}'" for b in blocks)


def page_csp(html: str) -> str:
    """The status page's policy: its own inline ``<script>`` and ``<style>`` blocks (by hash), fetches and event
    streams to its origin; nothing else, from anywhere."""
    return (
        f"default-src 'none'; script-src {_hashes(html, 'script') or NONE}; "
        f"style-src {_hashes(html, 'style') or NONE}; connect-src 'self'; img-src 'self' data:; "
        "form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
    )


DOCS_CSP = (  # only when KBINDEX_API_DOCS=1: FastAPI's Swagger UI / ReDoc pages load from jsdelivr
    "default-src 'none'; script-src 'unsafe-inline' https://cdn.jsdelivr.net; style-src 'unsafe-inline' "
    "https://cdn.jsdelivr.net https://fonts.googleapis.com; font-src https://fonts.gstatic.com; "
    "img-src 'self' data: https://fastapi.tiangolo.com https://cdn.redoc.ly; connect-src 'self'; "
    "worker-src blob:; base-uri 'none'; frame-ancestors 'none'"
)


class SecurityHeaders:
    """ASGI middleware: the headers above on every HTTP response; ``policies`` maps a path to its CSP
    (every other path gets ``API_CSP``)."""

    def __init__(self, app: Any, policies: Mapping[str, str] | None = None) -> None:
        self.app = app
        self.policies = dict(policies or {})

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        csp = self.policies.get(scope.get("path", ""), API_CSP).encode()

        async def send_with_headers(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                headers = [(k, v) for k, v in message.get("headers", []) if k.lower() not in _SET]
                message = {**message, "headers": [*headers, *COMMON, (b"content-security-policy", csp)]}
            await send(message)

        await self.app(scope, receive, send_with_headers)
