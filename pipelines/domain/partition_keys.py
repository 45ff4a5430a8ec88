"""Dagster partition keys for document versions: ``tenant/document_id/vN``.

Readable in the Dagster UI and unique per version. Dagster refuses some substrings ("...",
control characters) and long keys are unwieldy, so such document ids are replaced by ``~`` + a
digest. A literal id starting with ``~`` is digested too, so no raw id can equal a digest key.
The key is stored on the version row, so it is always looked up, never parsed back.
"""

from __future__ import annotations

import hashlib

_FORBIDDEN = ("...", "\a", "\b", "\f", "\n", "\r", "\t", "\v", "\0")
MAX_READABLE_ID = 200


def version_partition_key(tenant_id: str, document_id: str, version_number: int) -> str:
    readable = document_id
    if len(readable) > MAX_READABLE_ID or readable.startswith("~") or any(bad in readable for bad in _FORBIDDEN):
        readable = "~" + hashlib.sha256(document_id.encode("utf-8")).hexdigest()[:24]
    return f"{tenant_id}/{readable}/v{version_number}"
