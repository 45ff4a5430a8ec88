"""The four indexing assets, partitioned by document version: parse -> chunk -> embed -> publish.

Each asset is a thin adapter: it hands its partition keys to the run's ``IndexingRun``
(resources/indexing_run.py), which does the work per index task (one per profile of a version),
and reports what happened per version as materialization metadata: outcome, task ids, profiles,
and the step's figures (the run's counts per outcome are one log line per step). Run state lives in the IndexingRun, keyed by task, not in Dagster's IO
managers. Only ``search_index`` writes to the index, through the fenced publish transaction.

``context.partition_keys`` and Dagster's own per-step uses of the run's key range cost O(run), not
O(all keys) (pipelines/partitions.py); each step's per-version materializations are written in one
batch (pipelines/event_batching.py).

A run whose versions were all skipped (it holds no lease for any of them) fails instead of
reporting empty materializations as success.
"""

import os
from typing import Any

import dagster as dg

from pipelines import event_batching
from pipelines.partitions import document_versions
from resources import dagster_private
from resources.dagster_resources import EmbedderResource, IndexingRunResource
from resources.indexing_run import StepResult

event_batching.apply(os.environ)  # this run process writes its per-version events in batches

COMMON = dict(
    partitions_def=document_versions,
    backfill_policy=dg.BackfillPolicy.single_run(),
    group_name="indexing",
)


def _report(context: dg.AssetExecutionContext, keys: list[str], results: dict[str, list[StepResult]],
            why_skipped: Any) -> dg.MaterializeResult:
    """Per-version metadata (O(run), see ``dagster_private.add_partition_metadata``); the run-level counts in
    the step's log."""
    counts: dict[str, int] = {}
    for key in keys:
        tasks = results.get(key) or []
        for result in tasks:
            counts[result.outcome] = counts.get(result.outcome, 0) + 1
        if not tasks:
            counts["skipped"] = counts.get("skipped", 0) + 1
        dagster_private.add_partition_metadata(context, key, _version_metadata(key, tasks, why_skipped))
    if keys and not any(results.get(k) for k in keys):
        raise dg.Failure(
            description=f"this run holds no lease for any of its {len(keys)} version(s); nothing was built",
            metadata={"first_reason": why_skipped(keys[0])},
        )
    # The run's counts go in one log line per step, not in the result's metadata: Dagster copies a
    # partitioned result's metadata into every version's materialization, n copies of one run figure.
    context.log.info("tasks: " + ", ".join(f"{n} {outcome}" for outcome, n in sorted(counts.items())))
    return dg.MaterializeResult()


def _version_metadata(key: str, tasks: list[StepResult], why_skipped: Any) -> dict[str, Any]:
    if not tasks:
        return {"outcome": "skipped", "reason": why_skipped(key)}
    if len(tasks) == 1:
        return tasks[0].metadata()
    # Several profiles of one version in this run (a migration): one entry per profile.
    meta: dict[str, Any] = {"outcome": "/".join(sorted({t.outcome for t in tasks})),
                            "profiles": ",".join(t.profile for t in tasks)}
    for result in tasks:
        meta.update({f"{result.profile}.{name}": value for name, value in result.metadata().items()
                     if name != "profile"})
    return meta


@dg.asset(**COMMON, kinds={"python"}, description="Document bytes parsed into text blocks with heading paths and pages.")
def parsed_document(
    context: dg.AssetExecutionContext, indexing_run: IndexingRunResource, embedder: EmbedderResource
) -> dg.MaterializeResult:
    run = indexing_run.run(embedder)
    keys = list(context.partition_keys)
    embedder.preload(run.models(keys))  # torch + model load overlap parse and chunk
    run.start_ahead(keys)  # parse, chunk and embed go on ahead of the steps (resources/run_ahead.py)
    return _report(context, keys, run.parse(keys), run.why_skipped)


@dg.asset(**COMMON, deps=[parsed_document], kinds={"python"},
          description="Token-bounded, deterministic chunks with stable ids, per index profile.")
def document_chunks(
    context: dg.AssetExecutionContext, indexing_run: IndexingRunResource, embedder: EmbedderResource
) -> dg.MaterializeResult:
    run = indexing_run.run(embedder)
    keys = list(context.partition_keys)
    return _report(context, keys, run.chunk(keys), run.why_skipped)


@dg.asset(**COMMON, deps=[document_chunks], kinds={"python"},
          description="One normalized vector per chunk, every batch validated; embedded, reused and shared counts.")
def chunk_embeddings(
    context: dg.AssetExecutionContext, indexing_run: IndexingRunResource, embedder: EmbedderResource
) -> dg.MaterializeResult:
    run = indexing_run.run(embedder)
    keys = list(context.partition_keys)
    return _report(context, keys, run.embed(keys), run.why_skipped)


@dg.asset(**COMMON, deps=[chunk_embeddings], kinds={"postgres"},
          description="The fenced publish: chunks written and the search pointer moved in one transaction.")
def search_index(
    context: dg.AssetExecutionContext, indexing_run: IndexingRunResource, embedder: EmbedderResource
) -> dg.MaterializeResult:
    run = indexing_run.run(embedder)
    keys = list(context.partition_keys)
    return _report(context, keys, run.publish(keys), run.why_skipped)


indexing_assets = [parsed_document, document_chunks, chunk_embeddings, search_index]
