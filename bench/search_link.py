"""Search over a slow link: the product's ``search`` straight to PostgreSQL beside the same search through a relay
that delays every byte, same index, same queries, interleaved (issue #32: the API and PostgreSQL on different
hosts). What it measures is round trips: (through the relay - direct) / the round trip the relay adds.

``python -m bench.search_link [--corpus ../shared/corpus] [--docs 200] [--queries 20] [--rounds 3]
[--delay-ms 10] [--json out.json]``

The documents (one-paragraph texts cut from the corpus, generated without it: ``bench.publish.documents``) are
published and indexed in this process under the active profile (``bench.retrieval.index_corpus``: claim, parse,
chunk, checked embed, fenced publish), then analyzed as autovacuum would have by then. Vectors come from the
deterministic fake model: the bench times the database's part of a search, and a real model's query encoding
would cost the same on both sides. The relay
is bench/relay.py on 127.0.0.1 in front of the scratch server's Unix socket (the embedded server only), D ms each
way. Each round runs every query in every mode on both sides, alternating which side goes first; both sides must
return the same hits, or the bench fails.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from bench import exit_on_sigterm, server_url

MODES = ("dense", "lexical", "hybrid")
SIDES = ("direct", "relay")


def queries_from(docs: list[tuple[str, bytes]], n: int) -> list[str]:
    """``n`` queries of three words each, taken from documents spread over the set (each finds something)."""
    out = []
    for name, body in docs[:: max(1, len(docs) // max(1, n))][:n]:
        words = re.findall(r"[A-Za-z]{4,}", body.decode("utf-8", "replace"))
        out.append(" ".join(words[:3]) or name)
    return out


def _answer(hits: Any) -> list[tuple[str, str]]:
    return [(h.document_id, h.chunk_id) for h in hits]


def run(corpus: Path | None, n: int, n_queries: int, rounds: int, delay_ms: float,
        out: Any = print) -> dict[str, Any]:
    from rich.progress import Progress

    from bench.pipeline.__main__ import scratch_databases
    from bench.publish import documents
    from bench.relay import url_through_relay
    from bench.retrieval.__main__ import TENANT, Corpus, index_corpus
    from pipelines.domain.metadata import EVERYTHING
    from resources.database import Database
    from resources.embedder import DEFAULT_MODEL_NAME, FakeEmbedder
    from resources.search import search

    if delay_ms <= 0:
        raise SystemExit("--delay-ms must be above 0: the relay's delay is what the bench divides by")
    docs = documents(corpus, n)
    questions = queries_from(docs, n_queries)
    fake = FakeEmbedder(model_name=DEFAULT_MODEL_NAME)
    samples: dict[str, dict[str, list[float]]] = {m: {s: [] for s in SIDES} for m in MODES}
    with server_url() as admin_url, scratch_databases(admin_url) as (kb_url, _), ExitStack() as stack, \
            tempfile.TemporaryDirectory() as work:
        direct = stack.enter_context(Database(kb_url, max_size=2))
        texts = {name: body.decode("utf-8", "replace") for name, body in docs}
        indexed = index_corpus(direct, Corpus("paragraphs", texts, {}, {}), fake, 64, Path(work))
        direct.execute("bench_search_analyze")  # the statistics autovacuum would have gathered by now
        out(f"indexed {len(docs)} documents, {indexed['chunks']} chunks")
        relayed = stack.enter_context(Database(url_through_relay(kb_url, delay_ms, stack), max_size=2))
        dbs = {"direct": direct, "relay": relayed}

        def once(side: str, mode: str, query: str) -> tuple[float, list[tuple[str, str]]]:
            started = time.perf_counter()
            hits = search(dbs[side], fake, query, tenant_id=TENANT, k=10, mode=mode, read=EVERYTHING)
            return time.perf_counter() - started, _answer(hits)

        for side in SIDES:  # connect both pools and warm the plans: not on the clock
            for mode in MODES:
                once(side, mode, questions[0])
        with Progress(transient=True, disable=not sys.stderr.isatty()) as bar:
            job = bar.add_task("searching", total=rounds * len(MODES) * len(questions))
            for r in range(rounds):
                for mode in MODES:
                    for q, query in enumerate(questions):
                        order = SIDES if (r + q) % 2 == 0 else SIDES[::-1]
                        answers = {}
                        for side in order:
                            seconds, answers[side] = once(side, mode, query)
                            samples[mode][side].append(seconds)
                        if answers["direct"] != answers["relay"]:
                            raise SystemExit(f"{mode} {query!r}: the two sides answered differently")
                        bar.advance(job)
    round_trip = 2 * delay_ms / 1000
    report: dict[str, Any] = {"docs": len(docs), "queries": len(questions), "rounds": rounds, "delay_ms": delay_ms,
                              "chunks": indexed["chunks"], "modes": {}}
    for mode in MODES:
        d, s = samples[mode]["direct"], samples[mode]["relay"]
        report["modes"][mode] = {
            "direct_ms": 1000 * statistics.median(d), "relay_ms": 1000 * statistics.median(s),
            "relay_p95_ms": 1000 * sorted(s)[max(0, round(0.95 * len(s)) - 1)],
            "round_trips": (statistics.median(s) - statistics.median(d)) / round_trip,
        }
    return report


def render(report: dict[str, Any]) -> str:
    lines = [f"{report['docs']} documents ({report['chunks']} chunks), {report['queries']} queries x "
             f"{report['rounds']} interleaved round(s), a relay adding {report['delay_ms']:g} ms each way",
             f"{'mode':<8} {'direct p50 ms':>14} {'relay p50 ms':>13} {'relay p95 ms':>13} {'round trips':>12}"]
    for mode, m in report["modes"].items():
        lines.append(f"{mode:<8} {m['direct_ms']:14.1f} {m['relay_ms']:13.1f} {m['relay_p95_ms']:13.1f} "
                     f"{m['round_trips']:12.1f}")
    lines.append("round trips: (relay p50 - direct p50) / the relay's round trip")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.search_link", description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", type=Path, default=None, help="../shared/corpus (without it: generated text)")
    parser.add_argument("--docs", type=int, default=200)
    parser.add_argument("--queries", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--delay-ms", type=float, default=10.0, help="added each way by the relay")
    parser.add_argument("--json", dest="json_path", help="also write the report here")
    args = parser.parse_args(argv)
    exit_on_sigterm()
    report = run(args.corpus, args.docs, args.queries, args.rounds, args.delay_ms)
    print(render(report))
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
