"""End-to-end indexing throughput and publish-to-searchable latency through the real Dagster daemon.

Usage (from the checkout)::

    python -m bench.pipeline --corpus ../shared/corpus [--docs 300] [--latency-samples 20]
                             [--fake-model] [--json report.json] [--timeout 1800]

Uses KBINDEX_DATABASE_URL as an admin URL if set (scratch databases ``kbindex_bench_pipe_<pid>`` and
``dagster_bench_pipe_<pid>`` are created and dropped next to it), otherwise its own embedded
PostgreSQL under a temporary folder. It migrates, starts the embedding service and
``dagster dev -m pipelines.definitions`` (webserver, daemon, code server; the repository's
dagster.yaml) as ``kbindex dev`` does (``--no-embed-service``: without the service), and indexes
one warm-up document so that the clock never includes Dagster's own start-up. Then:

1. **Throughput.** Publishes ``--docs`` documents from the corpus (two en-peps ``.rst`` for every
   en-sotu ``.txt``, spread evenly over each folder) as fast as it can, to tenant ``bench``, and
   waits until every task is terminal, with live progress. Wall time is the database's own clock:
   first task created -> last task finished. End-to-end chunks/s counts SUCCEEDED chunks only.
2. **Latency.** Into the now idle system, ``--latency-samples`` one-page documents, one at a time:
   publish -> the search pointer names the version (polled every 50 ms). The task's event history
   splits each sample into waiting for the sensor, run start-up, parse+chunk, embed, publish.
3. **Bare model.** Dagster is stopped; the distinct chunk texts of the SUCCEEDED versions (their bytes
   parsed and chunked again, so exactly the same ``embed_text`` strings, each once: the pipeline
   embeds an identical text once and reuses stored vectors, e.g. the PEPs' shared copyright sections)
   are encoded by the profile's own model and backend (the default int8 on onnxruntime, or torch, ...:
   bench/embed/workers.py) in this process (loaded and warmed first, not timed), same batch size, and
   again split over one process per core with one thread each (on 2 cores that is the faster way to
   run the model alone). The ratio e2e/bare compares distinct texts/s on both
   sides (the same work), against the faster of the two: the share of the model's speed the whole
   system delivers. The report also gives the share of chunks served by reuse (1 - distinct/chunks)
   and the pipeline's own embedded/reused/shared counts (its ``chunk_embeddings`` metadata, summed).

It also reports the Dagster runs that carried each phase (from Dagster's run storage: count, versions
per run, queue/launch and run durations) and the final task states by error code. Settings are
taken from the environment as the pipeline reads them (KBINDEX_RUN_BATCH, KBINDEX_EMBED_BATCH, ...),
so variants are measured side by side by setting them on the command line.
"""
