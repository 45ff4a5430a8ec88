"""Bare ``model.encode`` speed on the pipeline's own chunk texts: the yardstick of bench.pipeline.

In a module of its own so that the worker processes of ``bare_encode_parallel`` (spawned) can import
the function they run (they cannot find it in ``python -m``'s ``__main__``).
"""

from __future__ import annotations

import sys
import time
from typing import Any


def bare_encode(texts: list[str], model: str, batch_size: int) -> dict[str, Any]:
    """Chunks/s of the model alone on ``texts`` (model loaded and warmed up first, not timed)."""
    from resources.embedder import FakeEmbedder, SentenceTransformerEmbedder

    if model.startswith("fake-"):
        fake = FakeEmbedder(model_name=model)
        encode = fake.embed
    else:
        st = SentenceTransformerEmbedder(batch_size=batch_size).model
        st.encode(texts[:batch_size], batch_size=batch_size)

        def encode(batch: list[str]) -> Any:
            return st.encode(batch, batch_size=batch_size, normalize_embeddings=True, convert_to_numpy=True,
                             show_progress_bar=False)

    started = time.perf_counter()
    encode(texts)
    seconds = time.perf_counter() - started
    threads = None
    if "torch" in sys.modules:
        threads = sys.modules["torch"].get_num_threads()
    return {"chunks": len(texts), "seconds": round(seconds, 2),
            "chunks_per_second": round(len(texts) / seconds, 2) if seconds else 0.0, "torch_threads": threads}


def _bare_worker(texts: list[str], batch_size: int, barrier: Any, results: Any) -> None:
    """One process of ``bare_encode_parallel``: load and warm up, wait for the others, encode, report seconds."""
    import torch

    from resources.embedder import SentenceTransformerEmbedder

    torch.set_num_threads(1)
    st = SentenceTransformerEmbedder(batch_size=batch_size).model
    st.encode(texts[:batch_size], batch_size=batch_size)
    barrier.wait()
    started = time.perf_counter()
    st.encode(texts, batch_size=batch_size, normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False)
    results.put(time.perf_counter() - started)


def bare_encode_parallel(texts: list[str], model: str, batch_size: int, processes: int) -> dict[str, Any] | None:
    """Chunks/s of ``processes`` model processes with one torch thread each, the texts dealt out evenly.

    The other way to spend the cores on the model alone: on 2 cores it beats one process with two
    threads, so the bench reports both and takes the faster one as "bare" (the stricter ratio).
    """
    if model.startswith("fake-") or processes < 2 or len(texts) < processes:
        return None
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(processes), ctx.Queue()
    workers = [ctx.Process(target=_bare_worker, args=(texts[i::processes], batch_size, barrier, results))
               for i in range(processes)]
    for w in workers:
        w.start()
    seconds = max(results.get(timeout=7200) for _ in workers)
    for w in workers:
        w.join()
    return {"chunks": len(texts), "seconds": round(seconds, 2), "processes": processes,
            "chunks_per_second": round(len(texts) / seconds, 2) if seconds else 0.0, "torch_threads": 1}
