"""Bearer tokens -> tenants. Every API read and write runs as the tenant its token names.

Two sources, checked in this order:

1. A file named by ``KBINDEX_API_TOKENS`` (JSON, or TOML when the name ends in ``.toml``)::

       {"tokens": {"s3cret-acme": "acme", "sha256:9f86d0...": "globex"}}

   or the same mapping at top level, or ``{"tokens": [{"token": "...", "tenant": "acme"}, ...]}``.
   TOML: a ``[tokens]`` table of ``"token" = "tenant"`` lines. A key written as ``sha256:<hex>``
   is the SHA-256 of the token, so the file need not hold the secret itself.
2. The ``api_token`` table (sql/migrations/0004_api.sql): ``token_sha256``, ``tenant_id``,
   ``revoked_at``. Only hashes are stored. A token revoked in the table is refused even when the
   file still lists it.

Tokens are compared by their SHA-256, never logged: ``install_log_redaction`` puts a filter on the
uvicorn loggers that blanks ``token=`` query values and ``Bearer`` credentials in every record
(uvicorn's access log prints the query string). A request without a valid token gets 401
``UNAUTHORIZED``; no token sees another tenant's data (it answers 404 as if it did not exist).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pipelines.api.errors import Unauthorized
from pipelines.domain.errors import InvalidRequest
from pipelines.domain.identifiers import validate_tenant
from resources.database import Database

TOKENS_ENV = "KBINDEX_API_TOKENS"


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def _normalize(mapping: Mapping[str, str], source: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for key, tenant in mapping.items():
        if not isinstance(key, str) or not key or not isinstance(tenant, str):
            raise InvalidRequest(f"{source}: every token must map to a tenant name")
        validate_tenant(tenant)
        digest = key[len("sha256:"):].lower() if key.startswith("sha256:") else token_hash(key)
        if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
            raise InvalidRequest(f"{source}: a sha256: key must be 64 hex digits")
        out[digest] = tenant
    return out


def parse_tokens(data: Any, source: str = "token file") -> dict[str, str]:
    """token-hash -> tenant from the parsed JSON/TOML document (see the module docstring for shapes)."""
    if isinstance(data, dict) and "tokens" in data:
        data = data["tokens"]
    if isinstance(data, list):
        try:
            data = {item["token"]: item["tenant"] for item in data}
        except (TypeError, KeyError) as exc:
            raise InvalidRequest(f"{source}: list entries need 'token' and 'tenant'") from exc
    if not isinstance(data, dict):
        raise InvalidRequest(f"{source}: expected a mapping of token to tenant")
    return _normalize(data, source)


def load_token_file(path: str | os.PathLike[str]) -> dict[str, str]:
    """Read a token file; raises InvalidRequest (without echoing its content) if it cannot be used."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise InvalidRequest(f"cannot read the API token file ({type(exc).__name__})") from exc
    try:
        data = tomllib.loads(text) if p.suffix.lower() == ".toml" else json.loads(text)
    except (ValueError, tomllib.TOMLDecodeError) as exc:
        raise InvalidRequest("the API token file is neither valid JSON nor (for .toml) TOML") from exc
    return parse_tokens(data, "API token file")


class TokenAuth:
    """Resolves a bearer token to its tenant from the file mapping, then the api_token table."""

    def __init__(self, db: Database, file_tokens: Mapping[str, str] | None = None, *, use_table: bool = True) -> None:
        self.db = db
        self.file_tokens = dict(file_tokens or {})
        self.use_table = use_table

    @classmethod
    def from_sources(
        cls, db: Database, tokens: Mapping[str, str] | None = None, tokens_file: str | None = None, *, use_table: bool = True
    ) -> TokenAuth:
        """``tokens`` maps plain tokens to tenants (tests, embedding); ``tokens_file`` defaults to $KBINDEX_API_TOKENS."""
        merged: dict[str, str] = {}
        path = tokens_file if tokens_file is not None else os.environ.get(TOKENS_ENV)
        if path:
            merged.update(load_token_file(path))
        if tokens:
            merged.update(_normalize(tokens, "tokens"))
        return cls(db, merged, use_table=use_table)

    def tenant_for(self, token: str | None) -> str:
        if not token:
            raise Unauthorized("a bearer token is required: send 'Authorization: Bearer <token>'")
        digest = token_hash(token)
        tenant = self.file_tokens.get(digest)
        if self.use_table:  # asked even for a file token: revoked_at in the table wins over the file
            row = self.db.fetch_one("api_token_state", {"token_sha256": digest})
            if row is not None and row["revoked"]:
                raise Unauthorized("the bearer token is not valid")
            if tenant is None and row is not None:
                tenant = row["tenant_id"]
        if tenant is None:
            raise Unauthorized("the bearer token is not valid")
        return tenant


def bearer_token(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header, or None."""
    if not authorization:
        return None
    scheme, _, value = authorization.strip().partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        return None
    return value.strip()


_TOKEN_IN_TEXT = re.compile(r"(?i)((?:[?&;]|\b)(?:access_|api_|metrics_)?token=)[^&\s\"']*|(\bbearer\s+)[^\s\"',]+")
REDACTED = "<redacted>"
LOGGERS = ("uvicorn", "uvicorn.access", "uvicorn.error", "kbindex.api", "fastapi")


def redact_tokens(text: str) -> str:
    """``text`` with every ``token=...`` value and ``Bearer ...`` credential replaced by <redacted>."""
    return _TOKEN_IN_TEXT.sub(lambda m: (m.group(1) or m.group(2)) + REDACTED, text)


class RedactTokens(logging.Filter):
    """Blanks tokens in a record's message and arguments (uvicorn's access log passes the path as an argument)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str):
            record.msg = redact_tokens(record.msg)
        if isinstance(record.args, tuple):
            record.args = tuple(redact_tokens(a) if isinstance(a, str) else a for a in record.args)
        elif isinstance(record.args, dict):
            record.args = {k: redact_tokens(v) if isinstance(v, str) else v for k, v in record.args.items()}
        return True


def install_log_redaction() -> None:
    """Put one RedactTokens filter on each API logger (idempotent; uvicorn's loggers do not propagate)."""
    for name in LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, RedactTokens) for f in logger.filters):
            logger.addFilter(RedactTokens())
