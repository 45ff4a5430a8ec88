"""bench.peers without LlamaIndex: its edit, its chunk settings, and the skips (no corpus, no LlamaIndex)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

import bench.peers as peers
from bench.peers import DEFAULT_CHUNK_OVERLAP, DEFAULT_CHUNK_TOKENS, PeersUnavailable, edit_documents, insert_sentence
from bench.peers.__main__ import main

ROOT = Path(__file__).resolve().parents[2]


def test_chunk_settings_are_the_default_profiles() -> None:
    migration = (ROOT / "sql" / "migrations" / "0001_initial.sql").read_text()
    row = re.search(r"VALUES \('minilm-v1', 'all-MiniLM-L6-v2', 384, (\d+), (\d+), true", migration)
    assert row is not None
    assert (int(row[1]), int(row[2])) == (DEFAULT_CHUNK_TOKENS, DEFAULT_CHUNK_OVERLAP)


def test_insert_sentence_adds_one_sentence_mid_paragraph_and_keeps_every_other_character() -> None:
    text = ("Title\n=====\n\nFirst sentence here is long enough. Second one follows it\nover a line break. "
            "Third closes the paragraph with a few more words.\n\n    code block. not prose.\n")
    new, inserted = insert_sentence("doc.rst", text)
    added = "This sentence was added to doc.rst in its second version. "
    assert len(new) == len(text) + inserted == len(text) + len(added)
    at = new.index(added)
    assert new[:at] + new[at + len(added):] == text
    assert new[:at].endswith("it\nover a line break. ")  # after the middle one of the paragraph's sentence ends
    assert insert_sentence("code.rst", "    indented = 1\n\n.. note:: x. y.") is None
    one = "A single sentence paragraph that runs on for a dozen words or so."
    assert insert_sentence("one.txt", one)[0] == one + " This sentence was added to one.txt in its second version."


def test_edit_documents_edits_the_share_asked_one_sentence_each() -> None:
    body = "\n\n".join(f"Para {p} has a first sentence. And a second sentence with enough words in it." for p in range(4))
    docs = [(f"d{i}.txt", body) for i in range(20)]
    edited, what = edit_documents(docs, 0.10)
    changed = [name for (name, old), (_, new) in zip(docs, edited, strict=True) if old != new]
    assert what["docs_edited"] == 2 and sorted(changed) == sorted(what["edited"])
    assert what["paragraph_share"] == round(2 / 80, 5) and 0 < what["char_share"] < 0.05
    assert edit_documents(docs, 0.10) == (edited, what)  # seeded


def test_missing_corpus_is_skipped(tmp_path, capsys) -> None:
    assert main(["--corpus", str(tmp_path / "nowhere"), "--docs", "3"]) == 0
    assert "bench.peers skipped" in capsys.readouterr().out


def test_missing_llama_index_is_a_skip_naming_the_extra(tmp_path, monkeypatch, capsys) -> None:
    for folder, name in (("en-peps", "pep-0001.rst"), ("en-sotu", "a.txt")):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / name).write_text("One sentence. Two sentences here, all told.\n")
    for name in ["llama_index", *(m for m in sys.modules if m.startswith("llama_index."))]:
        monkeypatch.setitem(sys.modules, name, None)  # importing it raises ModuleNotFoundError
    monkeypatch.delitem(sys.modules, "bench.peers.llama", raising=False)
    monkeypatch.delattr(peers, "llama", raising=False)
    with pytest.raises(PeersUnavailable, match=re.escape("pip install -e '.[peers]'")):
        peers.load_llama()
    assert main(["--corpus", str(tmp_path), "--docs", "2", "--no-kbindex"]) == 0
    out = capsys.readouterr().out
    assert "bench.peers skipped" in out and ".[peers]" in out
