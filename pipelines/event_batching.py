"""Dagster's event-batching settings, for runs that each cover many document versions (issue #14).

A run of n versions makes 4n per-version materialization events and, at its creation, 4n
"materialization planned" events. Dagster stores each with its own INSERT, NOTIFY and index
transaction on a fresh connection: ~25-40 ms apiece, about 0.3 s per version, more than parsing,
chunking and embedding a small document (measured with bench.scale.runs / bench.scale.small_docs).

- ``DAGSTER_EVENT_BATCH_SIZE``: a step's materializations are written as one batch (one INSERT).
  The events, their metadata and the UI's per-version lineage are unchanged.
- ``DAGSTER_EMIT_PARTITION_SUBSET_IN_PLANNED_EVENTS``: one planned event per asset naming the run's
  key range instead of one per version. Trade-off (Dagster's): when a whole run fails, the UI does
  not mark its versions' partitions as failed; they keep their previous status. kbindex records
  every version's outcome itself (``kbindex task``, the API), and a failed version inside a run is
  a materialization with ``outcome: failed`` either way.

The run process gets them from the code location (``apply(os.environ)`` when pipelines.assets is
imported, whatever launched it); the daemon, which creates the runs and writes the planned events,
gets them from ``kbindex dev``'s environment (or the deployment's). An explicit value wins.

Both are read by private Dagster code: ``apply`` checks that this Dagster still has it and warns once
if not (resources/dagster_private.py); the settings are then simply not honoured (Dagster's default:
correct, slower).
"""

from collections.abc import MutableMapping

EVENT_BATCH_ENV = {
    "DAGSTER_EVENT_BATCH_SIZE": "1000",
    "DAGSTER_EMIT_PARTITION_SUBSET_IN_PLANNED_EVENTS": "true",
}


def apply(env: MutableMapping[str, str]) -> MutableMapping[str, str]:
    """Set the batching settings in ``env`` where it does not set them already; returns ``env``."""
    from resources import dagster_private  # here: importing dagster costs every CLI command ~0.7 s

    dagster_private.event_batching_read()
    for name, value in EVENT_BATCH_ENV.items():
        env.setdefault(name, value)
    return env
