"""Bearer tokens -> callers: a tenant, and on whose behalf the token may read (DESIGN.md invariant 8).

Three kinds of token, all bound to one tenant:

- **whole-tenant** (the default): stands for the tenant; may publish, delete, erase, cancel and retry; reads
  every version (``EVERYTHING``) and may narrow a read to principals with ``as=``.
- **end-user** (``principals``): an end user's fixed principals (``user:alice``, ``group:finance``); reads only
  versions without an allow list or whose allow list names one of them; read-only; ``as=`` is refused (403).
- **service** (``search_as``): a RAG application's backend; names, per request, the principals it acts for
  (``as=group:finance&as=user:alice``); without ``as=`` it reads only versions without an allow list
  (fail-closed); read-only.

Read-only tokens get 403 ``FORBIDDEN`` from every write. Two sources, checked in this order:

1. A file named by ``KBINDEX_API_TOKENS`` (JSON, or TOML when the name ends in ``.toml``)::

       {"tokens": {"s3cret-acme": "acme", "sha256:9f86d0...": "globex"}}

   or the same mapping at top level, or a list of entries::

       {"tokens": [{"token": "s3cret-acme", "tenant": "acme"},
                   {"token": "alice-token", "tenant": "acme", "principals": ["user:alice", "group:finance"]},
                   {"token": "rag-backend", "tenant": "acme", "search_as": true}]}

   A mapping's value may also be such an entry without ``token``. TOML: a ``[tokens]`` table of
   ``"token" = "tenant"`` lines, or ``[[tokens]]`` tables with ``token``, ``tenant`` and optionally
   ``principals = [...]`` or ``search_as = true``. A key (or ``token``) written as ``sha256:<hex>`` is the
   SHA-256 of the token, so the file need not hold the secret itself. A token has principals or
   ``search_as``, never both.
2. The ``api_token`` table (migrations 0004, 0032): ``token_sha256``, ``tenant_id``, ``principals`` (NULL: not
   an end-user token), ``search_as``, ``revoked_at``. Only hashes are stored. A token revoked in the table is
   refused even when the file still lists it; otherwise the file's entry wins over the table's row.

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
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipelines.api.errors import Unauthorized
from pipelines.domain.errors import Forbidden, InvalidRequest
from pipelines.domain.identifiers import validate_tenant
from pipelines.domain.metadata import MAX_PRINCIPALS, ReadScope, canonical_principal
from resources.database import Database

TOKENS_ENV = "KBINDEX_API_TOKENS"


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class Caller:
    """Who a request runs as: its tenant, and on whose behalf it may read.

    ``principals``: an end-user token's fixed principals (None: not an end-user token).
    ``search_as``: a service token, which names the principals of each read with ``as=``.
    Neither: a whole-tenant token (``whole_tenant``), the only kind that may write.
    """

    tenant_id: str
    principals: tuple[str, ...] | None = None
    search_as: bool = False

    @property
    def whole_tenant(self) -> bool:
        return self.principals is None and not self.search_as

    @property
    def kind(self) -> str:
        return "tenant" if self.whole_tenant else "service" if self.search_as else "user"

    def require_write(self) -> str:
        """The tenant, if this token may change its documents and tasks; Forbidden (403) otherwise."""
        if not self.whole_tenant:
            raise Forbidden(f"a {self.kind} token is read-only: publishing, deleting, erasing, cancelling and "
                            "retrying need a whole-tenant token")
        return self.tenant_id

    def scope(self, acting_as: Sequence[str] | None = None, filters: Sequence[str] | None = None) -> ReadScope:
        """The read scope of one request: ``acting_as`` are the ``as=`` principals, ``filters`` metadata filters.

        Whole tenant: everything, or the named principals. Service: the named principals, or only versions
        without an allow list. End user: its own principals; naming others is Forbidden. Bad principals or
        filters: InvalidFilter (400).
        """
        if acting_as:
            if self.principals is not None:
                raise Forbidden("an end-user token reads as its own principals: as= needs a service token "
                                "(search_as) or a whole-tenant token")
            return ReadScope.of(acting_as, filters=filters)
        if self.principals is not None:
            return ReadScope.of(self.principals, filters=filters)
        return ReadScope.of((), see_all=self.whole_tenant, filters=filters)


def _principals(value: Any, source: str) -> tuple[str, ...] | None:
    if value is None:
        return None
    if isinstance(value, str) or not isinstance(value, Iterable):
        raise InvalidRequest(f"{source}: principals is a list such as [\"user:alice\", \"group:finance\"]")
    out = tuple(sorted({canonical_principal(p, InvalidRequest) for p in value}))
    if not out:
        raise InvalidRequest(f"{source}: an end-user token needs at least one principal")
    if len(out) > MAX_PRINCIPALS:
        raise InvalidRequest(f"{source}: a token may carry at most {MAX_PRINCIPALS} principals")
    return out


def _grant(tenant: str, principals: Any, search_as: Any, source: str) -> Caller:
    validate_tenant(tenant)
    if not isinstance(search_as, bool):
        raise InvalidRequest(f"{source}: search_as is true or false")
    fixed = _principals(principals, source)
    if fixed is not None and search_as:
        raise InvalidRequest(f"{source}: a token carries principals or search_as, not both")
    return Caller(tenant, fixed, search_as)


def _entry(value: Any, source: str) -> Caller:
    """A token's grant from a tenant name or an entry {tenant, principals?, search_as?}."""
    if isinstance(value, Caller):
        return value
    if isinstance(value, str):
        return _grant(value, None, False, source)
    if isinstance(value, Mapping) and isinstance(value.get("tenant"), str):
        unknown = set(value) - {"token", "tenant", "principals", "search_as", "label"}
        if unknown:
            raise InvalidRequest(f"{source}: unknown token field(s) {', '.join(sorted(map(str, unknown)))}")
        return _grant(value["tenant"], value.get("principals"), value.get("search_as", False), source)
    raise InvalidRequest(f"{source}: every token must map to a tenant name")


def _normalize(mapping: Mapping[str, Any], source: str) -> dict[str, Caller]:
    out: dict[str, Caller] = {}
    for key, value in mapping.items():
        if not isinstance(key, str) or not key:
            raise InvalidRequest(f"{source}: every token must map to a tenant name")
        grant = _entry(value, source)
        digest = key[len("sha256:"):].lower() if key.startswith("sha256:") else token_hash(key)
        if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
            raise InvalidRequest(f"{source}: a sha256: key must be 64 hex digits")
        out[digest] = grant
    return out


def parse_tokens(data: Any, source: str = "token file") -> dict[str, Caller]:
    """token-hash -> grant from the parsed JSON/TOML document (see the module docstring for shapes)."""
    if isinstance(data, dict) and "tokens" in data:
        data = data["tokens"]
    if isinstance(data, list):
        try:
            data = {item["token"]: item for item in data}
        except (TypeError, KeyError) as exc:
            raise InvalidRequest(f"{source}: list entries need 'token' and 'tenant'") from exc
    if not isinstance(data, dict):
        raise InvalidRequest(f"{source}: expected a mapping of token to tenant")
    return _normalize(data, source)


def load_token_file(path: str | os.PathLike[str]) -> dict[str, Caller]:
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
    """Resolves a bearer token to its caller from the file mapping, then the api_token table."""

    def __init__(self, db: Database, file_tokens: Mapping[str, Caller] | None = None, *, use_table: bool = True) -> None:
        self.db = db
        self.file_tokens = dict(file_tokens or {})
        self.use_table = use_table

    @classmethod
    def from_sources(
        cls, db: Database, tokens: Mapping[str, Any] | None = None, tokens_file: str | None = None, *, use_table: bool = True
    ) -> TokenAuth:
        """``tokens`` maps plain tokens to tenants or entries (tests, embedding); ``tokens_file`` defaults to
        $KBINDEX_API_TOKENS."""
        merged: dict[str, Caller] = {}
        path = tokens_file if tokens_file is not None else os.environ.get(TOKENS_ENV)
        if path:
            merged.update(load_token_file(path))
        if tokens:
            merged.update(_normalize(tokens, "tokens"))
        return cls(db, merged, use_table=use_table)

    def caller_for(self, token: str | None) -> Caller:
        if not token:
            raise Unauthorized("a bearer token is required: send 'Authorization: Bearer <token>'")
        digest = token_hash(token)
        caller = self.file_tokens.get(digest)
        if self.use_table:  # asked even for a file token: revoked_at in the table wins over the file
            row = self.db.fetch_one("api_token_state", {"token_sha256": digest})
            if row is not None and row["revoked"]:
                raise Unauthorized("the bearer token is not valid")
            if caller is None and row is not None:
                try:
                    caller = _grant(row["tenant_id"], row["principals"], bool(row["search_as"]), "api_token")
                except InvalidRequest as exc:  # a malformed row grants nothing
                    raise Unauthorized("the bearer token is not valid") from exc
        if caller is None:
            raise Unauthorized("the bearer token is not valid")
        return caller

    def tenant_for(self, token: str | None) -> str:
        return self.caller_for(token).tenant_id


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
