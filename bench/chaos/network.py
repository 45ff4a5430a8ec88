"""``bench.chaos --network``: PostgreSQL on a host of its own, silent partitions between it and the Dagster host.

Two network namespaces on this machine (bench/netns.py): PostgreSQL in A, listening on A's veth address; the
soak itself joins B (``netns.inside``), so ``dagster dev``, its daemon, code server and run processes, the
publisher, the source driver and the reader all reach PostgreSQL only over the veth link (KBINDEX_DATABASE_URL
and DAGSTER_PG_URL name ``10.77.0.1``). The bench's own bookkeeping (progress, victims, end checks, the verifier)
uses PostgreSQL's Unix socket, which no cut touches, so observing never depends on the link.

Alongside the process faults, ``NetworkFaults.loop`` cuts the link: nftables DROP rules in both namespaces (no
RST, no ICMP: each side's packets vanish), each cut longer than a lease, timed to land while a run holds a
task at the ``embed`` stage, then one at ``publish`` (alternating; it waits up to ``stage_wait`` seconds for
one, and cuts anyway when none comes: the record says which stage it found). Then it heals and follows
what the run host held at the cut: how long until every lease it held moved on (finished, released for a
retry, or claimed again), how they moved on, how many were taken over (claimed under a later attempt), and how long until the Dagster runs that were STARTED at the cut ended (their run
slots free). Optionally a lossy period follows (``loss_percent`` of the link's packets dropped for
``loss_seconds``), slow as well with ``net_delay_ms``: then every connection from B, all round, goes through a
relay in A (bench/relay.py, no netem here) that adds nothing until that period and the delay each way during
it; the record counts the tasks that finished and the leases taken over meanwhile.

The round's connection bounds (NET_BOUNDS) are the defaults' shape, shortened so that a silent connection
errors within about 5 s, against a 20 s lease (the defaults: 30 s against 60 s).
"""

from __future__ import annotations

import threading
import time
from typing import Any

NET_BOUNDS = {
    "KBINDEX_PG_CONNECT_TIMEOUT_S": "3",
    "KBINDEX_PG_KEEPALIVES_IDLE_S": "2",
    "KBINDEX_PG_KEEPALIVES_INTERVAL_S": "1",
    "KBINDEX_PG_KEEPALIVES_COUNT": "3",
    "KBINDEX_PG_TCP_USER_TIMEOUT_MS": "5000",
    "KBINDEX_PG_IDLE_IN_TRANSACTION_MS": "5000",
    "KBINDEX_PG_RECONNECT_S": "2",
}
"""The round's KBINDEX_PG_* bounds, for the soak's own process and ``dagster dev`` alike."""
STAGE_CYCLE = ("embed", "publish")
ACTIVE_RUN = ("STARTED", "STARTING", "CANCELING", "QUEUED_STARTING")


class NetPostgres:
    """The namespaced server behind the interface bench.chaos uses for its embedded one (stop, start, cleanup)."""

    def __init__(self, hosts: Any, relay: Any = None) -> None:
        self.hosts, self.relay = hosts, relay
        self.admin_url = hosts.local_url()

    def stop(self) -> None:
        self.hosts.stop_postgres()

    def start(self) -> None:
        self.hosts.start_postgres()
        self.hosts.wait_ready()

    def cleanup(self) -> None:
        if self.relay is not None:
            self.relay.kill()
        self.hosts.close()


class NetworkFaults:
    """The hosts, the veth URLs, and the cut / heal thread (see the module docstring)."""

    def __init__(self, chaos: Any) -> None:
        from bench.netns import Hosts

        self.chaos, self.cfg = chaos, chaos.cfg
        self.hosts = Hosts(prefix="kc")
        self.cuts: list[dict[str, Any]] = []
        self.loss: dict[str, Any] = {}
        self.active = threading.Event()
        """Set while the link is cut or lossy, and for ``grace`` seconds after: errors then are expected."""
        self.healed_at = 0.0
        self.grace = 15.0
        self.done = threading.Event()
        self.relay: Any = None

    def start(self) -> NetPostgres:
        self.hosts.start()
        self.hosts.wait_ready()
        if self.cfg.net_delay_ms > 0:
            from bench.relay import start_relay

            self.relay = start_relay(self.hosts, self.cfg.net_delay_ms, initial_ms=0)
        return NetPostgres(self.hosts, self.relay)

    def remote_url(self, database: str) -> str:
        """Where B's clients reach PostgreSQL: the relay in front of it, or the server itself."""
        if self.relay is not None:
            from bench.relay import relay_url

            return relay_url(database)
        return self.hosts.remote_url(database)

    def local_url(self, database: str) -> str:
        return self.hosts.local_url(database)

    def expected(self) -> bool:
        """Whether a database error now is the link's doing (cut, lossy, or healed less than ``grace`` s ago)."""
        return self.active.is_set() or time.monotonic() < self.healed_at + self.grace

    # -- the fault thread ----------------------------------------------------------------------------

    def loop(self) -> None:
        """The cuts, spread over the target's progress, then the lossy period; ``done`` once all have healed."""
        chaos, cfg = self.chaos, self.cfg
        try:
            n = cfg.net_cuts
            for i in range(n):
                at = 0.15 + 0.55 * i / max(1, n)
                while not chaos.stop_event.is_set() and chaos._progress() < at:
                    time.sleep(0.3)
                if chaos.stop_event.is_set():
                    return
                with chaos.fault_lock:
                    self._cut(STAGE_CYCLE[i % len(STAGE_CYCLE)])
            if cfg.net_loss_percent > 0 and cfg.net_loss_seconds > 0 and not chaos.stop_event.is_set():
                with chaos.fault_lock:
                    self._lossy()
        except Exception as exc:  # noqa: BLE001 - reported, and the soak fails
            import traceback

            chaos.c.errors.append(f"network: {type(exc).__name__}: {exc}\n{traceback.format_exc()}")
        finally:
            self.hosts.heal()
            self.done.set()

    def _running(self) -> list[tuple[int, int, str | None, bool]]:
        """(task, attempt, stage, reserved) of every RUNNING task: reserved for a run not started yet (its run adopts
        it even after lease_until while no claim took it over), or a started run's own lease."""
        from bench.chaos import _sql

        return [tuple(r) for r in _sql(
            self.chaos.url, "SELECT task_id, attempts, stage, lease_reserved FROM index_task WHERE status = 'RUNNING'")]

    def _active_runs(self) -> list[str]:
        from bench.chaos import _sql

        return [r[0] for r in _sql(self.chaos.dg_url, "SELECT run_id FROM runs WHERE status = ANY(%s)", [list(ACTIVE_RUN)])]

    def _cut(self, stage: str) -> None:
        """Wait (up to ``net_stage_wait`` s) for a task RUNNING at ``stage``, cut, hold, heal, follow the aftermath."""
        chaos, cfg = self.chaos, self.cfg
        waited_from = time.monotonic()
        held = self._running()
        while not any(s == stage for _, _, s, _ in held) and time.monotonic() - waited_from < cfg.net_stage_wait:
            if chaos.stop_event.is_set():
                return
            time.sleep(0.05)
            held = self._running()
        self.hosts.cut()
        self.active.set()
        cut_at = time.monotonic()
        held = self._running()  # what the run host holds as the link goes silent
        runs = self._active_runs()
        pids = [p.pid for p in chaos.dagster.run_processes()]
        found = sorted({s for _, _, s, _ in held if s})
        chaos._note(f"network cut {len(self.cuts) + 1} (target stage {stage}, held {len(held)} lease(s) at {found},"
                    f" {len(runs)} run(s) active) for {cfg.net_cut_seconds:.0f} s")
        record: dict[str, Any] = {
            "target_stage": stage, "stage_reached": stage in found, "stages_held_at_cut": found,
            "waited_for_stage_seconds": round(cut_at - waited_from, 1), "leases_held_at_cut": len(held),
            "of_them_reserved_for_runs_not_started": sum(1 for *_, reserved in held if reserved),
            "runs_active_at_cut": len(runs), "run_processes_at_cut": len(pids),
        }
        try:
            while time.monotonic() - cut_at < cfg.net_cut_seconds and not chaos.stop_event.is_set():
                time.sleep(0.2)
        finally:
            self.hosts.heal()
            healed = time.monotonic()
            self.healed_at = healed
            self.active.clear()
        record["cut_seconds"] = round(healed - cut_at, 1)
        chaos._note(f"network healed after {record['cut_seconds']} s")
        self.cuts.append(record)
        self._aftermath(record, held, runs, pids, healed)

    def _aftermath(self, record: dict[str, Any], held: list[tuple[int, int, str | None, bool]],
                   runs: list[str], pids: list[int], healed: float) -> None:
        """After the heal: until the leases held at the cut moved on and the runs active then ended (bounded)."""
        import psutil

        from bench.chaos import _sql

        chaos, cfg = self.chaos, self.cfg
        ids, attempts = [t for t, *_ in held], [a for _, a, *_ in held]
        bound = cfg.lease_seconds + 60
        deadline = healed + max(bound, cfg.lease_seconds * 4 + 40)
        leases_at = runs_at = None
        while time.monotonic() < deadline and not chaos.stop_event.is_set():
            now = time.monotonic()
            if leases_at is None:
                moved, total = _sql(
                    chaos.url,
                    "SELECT count(*) FILTER (WHERE t.attempts > l.attempt OR t.status <> 'RUNNING'), count(*) FROM index_task t"
                    " JOIN unnest(%s::bigint[], %s::int[]) AS l(task_id, attempt) ON l.task_id = t.task_id",
                    [ids, attempts])[0]
                if moved == total:
                    leases_at = now
            if runs_at is None:
                still = _sql(chaos.dg_url, "SELECT count(*) FROM runs WHERE run_id = ANY(%s) AND status = ANY(%s)",
                             [runs, list(ACTIVE_RUN)])[0][0]
                if still == 0:
                    runs_at = now
            if leases_at is not None and runs_at is not None:
                break
            time.sleep(0.5)
        record["moved_on_as"] = {f"{status}{' (later attempt)' if later else ''}": n for status, later, n in _sql(
            chaos.url, "SELECT t.status, t.attempts > l.attempt, count(*) FROM index_task t"
                       " JOIN unnest(%s::bigint[], %s::int[]) AS l(task_id, attempt) ON l.task_id = t.task_id"
                       " GROUP BY 1, 2 ORDER BY 1, 2", [ids, attempts])}
        # A later attempt is a takeover (a claim of the expired lease: RUNNING -> RUNNING) or a retry (the run
        # failed the task, e.g. INDEX_WRITE_FAILED when its connection died, and a claim took it from RETRY_WAIT).
        later, taken = _sql(
            chaos.url,
            "SELECT count(*) FILTER (WHERE t.attempts > l.attempt), count(*) FILTER (WHERE EXISTS ("
            " SELECT 1 FROM task_event e WHERE e.task_id = t.task_id AND e.kind = 'transition'"
            " AND e.from_status = 'RUNNING' AND e.to_status = 'RUNNING' AND e.attempt > l.attempt))"
            " FROM index_task t JOIN unnest(%s::bigint[], %s::int[]) AS l(task_id, attempt) ON l.task_id = t.task_id",
            [ids, attempts])[0]
        record["taken_over"], record["retried_after_failing"] = int(taken), int(later) - int(taken)
        record["leases_moved_on_seconds_after_heal"] = None if leases_at is None else round(leases_at - healed, 1)
        record["runs_ended_seconds_after_heal"] = None if runs_at is None else round(runs_at - healed, 1)
        record["runs_not_ended_within_lease_plus_60s"] = 0 if runs_at is not None and runs_at - healed <= bound else len(
            _sql(chaos.dg_url, "SELECT run_id FROM runs WHERE run_id = ANY(%s) AND status = ANY(%s)", [runs, list(ACTIVE_RUN)]))
        record["run_processes_from_cut_still_alive"] = sum(1 for p in pids if psutil.pid_exists(p))
        chaos._note(f"after cut {len(self.cuts)}: {record['taken_over']}/{len(held)} lease(s) taken over, leases moved on"
                    f" {record['leases_moved_on_seconds_after_heal']} s and runs ended"
                    f" {record['runs_ended_seconds_after_heal']} s after the heal")

    def _lossy(self) -> None:
        """``net_loss_percent`` % of the link's packets dropped for ``net_loss_seconds`` (and, with the relay,
        ``net_delay_ms`` added each way), with what finished and what was taken over meanwhile."""
        from bench.chaos import _sql

        cfg, chaos = self.cfg, self.chaos
        delay = f", {cfg.net_delay_ms} ms added each way" if self.relay is not None else ""
        chaos._note(f"lossy link: {cfg.net_loss_percent} % of packets dropped{delay} for {cfg.net_loss_seconds:.0f} s")
        count = ("SELECT count(*) FILTER (WHERE status = 'SUCCEEDED'), (SELECT count(*) FROM task_event"  # takeovers as
                 " WHERE kind = 'transition' AND from_status = 'RUNNING' AND to_status = 'RUNNING') FROM index_task")  # the report counts them
        succeeded_before, takeovers_before = _sql(chaos.url, count)[0]
        self.active.set()
        started = time.monotonic()
        try:
            self.hosts.lose(cfg.net_loss_percent)
            if self.relay is not None:
                self.relay.slow()
            while time.monotonic() - started < cfg.net_loss_seconds and not chaos.stop_event.is_set():
                time.sleep(0.2)
            dropped = self.hosts.dropped_packets()
        finally:
            if self.relay is not None:
                self.relay.fast()
            self.hosts.heal()
            self.healed_at = time.monotonic()
            self.active.clear()
        succeeded_after, takeovers_after = _sql(chaos.url, count)[0]
        self.loss = {"percent": cfg.net_loss_percent, "delay_ms_each_way": cfg.net_delay_ms if self.relay else 0,
                     "seconds": round(self.healed_at - started, 1), "packets_dropped": dropped,
                     "tasks_succeeded_meanwhile": succeeded_after - succeeded_before,
                     "leases_taken_over_meanwhile": takeovers_after - takeovers_before}

    # -- figures -------------------------------------------------------------------------------------

    def report(self) -> dict[str, Any]:
        cuts = self.cuts
        return {
            "postgres_host": self.hosts.remote_url("kbindex").split("@")[1].split("/")[0],
            "bounds": NET_BOUNDS,
            "cuts": len(cuts),
            "cut_seconds_total": round(sum(c["cut_seconds"] for c in cuts), 1),
            "cuts_at_target_stage": {s: sum(1 for c in cuts if c["target_stage"] == s and c["stage_reached"])
                                     for s in STAGE_CYCLE},
            "leases_held_at_cuts": sum(c["leases_held_at_cut"] for c in cuts),
            "of_them_reserved_for_runs_not_started": sum(c["of_them_reserved_for_runs_not_started"] for c in cuts),
            "leases_taken_over_after_cuts": sum(c.get("taken_over", 0) for c in cuts),
            "max_seconds_heal_to_leases_moved_on": _max(c.get("leases_moved_on_seconds_after_heal") for c in cuts),
            "max_seconds_heal_to_runs_ended": _max(c.get("runs_ended_seconds_after_heal") for c in cuts),
            "cut_details": cuts,
            **({"lossy_period": self.loss} if self.loss else {}),
        }

    def must_be_zero(self) -> dict[str, int]:
        """Runs active at a cut still holding their slot lease + 60 s after the heal (issue #32's bound)."""
        return {"cut_runs_not_ended_within_lease_plus_60s": sum(c.get("runs_not_ended_within_lease_plus_60s", 0)
                                                                 for c in self.cuts)}


def _max(values: Any) -> float | None:
    present = [v for v in values if v is not None]
    return max(present) if present else None
