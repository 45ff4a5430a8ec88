"""The event-batching settings go into every Dagster process's environment unless set explicitly."""

import os

from pipelines import event_batching


def test_apply_sets_the_batching_settings_and_keeps_explicit_values():
    env = {"DAGSTER_EVENT_BATCH_SIZE": "50", "OTHER": "x"}
    assert event_batching.apply(env) is env
    assert env == {"DAGSTER_EVENT_BATCH_SIZE": "50", "OTHER": "x",
                   "DAGSTER_EMIT_PARTITION_SUBSET_IN_PLANNED_EVENTS": "true"}


def test_a_run_process_gets_them_from_the_code_location():
    import pipelines.assets  # noqa: F401 - importing the assets applies them

    for name in event_batching.EVENT_BATCH_ENV:
        assert os.environ.get(name), name


def test_every_harness_dagster_dev_gets_them_as_kbindex_dev_does(tmp_path):
    """bench/dagster_dev.py's DagsterDev (the chaos rounds, the benches, the end-to-end tests): the chaos rounds
    once started dagster dev without them, and over a slow link each run's per-version planned events took
    ~100 s of its creation."""
    from bench.dagster_dev import DagsterDev

    dev = DagsterDev(tmp_path, {"DAGSTER_EVENT_BATCH_SIZE": "7"})
    assert dev.env == {"DAGSTER_EVENT_BATCH_SIZE": "7", "DAGSTER_EMIT_PARTITION_SUBSET_IN_PLANNED_EVENTS": "true"}
