"""Does building a shadow profile slow the live sensor path? ``python -m bench.migration_load``.

Measures live claim+complete per second (1 worker, claims of 10) on a queue of live INDEX tasks,
then again after a backlog of PENDING REINDEX tasks (a migration being built) is added, and prints
the ratio. The sensor's claim walks a due index that covers INDEX tasks only, so the ratio should
stay near 1 however large the backlog is.
"""
