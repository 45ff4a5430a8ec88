"""Claim throughput of the index-task queue versus queue depth.

Usage (from the checkout)::

    python -m bench.queue [--sizes 1000,100000,1000000] [--workers 1,4,8] [--seconds 10]
                          [--mode threads|processes] [--complete many|one] [--batch 10]
                          [--sync-commit on|off]

Uses KBINDEX_DATABASE_URL if set (a scratch database ``kbindex_bench_<size>`` is created and
dropped next to it), otherwise its own embedded PostgreSQL under a temporary folder.

For each size N it bulk-loads N PENDING tasks (``task_bench_load``: generate_series, in slices of
100k with progress), then for each worker count runs W workers for a fixed time, each looping
``claim(limit=batch)`` -> ``complete_many`` (or one ``complete`` per lease) on one held autocommit
connection, requeueing the finished tasks as PENDING (``task_bench_requeue``, in the completing
transaction) so the queue keeps depth N for the whole run, as under a steady publish rate.
``--sync-commit off`` takes the disk's fsync out of each commit, to see the statements' own cost. The table counts claimed-and-completed tasks per second; the last line is
the throughput at the largest size divided by the one at the smallest, per worker count.
The claim and complete statements are the production ones: fenced, one event row per
transition, one NOTIFY per statement.
"""
