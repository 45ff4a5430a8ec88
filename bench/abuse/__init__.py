"""Abuse bench (issue #17): one tenant must not take the service down for the others.

``python -m bench.abuse`` starts a throwaway PostgreSQL (or uses KBINDEX_DATABASE_URL), serves the
real API in a child process on 127.0.0.1, and runs three bounded scenarios, printing their figures:

1. tenant A opens 150 event streams at once while tenant B publishes and searches: B's answers,
   A's refusals (429/503), PostgreSQL connections in use and whether new ones are still accepted;
2. 20 concurrent 50 MB uploads made of tiny parts: /healthz latency (p50/p95/max) meanwhile, and
   the server process's RSS (peak);
3. 1M tasks in the table: 10 loops of 10 concurrent /metrics scrapes while tenant B lists its
   tasks: scrape and tenant latencies (the first scrape computes, the rest come from the cache).
"""
