"""Incremental re-embedding benchmark: a long document, then a new version with ~1% of its chunks changed.

``python -m bench.incremental [--paragraphs N] [--change 0.01] [--model NAME]`` starts its own embedded
PostgreSQL in a temporary folder (or uses ``--database-url``), loads the packaged all-MiniLM-L6-v2 and
indexes two versions of one markdown document through the real path: publish (blob + version + task),
claim a real lease, parse, chunk with the model's tokenizer, ``embed_with_reuse``, and the fenced
``IndexSink.publish``. It prints, for each version, the texts embedded, the embed calls and the wall
time of every stage, then v2 relative to v1. Targets: v2 embeds <= 5% of v1's texts in <= 15% of its time.

The document is ~N paragraphs (4 sentences each) of the State of the Union addresses in
../shared/corpus/en-sotu, one section per address; without the corpus the text is generated. v2 edits a
few paragraphs by swapping one word for another of the same word-piece count, so chunk boundaries stay
where they were and only the chunks holding those paragraphs (and their overlaps) change.

That is the best case. ``python -m bench.incremental --edit-kinds`` (no database, no model) also inserts
a sentence in the middle of a paragraph, deletes one, and rewrites a whole paragraph, on the handbook,
on the same text without blank lines, and on 150 PEPs; per kind it reports the share of paragraphs
touched and the share of v2's distinct chunk texts that are new (what ``embed_with_reuse`` embeds),
for the fixed-window chunker this project had before issue #15 (bench/incremental/fixed_windows.py)
beside today's (see bench/incremental/edits.py).
"""
