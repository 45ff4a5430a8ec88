"""The claiming sensor waits inside its tick for a publish (issue #34: publish -> searchable waited on
Dagster's 5-s sensor loop): LISTEN before the claim, claim again on a task event, until the tick's deadline."""

from __future__ import annotations

import threading
import time

import dagster as dg
import psycopg

import pipelines.sensors as sensors
from pipelines.stopping import STOP_FILE_ENV, request_stop, stop_check
from resources.dagster_resources import DatabaseResource, leases_of
from resources.task_wakeup import STOP_CHECK_SECONDS, TaskWakeup


def tick(instance, db_url) -> dg.SensorResult | dg.SkipReason:
    with dg.build_sensor_context(instance=instance, resources={"database": DatabaseResource(url=db_url)}) as ctx:
        return sensors.claim_index_tasks(ctx)


def test_a_publish_during_an_idle_tick_is_claimed_by_that_tick(db_url, publish_task, instance, monkeypatch):
    monkeypatch.setattr(sensors, "CLAIM_WAIT_SECONDS", 30.0)
    results = []
    ticking = threading.Thread(target=lambda: results.append(tick(instance, db_url)))
    ticking.start()
    time.sleep(1.0)  # the tick has claimed nothing and is waiting
    assert ticking.is_alive()
    published = publish_task()
    ticking.join(20)
    assert not ticking.is_alive(), "the tick kept waiting after the publish"
    (result,) = results
    assert isinstance(result, dg.SensorResult), result
    assert [t for r in result.run_requests for t, _ in leases_of(r.tags)] == [published.task_id]


def test_an_idle_tick_ends_at_its_deadline_with_nothing_claimed(db_url, instance, monkeypatch):
    monkeypatch.setattr(sensors, "CLAIM_WAIT_SECONDS", 1.0)
    started = time.monotonic()
    result = tick(instance, db_url)
    waited = time.monotonic() - started
    assert isinstance(result, dg.SkipReason) and result.skip_message == "no due index tasks"
    assert 1.0 <= waited < 10.0


def test_an_event_that_makes_nothing_due_does_not_end_the_wait(db_url, publish_task, instance, monkeypatch):
    """Any task event wakes the tick (a run's progress): it claims nothing, and waits again until a publish."""
    monkeypatch.setattr(sensors, "CLAIM_WAIT_SECONDS", 30.0)
    first = publish_task()
    results = []
    ticking = threading.Thread(target=lambda: results.append(tick(instance, db_url)))
    ticking.start()
    ticking.join(20)
    (claimed_first,) = results  # the first publish was due: claimed at once, no waiting
    assert [t for r in claimed_first.run_requests for t, _ in leases_of(r.tags)] == [first.task_id]

    results.clear()
    ticking = threading.Thread(target=lambda: results.append(tick(instance, db_url)))
    ticking.start()
    time.sleep(1.0)
    with psycopg.connect(db_url, autocommit=True) as conn:  # an event of the claimed task: nothing new is due
        conn.execute("NOTIFY kbindex_task_event, '0'")
    time.sleep(1.0)
    assert ticking.is_alive(), "an event with nothing due ended the wait"
    second = publish_task()
    ticking.join(20)
    (result,) = results
    assert [t for r in result.run_requests for t, _ in leases_of(r.tags)] == [second.task_id]


def test_an_idle_tick_stops_waiting_once_kbindex_dev_stops_dagster(db_url, instance, monkeypatch, tmp_path):
    """Dagster's stop waits for the sensor RPC in flight: a tick waiting out its 4.5 s held every `kbindex dev`
    stop that long (past its 12 s grace on a loaded CI machine). The stop file ends the wait within a poll."""
    stop_file = tmp_path / "dagster-stopping"
    monkeypatch.setenv(STOP_FILE_ENV, str(stop_file))
    monkeypatch.setattr(sensors, "CLAIM_WAIT_SECONDS", 30.0)
    results = []
    ticking = threading.Thread(target=lambda: results.append(tick(instance, db_url)))
    ticking.start()
    time.sleep(1.0)
    assert ticking.is_alive(), "the tick is waiting for a publish"
    asked = time.monotonic()
    request_stop(stop_file)
    ticking.join(20)
    assert not ticking.is_alive()
    assert time.monotonic() - asked < 5.0, "the tick waited on after the stop file appeared"
    (result,) = results
    assert isinstance(result, dg.SkipReason) and result.skip_message == "no due index tasks"


def test_a_tick_claims_nothing_once_kbindex_dev_stops_dagster(db_url, publish_task, instance, monkeypatch,
                                                              tmp_path):
    """A claim in the stop's last seconds would reserve a task for a run that never starts (seen under load in
    test_dev_command's stop with a run in flight: its task not claimable 45 s after the stop). Once the stop file
    exists a tick claims nothing, due tasks included; they stay due for the next start."""
    stop_file = tmp_path / "dagster-stopping"
    monkeypatch.setenv(STOP_FILE_ENV, str(stop_file))
    published = publish_task()
    request_stop(stop_file)
    result = tick(instance, db_url)
    assert isinstance(result, dg.SkipReason) and "stopping" in result.skip_message, result
    with psycopg.connect(db_url) as conn:
        (status,) = conn.execute("SELECT status FROM index_task WHERE task_id = %s", [published.task_id]).fetchone()
    assert status == "PENDING"
    stop_file.unlink()
    result = tick(instance, db_url)  # the next start (which removes the file) claims it
    assert [t for r in result.run_requests for t, _ in leases_of(r.tags)] == [published.task_id]


def test_a_tick_watching_for_a_stop_still_claims_a_publish(db_url, publish_task, instance, monkeypatch, tmp_path):
    """Under `kbindex dev` the wait polls the stop file between short waits: a publish still wakes it."""
    monkeypatch.setenv(STOP_FILE_ENV, str(tmp_path / "dagster-stopping"))
    monkeypatch.setattr(sensors, "CLAIM_WAIT_SECONDS", 30.0)
    results = []
    ticking = threading.Thread(target=lambda: results.append(tick(instance, db_url)))
    ticking.start()
    time.sleep(1.0)
    assert ticking.is_alive()
    published = publish_task()
    ticking.join(20)
    assert not ticking.is_alive(), "the tick kept waiting after the publish"
    (result,) = results
    assert [t for r in result.run_requests for t, _ in leases_of(r.tags)] == [published.task_id]


def test_only_kbindex_dev_ticks_poll_for_a_stop_and_a_given_check_is_polled(db_url, monkeypatch):
    """Outside `kbindex dev` a tick gets no stop check (one blocking wait); a wait given one calls it each poll."""
    monkeypatch.delenv(STOP_FILE_ENV, raising=False)
    assert stop_check() is None
    checks = []
    with TaskWakeup(db_url) as wakeup:
        started = time.monotonic()
        assert not wakeup.wait(started + 1.0, stop=lambda: checks.append(1) or False)
        assert time.monotonic() - started >= 1.0
    assert len(checks) >= 1.0 / STOP_CHECK_SECONDS - 1, "the wait did not look at its stop check between polls"


def test_a_full_run_queue_does_not_wait(db_url, instance, monkeypatch):
    """With the run queue full the tick only takes over expired leases: no publish could be started, so no wait."""
    monkeypatch.setattr(sensors, "CLAIM_WAIT_SECONDS", 30.0)
    monkeypatch.setattr(sensors, "MAX_WAITING_RUNS", 0)
    started = time.monotonic()
    result = tick(instance, db_url)
    assert isinstance(result, dg.SkipReason) and "still waiting to start" in result.skip_message
    assert time.monotonic() - started < 10.0


def test_a_failed_listen_claims_once_and_says_so(db_url, instance, monkeypatch, capsys):
    def refuse(url, role="run"):
        raise psycopg.OperationalError("connection refused")

    monkeypatch.setattr(sensors, "CLAIM_WAIT_SECONDS", 30.0)
    monkeypatch.setattr(sensors, "TaskWakeup", refuse)
    started = time.monotonic()
    result = tick(instance, db_url)
    assert isinstance(result, dg.SkipReason) and result.skip_message == "no due index tasks"
    assert time.monotonic() - started < 10.0
    assert "could not LISTEN for new tasks (OperationalError): claiming once this tick" in capsys.readouterr().err


def test_a_publish_committed_after_listen_and_before_the_wait_still_wakes_it(db_url, publish_task):
    with TaskWakeup(db_url) as wakeup:
        publish_task()  # between the claim (nothing due) and the wait
        started = time.monotonic()
        assert wakeup.wait(started + 30.0)
        assert time.monotonic() - started < 10.0
        assert not wakeup.wait(time.monotonic() + 0.2), "one wake-up per event burst: the rest were drained"


def test_a_waiting_tick_leaves_a_fast_path_delete_to_its_publisher(db, db_url, publisher, instance, monkeypatch):
    """Woken by a delete whose publishing process finishes it itself (the fast path), the tick lets it: the grace
    before its claim is what keeps it from sending the tombstone through a run."""
    from resources.chunk_copy import FastPublish
    from resources.publisher import Publisher
    from resources.task_queue import TaskQueue

    first = publisher.publish("acme", "doc-1", b"body", "doc-1.txt")
    assert [t for r in tick(instance, db_url).run_requests for t, _ in leases_of(r.tags)] == [first.task_id]
    monkeypatch.setattr(sensors, "CLAIM_WAIT_SECONDS", 4.0)
    monkeypatch.setattr(sensors, "CLAIM_WAKE_GRACE_SECONDS", 1.0)
    results = []
    ticking = threading.Thread(target=lambda: results.append(tick(instance, db_url)))
    ticking.start()
    time.sleep(1.0)
    fast = Publisher(db, publisher.blobs, fast=FastPublish(db, TaskQueue(db, lease_seconds=60)))
    deleted = fast.delete("acme", "doc-1")
    ticking.join(20)
    assert deleted.status == "SUCCEEDED", "the fast path published the tombstone in the call"
    (result,) = results
    assert isinstance(result, dg.SkipReason), "the tick claimed nothing: the tombstone was never due to it"


def test_an_idle_tick_claims_once_not_woken_by_its_own_empty_claims(db_url, instance, monkeypatch):
    """A claim that finds nothing due inserts no task event; the event trigger (per statement) used to notify
    anyway, with payload '0', so an idle tick woke itself every wake grace (0.1 s) and claimed ~40 times a tick
    (migration 0050)."""
    monkeypatch.setattr(sensors, "CLAIM_WAIT_SECONDS", 1.5)
    claims = []
    real = sensors.claim_due
    monkeypatch.setattr(sensors, "claim_due", lambda *a, **k: claims.append(1) or real(*a, **k))
    with TaskWakeup(db_url) as wakeup:
        result = tick(instance, db_url)
        woke = wakeup.wait(time.monotonic() + 0.5)
    assert isinstance(result, dg.SkipReason) and result.skip_message == "no due index tasks"
    assert len(claims) == 1, f"an idle tick claimed {len(claims)} times"
    assert not woke, "a tick that claimed nothing notified a task event"


def test_an_inserted_task_event_still_notifies_its_id(db_url, publish_task):
    with TaskWakeup(db_url) as wakeup:
        published = publish_task()
        notes = list(wakeup.conn.notifies(timeout=5, stop_after=1))
    with psycopg.connect(db_url) as conn:
        newest = conn.execute("SELECT max(event_id) FROM task_event WHERE task_id = %s",
                              [published.task_id]).fetchone()[0]
    assert [n.payload for n in notes] == [str(newest)]


def tick_as(name, instance, db_url) -> dg.SensorResult | dg.SkipReason:
    with dg.build_sensor_context(instance=instance, resources={"database": DatabaseResource(url=db_url)}) as ctx:
        return sensors.claim_tick(ctx, name)


def claimed_ids(result) -> list[int]:
    assert isinstance(result, dg.SensorResult), result
    return [t for r in result.run_requests for t, _ in leases_of(r.tags)]


def in_thread(fn):
    results = []
    thread = threading.Thread(target=lambda: results.append(fn()))
    thread.start()
    return thread, results


def test_the_code_location_has_the_configured_claiming_sensors():
    from pipelines.definitions import defs

    names = {s.name for s in defs.get_repository_def().sensor_defs}
    expected = {"claim_index_tasks", *(f"claim_index_tasks_{i}" for i in range(2, sensors.CLAIM_SENSORS + 1))}
    assert expected <= names and sensors.CLAIM_SENSORS == 3, "the default: three claims a daemon loop"


def test_a_claim_hands_the_rest_of_the_loops_wait_to_the_next_claiming_sensor(db_url, publish_task, instance,
                                                                              monkeypatch):
    """Back to back: the loop's first tick claimed one publish; the next claiming sensor, evaluated right after it,
    claims the publish that follows instead of leaving it for the daemon's next loop (issue #34)."""
    monkeypatch.setattr(sensors, "CLAIM_WAIT_SECONDS", 30.0)
    first = publish_task()
    assert claimed_ids(tick_as("claim_index_tasks", instance, db_url)) == [first.task_id]
    thread, results = in_thread(lambda: tick_as("claim_index_tasks_2", instance, db_url))
    time.sleep(1.0)
    assert thread.is_alive(), "the second sensor is waiting in the window the first one opened"
    second = publish_task()
    thread.join(20)
    assert not thread.is_alive()
    assert claimed_ids(results[0]) == [second.task_id]


def test_after_the_window_a_later_claiming_tick_returns_at_once(db_url, instance, monkeypatch):
    """An idle loop: the first tick waited the whole window; the others must not add a wait each."""
    monkeypatch.setattr(sensors, "CLAIM_WAIT_SECONDS", 1.0)
    claims = []
    real = sensors.claim_due
    monkeypatch.setattr(sensors, "claim_due", lambda *a, **k: claims.append(1) or real(*a, **k))
    assert isinstance(tick_as("claim_index_tasks", instance, db_url), dg.SkipReason)
    started = time.monotonic()
    late = tick_as("claim_index_tasks_2", instance, db_url)
    assert isinstance(late, dg.SkipReason) and "claim window has ended" in late.skip_message
    assert time.monotonic() - started < 0.5 and claims == [1], "the late tick claimed or waited"
    started = time.monotonic()
    assert isinstance(tick_as("claim_index_tasks", instance, db_url), dg.SkipReason)
    assert time.monotonic() - started >= 1.0, "the next loop's first tick opens a new window and waits it out"


def test_a_later_tick_leaves_a_burst_to_the_next_loops_first_tick(db_url, publisher, publish_task, instance,
                                                                   monkeypatch):
    """More than WAKE_CLAIM_MAX due on a wake-up is a burst: it goes in the next loop's bigger runs, not in a
    later tick's run of whatever had arrived by then."""
    from resources.publisher import PublishRequest

    monkeypatch.setattr(sensors, "CLAIM_WAIT_SECONDS", 3.0)
    monkeypatch.setattr(sensors, "WAKE_CLAIM_MAX", 2)
    first = publish_task()
    assert claimed_ids(tick_as("claim_index_tasks", instance, db_url)) == [first.task_id]
    thread, results = in_thread(lambda: tick_as("claim_index_tasks_2", instance, db_url))
    time.sleep(0.5)
    burst = publisher.publish_all("acme", [PublishRequest(f"burst-{i}", f"burst {i}".encode(), f"b{i}.txt")
                                           for i in range(3)])
    thread.join(20)
    assert isinstance(results[0], dg.SkipReason), "a later tick claimed a burst"
    assert sorted(claimed_ids(tick_as("claim_index_tasks", instance, db_url))) == sorted(r.task_id for r in burst)


def test_a_later_tick_waits_out_a_full_run_queue_and_claims_once_it_has_room(db_url, publish_task, instance,
                                                                             monkeypatch):
    """The queue is full of the run the loop's first tick just requested; the later tick waits, claims nothing
    while it stays full, and claims what is due once the run has started."""
    monkeypatch.setattr(sensors, "CLAIM_WAIT_SECONDS", 30.0)
    monkeypatch.setattr(sensors, "MAX_WAITING_RUNS", 0)  # full
    started = time.monotonic()
    assert isinstance(tick_as("claim_index_tasks", instance, db_url), dg.SkipReason)  # opens the window
    assert time.monotonic() - started < 10.0, "the loop's first tick waited with the run queue full"
    thread, results = in_thread(lambda: tick_as("claim_index_tasks_2", instance, db_url))
    time.sleep(0.5)
    second = publish_task()
    time.sleep(1.5)
    assert thread.is_alive(), "a later tick claimed with the run queue full, or stopped waiting"
    monkeypatch.setattr(sensors, "MAX_WAITING_RUNS", 1)  # the queued run started
    third = publish_task()
    thread.join(20)
    assert sorted(claimed_ids(results[0])) == sorted([second.task_id, third.task_id])
