"""A batch publish's manifest: each document's own metadata and allow list.

``POST /documents`` (its ``manifest`` part) and ``kbindex publish DIR --manifest FILE`` take shared metadata and
an allow list for every document of a batch; an importer whose documents each carry their own (a title, a
department, an ACL) adds a manifest: a JSON object keyed by the documents' names (the API: each file part's
filename, as sent; the CLI: each document id), each entry an object with ``metadata`` (an object, or null for
none) and/or ``allow`` (an array of principals, or null for the whole tenant). A key an entry sets replaces the
shared value for that document; a key it leaves out keeps the shared one.

A manifest that is not a JSON object, or names a document the batch does not hold (a typo would otherwise be
skipped in silence), refuses the whole batch with INVALID_METADATA. A malformed entry refuses only its own
document(s), as the publisher refuses bad metadata: the others publish.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pipelines.domain.errors import InvalidMetadata

ENTRY_KEYS = ("metadata", "allow")
_UNSET: Any = object()


@dataclass(frozen=True)
class Override:
    """One document's entry, read: the values it sets (``_UNSET``: keep the shared one), or why it is refused."""

    metadata: Any = _UNSET
    allow: Any = _UNSET
    error: InvalidMetadata | None = None

    def apply(self, metadata: Mapping[str, Any] | None, allow: Sequence[str] | None
              ) -> tuple[Mapping[str, Any] | None, Sequence[str] | None]:
        """The document's metadata and allow list: this entry's where it sets them, else the shared ones."""
        return (metadata if self.metadata is _UNSET else self.metadata,
                allow if self.allow is _UNSET else self.allow)


def read_manifest(text: str | None, names: Collection[str], *, keyed_by: str) -> dict[str, Override]:
    """The manifest's entries by name (empty without one, or an empty text); INVALID_METADATA for the whole batch
    when it cannot be read or names a document not in ``names``. ``keyed_by`` says what the names are, for the
    error ("each file part's filename, as sent")."""
    if text is None or not text.strip():
        return {}
    try:
        manifest = json.loads(text)
    except ValueError as exc:
        raise InvalidMetadata("the manifest is not valid JSON") from exc
    if not isinstance(manifest, dict):
        raise InvalidMetadata(f"the manifest must be a JSON object keyed by {keyed_by}")
    unknown = sorted(set(manifest) - set(names))
    if unknown:
        more = f" and {len(unknown) - 5} more" if len(unknown) > 5 else ""
        shown = ", ".join(repr(name) for name in unknown[:5]) + more
        raise InvalidMetadata(f"the manifest names documents the batch does not hold: {shown}; key it by {keyed_by}")
    return {name: _entry(name, value) for name, value in manifest.items()}


def _entry(name: str, value: Any) -> Override:
    """One entry, checked for shape (the publisher checks the values, as for shared metadata)."""
    if not isinstance(value, dict):
        return Override(error=InvalidMetadata(f"the manifest entry for {name!r} must be an object with 'metadata' "
                                              "and/or 'allow'"))
    extra = sorted(set(value) - set(ENTRY_KEYS))
    if extra:
        return Override(error=InvalidMetadata(f"the manifest entry for {name!r} has unknown keys {extra}; an entry "
                                              "takes 'metadata' and 'allow'"))
    metadata, allow = value.get("metadata", _UNSET), value.get("allow", _UNSET)
    if metadata is not _UNSET and metadata is not None and not isinstance(metadata, dict):
        return Override(error=InvalidMetadata(f"the manifest entry for {name!r}: metadata must be a JSON object "
                                              "of key/value pairs, or null"))
    if allow is not _UNSET and allow is not None and (
            not isinstance(allow, list) or not all(isinstance(p, str) for p in allow)):
        return Override(error=InvalidMetadata(f"the manifest entry for {name!r}: allow must be an array of "
                                              "principals, or null for the whole tenant"))
    return Override(metadata=metadata, allow=allow)
