"""``python -m bench.incremental``: v1 of a long document, then v2 with ~1% of chunks changed (see __init__)."""

from __future__ import annotations

import argparse
import os
import random
import re
import shutil
import sys
import tempfile
import time

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

from resources.local_postgres import temporary_server
from sql import queries

CORPUS = Path(__file__).resolve().parents[2].parent / "shared" / "corpus" / "en-sotu"
TENANT, DOCUMENT = "bench", "handbook"
SENTENCES_PER_PARAGRAPH = 4
# Word swaps that keep the word-piece count (checked with the tokenizer before use).
SWAPS = ((" the ", " our "), (" and ", " or "), (" of ", " for "), (" to ", " into "), (" a ", " one "))


def source_paragraphs(count: int) -> list[tuple[str, list[str]]]:
    """(section title, paragraphs) pairs with ``count`` paragraphs in all: SOTU addresses, or generated text."""
    sections: list[tuple[str, list[str]]] = []
    total = 0
    files = sorted(CORPUS.glob("*.txt")) if CORPUS.is_dir() else []
    for path in files:
        sentences = re.split(r"(?<=[.!?])\s+", " ".join(path.read_text(encoding="utf-8").split()))
        paragraphs = [
            " ".join(sentences[i : i + SENTENCES_PER_PARAGRAPH])
            for i in range(0, len(sentences), SENTENCES_PER_PARAGRAPH)
        ]
        paragraphs = [p for p in paragraphs if len(p.split()) >= 20][: count - total]
        title = path.stem.replace("_", " ").title()
        sections.append((title, paragraphs))
        total += len(paragraphs)
        if total >= count:
            return sections
    rng = random.Random(7)
    words = ("policy refund customer invoice period shipping warranty account credit request the and of to a "
             "within days order service support claim payment store").split()
    section = 0
    while total < count:
        section += 1
        n = min(60, count - total)
        paragraphs = [
            " ".join(" ".join(rng.choices(words, k=18)).capitalize() + "." for _ in range(SENTENCES_PER_PARAGRAPH))
            for _ in range(n)
        ]
        sections.append((f"Generated Section {section}", paragraphs))
        total += n
    return sections


def render(sections: list[tuple[str, list[str]]]) -> bytes:
    parts = ["# Handbook\n"]
    for title, paragraphs in sections:
        parts.append(f"## {title}\n")
        parts.extend(p + "\n" for p in paragraphs)
    return "\n".join(parts).encode("utf-8")


def edit(sections: list[tuple[str, list[str]]], paragraphs: int, tokenizer: Any, rng: random.Random) -> int:
    """Change ``paragraphs`` paragraphs in place by one same-length word swap each; returns how many changed."""
    spots = [(s, p) for s, (_, ps) in enumerate(sections) for p in range(len(ps))]
    rng.shuffle(spots)
    changed = 0
    for s, p in spots:
        if changed >= paragraphs:
            break
        text = sections[s][1][p]
        for old, new in SWAPS:
            if old in text:
                candidate = text.replace(old, new, 1)
                if tokenizer.count(candidate) == tokenizer.count(text):
                    sections[s][1][p] = candidate
                    changed += 1
                    break
    return changed


@dataclass
class VersionRun:
    version: int
    chunks: int = 0
    embedded: int = 0
    reused: int = 0
    calls: int = 0
    seconds: dict[str, float] = field(default_factory=dict)

    @property
    def wall(self) -> float:
        return sum(self.seconds.values())


def index_version(db: Any, publisher: Any, queue: Any, embedder: Any, tokenizer: Any, data: bytes,
                  batch_size: int) -> VersionRun:
    """Publish ``data`` as the next version and index it through the real path; time every stage."""
    from pipelines.domain.chunking import VersionIdentity, chunk_document
    from pipelines.domain.parsing import parse_document
    from resources.embedding_reuse import embed_with_reuse
    from resources.index_sink import IndexSink

    seconds: dict[str, float] = {}
    started = time.perf_counter()
    published = publisher.publish(TENANT, DOCUMENT, data, "handbook.md")
    (task,) = queue.claim("bench", limit=1)
    lease = task.lease
    profile = db.fetch_one("index_profile_get", {"name": task.profile})
    seconds["publish+claim"] = time.perf_counter() - started

    started = time.perf_counter()
    parsed = parse_document(publisher.blobs.get(published.content_hash), filename="handbook.md", media_type=None)
    seconds["parse"] = time.perf_counter() - started

    started = time.perf_counter()
    chunks = chunk_document(
        parsed,
        tokenizer=tokenizer,
        chunk_tokens=profile["chunk_tokens"],
        overlap=profile["chunk_overlap"],
        identity=VersionIdentity(TENANT, DOCUMENT, task.version_number, task.profile),
    )
    seconds["chunk"] = time.perf_counter() - started

    started = time.perf_counter()
    holder = {"lease": lease}

    def on_batch(done: int, total: int) -> None:
        holder["lease"] = queue.heartbeat(holder["lease"])

    vectors, stats = embed_with_reuse(
        db, embedder, tenant_id=TENANT, profile=task.profile, model=profile["model"], dimension=profile["dimension"],
        texts=[c.embed_text for c in chunks], batch_size=batch_size, on_batch=on_batch,
    )
    seconds["embed"] = time.perf_counter() - started

    started = time.perf_counter()
    outcome = IndexSink(db, queue).publish(holder["lease"], chunks, vectors)
    assert not outcome.superseded and outcome.chunk_count == len(chunks)
    seconds["index publish"] = time.perf_counter() - started
    return VersionRun(task.version_number, len(chunks), stats.embedded, stats.reused, stats.calls, seconds)


def run(url: str, *, paragraphs: int, change: float, model: str | None, batch_size: int,
        out: Any = print) -> tuple[VersionRun, VersionRun, int]:
    """Index v1 and v2 on the migrated database at ``url``; returns both runs and the paragraphs edited."""
    from resources.blob_store import BlobStore
    from resources.database import Database
    from resources.embedder import embedder_for_model
    from resources.migrations import migrate
    from resources.publisher import Publisher
    from resources.task_queue import TaskQueue
    from resources.tokenizer import ModelTokenizer

    migrate(url)
    with psycopg.connect(url, autocommit=True) as conn:
        if model is not None:
            conn.execute(queries["bench_set_active_model"], {"model": model})
        (active_model,) = conn.execute(queries["bench_active_model"]).fetchone()
    embedder = embedder_for_model(active_model, batch_size=batch_size)
    tokenizer = ModelTokenizer()
    started = time.perf_counter()
    _ = embedder.dimension, embedder.embed(["warm up"])  # load the model before timing anything
    out(f"model {active_model} loaded in {time.perf_counter() - started:.1f}s")

    sections = source_paragraphs(paragraphs)
    blobs = tempfile.mkdtemp(prefix="kbindex-bench-blobs-")
    db = Database(url, max_size=4)
    try:
        publisher = Publisher(db, BlobStore(blobs))
        queue = TaskQueue(db, lease_seconds=300)
        v1 = index_version(db, publisher, queue, embedder, tokenizer, render(sections), batch_size)
        # an edited paragraph changes one chunk, or two when the edit falls in an overlap
        wanted = max(1, round(change * v1.chunks))
        edited = edit(sections, wanted, tokenizer, random.Random(11))
        v2 = index_version(db, publisher, queue, embedder, tokenizer, render(sections), batch_size)
    finally:
        db.close()
        shutil.rmtree(blobs, ignore_errors=True)
    return v1, v2, edited


def report(v1: VersionRun, v2: VersionRun, edited: int, paragraphs: int, out: Any = print) -> bool:
    for r in (v1, v2):
        stages = ", ".join(f"{k} {v:.2f}s" for k, v in r.seconds.items())
        out(f"v{r.version}: {r.chunks} chunks, embedded {r.embedded} ({r.calls} calls), reused {r.reused}; "
            f"wall {r.wall:.2f}s ({stages})")
    text_ratio = v2.embedded / max(1, v1.embedded)
    time_ratio = v2.wall / max(1e-9, v1.wall)
    out(f"v2 edited {edited} of {paragraphs} paragraphs -> {v2.embedded} of {v2.chunks} chunks changed "
        f"({100 * v2.embedded / max(1, v2.chunks):.1f}%)")
    out(f"v2 / v1: texts embedded {100 * text_ratio:.1f}% (target <= 5%), wall time {100 * time_ratio:.1f}% "
        f"(target <= 15%)")
    return text_ratio <= 0.05 and time_ratio <= 0.15


PEPS = CORPUS.parent / "en-peps"


def edit_kinds(paragraphs: int, change: float, peps: int, out: Any = print) -> bool:
    """Re-embed share per edit kind, fixed windows (before) beside content-defined cuts (now); no database.

    Documents: the bench's handbook (4-sentence paragraphs), the same text with no blank lines (each
    section one block, so the chunker sees only sentences), and ``peps`` real PEPs (if the corpus is here).
    """
    from bench.incremental import edits
    from resources.tokenizer import ModelTokenizer

    tokenizer = ModelTokenizer()
    chunkers = edits.chunkers(tokenizer, chunk_tokens=200, overlap=32)  # the default profile's parameters
    sections = source_paragraphs(paragraphs)
    wrapped = "# Handbook\n\n" + "\n\n".join(f"## {t}\n\n" + "\n".join(ps) for t, ps in sections) + "\n"
    corpora = [("handbook, one paragraph per block", [("handbook.md", render(sections).decode())], "\n\n"),
               ("handbook, no blank lines", [("handbook.md", wrapped)], "\n")]
    files = sorted(PEPS.glob("pep-*.rst"))[:peps] if PEPS.is_dir() else []
    if files:
        corpora.append((f"{len(files)} PEPs", [(p.name, p.read_text(encoding="utf-8")) for p in files], "\n\n"))
    ok = True
    for label, documents, separator in corpora:
        total = sum(len(text.split(separator)) for _, text in documents)
        k = max(1, round(change * total))
        out(f"\n{label}: {k} paragraphs edited per kind (chunk_tokens 200, overlap 32)")
        figures = [f for kind in edits.KINDS
                   for f in edits.measure(documents, kind, k, chunkers, tokenizer, separator=separator)]
        ok = edits.report(figures, out) and ok
    out("text % = paragraphs (blank-line blocks) touched; re-embed % = v2's distinct chunk texts no v1 chunk had; "
        "per edit = those texts per paragraph edited; ratio = re-embed % / text % (target <= 2)")
    return ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.incremental", description=__doc__)
    parser.add_argument("--paragraphs", type=int, default=1500, help="paragraphs in the document (default 1500)")
    parser.add_argument("--edit-kinds", action="store_true",
                        help="only the re-embed share per edit kind, old chunker beside new (no database, no model)")
    parser.add_argument("--peps", type=int, default=150, help="PEPs measured by --edit-kinds (default 150)")
    parser.add_argument("--change", type=float, default=0.01, help="fraction of chunks to change in v2")
    parser.add_argument("--model", default=None, help="profile model to use (default: the packaged MiniLM)")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--database-url", default=None, help="an existing server database instead of an embedded one")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    if args.edit_kinds:
        return 0 if edit_kinds(args.paragraphs, args.change, args.peps) else 1
    if args.database_url:
        v1, v2, edited = run(args.database_url, paragraphs=args.paragraphs, change=args.change, model=args.model,
                             batch_size=args.batch_size)
    else:
        with temporary_server("kbindex-bench-incremental-") as admin_url:
            v1, v2, edited = run(admin_url, paragraphs=args.paragraphs, change=args.change, model=args.model,
                                 batch_size=args.batch_size)
    ok = report(v1, v2, edited, args.paragraphs)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
