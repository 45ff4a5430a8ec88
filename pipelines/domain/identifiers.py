"""Validation of the names users give us: tenants, document ids, profile names; dynamic partition keys.

Identifiers are data, never SQL or paths: they are passed as query parameters and never used to
build a file name (blobs are stored by content hash).
"""

from __future__ import annotations

import re
import unicodedata

from pipelines.domain.errors import InvalidRequest

_TENANT_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_PROFILE_RE = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,62}$")
MAX_DOCUMENT_ID = 1000
MAX_DOCUMENT_ID_BYTES = 1000
"""UTF-8 bytes: 1,000 four-byte characters would pass a character count and then exceed PostgreSQL's
btree entry limit (~2.7 kB) in the document indexes, after the bytes were stored."""


def validate_tenant(tenant_id: str) -> str:
    if not isinstance(tenant_id, str) or not _TENANT_RE.match(tenant_id) or ".." in tenant_id:
        raise InvalidRequest(
            "tenant must be 1-64 characters: letters, digits, '_', '.', '-', starting with a letter or digit, no '..'"
        )
    return tenant_id


def validate_profile_name(name: str) -> str:
    if not isinstance(name, str) or not _PROFILE_RE.match(name):
        raise InvalidRequest("profile name must be 1-63 characters: lower-case letters, digits, '_', '.', '-'")
    return name


def validate_document_id(document_id: str) -> str:
    """The id in Unicode NFC (so "é" typed two ways is one document): printable, not blank, at most
    1000 characters and 1000 UTF-8 bytes. Callers must use the returned value."""
    if not isinstance(document_id, str) or not document_id.strip():
        raise InvalidRequest("document id must not be empty")
    if any(unicodedata.category(ch) in ("Cc", "Cs") for ch in document_id):
        raise InvalidRequest("document id must not contain control characters")
    document_id = unicodedata.normalize("NFC", document_id)
    if len(document_id) > MAX_DOCUMENT_ID:
        raise InvalidRequest(f"document id must be at most {MAX_DOCUMENT_ID} characters")
    if len(document_id.encode("utf-8")) > MAX_DOCUMENT_ID_BYTES:
        raise InvalidRequest(f"document id must be at most {MAX_DOCUMENT_ID_BYTES} bytes in UTF-8")
    return document_id
