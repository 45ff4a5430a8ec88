"""Context in chunks (issue #35): a context profile embeds title + heading path + text; the text shown is the same."""

from __future__ import annotations

import pytest

from pipelines.domain.chunking import VersionIdentity, chunk_document, document_title
from pipelines.domain.parsing import ParsedDocument, TextBlock, parse_document
from resources.tokenizer import ModelTokenizer

IDENTITY = VersionIdentity("acme", "refunds", 1, "ctx")
BODY = "Customers may return goods within thirty days of delivery. " * 12


@pytest.fixture(scope="module")
def tokenizer() -> ModelTokenizer:
    return ModelTokenizer()


def doc(*blocks: tuple[str, tuple[str, ...]], metadata: dict | None = None) -> ParsedDocument:
    return ParsedDocument([TextBlock(text, path) for text, path in blocks], None, "text/plain",
                          metadata=metadata or {})


def test_a_context_chunk_embeds_title_and_headings_and_shows_the_same_text(tokenizer: ModelTokenizer) -> None:
    parsed = doc((BODY, ("Eligibility", "Goods")))
    plain = chunk_document(parsed, tokenizer=tokenizer, chunk_tokens=64, overlap=0, identity=IDENTITY)
    ctx = chunk_document(parsed, tokenizer=tokenizer, chunk_tokens=64, overlap=0, identity=IDENTITY,
                         title="Refund policy")
    assert plain[0].embed_text.startswith("Eligibility > Goods\n")
    assert all(c.embed_text == "Refund policy > Eligibility > Goods\n" + c.text for c in ctx)
    assert all(c.token_count <= 64 and c.token_count == tokenizer.count(c.embed_text) for c in ctx)
    # The shown text, ids and content digests do not depend on the flag (the prefix may move the cuts,
    # so compare where the chunking is the same: a budget-free view of the same paragraph).
    short = doc(("One short paragraph.", ("Eligibility",)))
    a = chunk_document(short, tokenizer=tokenizer, identity=IDENTITY)
    b = chunk_document(short, tokenizer=tokenizer, identity=IDENTITY, title="Refund policy")
    assert [(c.text, c.chunk_id, c.content_digest) for c in a] == [(c.text, c.chunk_id, c.content_digest) for c in b]
    assert a[0].embed_text != b[0].embed_text == "Refund policy > Eligibility\nOne short paragraph."


def test_the_title_is_not_repeated_when_the_heading_path_starts_with_it(tokenizer: ModelTokenizer) -> None:
    parsed = doc(("Text.", ("Refund Policy", "Scope")), ("More.", ("Refund Policy",)))
    chunks = chunk_document(parsed, tokenizer=tokenizer, identity=IDENTITY, title="refund policy")
    assert [c.embed_text for c in chunks] == ["refund policy > Scope\nText.", "refund policy\nMore."]


def test_no_headings_and_a_title_give_the_title_line(tokenizer: ModelTokenizer) -> None:
    chunks = chunk_document(doc(("Text.", ())), tokenizer=tokenizer, identity=IDENTITY, title="Handbook")
    assert chunks[0].embed_text == "Handbook\nText."
    empty = chunk_document(doc(("Text.", ())), tokenizer=tokenizer, identity=IDENTITY, title="  ")
    assert empty[0].embed_text == "Text."  # a blank title adds nothing


def test_a_long_title_is_cut_and_kept_while_outer_headings_go_first(tokenizer: ModelTokenizer) -> None:
    title = "An extraordinarily long document title " * 10
    path = tuple(f"Section heading number {i}" for i in range(8))
    chunks = chunk_document(doc((BODY, path)), tokenizer=tokenizer, chunk_tokens=80, overlap=0, identity=IDENTITY,
                            title=title)
    prefix = chunks[0].embed_text.split("\n", 1)[0]
    first = prefix.split(" > ")[0]
    assert title.startswith(first) and tokenizer.count(first) <= 80 // 8
    assert prefix.endswith("Section heading number 7")  # the innermost heading is kept
    assert tokenizer.count(prefix + "\n") <= 80 // 4 + 1 and all(c.token_count <= 80 for c in chunks)
    # A long title that is also the lone top heading is cut, and still not repeated.
    again = chunk_document(doc((BODY, (title.strip(), "Scope"))), tokenizer=tokenizer, chunk_tokens=80, overlap=0,
                           identity=IDENTITY, title=title)
    assert again[0].embed_text.split("\n", 1)[0] == f"{first} > Scope"


def test_document_title_prefers_the_parsers_then_a_lone_top_heading_then_the_file_name() -> None:
    assert document_title(doc(("x", ("A",))), "f.md") == "A"
    assert document_title(doc(("x", ("A",)), ("y", ("B",))), "refund_policy.v2.txt") == "refund policy.v2"
    assert document_title(doc(("x", ("A",)), ("y", ())), "dir/Handbook.docx") == "Handbook"
    assert document_title(doc(("x", ("A",)), metadata={"title": " The  Title "}), "f.html") == "The Title"
    assert document_title(doc(("x", ())), ".profile") == ".profile"


def test_html_title_is_the_documents_title() -> None:
    html = b"<html><head><title>Travel\nexpenses</title></head><body><h1>Scope</h1><p>Trains.</p>" \
           b"<h1>Limits</h1><p>Hotels.</p></body></html>"
    parsed = parse_document(html, filename="page.html")
    assert parsed.metadata["title"] == "Travel expenses"
    assert document_title(parsed, "page.html") == "Travel expenses"
    assert "Travel" not in " ".join(b.text for b in parsed.blocks)  # the title is no block of text


# The lexical side of context (issue #35): a context profile's lexical rows read title + heading path + text.

def test_a_context_chunk_keeps_the_whole_title_and_a_plain_one_none(tokenizer: ModelTokenizer) -> None:
    title = "An extraordinarily long document title " * 10
    parsed = doc((BODY, ("Eligibility",)))
    ctx = chunk_document(parsed, tokenizer=tokenizer, chunk_tokens=80, overlap=0, identity=IDENTITY, title=title)
    assert {c.context_title for c in ctx} == {" ".join(title.split())}  # whole: only the embedding is cut short
    assert not ctx[0].embed_text.startswith(" ".join(title.split()))
    plain = chunk_document(parsed, tokenizer=tokenizer, chunk_tokens=80, overlap=0, identity=IDENTITY)
    assert {c.context_title for c in plain} == {None}
    blank = chunk_document(parsed, tokenizer=tokenizer, identity=IDENTITY, title="  ")
    assert {c.context_title for c in blank} == {None}


def test_lexical_text_puts_the_title_first_and_does_not_repeat_it() -> None:
    from resources.lexical import lexical_text

    assert lexical_text(("Eligibility", "Goods"), "Text.", "Refund  policy") == (
        "Refund policy\nEligibility\nGoods\nText.")
    assert lexical_text(("refund POLICY", "Scope"), "Text.", "Refund policy") == "Refund policy\nScope\nText."
    assert lexical_text((), "Text.", "Handbook") == "Handbook\nText."


def old_lexical_text(heading_path: tuple[str, ...], text: str) -> str:
    """What every profile's lexical rows read before the title reached them (kept to prove nothing moved)."""
    return "\n".join([*heading_path, text]) if heading_path else text


@pytest.mark.parametrize("analyzer", ["english", "wordpiece"])
def test_rows_without_a_title_are_byte_for_byte_what_they_were(tokenizer: ModelTokenizer, analyzer: str) -> None:
    from resources.lexical import analyzer_for, lexical_rows, lexical_text

    analyze = analyzer_for("all-MiniLM-L6-v2", analyzer)
    parsed = doc((BODY, ("Eligibility", "Goods")), ("Refunds are paid in five days.", ()), ("More.", ("Scope",)))
    plain = chunk_document(parsed, tokenizer=tokenizer, chunk_tokens=64, overlap=8, identity=IDENTITY)
    for title in (None, ""):
        assert [lexical_text(c.heading_path, c.text, title) for c in plain] == [
            old_lexical_text(c.heading_path, c.text) for c in plain]
    rows = lexical_rows(plain, analyze)
    expected = [analyze(old_lexical_text(c.heading_path, c.text)) for c in plain]
    assert rows["terms"] == ["{" + ",".join(map(str, sorted(e))) + "}" for e in expected]
    assert rows["tfs"] == ["{" + ",".join(str(e[t]) for t in sorted(e)) + "}" for e in expected]
    assert rows["lengths"] == [sum(e.values()) for e in expected]
    # The same chunks under a context profile: the title's terms are added to every row, nothing else moves.
    ctx = chunk_document(parsed, tokenizer=tokenizer, chunk_tokens=64, overlap=8, identity=IDENTITY,
                         title="Zebra handbook")
    titled = lexical_rows(ctx, analyze)
    extra = analyze("Zebra handbook")
    assert titled["lengths"] == [sum(analyze(old_lexical_text(c.heading_path, c.text)).values())
                                 + sum(extra.values()) for c in ctx]
