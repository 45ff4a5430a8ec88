"""Small documents (1-2 chunks each) through the real daemon vs bare ``model.encode`` of the same texts.

``python -m bench.scale.small_docs --corpus ../shared/corpus [--docs 3000] [--fake-model]``

FAQ entries, tickets and policy pages are small: there a per-version fixed cost (Dagster events,
per-version queries, run start-up) weighs as much as the model (issue #14 measured 0.3 of bare
encode). The documents are the shared corpus's paragraphs (en-sotu and en-peps, 200-2,000
characters, duplicates removed so no chunk reuses another's vector), each published as a document
of its own. They go through ``dagster dev`` with the repository's dagster.yaml and the warm
embedding service, exactly as ``kbindex dev`` runs them (bench/pipeline's machinery): the claiming
sensor, its run processes, their model loads and Dagster's event writes are all on the clock, which
an in-process job would leave out. Then Dagster is stopped and the unique chunk texts the pipeline
embedded are encoded bare, in one process and in one process per core; the faster is the yardstick.

Besides the ratio it prints where each version's seconds go: per asset step, summed over the runs
and divided by the versions, next to bare encode's seconds per version.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import psycopg

from bench import exit_on_sigterm
from bench.cpu import budget as cpu_budget
from bench.cpu import render as render_cpu
from bench.warm_service import warm_embedding_service
from sql import queries

TENANT = "bench"  # bench.pipeline.Bench measures this tenant


def paragraph_documents(corpus: Path, n: int, min_chars: int = 200, max_chars: int = 2000) -> list[tuple[str, bytes]]:
    """``n`` distinct paragraphs of the corpus as one-paragraph documents, spread evenly over it."""
    files = sorted((corpus / "en-sotu").glob("*.txt")) + sorted((corpus / "en-peps").glob("*.rst"))
    seen: dict[str, None] = {}
    for path in files:
        for block in path.read_text(errors="replace").split("\n\n"):
            text = " ".join(block.split())
            if min_chars <= len(text) <= max_chars:
                seen.setdefault(text)
    paragraphs = list(seen)
    if len(paragraphs) < n:
        raise ValueError(f"only {len(paragraphs)} paragraphs of {min_chars}-{max_chars} characters in {corpus}")
    picked = [paragraphs[int(i * len(paragraphs) / n)] for i in range(n)]
    return [(f"para-{i:05d}.txt", text.encode()) for i, text in enumerate(picked)]


def per_version_seconds(runs: dict[str, Any], versions: int) -> dict[str, float]:
    """Each asset step's seconds summed over the runs, per version (where a version's time goes)."""
    return {step: round(sum(seconds) / max(1, versions), 4) for step, seconds in runs["step_seconds"].items()}


def run(corpus: Path, docs: int, *, fake_model: bool = False, embed_service: bool = True,
        timeout: float = 3600.0, passes: int = 3, publish_batch: int | None = None, out: Any = print) -> dict[str, Any]:
    from bench import share_built_models

    share_built_models()
    return run_documents(paragraph_documents(corpus, docs), fake_model=fake_model, embed_service=embed_service,
                         timeout=timeout, passes=passes, publish_batch=publish_batch, out=out)


def run_documents(documents: list[tuple[str, bytes]], *, fake_model: bool = False, embed_service: bool = True,
                  timeout: float = 3600.0, passes: int = 3, publish_batch: int | None = None,
                  out: Any = print) -> dict[str, Any]:
    """The bench on these documents: ``passes`` interleaved rounds of pipeline, bare encode and bare system
    (bench/pipeline/passes.py); pass 1's figures are the detailed report."""
    from bench import server_url
    from bench.pipeline.__main__ import Bench, dagster_dev, scratch_databases
    from bench.pipeline.passes import interleaved_passes, summary

    embed_batch = int(os.environ.get("KBINDEX_EMBED_BATCH", "64"))
    report: dict[str, Any] = {"cpus": os.cpu_count(), "docs": len(documents), "publish_batch": publish_batch}
    with server_url() as admin_url, scratch_databases(admin_url) as (kb_url, dg_url):
        if fake_model:
            with psycopg.connect(kb_url, autocommit=True) as conn:
                conn.execute(queries["bench_set_active_model"], {"model": "fake-384"})
        root = Path(tempfile.mkdtemp(prefix="kbindex-bench-small-"))
        dagster = dagster_dev(kb_url, dg_url, root)
        bench = Bench(kb_url, dg_url, dagster, out, publish_batch=publish_batch)
        services = ExitStack()
        try:
            service = services.enter_context(warm_embedding_service(  # as `kbindex dev` runs it
                dagster.env["KBINDEX_HOME"], dagster.env, log=root / "embedder.log",
                enabled=embed_service and not fake_model))
            bench.service_pid = service.pid if service else None
            dagster.start()
            out(f"dagster dev answered in {dagster.wait_ready():.1f} s; warm-up document…")
            bench.warm_up(300.0)
            report["model"] = bench.model_name()
            report["passes"] = interleaved_passes(
                bench, documents, passes=max(1, passes), admin_url=admin_url, model=report["model"],
                embed_batch=embed_batch, tenant=TENANT, timeout=timeout, out=out,
                idle_pids=lambda: [dagster.proc.pid if dagster.proc else None, service.pid if service else None])
            report["floor"] = summary(report["passes"])
        finally:
            dagster.stop()
            services.close()
            bench.close()
            shutil.rmtree(root, ignore_errors=True)
    first = report["passes"][0]
    report["throughput"] = t = first["throughput"]
    report["bare"] = first["bare_encode"]
    report["bare_unique_chunks"] = first["distinct_texts"]
    report["ratio"] = round(t["chunks_per_second"] / report["bare"]["chunks_per_second"], 3)
    report["cpu"] = cpu_budget(t["cpu_seconds"], t["wall_seconds"], report["bare"]["cpu_seconds"], report["cpus"])
    versions = max(1, t["succeeded_docs"])
    report["seconds_per_version"] = {
        "wall": round(t["wall_seconds"] / versions, 4),
        "bare_encode": round(report["bare"]["seconds"] / versions, 4),
        "steps (summed over runs)": per_version_seconds(t["dagster"], versions),
    }
    return report


def render(report: dict[str, Any]) -> str:
    from bench.pipeline.passes import render as render_passes

    t, b, d = report["throughput"], report["bare"], report["throughput"]["dagster"]
    return "\n".join([
        f"model {report['model']}, {report['cpus']} cpus; {t['docs']} one-paragraph documents "
        f"({t['succeeded_docs']} succeeded, {t['chunks']} chunks, {t['chunks'] / max(1, t['succeeded_docs']):.2f} per doc)",
        f"end-to-end       {t['chunks_per_second']:.1f} chunks/s  ({t['wall_seconds']:.1f} s, first publish -> last terminal)",
        f"bare encode      {b['chunks_per_second']:.1f} chunks/s  ({report['bare_unique_chunks']} unique texts in "
        f"{b['seconds']:.1f} s, {b.get('processes', 1)} process(es))",
        f"ratio e2e/bare   {report['ratio']}  (target >= 0.8)",
        f"runs             {d['runs']}  versions per run mean {d['versions_per_run_mean']}, median run {d['run_seconds_median']} s",
        f"s per version    {report['seconds_per_version']}",
        f"median phases    {t['stages']}",
        render_cpu(report["cpu"], t.get("dagster_parts")),
        f"final states     {t['final_states']}",
        render_passes(report["passes"], report["floor"]),
    ])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.scale.small_docs", description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", type=Path, default=Path("../shared/corpus"))
    parser.add_argument("--docs", type=int, default=3000)
    parser.add_argument("--fake-model", action="store_true", help="fake-384 embedder (smoke runs; no torch)")
    parser.add_argument("--no-embed-service", dest="embed_service", action="store_false")
    parser.add_argument("--timeout", type=float, default=3600.0)
    parser.add_argument("--passes", type=int, default=3,
                        help="interleaved passes of pipeline, bare encode and bare system (medians reported)")
    parser.add_argument("--publish-batch", type=int, default=None, metavar="N",
                        help="documents per publish transaction (default: `kbindex publish`'s, KBINDEX_PUBLISH_BATCH; "
                        "0: one publish call per document, as before batches)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    exit_on_sigterm()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    if not (args.corpus / "en-sotu").is_dir():
        print(f"bench.scale.small_docs skipped: corpus {args.corpus} not found")
        return 0
    report = run(args.corpus, args.docs, fake_model=args.fake_model, embed_service=args.embed_service,
                 timeout=args.timeout, passes=args.passes, publish_batch=args.publish_batch, out=lambda line: print(line, flush=True))
    print(render(report))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
