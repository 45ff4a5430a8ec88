"""Token-aware chunking of a ParsedDocument into deterministic, never-truncated chunks.

Why it works this way:
- Counting uses the embedding model's own tokenizer (the ``Tokenizer`` protocol; the real one is
  ``resources.tokenizer.ModelTokenizer``), so the model reads every chunk whole. all-MiniLM-L6-v2
  reads 256 word pieces including [CLS] and [SEP]: ``chunk_tokens`` may be at most 254.
- A chunk never spans a heading or page change. A section is tokenized once; the word pieces of any
  span are counted from those offsets (no tokenizer call per piece), and each finished chunk is
  counted once for real (its ``token_count``, and the guard that the model reads it whole).
- Boundaries are stable under local edits (issue #15). The section is cut into units: sentences
  (also 。！？ with no space after), and for a sentence over the budget, lines, clauses, words and
  finally word pieces. A chunk ends at a paragraph end when one fills at least a quarter of its room
  (the fullest such: paragraphs that fit are never cut), else at the sentence (or finer) boundary,
  filling at least half the room, whose preceding unit has the largest hash. Such a cut depends on
  the text around it, not on where the section starts, so after a sentence is inserted, deleted or
  rewritten the following cuts fall back onto the old ones within a chunk or two, and only those
  chunks are embedded again (bench/incremental --edit-kinds measures it). The greedy packing used
  before moved every later cut of the section until one happened to coincide again.
- Overlap: a chunk after the first of its section starts by repeating the last up to ``overlap``
  word pieces of the previous chunk, from a word start (fewer if its first unit needs the room).
  The repeated tail is a function of the previous cut, so it is as stable as the cuts.
- What is embedded is ``embed_text`` = the heading path ("A > B", outermost titles dropped first if
  it would take more than a quarter of the budget) + a newline + ``text``. Headings carry meaning a
  paragraph leaves implicit ("Refunds > Eligibility"). ``token_count`` counts ``embed_text``, and it
  is what must stay within ``chunk_tokens``; ``text`` stays the plain content shown to readers.
- Context (a profile's ``embed_context``, issue #35): given a document ``title`` (``document_title``: the
  parser's, else the heading every block sits under, else the file name), ``embed_text`` = the title, then the
  heading path below it, then the text ("Refund policy > Eligibility\n..."). The title gets up to an eighth of
  the budget and is never dropped for the headings (it is what tells a chunk's document apart); a heading path
  that already starts with it does not repeat it. ``text``, ids and digests are as without context. The chunk
  keeps the whole title (``context_title``) for the lexical index, which reads title + heading path + text.
- Identity is deterministic (DESIGN invariant 5): ``content_digest`` = sha256 of the NFC,
  whitespace-collapsed ``text``; ``chunk_id`` = sha256 over (tenant, document, version, profile,
  ordinal, heading path, content digest), 32 hex characters. Same input, same chunks, byte for byte.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import re
import unicodedata
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

from pipelines.domain.errors import InternalError
from pipelines.domain.parsing.model import ParsedDocument, TextBlock

DEFAULT_CHUNK_TOKENS = 200
DEFAULT_OVERLAP = 32
MIN_CHUNK_TOKENS = 8
HEADING_SEPARATOR = " > "
CHUNK_ID_CHARS = 32
CHUNKER_VERSION = 3
"""Bumped whenever the same input and parameters may chunk differently (2: content-defined cuts,
issue #15; 3: a chunk carries its ``context_title``, issue #35); run state fingerprints include it, so chunks
stored by an older chunker are not reused."""
PARAGRAPH_MIN_FILL = (1, 4)
"""A chunk may end at a paragraph end once it fills this share of its room (numerator, denominator)."""
FINER_MIN_FILL = (1, 2)
"""... and at a sentence (or finer) boundary once it fills this share."""


class Tokenizer(Protocol):
    """The embedding model's tokenizer, as the chunker needs it (special tokens never counted)."""

    max_content_tokens: int
    """Word pieces the model reads besides its special tokens (254 for all-MiniLM-L6-v2)."""

    def count(self, text: str) -> int:
        """Number of word pieces in ``text``."""
        ...

    def offsets(self, text: str) -> list[tuple[int, int]]:
        """Character span of each word piece of ``text``, in order."""
        ...


@dataclass(frozen=True, slots=True)
class VersionIdentity:
    """Which document version, under which index profile, the chunks belong to."""

    tenant_id: str
    document_id: str
    version_number: int
    profile: str


@dataclass(frozen=True, slots=True)
class Chunk:
    chunk_id: str
    ordinal: int
    heading_path: tuple[str, ...]
    page: int | None
    text: str
    """The content, as shown to a reader."""
    embed_text: str
    """What the model embeds: heading prefix + text."""
    token_count: int
    """Word pieces of ``embed_text`` (without [CLS]/[SEP]); never more than ``chunk_tokens``."""
    content_digest: str
    """sha256 hex of the normalized ``text``."""
    context_title: str | None = None
    """A context profile's document title (whitespace-collapsed, whole; ``embed_text`` may carry it cut short),
    None without context. The lexical index reads it before the heading path (resources/lexical.py), and it is
    stored with the chunk so paths that do not parse again (a copied version, the lexical backfill) read it back."""


def chunk_document(
    doc: ParsedDocument,
    *,
    tokenizer: Tokenizer,
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
    overlap: int = DEFAULT_OVERLAP,
    identity: VersionIdentity,
    title: str | None = None,
) -> list[Chunk]:
    """Split ``doc`` into chunks whose ``embed_text`` fits ``chunk_tokens`` word pieces. ``title`` (a context
    profile's ``document_title``): embedded before each chunk's heading path; None embeds the heading path only."""
    if not MIN_CHUNK_TOKENS <= chunk_tokens <= tokenizer.max_content_tokens:
        raise ValueError(
            f"chunk_tokens must be between {MIN_CHUNK_TOKENS} and the model's {tokenizer.max_content_tokens}"
        )
    if not 0 <= overlap <= chunk_tokens // 2:
        raise ValueError("overlap must be between 0 and half of chunk_tokens")
    chunks: list[Chunk] = []
    context_title = (" ".join(title.split()) or None) if title is not None else None
    for heading_path, page, section in _sections(doc.blocks):
        if title is None:
            prefix = _heading_prefix(heading_path, tokenizer, chunk_tokens // 4)
        else:
            prefix = _context_prefix(title, heading_path, tokenizer, chunk_tokens)
        for text, token_count in _SectionSplitter(section, prefix, tokenizer, chunk_tokens, overlap).chunks():
            embed_text = prefix + text
            digest = content_digest(text)
            ordinal = len(chunks)
            chunks.append(
                Chunk(
                    chunk_id=chunk_id(identity, ordinal, heading_path, digest),
                    ordinal=ordinal,
                    heading_path=heading_path,
                    page=page,
                    text=text,
                    embed_text=embed_text,
                    token_count=token_count,
                    content_digest=digest,
                    context_title=context_title,
                )
            )
    return chunks


def normalize_text(text: str) -> str:
    """NFC with every whitespace run collapsed to one space: what the digest is taken over."""
    return " ".join(unicodedata.normalize("NFC", text).split())


def content_digest(text: str) -> str:
    return hashlib.sha256(normalize_text(text).encode("utf-8", "surrogatepass")).hexdigest()


def chunk_id(identity: VersionIdentity, ordinal: int, heading_path: tuple[str, ...], digest: str) -> str:
    """Stable id: a re-run over the same version and profile writes the same rows."""
    key = [
        identity.tenant_id,
        identity.document_id,
        identity.version_number,
        identity.profile,
        ordinal,
        list(heading_path),
        digest,
    ]
    encoded = json.dumps(key, ensure_ascii=True, separators=(",", ":")).encode("ascii")
    return hashlib.sha256(encoded).hexdigest()[:CHUNK_ID_CHARS]


def _sections(blocks: list[TextBlock]) -> Iterator[tuple[tuple[str, ...], int | None, str]]:
    """Consecutive blocks with the same heading path and page, joined by blank lines."""
    current: tuple[tuple[str, ...], int | None] | None = None
    texts: list[str] = []
    for block in blocks:
        key = (tuple(block.heading_path), block.page)
        if key != current and texts and current is not None:
            yield current[0], current[1], "\n\n".join(texts)
            texts = []
        current = key
        texts.append(block.text)
    if texts and current is not None:
        yield current[0], current[1], "\n\n".join(texts)


def _heading_prefix(heading_path: tuple[str, ...], tokenizer: Tokenizer, max_tokens: int) -> str:
    """ "Outer > Inner\\n", dropping outer titles (then cutting the innermost) to fit ``max_tokens``."""
    titles = [" ".join(title.split()) for title in heading_path]
    titles = [title for title in titles if title]
    while titles:
        prefix = HEADING_SEPARATOR.join(titles) + "\n"
        if tokenizer.count(prefix) <= max_tokens:
            return prefix
        if len(titles) == 1:
            break
        titles = titles[1:]
    if not titles or max_tokens <= 0:
        return ""
    title = titles[0]
    spans = tokenizer.offsets(title)
    for keep in range(min(max_tokens, len(spans)), 0, -1):
        prefix = title[: spans[keep - 1][1]].rstrip() + "\n"
        if tokenizer.count(prefix) <= max_tokens:
            return prefix
    return ""


def _context_prefix(title: str, heading_path: tuple[str, ...], tokenizer: Tokenizer, chunk_tokens: int) -> str:
    """ "Title > Outer > Inner\n": the title cut to an eighth of the budget, then as much of the heading path
    below it as fits a quarter of the budget in all (outer headings dropped first, as without context)."""
    title = full = " ".join(title.split())
    spans = tokenizer.offsets(title) if title else []
    room = chunk_tokens // 8
    if len(spans) > room:
        title = title[: spans[room - 1][1]].rstrip() if room > 0 else ""
    if not title:
        return _heading_prefix(heading_path, tokenizer, chunk_tokens // 4)
    path = tuple(heading_path)
    if path and " ".join(path[0].split()).casefold() == full.casefold():
        path = path[1:]  # the heading path already starts with the title (a lone top heading)
    rest = _heading_prefix(path, tokenizer, chunk_tokens // 4 - tokenizer.count(title + HEADING_SEPARATOR))
    return title + (HEADING_SEPARATOR + rest if rest else "\n")


def document_title(doc: ParsedDocument, filename: str) -> str:
    """What a context profile embeds as a document's title: the title the parser read (HTML ``<title>``), else
    the heading every block sits under (a Markdown or reStructuredText document's lone top heading, an e-mail's
    subject), else the file name without its extension (``_`` read as a space)."""
    declared = doc.metadata.get("title") if doc.metadata else None
    if isinstance(declared, str) and declared.split():
        return " ".join(declared.split())
    roots = {block.heading_path[0] if block.heading_path else None for block in doc.blocks}
    if len(roots) == 1 and (root := roots.pop()):
        return root
    name = filename.replace("\\", "/").rsplit("/", 1)[-1]
    stem = name.rsplit(".", 1)[0] if "." in name.strip(".") else name
    return " ".join(stem.replace("_", " ").split())


# Split points, coarsest first; each pattern matches the gap *after* a separator.
_LEVELS = (
    re.compile(r"\n[^\S\n]*\n\s*"),  # paragraphs
    # sentences; after CJK full stops no space is needed
    re.compile(r"(?<=[.!?])[\"'”’)\]]*\s+|(?<=[。！？；…])[」』”’）)\]]*\s*"),
    re.compile(r"\n\s*"),  # lines (after sentences: hard-wrapped prose breaks lines mid-sentence)
    re.compile(r"(?<=[,，、:：;；])\s*"),  # clauses
    re.compile(r"\s+"),  # words
)
_CJK_RANGES = (
    (0x3400, 0x4DBF), (0x4E00, 0x9FFF), (0xF900, 0xFAFF),
    (0x20000, 0x2A6DF), (0x2A700, 0x2CEAF), (0x2F800, 0x2FA1F),
)


def _is_cjk(char: str) -> bool:
    """CJK ideographs, which BERT tokenizers treat as words of their own."""
    code = ord(char)
    return any(low <= code <= high for low, high in _CJK_RANGES)


class _SectionSplitter:
    """Chunks one section (one heading path and page): tokenize once, cut into units, choose the cuts
    (``_cut``), verify each chunk with one real count."""

    def __init__(self, text: str, prefix: str, tokenizer: Tokenizer, chunk_tokens: int, overlap: int) -> None:
        self.text = text
        self.prefix = prefix
        self.tokenizer = tokenizer
        self.chunk_tokens = chunk_tokens
        self.overlap = overlap
        self.budget = chunk_tokens - (tokenizer.count(prefix) if prefix else 0)
        spans = tokenizer.offsets(text) if text.strip() else []
        self.starts = [a for a, _ in spans]
        self.ends = [b for _, b in spans]

    def tokens(self, start: int, end: int) -> int:
        """Word pieces lying inside ``text[start:end]``, from the section's one tokenization."""
        return max(0, bisect.bisect_right(self.ends, end) - bisect.bisect_left(self.starts, start))

    def fits(self, text: str) -> bool:
        """The real count (used where spans are not additive: word-piece cuts, and the final check)."""
        return self.tokenizer.count(self.prefix + text.strip()) <= self.chunk_tokens

    def chunks(self) -> Iterator[tuple[str, int]]:
        """(text, word pieces of prefix + text) in order, each verified against the bound with one real count."""
        units = self._units()
        i, previous = 0, None
        while i < len(units):
            start = units[i].start
            if previous is not None:  # repeat the previous tail, shrunk so the next unit still fits
                overlap_start = self._overlap_start(*previous, min(self.overlap, self.budget - units[i].tokens))
                start = start if overlap_start is None else overlap_start
            j = self._cut(units, i, self.budget - self.tokens(start, units[i].start))
            while (count := self.tokenizer.count(self.prefix + self.text[start : units[j - 1].end].strip())) \
                    > self.chunk_tokens:  # spans are estimates: verify
                if j - 1 > i:
                    j -= 1
                elif start != units[i].start:
                    start = units[i].start
                elif not units[i].exact:  # a unit the offsets under-counted: cut it by real counts
                    units[i : i + 1] = self._split_tokens(units[i])
                    j = i + 1
                else:
                    raise InternalError("chunker could not fit a piece within the token budget")
            end = units[j - 1].end
            chunk = self.text[start:end].strip()
            if chunk:
                yield chunk, count
            i, previous = j, (start, end)

    def _cut(self, units: list[_Unit], i: int, room: int) -> int:
        """End (exclusive unit index) of the chunk starting at unit ``i`` with ``room`` word pieces.

        Among the boundaries that fit: a paragraph end filling at least a quarter of the room, the
        fullest one (structure-anchored: an edit inside a paragraph leaves the other paragraph ends
        where they were); else a finer boundary filling at least half the room, the one whose unit
        before it has the largest fingerprint (content-defined: the cut follows the text, not the
        start, so after an edit the cuts fall back onto the old ones); else as much as fits.
        """
        total, best, best_strength, j = 0, i + 1, None, i
        while j < len(units) and (j == i or total + units[j].tokens <= room):
            total += units[j].tokens
            j += 1
            if j == len(units):
                return j  # the section ends here: no cut is stronger
            unit = units[j - 1]
            if unit.level == 0 and total * PARAGRAPH_MIN_FILL[1] >= room * PARAGRAPH_MIN_FILL[0]:
                strength = (0, total)
            elif unit.level > 0 and total * FINER_MIN_FILL[1] >= room * FINER_MIN_FILL[0]:
                strength = (-unit.level, unit.fingerprint)
            else:
                continue
            if best_strength is None or strength > best_strength:
                best, best_strength = j, strength
        return best if best_strength is not None else j

    def _units(self) -> list[_Unit]:
        """Consecutive units covering the section: sentences, or finer pieces where one does not fit."""
        units: list[_Unit] = []
        self._partition(0, len(self.text), 0, 0, units)
        return units

    def _partition(self, start: int, end: int, level: int, tail_level: int, out: list[_Unit]) -> None:
        """Split ``text[start:end]`` at ``_LEVELS[level]`` (always down to sentences, finer only to fit)."""
        if level >= 2 and self.tokens(start, end) <= self.budget:
            out.append(self._unit(start, end, tail_level))
            return
        if level == len(_LEVELS):
            out.extend(self._split_tokens(_Unit(start, end, tail_level, 0, 0, False)))
            return
        cuts = [start + c for c in _cut_points(_LEVELS[level], self.text[start:end])]
        bounds = [start, *cuts, end]
        for k, (a, b) in enumerate(zip(bounds, bounds[1:])):
            self._partition(a, b, level + 1, level if k < len(cuts) else tail_level, out)

    def _unit(self, start: int, end: int, level: int, exact: bool = False) -> _Unit:
        fingerprint = int.from_bytes(
            hashlib.blake2b(normalize_text(self.text[start:end]).encode("utf-8", "surrogatepass"),
                            digest_size=8).digest(), "big")
        return _Unit(start, end, level, self.tokens(start, end), fingerprint, exact)

    def _split_tokens(self, unit: _Unit) -> list[_Unit]:
        """Last resort: cut at word-piece boundaries (long "words", CJK runs without punctuation),
        each piece checked with a real count (a piece starting mid-word re-tokenizes differently)."""
        text = self.text[unit.start : unit.end]
        spans = self.tokenizer.offsets(text)
        pieces: list[tuple[int, int]] = []
        start_char, i = 0, 0
        while i < len(spans):
            j = min(i + max(self.budget, 1), len(spans))
            while True:
                end_char = spans[j][0] if j < len(spans) else len(text)
                if j == i + 1 or self.fits(text[start_char:end_char]):
                    break
                j = i + max(1, (j - i) * 3 // 4)
            pieces.append((start_char, end_char))
            start_char, i = end_char, j
        if start_char < len(text) or not pieces:
            pieces.append((start_char, len(text)))
        levels = [len(_LEVELS)] * (len(pieces) - 1) + [unit.level]
        return [self._unit(unit.start + a, unit.start + b, level, exact=True)
                for (a, b), level in zip(pieces, levels, strict=True)]

    def _overlap_start(self, start: int, end: int, tokens: int) -> int | None:
        """Where the next chunk starts to repeat the last ``tokens`` word pieces of [start, end), at a word."""
        if tokens <= 0:
            return None
        first, stop = bisect.bisect_left(self.starts, start), bisect.bisect_right(self.ends, end)
        k = stop - tokens
        if k <= first:
            return None  # the whole chunk would repeat
        while k < stop and _mid_word(self.text, self.starts[k]):
            k += 1
        return self.starts[k] if k < stop else None


@dataclass(frozen=True, slots=True)
class _Unit:
    """A span of the section the chunker never cuts inside, and the boundary after it."""

    start: int
    end: int
    level: int
    """How coarse the boundary after it is: 0 paragraph, 1 sentence, ... len(_LEVELS) word piece."""
    tokens: int
    fingerprint: int
    """A hash of its normalized text: ties between equally coarse boundaries go the same way every time."""
    exact: bool
    """Cut by real counts (word-piece fallback): cannot be split further."""


def _cut_points(pattern: re.Pattern[str], text: str) -> list[int]:
    """Offsets after each match of ``pattern`` strictly inside ``text``."""
    return [m.end() for m in pattern.finditer(text) if 0 < m.end() < len(text)]


def _mid_word(text: str, index: int) -> bool:
    """Whether a chunk starting at ``index`` would start inside a word or number ("3.5", "pre-fix")."""
    if index <= 0:
        return False
    before, after = text[index - 1], text[index]
    return not (before.isspace() or before in _CJK_PUNCTUATION or _is_cjk(before) or _is_cjk(after))


_CJK_PUNCTUATION = frozenset("。！？；：，、…」』”’）")


__all__ = [
    "CHUNKER_VERSION",
    "Chunk",
    "DEFAULT_CHUNK_TOKENS",
    "DEFAULT_OVERLAP",
    "Tokenizer",
    "VersionIdentity",
    "chunk_document",
    "chunk_id",
    "content_digest",
    "document_title",
    "normalize_text",
]
