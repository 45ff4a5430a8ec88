"""Version metadata, allow lists and search filters: the rules, without I/O (DESIGN.md "metadata", "principal").

Metadata is a small flat object of typed values, canonicalized so that equal metadata compares equal
(it is part of a version's identity: the same bytes with new metadata are a new version):
- keys: identifiers (a letter, then letters, digits or ``_``; at most 40 characters), at most 32 keys;
- values: strings (at most 1,000 characters), finite numbers, booleans, dates (``YYYY-MM-DD``, kept as that
  string: ISO dates order like the dates they name) and lists of strings (at most 100, each at most 200
  characters; sorted and without repeats, since membership is all a filter asks of them);
- the whole object at most 8 KiB as JSON.
An allow list is a set of principals, ``kind:name`` (``group:finance``, ``user:alice``); none means the
whole tenant may read the version. Anything else is ``INVALID_METADATA``.

A filter is ``key OP value`` with OP one of ``= != > >= < <=``, ``key`` alone (the key exists) or ``!key``
(it does not). ``key=a|b`` matches any of the values; on a list-valued key ``=`` means "contains". Ranges
compare numbers with numbers and dates with dates: a value of another type never matches. ``!=`` matches
a version whose key is absent. Filters combine with AND. They travel to SQL as one JSON parameter that
the ``kbindex_metadata_match`` function (migration 0032) evaluates: no SQL is ever built from them.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import date
from typing import Any

from pipelines.domain.errors import InvalidFilter, InvalidMetadata

MAX_KEYS = 32
MAX_KEY_CHARS = 40
MAX_STRING_CHARS = 1000
MAX_LIST_ITEMS = 100
MAX_LIST_ITEM_CHARS = 200
MAX_JSON_BYTES = 8 * 1024
MAX_PRINCIPALS = 100
MAX_FILTERS = 20

_KEY_RE = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,%d}" % (MAX_KEY_CHARS - 1))
_DATE_RE = re.compile(r"\d{4}-\d{2}-\d{2}")
_NUMBER_RE = re.compile(r"[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?")
_PRINCIPAL_RE = re.compile(r"(user|group|role):[^\s,|]{1,200}")

Metadata = dict[str, Any]


def _key(key: object, error: type[Exception] = InvalidMetadata) -> str:
    if not isinstance(key, str) or not _KEY_RE.fullmatch(key):
        raise error(f"metadata key {str(key)[:60]!r} is not an identifier (a letter, then letters, digits or _; "
                    f"at most {MAX_KEY_CHARS} characters)")
    return key


def is_date(value: object) -> bool:
    """Whether ``value`` is a date as metadata keeps one (``YYYY-MM-DD`` naming a real day)."""
    if not isinstance(value, str) or not _DATE_RE.fullmatch(value):
        return False
    try:
        date.fromisoformat(value)
    except ValueError:
        return False
    return True


def _value(key: str, value: object) -> Any:
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)):
        if isinstance(value, float) and not math.isfinite(value):
            raise InvalidMetadata(f"metadata {key}: numbers must be finite")
        return value
    if isinstance(value, date):
        return value.isoformat()
    if isinstance(value, str):
        if len(value) > MAX_STRING_CHARS:
            raise InvalidMetadata(f"metadata {key}: a string may have at most {MAX_STRING_CHARS} characters")
        if _DATE_RE.fullmatch(value) and not is_date(value):
            raise InvalidMetadata(f"metadata {key}: {value!r} looks like a date but names no day")
        return value
    if isinstance(value, (list, tuple)):
        if len(value) > MAX_LIST_ITEMS:
            raise InvalidMetadata(f"metadata {key}: a list may hold at most {MAX_LIST_ITEMS} strings")
        if not all(isinstance(v, str) and 0 < len(v) <= MAX_LIST_ITEM_CHARS for v in value):
            raise InvalidMetadata(f"metadata {key}: a list holds non-empty strings of at most "
                                  f"{MAX_LIST_ITEM_CHARS} characters")
        return sorted(set(value))
    raise InvalidMetadata(f"metadata {key}: values are strings, numbers, booleans, dates or lists of strings, "
                          f"not {type(value).__name__}")


def canonical_metadata(metadata: Mapping[str, Any] | None) -> Metadata:
    """The validated, canonical form of ``metadata`` (None: empty). Raises InvalidMetadata."""
    if metadata is None:
        return {}
    if not isinstance(metadata, Mapping):
        raise InvalidMetadata("metadata must be a JSON object of key/value pairs")
    if len(metadata) > MAX_KEYS:
        raise InvalidMetadata(f"at most {MAX_KEYS} metadata keys, got {len(metadata)}")
    out = {_key(k): _value(k, v) for k, v in sorted(metadata.items(), key=lambda kv: str(kv[0]))}
    if len(json.dumps(out, ensure_ascii=False).encode("utf-8")) > MAX_JSON_BYTES:
        raise InvalidMetadata(f"metadata is larger than {MAX_JSON_BYTES} bytes as JSON")
    return out


def scalar_from_text(text: str) -> Any:
    """A command-line value's type: true/false, a number, a date (kept as text), a "quoted" string, or text."""
    if len(text) >= 2 and text[0] == text[-1] == '"':
        return text[1:-1]
    if text in ("true", "false"):
        return text == "true"
    if _NUMBER_RE.fullmatch(text):
        number = float(text)
        return int(number) if number.is_integer() and re.fullmatch(r"[+-]?\d+", text) else number
    return text


def metadata_from_args(pairs: Iterable[str]) -> Metadata:
    """``--meta key=value`` options as metadata: a key given twice or more becomes a list of strings."""
    values: dict[str, list[Any]] = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        if not sep:
            raise InvalidMetadata(f"--meta {pair!r}: expected key=value")
        values.setdefault(_key(key.strip()), []).append(text)
    out: dict[str, Any] = {}
    for key, texts in values.items():
        out[key] = scalar_from_text(texts[0]) if len(texts) == 1 else [t.strip('"') for t in texts]
    return canonical_metadata(out)


def canonical_principal(principal: object, error: type[Exception] = InvalidMetadata) -> str:
    if not isinstance(principal, str) or not _PRINCIPAL_RE.fullmatch(principal.strip()):
        raise error(f"principal {str(principal)[:60]!r} must look like group:NAME, user:NAME or role:NAME")
    return principal.strip()


def canonical_allow(principals: Iterable[str] | None) -> list[str] | None:
    """A version's allow list, sorted without repeats; None (no list given) means the whole tenant may read.
    An empty list is refused: a version nobody may read is a mistake, not a setting."""
    if principals is None:
        return None
    if isinstance(principals, str):
        raise InvalidMetadata("an allow list is a list of principals, not one string")
    out = sorted({canonical_principal(p) for p in principals})
    if not out:
        raise InvalidMetadata("an allow list needs at least one principal (leave it out to let the whole tenant read)")
    if len(out) > MAX_PRINCIPALS:
        raise InvalidMetadata(f"an allow list may name at most {MAX_PRINCIPALS} principals")
    return out


def canonical_principals(principals: Iterable[str]) -> list[str]:
    """The principals a search acts for (INVALID_FILTER when malformed)."""
    out = sorted({canonical_principal(p, InvalidFilter) for p in principals})
    if len(out) > MAX_PRINCIPALS:
        raise InvalidFilter(f"a search may act for at most {MAX_PRINCIPALS} principals")
    return out


@dataclass(frozen=True)
class Filter:
    """One condition on metadata, as ``kbindex_metadata_match`` reads it (``to_json``)."""

    key: str
    op: str
    """eq, ne, gt, ge, lt, le, exists, missing"""
    values: tuple[Any, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"key": self.key, "op": self.op, "values": list(self.values), "kind": self.kind}

    @property
    def kind(self) -> str:
        """What a range compares: ``number`` or ``date``; ``any`` for the other operators."""
        if self.op not in ("gt", "ge", "lt", "le"):
            return "any"
        return "date" if is_date(self.values[0]) else "number"

    def matches(self, metadata: Mapping[str, Any]) -> bool:
        """The same rule in Python: the reference the property tests hold the SQL to."""
        present = self.key in metadata
        if self.op == "exists":
            return present
        if self.op == "missing":
            return not present
        value = metadata.get(self.key)
        if self.op in ("eq", "ne"):
            hit = present and any(_equal(value, v) for v in self.values)
            return hit if self.op == "eq" else not hit
        bound = self.values[0]
        if self.kind == "date":
            if not is_date(value):
                return False
        elif isinstance(value, bool) or not isinstance(value, (int, float)):
            return False
        return {"gt": value > bound, "ge": value >= bound, "lt": value < bound, "le": value <= bound}[self.op]


def _equal(stored: Any, wanted: Any) -> bool:
    if isinstance(stored, list):
        return isinstance(wanted, str) and wanted in stored
    if isinstance(stored, bool) or isinstance(wanted, bool):
        return isinstance(stored, bool) and isinstance(wanted, bool) and stored == wanted
    return stored == wanted


_OPS = (("!=", "ne"), (">=", "ge"), ("<=", "le"), ("=", "eq"), (">", "gt"), ("<", "lt"))


def parse_filter(expr: str) -> Filter:
    """One ``--filter`` expression (see the module docstring); raises InvalidFilter."""
    text = (expr or "").strip()
    if not text:
        raise InvalidFilter("an empty filter")
    for symbol, op in _OPS:
        key, sep, rest = text.partition(symbol)
        if not sep:
            continue
        key = _key(key.strip(), InvalidFilter)
        if op in ("eq", "ne"):
            values = tuple(scalar_from_text(v.strip()) for v in rest.split("|"))
            if any(v == "" for v in values):
                raise InvalidFilter(f"filter {text!r}: a value is empty")
            return Filter(key, op, values)
        bound = scalar_from_text(rest.strip())
        if not is_date(bound) and (isinstance(bound, bool) or not isinstance(bound, (int, float))):
            raise InvalidFilter(f"filter {text!r}: {symbol} compares numbers or dates (YYYY-MM-DD)")
        return Filter(key, op, (bound,))
    if text.startswith("!"):
        return Filter(_key(text[1:].strip(), InvalidFilter), "missing")
    return Filter(_key(text, InvalidFilter), "exists")


def filters_json(filters: Sequence[Filter]) -> str:
    """The SQL parameter: a JSON array of conditions (evaluated by ``kbindex_metadata_match``)."""
    return json.dumps([f.to_json() for f in filters], ensure_ascii=False)


def _path_literal(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return json.dumps(value)
    return json.dumps(str(value), ensure_ascii=False)


def metadata_path(filters: Sequence[Filter]) -> str | None:
    """A jsonpath every version passing ``filters`` matches (``metadata @? path``), built from their equality
    conditions only, for the GIN index on the pointers' metadata (migration 0034); None when there are none.
    A necessary condition, never a sufficient one: ``kbindex_metadata_match`` still decides. In lax mode
    ``@.key == v`` also holds when the key is a list holding ``v``, compares numbers as numbers and never equals
    values of different types, so no version that passes is left out. Keys are identifiers and values JSON
    literals, so the text is data, not a language a filter can reach into."""
    conds = []
    for f in filters:
        if f.op == "eq":
            key = json.dumps(f.key)
            conds.append("(" + " || ".join(f"@.{key} == {_path_literal(v)}" for v in f.values) + ")")
    return "$ ? (" + " && ".join(conds) + ")" if conds else None


def may_read(allow: Sequence[str] | None, principals: Sequence[str] | None) -> bool:
    """The permission rule, in Python (the SQL has the same): no allow list, or one shared principal.
    ``principals`` None: an explicit see-everything override (an operator's ``--all``)."""
    if principals is None or allow is None:
        return True
    return bool(set(allow) & set(principals))


@dataclass(frozen=True)
class ReadScope:
    """On whose behalf a search (or any read of document data) runs, and what it filters on.

    ``principals``: who is reading; a version with an allow list is visible only if it names one of them.
    ``see_all``: an explicit override (an operator's ``--all``, a whole-tenant token): every version.
    The default scope sees only versions without an allow list: fail-closed.
    """

    principals: tuple[str, ...] = ()
    see_all: bool = False
    filters: tuple[Filter, ...] = ()

    @classmethod
    def of(cls, principals: Iterable[str] | None = (), *, see_all: bool = False,
           filters: Sequence[str] | Sequence[Filter] | None = None) -> ReadScope:
        parsed = tuple(f if isinstance(f, Filter) else parse_filter(f) for f in filters or ())
        if len(parsed) > MAX_FILTERS:
            raise InvalidFilter(f"at most {MAX_FILTERS} filters")
        return cls(tuple(canonical_principals(principals or ())), bool(see_all), parsed)

    def may_read(self, allow: Sequence[str] | None) -> bool:
        return may_read(allow, None if self.see_all else self.principals)

    def matches(self, metadata: Mapping[str, Any], allow: Sequence[str] | None) -> bool:
        """Whether a version with this metadata and allow list is in scope (the Python reference of the SQL)."""
        return self.may_read(allow) and all(f.matches(metadata) for f in self.filters)

    def params(self) -> dict[str, Any]:
        """The SQL parameters every statement that reads document data takes: principals, see_all, filters (and
        metadata_path, which the statements that can use the metadata index take)."""
        return {"principals": list(self.principals), "see_all": self.see_all, "filters": filters_json(self.filters),
                "metadata_path": metadata_path(self.filters)}


NO_FILTERS = filters_json(())
"""``params()["filters"]`` of a scope without filters."""
EVERYTHING = ReadScope(see_all=True)
"""Every version of the tenant, unfiltered: operators and whole-tenant tokens."""
