"""Bare encode speed of the pipeline's model on the pipeline's own chunk texts: the yardstick of bench.pipeline.

The same backend as the pipeline's profile (torch, or a derived ONNX/OpenVINO/int8 model: issue #15 asks
for the ratio against the fastest bare setup *of the same backend*), through the embedders bench.embed
measures (bench/embed/workers.py). In a module of its own so that the worker processes of
``bare_encode_parallel`` (spawned) can import what they run.
"""

from __future__ import annotations

import sys
import time
from typing import Any


def _home() -> str:
    from resources.settings import Settings

    return str(Settings.from_env().home)


def bare_encode(texts: list[str], model: str, batch_size: int) -> dict[str, Any]:
    """Chunks/s of the model alone on ``texts`` in this process, all cores (loaded and warmed up first, not timed)."""
    from resources.embedder import FakeEmbedder

    if model.startswith("fake-"):
        encode = FakeEmbedder(model_name=model).embed
    else:
        from bench.embed.workers import make_embedder

        embedder = make_embedder(model, _home(), None)
        embedder.embed(texts[:batch_size])
        encode = embedder.embed
    started, cpu = time.perf_counter(), time.process_time()
    encode(texts)
    seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
    threads = sys.modules["torch"].get_num_threads() if "torch" in sys.modules else "all"
    return {"chunks": len(texts), "seconds": round(seconds, 2), "cpu_seconds": round(cpu, 6),
            "chunks_per_second": round(len(texts) / seconds, 2) if seconds else 0.0, "threads": threads}


def bare_encode_parallel(texts: list[str], model: str, batch_size: int, processes: int) -> dict[str, Any] | None:
    """Chunks/s of ``processes`` model processes with one thread each, the texts dealt out evenly.

    The other way to spend the cores on the model alone: on 2 cores it beats one process with two
    threads, so the bench reports both and takes the faster one as "bare" (the stricter ratio).
    """
    if model.startswith("fake-") or processes < 2 or len(texts) < processes:
        return None
    from bench.embed.workers import encode_in_processes

    seconds, cpu = encode_in_processes(model, _home(), texts, processes, 1)
    per_second = len(texts) / seconds if seconds > 0 else 0.0
    return {"chunks": len(texts), "seconds": round(seconds, 2), "cpu_seconds": round(cpu, 6),
            "processes": processes, "chunks_per_second": round(per_second, 2), "threads": 1}
