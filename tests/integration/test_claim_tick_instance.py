"""The claiming sensor keeps one Dagster instance per code-server process (pipelines/sensors.py ``tick_instance``).

The daemon hands each evaluation an instance *ref*; ``context.instance`` would build (and dispose of) a new
instance from it every tick: new storage engines and connections, ~25 ms of the code server's CPU and ~30 ms of
PostgreSQL's, idle or not. Here ticks evaluated as the daemon evaluates them (from the ref) share one instance,
claim through it, and a context that brings an instance of its own keeps it.
"""

from __future__ import annotations

import dagster as dg

import pipelines.sensors as sensors
from pipelines.partitions import VERSIONS_PARTITIONS_NAME
from resources.dagster_resources import DatabaseResource, leases_of


def _as_the_daemon_evaluates(name, db_url, monkeypatch):
    """Sensor ``name`` with the resources the code server would hand it, fresh kept instances and pools, and a
    list that grows by one for each Dagster instance built from a ref."""
    from pipelines.definitions import defs
    from resources import dagster_resources

    monkeypatch.setattr(sensors, "_TICK_INSTANCES", {})
    monkeypatch.setattr(dagster_resources, "_TICK_DATABASES", {})
    monkeypatch.setenv("KBINDEX_DATABASE_URL", db_url)
    built = []
    real_from_ref = dg.DagsterInstance.from_ref
    monkeypatch.setattr(dg.DagsterInstance, "from_ref", staticmethod(lambda ref: built.append(1) or real_from_ref(ref)))
    repo = defs.get_repository_def()
    sensor = repo.get_sensor_def(name)
    declared = {k: v for k, v in repo.get_top_level_resources().items() if k in sensor.required_resource_keys}
    return built, repo, sensor, declared


def _context_from_ref(instance, db_url) -> dg.SensorEvaluationContext:
    return dg.SensorEvaluationContext(instance_ref=instance.get_ref(),
                                      resources={"database": DatabaseResource(url=db_url)})


def test_ticks_from_the_daemons_ref_share_one_kept_instance_and_claim_through_it(db_url, publish_task, instance,
                                                                                 monkeypatch):
    monkeypatch.setattr(sensors, "_TICK_INSTANCES", {})
    seen = []
    real = sensors.leased_runs
    monkeypatch.setattr(sensors, "leased_runs", lambda inst: seen.append(inst) or real(inst))

    published = []
    for _ in range(3):
        published.append(publish_task())
        with _context_from_ref(instance, db_url) as ctx:
            result = sensors.claim_index_tasks(ctx)
        assert isinstance(result, dg.SensorResult), result
        assert [t for r in result.run_requests for t, _ in leases_of(r.tags)] == [published[-1].task_id]
    assert len(seen) == 3 and seen[0] is seen[1] is seen[2]  # built once, not per tick
    assert seen[0] is not instance and list(sensors._TICK_INSTANCES.values()) == [seen[0]]
    assert seen[0].get_ref() == instance.get_ref()  # the daemon's instance, as context.instance would build it


def test_a_context_with_its_own_instance_keeps_it(db_url, instance, monkeypatch):
    monkeypatch.setattr(sensors, "_TICK_INSTANCES", {})
    with dg.build_sensor_context(instance=instance, resources={"database": DatabaseResource(url=db_url)}) as ctx:
        assert sensors.tick_instance(ctx) is instance
    assert sensors._TICK_INSTANCES == {}


def test_ticks_share_the_processs_kept_database_pool_and_runs_get_their_own(db_url, instance, monkeypatch):
    """Dagster sets a sensor's resources up and tears them down on every tick: the database resource of a tick
    is the process's kept pool (one connection reused, not one opened per tick), while a run's is its own and
    closed at the run's end."""
    from resources import dagster_resources

    monkeypatch.setattr(dagster_resources, "_TICK_DATABASES", {})
    pools = []
    for _ in range(3):
        with dg.build_sensor_context(instance=instance, resources={"database": DatabaseResource(url=db_url)}) as ctx:
            pools.append(ctx.resources.database.db)
    assert pools[0] is pools[1] is pools[2]
    assert not pools[0].pool.closed  # torn down after each tick, still open

    run = dg.DagsterRun(job_name="index_versions", run_id="r-1")
    with dg.build_resources({"database": DatabaseResource(url=db_url)}, instance=instance, dagster_run=run) as res:
        own = res.database.db
        assert own is not pools[0]
    assert own.pool.closed


def test_a_tick_evaluated_as_the_daemon_does_builds_no_instance_for_resources(db_url, publish_task, instance,
                                                                              monkeypatch):
    """The code server hands a sensor the resources it declares (dagster/_grpc/impl.py), and for any of them
    Dagster builds a whole instance from the daemon's ref, every tick, to pass to them. The claiming sensor
    declares none, and a tick that claims logs through the kept tick instance (``context.log`` builds one
    too): over three claiming ticks evaluated that way, one instance is built, and the ticks share the
    process's kept database pool."""
    built, repo, sensor, declared = _as_the_daemon_evaluates("claim_index_tasks", db_url, monkeypatch)
    pools = []
    real_task_queue = sensors.task_queue
    monkeypatch.setattr(sensors, "task_queue", lambda database: pools.append(database.db) or real_task_queue(database))
    for _ in range(3):
        task = publish_task()
        with dg.SensorEvaluationContext(instance_ref=instance.get_ref(), resources=declared) as ctx:
            result = sensors.claim_index_tasks(ctx)
        assert [t for r in result.run_requests for t, _ in leases_of(r.tags)] == [task.task_id]
        # its key added by the tick itself, in one statement; no request left for the daemon to check key by key
        assert not result.dynamic_partitions_requests
        assert instance.has_dynamic_partition(VERSIONS_PARTITIONS_NAME, result.run_requests[0].partition_key)
    assert declared == {} and len(built) == 1
    assert pools[0] is pools[1] is pools[2]


def test_the_run_failure_sensor_evaluated_as_the_daemon_does_builds_no_instance_per_tick(db, db_url, publish_task,
                                                                                        instance, monkeypatch):
    """Dagster's run-status wrapper reads ``context.instance`` before the sensor's own code runs; the sensor is
    lent the kept tick instance first (``dagster_private.run_before_evaluation``) and declares no resource. Over
    three ticks evaluated from the daemon's ref, one instance is built, and a run that crashed between two of
    them still has its tasks recorded RUN_CRASHED."""
    from dagster._core.storage.dagster_run import DagsterRunStatus

    from pipelines.jobs import index_versions_job
    from resources.dagster_resources import OWNER_TAG, lease_tags, run_owner
    from resources.task_queue import TaskQueue

    built, repo, sensor, declared = _as_the_daemon_evaluates("record_crashed_runs", db_url, monkeypatch)
    assert declared == {}

    def tick(cursor):
        with dg.SensorEvaluationContext(instance_ref=instance.get_ref(), resources=declared, cursor=cursor,
                                        repository_def=repo) as ctx:
            return sensor.evaluate_tick(ctx).cursor

    cursor = tick(None)  # the first tick only places the cursor
    task = publish_task()
    queue = TaskQueue(db)
    claimed = queue.claim("batch-x", limit=1, for_run=True)
    assert [t.lease.task_id for t in claimed] == [task.task_id]
    queue.adopt([t.lease for t in claimed], run_owner("c" * 32))  # the run started it, then died
    run = instance.add_run(dg.DagsterRun(
        job_name=index_versions_job.name, run_id="c" * 32, status=DagsterRunStatus.STARTED,
        tags={**lease_tags([(t.lease.task_id, t.lease.attempt) for t in claimed]), OWNER_TAG: "batch-x"}))
    instance.report_run_failed(run)
    cursor = tick(cursor)
    tick(cursor)
    assert len(built) == 1  # the kept one, built at the first tick; not one per tick
    row = db.fetch_one("task_get", {"task_id": task.task_id})
    assert (row["status"], row["error_code"]) == ("RETRY_WAIT", "RUN_CRASHED"), dict(row)
