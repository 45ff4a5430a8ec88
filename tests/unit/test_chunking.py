"""Chunking with the model's real tokenizer: bound, determinism, headings, overlap, Chinese."""

from __future__ import annotations

import hashlib
import random
import string
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer as HFTokenizer

from pipelines.domain.chunking import Chunk, VersionIdentity, chunk_document, normalize_text
from pipelines.domain.parsing import ParsedDocument, TextBlock, parse_document
from resources.tokenizer import ModelTokenizer, default_model_dir

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "documents"
IDENTITY = VersionIdentity(tenant_id="acme", document_id="refund-policy", version_number=3, profile="minilm-v1")
MODEL_MAX_SEQ = 256


@pytest.fixture(scope="module")
def tokenizer() -> ModelTokenizer:
    return ModelTokenizer()


@pytest.fixture(scope="module")
def model_view() -> HFTokenizer:
    """An independent look at what the model reads: the raw tokenizer.json, specials included."""
    raw = HFTokenizer.from_file(str(default_model_dir() / "tokenizer.json"))
    raw.no_truncation()
    raw.no_padding()
    return raw


def parse_fixture(name: str) -> ParsedDocument:
    return parse_document((FIXTURES / name).read_bytes(), filename=name)


def no_space(text: str) -> str:
    return "".join(text.split())


def assert_covers(section: str, chunks: list[Chunk]) -> None:
    """Chunks, in order, cover the section text (whitespace aside), overlapping only backwards."""
    target, position = no_space(section), 0
    for chunk in chunks:
        piece = no_space(chunk.text)
        found = target.find(piece, max(0, position - len(piece)))
        assert found != -1 and found <= position, f"gap or reorder before chunk {chunk.ordinal}"
        position = max(position, found + len(piece))
    assert position == len(target)


def test_tokenizer_budget_is_254_and_counts_without_specials(tokenizer: ModelTokenizer) -> None:
    assert tokenizer.max_seq_length == MODEL_MAX_SEQ
    assert tokenizer.max_content_tokens == 254
    assert tokenizer.count("hello world") == 2
    assert tokenizer.count("中文句子") == 4  # CJK ideographs are one piece each
    assert tokenizer.count("word " * 1000) == 1000  # the shipped truncation at 128 is switched off


def test_rejects_budgets_the_model_would_truncate(tokenizer: ModelTokenizer) -> None:
    doc = ParsedDocument([TextBlock("text")], None, "text/plain")
    with pytest.raises(ValueError, match="chunk_tokens"):
        chunk_document(doc, tokenizer=tokenizer, chunk_tokens=255, overlap=0, identity=IDENTITY)
    with pytest.raises(ValueError, match="overlap"):
        chunk_document(doc, tokenizer=tokenizer, chunk_tokens=100, overlap=60, identity=IDENTITY)


def test_chunk_fields_identity_and_digest(tokenizer: ModelTokenizer) -> None:
    doc = parse_fixture("handbook.docx")
    chunks = chunk_document(doc, tokenizer=tokenizer, identity=IDENTITY)
    assert [c.ordinal for c in chunks] == list(range(len(chunks)))
    assert len({c.chunk_id for c in chunks}) == len(chunks)
    for chunk in chunks:
        assert len(chunk.chunk_id) == 32
        assert chunk.content_digest == hashlib.sha256(normalize_text(chunk.text).encode()).hexdigest()
        assert chunk.embed_text == " > ".join(chunk.heading_path) + "\n" + chunk.text
        assert chunk.token_count == tokenizer.count(chunk.embed_text)
    other = chunk_document(
        doc, tokenizer=tokenizer, identity=VersionIdentity("acme", "refund-policy", 4, "minilm-v1")
    )
    assert [c.content_digest for c in other] == [c.content_digest for c in chunks]
    assert not {c.chunk_id for c in other} & {c.chunk_id for c in chunks}


def test_chunk_id_recipe_is_pinned(tokenizer: ModelTokenizer) -> None:
    """Invariant 5 across releases: changing the id recipe would orphan every stored chunk."""
    doc = ParsedDocument([TextBlock("Refunds within 30 days.", ("Refunds",))], None, "text/plain")
    (chunk,) = chunk_document(doc, tokenizer=tokenizer, identity=IDENTITY)
    assert chunk.content_digest == hashlib.sha256(b"Refunds within 30 days.").hexdigest()
    assert chunk.chunk_id == PINNED_CHUNK_ID


PINNED_CHUNK_ID = "19341d826b48b5c2745ab358858ed9e5"


def test_sections_never_mix_headings_or_pages(tokenizer: ModelTokenizer) -> None:
    doc = parse_fixture("handbook.docx")
    chunks = chunk_document(doc, tokenizer=tokenizer, identity=IDENTITY)
    assert [c.heading_path for c in chunks] == [
        ("Staff Handbook",),
        ("Staff Handbook", "Refunds"),
        ("Staff Handbook", "Refunds", "Eligibility"),
        ("Staff Handbook", "Refunds", "Process"),
        ("Staff Handbook", "Leave"),
    ]
    assert "- The receipt is shown." in chunks[2].text
    pdf = chunk_document(parse_fixture("pdflatex-4-pages.pdf"), tokenizer=tokenizer, identity=IDENTITY)
    assert sorted({c.page for c in pdf}) == [1, 2, 3, 4]
    assert [c.page for c in pdf] == sorted(c.page for c in pdf)  # type: ignore[type-var]


@pytest.mark.parametrize(
    "name", ["sotu-1790-washington.txt", "pep-0257.rst", "debian-reference-apa.zh-cn.html", "pdflatex-4-pages.pdf"]
)
def test_real_documents_fit_the_model(name: str, tokenizer: ModelTokenizer, model_view: HFTokenizer) -> None:
    chunks = chunk_document(parse_fixture(name), tokenizer=tokenizer, identity=IDENTITY)
    assert chunks
    for chunk in chunks:
        assert chunk.token_count <= 200
        assert len(model_view.encode(chunk.embed_text).ids) <= MODEL_MAX_SEQ  # [CLS] + pieces + [SEP]


def test_paragraphs_and_sentences_are_preferred_split_points(tokenizer: ModelTokenizer) -> None:
    chunks = chunk_document(
        parse_fixture("sotu-1790-washington.txt"), tokenizer=tokenizer, overlap=0, identity=IDENTITY
    )
    assert len(chunks) > 3
    assert all(c.text.endswith((".", ";", ":", "?", "!")) for c in chunks)  # whole sentences only


def overlap_chars(previous: str, following: str) -> int:
    """Length of the longest head of ``following`` that is a tail of ``previous`` (whitespace aside)."""
    left, right = no_space(previous), no_space(following)
    return max((k for k in range(1, min(len(left), len(right)) + 1) if left.endswith(right[:k])), default=0)


@pytest.mark.parametrize(
    ("name", "chunk_tokens", "overlap"),
    [("sotu-1790-washington.txt", 120, 32), ("debian-reference-excerpt.zh-cn.txt", 64, 8)],
)
def test_overlap_repeats_the_tail_of_the_previous_chunk(
    name: str, chunk_tokens: int, overlap: int, tokenizer: ModelTokenizer
) -> None:
    doc = parse_fixture(name)
    chunks = chunk_document(doc, tokenizer=tokenizer, chunk_tokens=chunk_tokens, overlap=overlap, identity=IDENTITY)
    pairs = list(zip(chunks, chunks[1:]))
    assert len(pairs) > 3
    overlapping = [overlap_chars(a.text, b.text) > 0 for a, b in pairs]
    assert sum(overlapping) >= 0.8 * len(pairs)  # a piece as large as the budget leaves no room
    section = "\n\n".join(b.text for b in doc.blocks)
    assert_covers(section, chunks)
    for chunk in chunks[1:]:  # every chunk starts at a word (never "##piece" or mid-number)
        at = section.find(chunk.text)
        before, first = section[at - 1], chunk.text[0]
        assert at == 0 or before.isspace() or not before.isalnum() or max(ord(before), ord(first)) > 0x2E80
    no_overlap = chunk_document(doc, tokenizer=tokenizer, chunk_tokens=chunk_tokens, overlap=0, identity=IDENTITY)
    assert no_space("".join(c.text for c in no_overlap)) == no_space(section)


def test_chinese_is_split_at_sentence_ends_and_kept_whole(tokenizer: ModelTokenizer) -> None:
    doc = parse_fixture("debian-reference-excerpt.zh-cn.txt")
    chunks = chunk_document(doc, tokenizer=tokenizer, chunk_tokens=64, overlap=8, identity=IDENTITY)
    assert len(chunks) > 20
    assert all(c.token_count <= 64 for c in chunks)
    section = "\n\n".join(b.text for b in doc.blocks)
    assert_covers(section, chunks)

    def ends_cleanly(chunk: Chunk) -> bool:
        at = section.find(chunk.text) + len(chunk.text)
        return chunk.text.endswith(("。", "！", "？", "；", "：")) or section[at : at + 2] in ("", "\n\n")

    assert sum(map(ends_cleanly, chunks)) >= 0.75 * len(chunks)  # only sentences over budget are cut


_RNG = random.Random(20240501)
_UNSPLITTABLE = {
    "cjk-no-punctuation": "".join(chr(_RNG.randint(0x4E00, 0x9FA5)) for _ in range(3000)),
    "dotted-no-spaces": ",".join(f"k{i}.v{i * 7}" for i in range(600)),
    "one-huge-word": "".join(_RNG.choices(string.ascii_lowercase, k=6000)) + " tail",
}


@pytest.mark.parametrize("text", list(_UNSPLITTABLE.values()), ids=list(_UNSPLITTABLE))
def test_text_without_split_points_falls_back_to_word_pieces(text: str, tokenizer: ModelTokenizer) -> None:
    doc = ParsedDocument([TextBlock(text, ("Heading",))], None, "text/plain")
    chunks = chunk_document(doc, tokenizer=tokenizer, chunk_tokens=50, overlap=10, identity=IDENTITY)
    assert all(c.token_count <= 50 for c in chunks)
    assert_covers(text, chunks)


def test_long_heading_paths_are_shortened_to_fit(tokenizer: ModelTokenizer, model_view: HFTokenizer) -> None:
    path = tuple(f"Chapter {i} " + "very long title words " * 20 for i in range(6))
    doc = ParsedDocument([TextBlock("body text. " * 400, path)], None, "text/plain")
    chunks = chunk_document(doc, tokenizer=tokenizer, chunk_tokens=254, overlap=32, identity=IDENTITY)
    for chunk in chunks:
        assert chunk.heading_path == path
        assert len(model_view.encode(chunk.embed_text).ids) <= MODEL_MAX_SEQ
        assert chunk.embed_text.startswith("chapter 5".title().split()[0])


# --- properties on arbitrary unicode, CJK included -----------------------------------------

_TEXT = st.text(
    alphabet=st.one_of(
        st.characters(codec="utf-8"),
        st.characters(min_codepoint=0x4E00, max_codepoint=0x9FFF),
        st.sampled_from(list("。！？，、 \n\n.,;")),
    ),
    max_size=1200,
)
_DOC = st.lists(st.tuples(_TEXT, st.lists(st.text(max_size=30), max_size=3)), min_size=1, max_size=4).map(
    lambda items: ParsedDocument(
        [TextBlock(text, (f"S{i}", *titles)) for i, (text, titles) in enumerate(items)], None, "text/plain"
    )
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(doc=_DOC, chunk_tokens=st.integers(8, 254), overlap_share=st.floats(0, 0.5))
def test_property_bound_and_determinism(
    doc: ParsedDocument, chunk_tokens: int, overlap_share: float, tokenizer: ModelTokenizer, model_view: HFTokenizer
) -> None:
    overlap = int(chunk_tokens * overlap_share) if chunk_tokens >= 2 else 0
    overlap = min(overlap, chunk_tokens // 2)
    first = chunk_document(doc, tokenizer=tokenizer, chunk_tokens=chunk_tokens, overlap=overlap, identity=IDENTITY)
    second = chunk_document(doc, tokenizer=tokenizer, chunk_tokens=chunk_tokens, overlap=overlap, identity=IDENTITY)
    assert first == second
    for chunk in first:
        assert chunk.text.strip() == chunk.text and chunk.text
        assert chunk.token_count == tokenizer.count(chunk.embed_text) <= chunk_tokens
        assert len(model_view.encode(chunk.embed_text).ids) <= chunk_tokens + 2
    for block in doc.blocks:
        section = [c for c in first if c.heading_path == block.heading_path]
        target = no_space(block.text)
        if not target:
            assert not section
            continue
        assert section and target.startswith(no_space(section[0].text)) and target.endswith(no_space(section[-1].text))
        assert all(no_space(c.text) in target for c in section)
        if overlap == 0:
            assert no_space("".join(c.text for c in section)) == target


# --- stable boundaries and one tokenization per section (issue #15) ------------------------


def _inserted(text: str, sentence: str, at: float) -> str:
    """``text`` with ``sentence`` inserted after the sentence end nearest to ``at`` (a share of its length)."""
    cut = text.index(". ", int(len(text) * at)) + 2
    return text[:cut] + sentence + " " + text[cut:]


@pytest.mark.parametrize("overlap", [0, 32])
@pytest.mark.parametrize("edit", ["insert", "delete"])
def test_a_local_edit_in_a_long_section_changes_only_nearby_chunks(
    edit: str, overlap: int, tokenizer: ModelTokenizer
) -> None:
    """One sentence inserted (or deleted) in the middle of a section of ~20 chunks: at most 3 chunk
    texts are new, and every other chunk of v2 is a v1 chunk. Fixed windows re-cut the whole rest."""
    text = " ".join(parse_fixture("sotu-1790-washington.txt").blocks[0].text.split() * 3)  # one paragraph
    if edit == "insert":
        edited = _inserted(text, "This sentence was inserted in the second version of the address.", 0.4)
    else:
        start = text.index(". ", int(len(text) * 0.4)) + 2
        edited = text[:start] + text[text.index(". ", start) + 2 :]

    def texts(body: str) -> list[str]:
        doc = ParsedDocument([TextBlock(body, ("Address",))], None, "text/plain")
        return [c.embed_text for c in chunk_document(doc, tokenizer=tokenizer, chunk_tokens=200, overlap=overlap,
                                                     identity=IDENTITY)]

    before, after = texts(text), texts(edited)
    assert len(before) >= 15
    assert len(set(after) - set(before)) <= 3


class CountingTokenizer:
    """The real tokenizer, counting the calls the chunker makes."""

    def __init__(self, inner: ModelTokenizer) -> None:
        self.inner, self.max_content_tokens = inner, inner.max_content_tokens
        self.offsets_calls: list[str] = []
        self.count_calls = 0

    def count(self, text: str) -> int:
        self.count_calls += 1
        return self.inner.count(text)

    def offsets(self, text: str) -> list[tuple[int, int]]:
        self.offsets_calls.append(text)
        return self.inner.offsets(text)


@pytest.mark.parametrize("name", ["sotu-1790-washington.txt", "pep-0257.rst", "debian-reference-excerpt.zh-cn.txt"])
def test_each_section_is_tokenized_once(name: str, tokenizer: ModelTokenizer) -> None:
    """One ``offsets`` call per section, and one ``count`` per heading prefix and per chunk (prose has
    no word-piece fallback); before issue #15 every piece and every overlap was tokenized again."""
    counting = CountingTokenizer(tokenizer)
    doc = parse_fixture(name)
    chunks = chunk_document(doc, tokenizer=counting, identity=IDENTITY)
    sections = {(c.heading_path, c.page) for c in chunks}
    assert len(counting.offsets_calls) == len(sections)
    assert counting.count_calls <= len(chunks) + 2 * len(sections)
    assert chunks == chunk_document(doc, tokenizer=tokenizer, identity=IDENTITY)
