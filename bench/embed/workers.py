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
    """Load and warm up, wait for the other processes, embed ``texts``, report the seconds it took and
    the CPU seconds it spent doing so (all its threads)."""
    embedder = make_embedder(model, home, threads)
    embedder.embed(texts[:8])
    barrier.wait(timeout=1800)
    started, cpu = time.perf_counter(), time.process_time()
    embedder.embed(texts)
    results.put((time.perf_counter() - started, time.process_time() - cpu))


def throughput(model: str, home: str, texts: list[str], processes: int, threads: int) -> float:
    """Chunks/s of ``processes`` fresh processes of ``threads`` threads each, sharing ``texts`` evenly."""
    seconds, _ = encode_in_processes(model, home, texts, processes, threads)
    return len(texts) / seconds if seconds > 0 else 0.0


def encode_in_processes(model: str, home: str, texts: list[str], processes: int, threads: int) -> tuple[float, float]:
    """Wall seconds of the slowest of ``processes`` workers sharing ``texts``, and the CPU seconds of all of them."""
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(processes), ctx.Queue()
    workers = [ctx.Process(target=encode_worker, args=(model, home, threads, texts[i::processes], barrier, results))
               for i in range(processes)]
    for worker in workers:
        worker.start()
    try:
        measured = [_result(results, workers) for _ in workers]
    finally:
        for worker in workers:
            worker.join(timeout=60)
            if worker.is_alive():
                worker.terminate()
    return max(wall for wall, _ in measured), sum(cpu for _, cpu in measured)


def _result(results: Any, workers: list[Any]) -> tuple[float, float]:
    """The next worker's (seconds, CPU seconds); RuntimeError as soon as a worker died without reporting."""
    import queue

    while True:
        try:
            wall, cpu = results.get(timeout=1.0)
            return float(wall), float(cpu)
        except queue.Empty:
            if any(w.exitcode not in (None, 0) for w in workers):
                raise RuntimeError("an embedding worker process failed (see its traceback above)") from None
