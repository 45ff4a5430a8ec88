"""Retrieval benchmark: does the stored index rank as well as the model itself, and is the embed path fast?

``python -m bench.retrieval --corpus ../shared/corpus/eval/xquad-en [--corpus .../xquad-zh]``

For each BEIR-layout corpus (corpus.jsonl {_id,title,text}, queries.jsonl, qrels/test.tsv) it indexes
every paragraph through the project's own path: Publisher (version + PENDING task) -> TaskQueue.claim
(a real lease) -> parse_document -> chunk_document (the model's tokenizer, the profile's parameters)
-> checked_embed with the packaged all-MiniLM-L6-v2 -> IndexSink.publish (the fenced transaction) into a
throwaway PostgreSQL; then it answers every query with resources.search.search in each mode (dense,
lexical, hybrid: issue #13). It prints:

- per mode, nDCG@10, recall@10 and query latency p50/p95 (embedding included where the mode embeds),
  and how much hybrid adds to dense at p95 (target: <= 15 ms on the largest set);

- nDCG@10 and recall@10 of the stored index beside the same model scored by brute force in memory on
  the same chunks (bare ``model.encode``; a document scores the max over its chunks), and the gap
  (target: stored within 0.01 nDCG@10 of brute force on xquad-en);
- embedding throughput, chunks/s through checked_embed beside bare ``model.encode`` on the same texts,
  interleaved in the same run (best of ``--repeats``), as a ratio (target: >= 0.9).

A missing corpus folder is skipped with a message (the shared corpus is optional).
"""
