"""Abuse bench (issue #17): one tenant must not take the service down for the others.

``python -m bench.abuse`` starts a throwaway PostgreSQL (or uses KBINDEX_DATABASE_URL), serves the
real API in a child process on 127.0.0.1, and runs three bounded scenarios, printing their figures:

1. tenant A opens 150 event streams at once while tenant B publishes and searches: B's answers,
   A's refusals (429/503), PostgreSQL connections in use and whether new ones are still accepted;
2. 20 concurrent 50 MB uploads made of tiny parts: /healthz latency (p50/p95/max) meanwhile, and
   the server process's RSS (peak);
3. 1M tasks in the table: 10 loops of 10 concurrent /metrics scrapes while tenant B lists its
   tasks: scrape and tenant latencies (the first scrape computes, the rest come from the cache);
4. (issue #31) the active profile embeds through an HTTP provider (bench/fake_embedding_server.py) that
   answers every request 429 with Retry-After: 60; tenant A keeps 41 searches in flight for 10 s while
   another process polls tenant B's GET /tasks and /healthz: B's latencies (p50/p95/max), A's answers
   by status and code, and how many requests reached the provider;
5. (issue #31) parser bombs (bench/abuse/bombs.py), each made on the spot and parsed in its own child
   process: code, seconds and peak RSS per bomb (no server needed).

``--sections 4`` runs only the search flood (``--searches``, ``--flood-seconds``); it runs last because it
activates the HTTP profile in the scratch database. ``--bombs`` (or ``--sections 5``) runs only the parser
bombs, with no server or database.
"""
