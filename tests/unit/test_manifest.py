"""read_manifest: a batch publish's per-document metadata and allow lists (pipelines/domain/manifest.py)."""

from __future__ import annotations

import json
import re

import pytest

from pipelines.domain.manifest import read_manifest
from pipelines.domain.errors import InvalidMetadata

SHARED = ({"dept": "hr"}, ["group:hr"])
BY = "each document id"


def read(text, names):
    return read_manifest(text, names, keyed_by=BY)


def test_no_manifest_part_or_an_empty_one_changes_nothing():
    assert read(None, {"a.md"}) == {}
    assert read("  ", {"a.md"}) == {}


def test_an_entry_replaces_only_the_keys_it_sets():
    entries = read(json.dumps({
        "a.md": {"metadata": {"title": "A"}},
        "b.md": {"allow": ["user:bob"]},
        "c.md": {"metadata": None, "allow": None},
        "d.md": {},
    }), {"a.md", "b.md", "c.md", "d.md", "e.md"})
    assert entries["a.md"].apply(*SHARED) == ({"title": "A"}, ["group:hr"])
    assert entries["b.md"].apply(*SHARED) == ({"dept": "hr"}, ["user:bob"])
    assert entries["c.md"].apply(*SHARED) == (None, None), "null clears the shared value"
    assert entries["d.md"].apply(*SHARED) == SHARED
    assert "e.md" not in entries


@pytest.mark.parametrize("text, message", [
    ("{not json", "not valid JSON"),
    ("[1, 2]", "JSON object keyed by each document id"),
    (json.dumps({"typo.md": {}}), "does not hold: 'typo.md'; key it by each document id"),
])
def test_a_manifest_that_cannot_be_read_or_names_a_missing_file_refuses_the_batch(text, message):
    with pytest.raises(InvalidMetadata, match=message) as refused:
        read(text, {"a.md"})
    assert refused.value.code == "INVALID_METADATA"


def test_many_unknown_names_are_counted_not_all_listed():
    names = {f"x{i}.md": {} for i in range(8)}
    with pytest.raises(InvalidMetadata, match="and 3 more"):
        read(json.dumps(names), {"a.md"})


@pytest.mark.parametrize("entry, message", [
    ("just a string", "must be an object"),
    ({"meta": {"a": 1}}, "unknown keys \\['meta'\\]"),
    ({"metadata": ["a"]}, "metadata must be a JSON object"),
    ({"allow": "group:hr"}, "allow must be an array"),
    ({"allow": ["group:hr", 7]}, "allow must be an array"),
])
def test_a_malformed_entry_is_that_documents_refusal_only(entry, message):
    entries = read(json.dumps({"a.md": entry, "b.md": {"metadata": {"ok": True}}}), {"a.md", "b.md"})
    assert entries["a.md"].error is not None and entries["a.md"].error.code == "INVALID_METADATA"
    assert re.search(message, entries["a.md"].error.message)
    assert entries["b.md"].error is None and entries["b.md"].apply(*SHARED)[0] == {"ok": True}
