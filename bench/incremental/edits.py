"""Edit kinds for ``bench.incremental`` and the re-embed share they cause, old chunker vs new.

Each kind edits ``k`` prose paragraphs (picked at random, seeded) of some documents:

- ``swap``: one word swapped for another of the same word-piece count (the original, best case);
- ``insert``: a new sentence inserted in the middle of the paragraph;
- ``delete``: one sentence of the paragraph deleted;
- ``rewrite``: every sentence of the paragraph rewritten (its words shuffled: same length, new text).

Figures per kind: the share of changed text (paragraphs touched / paragraphs, and changed characters /
characters), and the share of v2's chunk texts that must be embedded, i.e. whose exact ``embed_text`` no
v1 chunk had. That is what ``embed_with_reuse`` embeds (it reuses by the digest of the exact embed text),
so these shares need no database and no model: only the parser, the chunker and the tokenizer.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

KINDS = ("swap", "insert", "delete", "rewrite")
SWAPS = ((" the ", " our "), (" and ", " or "), (" of ", " for "), (" to ", " into "), (" a ", " one "))
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
Chunker = Callable[[bytes, str], list[Any]]
"""(document bytes, filename) -> chunks (anything with ``embed_text``)."""


@dataclass
class EditFigures:
    kind: str
    chunker: str
    paragraphs_touched: int
    paragraphs: int
    chars_changed: int
    chars: int
    chunks_v1: int
    chunks_v2: int
    embedded_v2: int
    """Distinct v2 embed texts that no v1 chunk had: what v2 embeds."""
    distinct_v2: int

    @property
    def text_share(self) -> float:
        return self.paragraphs_touched / max(1, self.paragraphs)

    @property
    def char_share(self) -> float:
        return self.chars_changed / max(1, self.chars)

    @property
    def embed_share(self) -> float:
        return self.embedded_v2 / max(1, self.distinct_v2)

    @property
    def per_edit(self) -> float:
        """Chunk texts embedded per paragraph edited (1 is the floor; overlap makes it 2 at a chunk's end)."""
        return self.embedded_v2 / max(1, self.paragraphs_touched)

    @property
    def ratio(self) -> float:
        """Re-embed share / changed-paragraph share: the target is <= 2."""
        return self.embed_share / max(1e-12, self.text_share)


def _is_prose(paragraph: str) -> bool:
    """A paragraph of running text with at least two sentences (not code, a table, a heading or a field list)."""
    first = paragraph.lstrip("\n")[:1]
    return (bool(first) and not first.isspace() and first not in "#.:|=-*+`>"
            and len(_SENTENCE_END.split(" ".join(paragraph.split()))) >= 2 and len(paragraph.split()) >= 12)


PARAGRAPH_BREAK = "\n\n"


def paragraphs_of(text: str, separator: str = PARAGRAPH_BREAK) -> list[str]:
    return text.split(separator)


def edit_documents(documents: list[tuple[str, str]], kind: str, k: int, tokenizer: Any, rng: random.Random,
                   separator: str = PARAGRAPH_BREAK) -> tuple[list[tuple[str, str]], int, int]:
    """Apply ``kind`` to ``k`` random prose paragraphs; returns (edited documents, touched, chars changed)."""
    split = [(name, paragraphs_of(text, separator)) for name, text in documents]
    spots = [(d, p) for d, (_, ps) in enumerate(split) for p, para in enumerate(ps) if _is_prose(para)]
    rng.shuffle(spots)
    donors = [split[d][1][p] for d, p in spots[k : k + 4 * k + 10]]
    touched = changed = 0
    for d, p in spots:
        if touched >= k:
            break
        old = split[d][1][p]
        new = _edit(kind, old, tokenizer, rng, donors)
        if new is None or new == old:
            continue
        split[d][1][p] = new
        touched += 1
        changed += abs(len(new) - len(old)) if kind in ("insert", "delete") else (
            len(old) if kind == "rewrite" else sum(a != b for a, b in zip(old, new, strict=False)))
    return [(name, separator.join(ps)) for name, ps in split], touched, changed


def _edit(kind: str, paragraph: str, tokenizer: Any, rng: random.Random, donors: list[str]) -> str | None:
    sentences = _SENTENCE_END.split(paragraph)
    if kind == "swap":
        for old, new in SWAPS:
            if old in paragraph:
                candidate = paragraph.replace(old, new, 1)
                if tokenizer.count(candidate) == tokenizer.count(paragraph):
                    return candidate
        return None
    if kind == "insert":
        donor = _SENTENCE_END.split(" ".join(rng.choice(donors).split()))
        words = rng.choice(donor).rstrip(".!?").split()
        rng.shuffle(words)
        new_sentence = " ".join(words).capitalize() + "."
        middle = len(sentences) // 2
        return " ".join([*sentences[:middle], new_sentence, *sentences[middle:]])
    if kind == "delete":
        middle = len(sentences) // 2
        return " ".join(sentences[:middle] + sentences[middle + 1 :])
    if kind == "rewrite":
        out = []
        for sentence in sentences:
            words = sentence.rstrip(".!?").split()
            rng.shuffle(words)
            out.append(" ".join(words).capitalize() + ".")
        return " ".join(out)
    raise ValueError(f"unknown edit kind {kind!r}")


def measure(documents: list[tuple[str, str]], kind: str, k: int, chunkers: dict[str, Chunker], tokenizer: Any,
            seed: int = 11, separator: str = PARAGRAPH_BREAK) -> list[EditFigures]:
    """v1 = ``documents``, v2 = ``k`` paragraphs (split at ``separator``) edited by ``kind``; figures per chunker."""
    edited, touched, changed = edit_documents(documents, kind, k, tokenizer, random.Random(seed), separator)
    paragraphs = sum(len(paragraphs_of(text, separator)) for _, text in documents)
    chars = sum(len(text) for _, text in documents)
    out = []
    for label, chunker in chunkers.items():
        v1 = [c.embed_text for name, text in documents for c in chunker(text.encode("utf-8"), name)]
        v2 = [c.embed_text for name, text in edited for c in chunker(text.encode("utf-8"), name)]
        known = set(v1)
        distinct = set(v2)
        out.append(EditFigures(kind, label, touched, paragraphs, changed, chars, len(v1), len(v2),
                               len(distinct - known), len(distinct)))
    return out


def chunkers(tokenizer: Any, chunk_tokens: int, overlap: int) -> dict[str, Chunker]:
    """The fixed-window chunker this issue replaced, and today's, over the same parser."""
    from bench.incremental import fixed_windows
    from pipelines.domain import chunking
    from pipelines.domain.parsing import parse_document

    identity = chunking.VersionIdentity("bench", "doc", 1, "bench")
    parsed: dict[tuple[str, int], Any] = {}

    def using(module: Any) -> Chunker:
        def chunk(data: bytes, filename: str) -> list[Any]:
            key = (filename, hash(data))
            if key not in parsed:
                parsed[key] = parse_document(data, filename=filename)
            return module.chunk_document(parsed[key], tokenizer=tokenizer, chunk_tokens=chunk_tokens,
                                         overlap=overlap, identity=identity)

        return chunk

    return {"fixed windows (before)": using(fixed_windows), "content-defined (now)": using(chunking)}


def report(figures: list[EditFigures], out: Callable[[str], None] = print) -> bool:
    """One line per kind and chunker; True when every kind of the current chunker meets ratio <= 2."""
    out(f"{'edit':8} {'chunker':24} {'paragraphs':>12} {'text %':>7} {'chars %':>8} {'chunks v1/v2':>13} "
        f"{'re-embed %':>10} {'per edit':>8} {'ratio':>6}")
    for f in figures:
        out(f"{f.kind:8} {f.chunker:24} {f'{f.paragraphs_touched}/{f.paragraphs}':>12} {100 * f.text_share:7.2f} "
            f"{100 * f.char_share:8.3f} {f'{f.chunks_v1}/{f.chunks_v2}':>13} {100 * f.embed_share:10.2f} "
            f"{f.per_edit:8.2f} {f.ratio:6.2f}")
    current = [f for f in figures if f.chunker.endswith("(now)")]
    return all(f.ratio <= 2.0 for f in current)
