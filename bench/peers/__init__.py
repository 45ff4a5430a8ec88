"""``python -m bench.peers``: kbindex side by side with an in-process LlamaIndex ``IngestionPipeline``.

Same files (``bench.pipeline.select_documents``), same model (the packaged all-MiniLM-L6-v2), same chunk
size in the same word pieces (the default profile's 200 tokens, 32 overlap). Three rounds on each side:

1. first run: LlamaIndex's texts/s and chunks/s, against bare ``model.encode`` of exactly the distinct
   texts LlamaIndex embedded, measured in the same process right after (``bench.pipeline.bare``);
2. re-run of the same documents: how many texts each side embeds again;
3. edit: one sentence inserted in the middle of one paragraph of 10% of the documents: texts re-embedded,
   beside the share of text that changed.

kbindex's rounds go through the real indexing code (``IndexingRun``) on a scratch database
(``bench/peers/kbindex.py``); its first-run speed through Dagster is ``bench.pipeline``'s figure, and
``python -m bench.pipeline --peers`` prints both ratios from one run. LlamaIndex is an optional extra:
``pip install -e '.[peers]'``.
"""

from __future__ import annotations

import random
import re
import time
from collections.abc import Callable
from typing import Any

DEFAULT_CHUNK_TOKENS = 200
DEFAULT_CHUNK_OVERLAP = 32
"""The default profile minilm-v1 (sql/migrations/0001_initial.sql); tests check they still match."""

EDIT_SHARE = 0.10
INSTALL_HINT = "pip install -e '.[peers]'"
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")

Out = Callable[[str], None]


class PeersUnavailable(Exception):
    """LlamaIndex is not installed: the bench is skipped, not failed."""


def load_llama() -> Any:
    """The LlamaIndex side's module, or PeersUnavailable naming the install command."""
    try:
        from bench.peers import llama
    except ImportError as exc:
        if not (exc.name or "").startswith("llama_index"):
            raise
        raise PeersUnavailable(f"LlamaIndex is not installed ({exc.name}): {INSTALL_HINT}") from exc
    return llama


# --------------------------------------------------------------------------------------------------
# the edit


def _is_prose(paragraph: str) -> bool:
    """Running text ending a sentence (not a heading, field list, table, code or indented block)."""
    first = paragraph.lstrip("\n")[:1]
    return (bool(first) and not first.isspace() and first not in "#.:|=-*+`>"
            and len(paragraph.split()) >= 12 and paragraph.rstrip()[-1:] in ".!?")


def insert_sentence(name: str, text: str) -> tuple[str, int] | None:
    """``text`` with one new sentence in the middle of its middle prose paragraph; (new text, characters
    inserted), or None if it has no prose paragraph. Every other character, line breaks included, stays."""
    paragraphs = text.split("\n\n")
    prose = [i for i, p in enumerate(paragraphs) if _is_prose(p)]
    if not prose:
        return None
    i = prose[len(prose) // 2]
    body = paragraphs[i].rstrip()
    ends = [m.end() for m in _SENTENCE_END.finditer(body)] or [len(body)]  # one sentence: after it
    at = ends[len(ends) // 2]
    added = f"This sentence was added to {name} in its second version."
    piece = f" {added}" if at == len(body) else f"{added} "
    paragraphs[i] = paragraphs[i][:at] + piece + paragraphs[i][at:]
    return "\n\n".join(paragraphs), len(piece)


def edit_documents(documents: list[tuple[str, str]], share: float = EDIT_SHARE,
                   seed: int = 11) -> tuple[list[tuple[str, str]], dict[str, Any]]:
    """One inserted sentence in ``share`` of the documents (seeded pick); the edited list and what changed."""
    wanted = max(1, round(share * len(documents)))
    order = random.Random(seed).sample(range(len(documents)), len(documents))
    edited = list(documents)
    names: list[str] = []
    inserted = 0
    for i in order:
        if len(names) >= wanted:
            break
        name, text = documents[i]
        result = insert_sentence(name, text)
        if result is not None:
            edited[i] = (name, result[0])
            names.append(name)
            inserted += result[1]
    paragraphs = sum(len(text.split("\n\n")) for _, text in documents)
    chars = sum(len(text) for _, text in documents)
    return edited, {"docs": len(documents), "docs_edited": len(names), "edited": names,
                    "paragraph_share": round(len(names) / max(1, paragraphs), 5),
                    "char_share": round(inserted / max(1, chars), 5)}


# --------------------------------------------------------------------------------------------------
# the bench


def run(
    documents: list[tuple[str, bytes]],
    *,
    batch_size: int = 64,
    edit_share: float = EDIT_SHARE,
    bare_parallel: bool = True,
    kbindex: bool = True,
    kbindex_model: str | None = None,
    database_url: str | None = None,
    out: Out = print,
) -> dict[str, Any]:
    """Every round on both sides; the report ``render`` prints. Raises PeersUnavailable without LlamaIndex.

    ``documents``: (file name, bytes), e.g. bench.pipeline's own list. ``kbindex_model``: the scratch
    profile's model (default: the packaged one; ``fake-384`` gives the same counts cheaply).
    ``database_url``: a migrated database to use instead of a scratch one.
    """
    import os

    from bench.pipeline.bare import bare_encode, bare_encode_parallel
    from resources.embedder import PACKAGED_MODEL_NAME, packaged_model_path

    llama = load_llama()
    texts = [(name, data.decode("utf-8", errors="replace")) for name, data in documents]
    report: dict[str, Any] = {"docs": len(documents), "chunk_tokens": DEFAULT_CHUNK_TOKENS,
                              "chunk_overlap": DEFAULT_CHUNK_OVERLAP, "batch_size": batch_size,
                              "model": PACKAGED_MODEL_NAME}
    pipeline = llama.LlamaPipeline(model_path=str(packaged_model_path()), chunk_tokens=DEFAULT_CHUNK_TOKENS,
                                   overlap=DEFAULT_CHUNK_OVERLAP, batch_size=batch_size)
    out(f"LlamaIndex: model loaded in {pipeline.load_seconds:.1f} s; first run on {len(texts)} documents…")
    first = pipeline.ingest(texts)
    distinct = list(dict.fromkeys(first.pop("texts")))
    seconds = first["seconds"]
    first["texts_per_second"] = round(len(distinct) / seconds, 2) if seconds else 0.0
    first["chunks_per_second"] = round(first["nodes"] / seconds, 2) if seconds else 0.0
    report["llama"] = first

    out(f"bare model.encode on the {len(distinct)} distinct texts LlamaIndex embedded…")
    report["bare_one_process"] = bare_encode(distinct, PACKAGED_MODEL_NAME, batch_size)
    if bare_parallel:
        report["bare_processes"] = bare_encode_parallel(distinct, PACKAGED_MODEL_NAME, batch_size,
                                                        os.cpu_count() or 1)
    bares = [b for b in (report["bare_one_process"], report.get("bare_processes")) if b]
    best = max(b["chunks_per_second"] for b in bares)
    one = report["bare_one_process"]["chunks_per_second"]

    def ratio(rate: float, bare: float) -> float | None:
        return round(rate / bare, 3) if bare else None

    report["ratio"] = ratio(first["texts_per_second"], best)
    report["ratio_vs_one_process"] = ratio(first["texts_per_second"], one)
    # LlamaIndex embeds duplicate texts again; counting every text it embedded shows its overhead alone.
    report["ratio_all_embedded"] = ratio(first["embedded"] / seconds if seconds else 0.0, best)

    out("LlamaIndex: re-run on the same documents, then the edit…")
    rerun = pipeline.ingest(texts)
    rerun.pop("texts")
    edited, edit = edit_documents(texts, edit_share)
    after_edit = pipeline.ingest(edited)
    after_edit.pop("texts")
    after_edit["share_of_first"] = round(after_edit["embedded"] / max(1, first["embedded"]), 4)
    report["rerun"] = {"llama": rerun}
    report["edit"] = {**edit, "llama": after_edit}

    if kbindex:
        rounds = kbindex_rounds(documents, texts, edited, model=kbindex_model, batch_size=batch_size,
                                database_url=database_url, out=out)
        report["kbindex_first"] = rounds["first"]
        report["rerun"]["kbindex"] = rounds["rerun"]
        report["edit"]["kbindex"] = rounds["edit"]
    return report


def kbindex_rounds(documents: list[tuple[str, bytes]], texts: list[tuple[str, str]], edited: list[tuple[str, str]],
                   *, model: str | None, batch_size: int, database_url: str | None, out: Out) -> dict[str, Any]:
    """The same three rounds through kbindex's IndexingRun: {"first", "rerun", "edit"} counts and seconds."""
    from contextlib import nullcontext

    from bench.peers.kbindex import KbindexRounds, scratch_database

    # Unedited documents keep their original bytes (a lossy decode must not make a new version).
    edited_bytes = [(name, data if new == old else new.encode("utf-8"))
                    for (name, data), (_, old), (_, new) in zip(documents, texts, edited, strict=True)]
    started = time.perf_counter()
    with (nullcontext(database_url) if database_url else scratch_database()) as url:
        rounds = KbindexRounds(url, model=model, batch_size=batch_size)
        try:
            out(f"kbindex: model {rounds.profile['model']} ready in {time.perf_counter() - started:.1f} s; "
                "first run through IndexingRun…")
            first = rounds.round(documents)
            out("kbindex: re-run (identical bytes), then the edit…")
            rerun = rounds.round(documents)
            after_edit = rounds.round(edited_bytes)
        finally:
            rounds.close()
    after_edit["share_of_first"] = round(after_edit["embedded"] / max(1, first["embedded"]), 4)
    return {"first": {**first, "model": rounds.profile["model"]}, "rerun": rerun, "edit": after_edit}


def render(report: dict[str, Any]) -> str:
    """The report as lines: first-run speed against bare encode, then re-run and edit embeds per side."""
    first, one, edit = report["llama"], report["bare_one_process"], report["edit"]
    lines = [
        f"LlamaIndex IngestionPipeline: {report['docs']} docs, model {report['model']}, SentenceSplitter "
        f"{report['chunk_tokens']}/{report['chunk_overlap']} word pieces, embed batch {report['batch_size']}",
        f"first run            {first['nodes']} nodes, {first['embedded']} texts embedded "
        f"({first['distinct_embedded']} distinct) in {first['seconds']:.1f} s: "
        f"{first['chunks_per_second']:.1f} chunks/s, {first['texts_per_second']:.1f} distinct texts/s",
        *(f"bare model.encode    {b['chunks_per_second']:.1f} chunks/s ({b['chunks']} distinct texts in "
          f"{b['seconds']:.1f} s, {b.get('processes', 1)} process(es) x {b['threads']} thread(s))"
          for b in (one, report.get("bare_processes")) if b),
        f"ratio LlamaIndex/bare {report['ratio']}  (distinct texts/s vs the faster bare setup; "
        f"vs one process: {report['ratio_vs_one_process']}; counting all {first['embedded']} texts it embedded, "
        f"duplicates too: {report['ratio_all_embedded']})",
    ]
    if "kbindex_first" in report:
        k = report["kbindex_first"]
        lines.append(f"kbindex first run    {k['tasks']} tasks, {k['chunks']} chunks, embedded {k['embedded']}, "
                     f"reused {k['reused']}, shared {k['shared']} in {k['seconds']:.1f} s (IndexingRun, no Dagster; "
                     f"model {k['model']})")
    lines.append(f"re-run (same docs)   texts embedded: LlamaIndex {report['rerun']['llama']['embedded']}"
                 + (f", kbindex {report['rerun']['kbindex']['embedded']} ({report['rerun']['kbindex']['tasks']} tasks)"
                    if "kbindex" in report["rerun"] else ""))
    changed = (f"edit                 one sentence inserted in {edit['docs_edited']} of {edit['docs']} docs: "
               f"{100 * edit['paragraph_share']:.2f}% of paragraphs, {100 * edit['char_share']:.3f}% of characters")
    lines.append(changed)
    for side in ("llama", "kbindex"):
        if side in edit:
            e = edit[side]
            label = "LlamaIndex" if side == "llama" else "kbindex"
            lines.append(f"  {label:<18} re-embedded {e['embedded']} texts = {100 * e['share_of_first']:.2f}% of its "
                         f"first run" + (f" (reused {e['reused']}, shared {e['shared']})" if side == "kbindex" else
                                         f" ({e['nodes']} nodes of the edited docs)"))
    return "\n".join(lines)
