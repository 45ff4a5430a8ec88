"""``python -m bench.embed.service``: the warm embedding service against bare encode, same texts, side by side.

Usage (from the checkout)::

    python -m bench.embed.service [--max-chunks 2000] [--docs 60] [--workers 1,2] [--model all-MiniLM-L6-v2]

Texts are the corpus's distinct chunks, as ``python -m bench.embed`` makes them. Rows:

- ``bare PxT``: P fresh processes of T threads each encode their share (``bench.embed.workers.throughput``):
  1 x cores is one process with every core, cores x 1 the fastest bare layout measured on 2 cores;
- ``service N worker(s)``: ``kbindex embed-service`` with N workers (started and warmed before the
  passes), one client sending batches of 64 through ``checked_embed`` as a run does; each batch is
  dealt out to the workers. Model loading is not timed in any row (a warm service pays it once).

Passes are interleaved and the best of ``--repeats`` counts. The service's vectors must match one
process's bare encode (atol 1e-5), else its row says VECTORS DIFFER.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from bench.embed.__main__ import ROOT, chunk_texts  # noqa: E402
from bench.embed.workers import make_embedder, throughput  # noqa: E402
from resources.embedder import DEFAULT_BATCH_SIZE, PACKAGED_MODEL_NAME  # noqa: E402


class ServiceUnderTest:
    """A fresh ``kbindex embed-service`` of ``workers`` workers with ``model`` loaded and warmed (untimed)."""

    def __init__(self, model: str, workers: int) -> None:
        from resources.embedding_service import ServiceEmbedder, start_service

        self.model, self.workers = model, workers
        self.home = Path(tempfile.mkdtemp(prefix="kbes-"))  # short: a Unix socket path is limited to ~100 bytes
        env = {**os.environ, "KBINDEX_EMBED_WORKERS": str(workers), "KBINDEX_EMBED_SERVICE_PRELOAD": model}
        self.proc = start_service(self.home, env, timeout=300)
        self.client = ServiceEmbedder(model, self.home, timeout=600)
        self.dimension = self.client.dimension
        self.client.embed([f"warm-up text {i}" for i in range(8 * workers)])  # every worker's first encode

    def time(self, texts: list[str]) -> tuple[float, Any]:
        """Chunks/s of one client sending batches of 64 through checked_embed, as a run does; and the vectors."""
        from resources.embedder import checked_embed

        started = time.perf_counter()
        vectors = checked_embed(self.client, texts, expected_model=self.model, expected_dim=self.dimension,
                                batch_size=DEFAULT_BATCH_SIZE)
        return len(texts) / (time.perf_counter() - started), vectors

    def stop(self) -> None:
        self.client.close()
        self.proc.terminate()
        self.proc.wait(30)
        shutil.rmtree(self.home, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.embed.service", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", default=str(ROOT.parent / "shared" / "corpus"))
    parser.add_argument("--pattern", default="pep-*.rst")
    parser.add_argument("--docs", type=int, default=60, help="documents to chunk, spread over the folder (0: all)")
    parser.add_argument("--max-chunks", type=int, default=2000, help="at most this many distinct chunks (0: all)")
    parser.add_argument("--workers", default="1,2", help="service worker counts to time, comma-separated")
    parser.add_argument("--model", default=PACKAGED_MODEL_NAME)
    parser.add_argument("--repeats", type=int, default=2, help="interleaved passes (best of)")
    parser.add_argument("--home", help="where derived models are cached (default: KBINDEX_HOME)")
    args = parser.parse_args(argv)
    documents = Path(args.corpus) / "en-peps"
    if not any(documents.glob(args.pattern)):
        print(f"skipped: no {args.pattern} files in {documents} (the shared corpus is optional)")
        return 0
    home = str(Path(args.home or os.environ.get("KBINDEX_HOME") or ROOT / ".kbindex").resolve())
    cores = os.cpu_count() or 1
    texts = chunk_texts(documents, args.pattern, args.docs, args.max_chunks)
    print(f"{len(texts)} distinct chunks, mean {sum(map(len, texts)) // max(1, len(texts))} chars; {cores} cores; "
          f"load average {os.getloadavg()[0]:.2f}", file=sys.stderr)
    sample = min(len(texts), 256)  # enough to catch a wrong order or split; not another full encode
    local = make_embedder(args.model, home, None).embed(texts[:sample])
    services = [ServiceUnderTest(args.model, int(w)) for w in args.workers.split(",") if w.strip()]
    best: dict[str, float] = {}
    try:
        for repeat in range(args.repeats):  # interleaved passes, best of: a noisy neighbour hurts all rows alike
            for processes, threads in sorted({(1, cores), (cores, 1)}):
                speed = throughput(args.model, home, texts, processes, threads)
                _keep(best, f"bare {processes}x{threads}", speed, repeat)
            for service in services:
                speed, vectors = service.time(texts)
                differ = "" if abs(vectors[:sample] - local).max() <= 1e-5 else " (VECTORS DIFFER)"
                _keep(best, f"service {service.workers} worker(s){differ}", speed, repeat)
    finally:
        for service in services:
            service.stop()
    rows = list(best.items())
    fastest_bare = max(speed for name, speed in rows if name.startswith("bare"))
    print(f"{'layout':<32}{'chunks/s':>10}{'vs fastest bare':>17}")
    for name, speed in rows:
        print(f"{name:<32}{speed:>10.1f}{speed / fastest_bare:>17.2f}")
    return 0


def _keep(best: dict[str, float], name: str, speed: float, repeat: int) -> None:
    best[name] = max(best.get(name, 0.0), speed)
    print(f"pass {repeat + 1}: {name}: {speed:.1f} chunks/s (load average {os.getloadavg()[0]:.2f})", file=sys.stderr)


if __name__ == "__main__":
    raise SystemExit(main())
