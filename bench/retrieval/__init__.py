"""Retrieval benchmark: does the stored index rank as well as the model itself, and is the embed path fast?

``python -m bench.retrieval --corpus ../shared/corpus/eval/xquad-en [--corpus .../xquad-zh] [--model M]
[--analyzer wordpiece,english]``

For each BEIR-layout corpus (corpus.jsonl {_id,title,text}, queries.jsonl, qrels/test.tsv) it indexes
every paragraph through the project's own path: Publisher (version + PENDING task) -> TaskQueue.claim
(a real lease) -> parse_document -> chunk_document (the profile's tokenizer and parameters) -> checked_embed
with the profile's own embedder (``embedder_for_profile``, as indexing and search pick it: the default
profile's all-MiniLM-L6-v2-int8 unless ``--model`` names another) -> IndexSink.publish (the fenced
transaction) into a throwaway PostgreSQL; then it answers every query with resources.search.search. It
prints, side by side, nDCG@10, recall@10 and query latency p50/p95 (embedding included where the mode
embeds) of:

- ``bm25-stock``: bm25s with its stock tokenizer over whole paragraphs, in memory (the baseline any
  lexical engine should reach; needs ``pip install bm25s``, a test dependency);
- ``lexical``, ``dense``: search's two sides;
- ``hybrid-weighted``, ``hybrid-rrf``: hybrid search fused by the weighted score sum and by reciprocal rank
  fusion (the profile's ``lexical_weight`` and ``rrf_k``; pipelines/domain/lexical.py), and their nDCG@10
  difference;
- the lexical and hybrid rows once per lexical analyzer (``--analyzer``, default every one: ``wordpiece`` rows
  keep the names above, ``english`` rows are ``lexical-english``, ``hybrid-weighted-english``, ...): a profile
  per analyzer with the same model, chunking and search settings, indexed by the same publishes (each text
  embedded once), each profile active in turn while its rows are searched;

then dense nDCG@10 and recall@10 of the stored index beside the same embedder scored by brute force in
memory on the same chunks (a document scores the max over its chunks), and the gap (target: within 0.01
nDCG@10 on xquad-en); and embedding throughput, chunks/s through checked_embed beside the bare
``embedder.embed`` on the same texts, interleaved (best of ``--repeats``), as a ratio (target: >= 0.9).

``--context`` measures each corpus twice, under a profile without and one with context in chunks (``kbindex
profile create --context``: the document title + heading path embedded before each chunk, and read by its
lexical index with the chunk), and prints the rows side by side. A document's BEIR ``title`` is published as its file name (``Super_Bowl_50.txt``), which only a
context profile reads (as the title of a plain-text file), so the rows without context do not see it.

``pep-titles`` (built by ``python -m bench.retrieval.build_pep_titles ../shared/corpus/en-peps OUT``; a CI-sized
copy is tests/fixtures/eval/pep-titles-small) is an English set keyword matching does not solve: PEP titles as
queries, each PEP's opening text (header and title removed) as documents.

xquad-en, xquad-zh and cmrc2018-dev (../shared/corpus/eval) are labelled regression checks: stock BM25
scores 0.95-0.99 on them, so they catch breakage (and broken Chinese handling), not rank models.
A missing corpus folder is skipped with a message (the shared corpus is optional); the CI-sized round on
tests/fixtures/eval/small-en is tests/integration/test_bench_retrieval.py.
"""
