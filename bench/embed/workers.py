"""The spawned processes of bench.embed (a module of its own: spawn children cannot import ``python -m``'s
``__main__``)."""

from __future__ import annotations

import os
import time
from typing import Any

from resources.embedder import PACKAGED_MODEL_NAME, DEFAULT_BATCH_SIZE


def make_embedder(model: str, home: str, threads: int | None) -> Any:
    """The embedder a profile of ``model`` gets, its runtime limited to ``threads`` (None: all cores)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    if model == PACKAGED_MODEL_NAME:
        import torch

        from resources.embedder import SentenceTransformerEmbedder

        if threads:
            torch.set_num_threads(threads)
        return SentenceTransformerEmbedder(batch_size=DEFAULT_BATCH_SIZE)
    from resources.derived_models import DerivedModelEmbedder

    return DerivedModelEmbedder(model, home=home, batch_size=DEFAULT_BATCH_SIZE, threads=threads)


def encode_worker(model: str, home: str, threads: int, texts: list[str], barrier: Any, results: Any) -> None:
    """Load and warm up, wait for the other processes, embed ``texts``, report the seconds it took."""
    embedder = make_embedder(model, home, threads)
    embedder.embed(texts[:8])
    barrier.wait(timeout=1800)
    started = time.perf_counter()
    embedder.embed(texts)
    results.put(time.perf_counter() - started)


def throughput(model: str, home: str, texts: list[str], processes: int, threads: int) -> float:
    """Chunks/s of ``processes`` fresh processes of ``threads`` threads each, sharing ``texts`` evenly."""
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(processes), ctx.Queue()
    workers = [ctx.Process(target=encode_worker, args=(model, home, threads, texts[i::processes], barrier, results))
               for i in range(processes)]
    for worker in workers:
        worker.start()
    try:
        seconds = max(_result(results, workers) for _ in workers)
    finally:
        for worker in workers:
            worker.join(timeout=60)
            if worker.is_alive():
                worker.terminate()
    return len(texts) / seconds if seconds > 0 else 0.0


def _result(results: Any, workers: list[Any]) -> float:
    """The next worker's seconds; RuntimeError as soon as a worker died without reporting."""
    import queue

    while True:
        try:
            return float(results.get(timeout=1.0))
        except queue.Empty:
            if any(w.exitcode not in (None, 0) for w in workers):
                raise RuntimeError("an embedding worker process failed (see its traceback above)") from None
