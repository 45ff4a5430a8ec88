"""Local embedding backends side by side: chunks/s per process/thread layout and nDCG@10, in one run.

Usage (from the checkout)::

    python -m bench.embed [--corpus ../shared/corpus] [--docs 60] [--max-chunks 1200] [--repeats 2]
                          [--backends all-MiniLM-L6-v2,all-MiniLM-L6-v2-onnx,...] [--layouts 1x2,2x1]
                          [--home DIR] [--json report.json]

Texts are the corpus's real chunks: ``--docs`` en-peps ``.rst`` files (spread over the folder) parsed
and chunked by the project's chunker with the default profile's 200/32 tokens, each distinct text once
(as the pipeline embeds them). Each backend x layout ("PxT": P processes of T threads, the texts dealt
out evenly) runs in fresh spawned processes that load and warm the model before a shared start; its
chunks/s is all texts over the slowest process's seconds. Passes are interleaved (every backend and
layout once per repeat) and the best of ``--repeats`` counts, so a noisy neighbour hurts all alike.
nDCG@10 is ``resources.profiles.evaluate_profile`` in dense mode on ``--eval`` (default the corpus's
eval/xquad-en), as the quality gate computes it. The recommendation is the fastest backend whose
nDCG@10 is within 0.005 of torch's. Derived models are built (offline) under ``--home``/models first,
untimed; ``--home`` defaults to KBINDEX_HOME. A missing corpus is a clean skip (exit 0).
"""
