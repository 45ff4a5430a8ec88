"""``bench.chaos --network``: PostgreSQL, the API and the embedding service on hosts of their own, silent partitions.

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

Two more hosts (bench/netns.py ``add_embed_host``, ``add_api_host``; the services from bench/net_services.py):
the embedding service on C, which the runs reach over TCP with its key handshake (KBINDEX_EMBED_SERVICE=tcp://,
a copy of its key; the fake model is served there, with the round's delay and faults; bounds NET_EMBED_BOUNDS),
and ``kbindex api`` on D, linked to A for PostgreSQL and to B, from where the bench talks to it. ``plan`` takes
the faults in turn: the PostgreSQL cuts above, then

- ``_api_cut``: event streams opened on up to API_STREAMS unfinished tasks and searches (and ``/healthz``,
  ``/readyz``) asked without pause through the API; D <-> A cut for ``net_api_cut_seconds`` while B keeps working
  (the streams' tasks go on writing events); healed. ``classify_api_requests`` judges the answers (``/healthz`` 200
  within HEALTH_CEILING_S; a request needing the database: no hang past API_CEILING_S, and 503 API_DB_CODE when
  answered before the heal), ``stream_outcome`` each stream (open through the cut, exactly the database's events
  in order, caught up within RESUME_BOUND_S of the heal), and searches must answer 200 again within it;
- ``_embed_cut``: once the service has just answered a batch and a task still has texts to embed, B <-> C cut
  for ``net_embed_cut_seconds``; healed; followed as a PostgreSQL cut (leases moved on, runs ended), with the
  runs' failures by code since the cut and, after quiescence, where the tasks held at the cut ended. Lost or
  duplicated work shows in the round's own end checks.
"""

from __future__ import annotations

import json
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
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
NET_EMBED_BOUNDS = {
    "KBINDEX_EMBED_SERVICE_CONNECT_TIMEOUT_S": "3",
    "KBINDEX_EMBED_SERVICE_KEEPALIVES_IDLE_S": "2",
    "KBINDEX_EMBED_SERVICE_KEEPALIVES_INTERVAL_S": "1",
    "KBINDEX_EMBED_SERVICE_KEEPALIVES_COUNT": "3",
    "KBINDEX_EMBED_SERVICE_TCP_USER_TIMEOUT_MS": "5000",
}
"""The round's KBINDEX_EMBED_SERVICE_* bounds, for the runs and the service: a silent link errors within ~6 s."""
API_CEILING_S = 10.0
"""A request that needs the database answers (503 while the API host is cut off) before this: the API's own bound
(~5 s, resources.settings.ConnectionBounds "api") plus slack for the shared 2-core machine; no answer is a hang."""
HEALTH_CEILING_S = 2.0
"""``/healthz`` never asks the database: it answers 200 within this, cut or not."""
RESUME_BOUND_S = 30.0
"""After the API host's heal: open event streams have sent what they missed, and searches succeed, within this."""
API_STREAMS = 4
"""Event streams opened on unfinished tasks before the API host is cut off."""
API_BACKLOG = 24
"""Unfinished tasks the publisher keeps while the API host's cut is prepared and held: with three claiming
sensors (#34) a round's few open tasks were often done before the cut began, and no stream saw it (0 of 4 open at
the cut in one soak round). The streams follow the newest of them, which are indexed during the cut."""
API_DB_CODE = "INDEX_WRITE_FAILED"
"""The stable code of a 503 from a request that could not reach the database."""
STAGE_CYCLE = ("embed", "publish")
ACTIVE_RUN = ("STARTED", "STARTING", "CANCELING", "QUEUED_STARTING")


class NetPostgres:
    """The namespaced server behind the interface bench.chaos uses for its embedded one (stop, start, cleanup)."""

    def __init__(self, hosts: Any, relay: Any = None, faults: NetworkFaults | None = None) -> None:
        self.hosts, self.relay, self.faults = hosts, relay, faults
        self.admin_url = hosts.local_url()

    def stop(self) -> None:
        self.hosts.stop_postgres()

    def start(self) -> None:
        self.hosts.start_postgres()
        self.hosts.wait_ready()

    def cleanup(self) -> None:
        if self.faults is not None:
            self.faults.stop_services()
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
        self.api_cuts: list[dict[str, Any]] = []
        self.embed_cuts: list[dict[str, Any]] = []
        self.services: list[Any] = []  # the API's and the embedding service's processes
        self.api_base = ""
        self.tokens: dict[str, str] = {}
        self.embed_home: Path | None = None
        self.db: Any = None  # observations over the Unix socket (bench_chaos_* named queries)

    def start(self) -> NetPostgres:
        self.hosts.start()
        self.hosts.wait_ready()
        if self.cfg.net_delay_ms > 0:
            from bench.relay import start_relay

            self.relay = start_relay(self.hosts, self.cfg.net_delay_ms, initial_ms=0)
        self.embed_home = Path(tempfile.mkdtemp(prefix="kbes-"))  # short: a Unix socket path has ~100 bytes
        return NetPostgres(self.hosts, self.relay, self)

    def dagster_env(self) -> dict[str, str]:
        """What ``dagster dev`` and its runs need to embed through the service on the embedding host (its TCP
        address, a copy of its key, the round's bounds on that link); known before the service starts."""
        from bench.net_services import embed_address

        assert self.embed_home is not None
        return {"KBINDEX_EMBED_SERVICE": embed_address(), **NET_EMBED_BOUNDS,
                "KBINDEX_EMBED_SERVICE_KEY_FILE": str(self.embed_home / "embedder.key")}

    def start_services(self, root: Path, tenants: list[str]) -> None:
        """The embedding service on its host and ``kbindex api`` on its own (called on host B, which reaches both)."""
        import secrets

        from bench.net_services import start_api, start_embed_service
        from resources.database import Database

        cfg = self.cfg
        assert self.embed_home is not None
        self.services.append(start_embed_service(self.hosts, self.embed_home, {
            "KBINDEX_EMBED_WORKERS": "2", "KBINDEX_FAKE_DELAY": str(cfg.fake_delay), "KBINDEX_FAKE_FAULTS": cfg.faults,
            "KBINDEX_FAKE_SEED": str(cfg.seed), **NET_EMBED_BOUNDS}, log=root / "embed-service.log"))
        self.tokens = {tenant: f"chaos-{secrets.token_hex(12)}" for tenant in tenants}
        tokens_file = root / "api-tokens.json"
        tokens_file.write_text(json.dumps({token: tenant for tenant, token in self.tokens.items()}))
        tokens_file.chmod(0o600)
        (root / "apihome").mkdir(exist_ok=True)
        proc, self.api_base = start_api(self.hosts, self.hosts.remote_url("kbindex"), tokens_file, {
            "KBINDEX_HOME": str(root / "apihome"), "KBINDEX_BLOB_URL": str(root / "blobs")}, log=root / "api.log")
        self.services.append(proc)
        self.db = Database(self.chaos.url, max_size=2)

    def stop_services(self) -> None:
        import shutil

        from bench.net_services import stop

        if self.db is not None:
            self.db.close()
            self.db = None
        for proc in self.services:
            try:
                stop(proc)
            except Exception:  # noqa: BLE001 - the namespaces go next either way
                proc.kill()
        self.services = []
        if self.embed_home is not None:
            shutil.rmtree(self.embed_home, ignore_errors=True)

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

    def plan(self) -> list[str]:
        """The faults in order: PostgreSQL cuts (``postgres-embed`` / ``postgres-publish``, by target stage), API host
        cuts (``api``) and embedding host cuts (``embed``), taken in turn while each kind has some left."""
        cfg = self.cfg
        kinds = [[f"postgres-{STAGE_CYCLE[i % len(STAGE_CYCLE)]}" for i in range(cfg.net_cuts)],
                 ["api"] * cfg.net_api_cuts, ["embed"] * cfg.net_embed_cuts]
        return [k[i] for i in range(max(map(len, kinds))) for k in kinds if i < len(k)]

    def loop(self) -> None:
        """The cuts, spread over the target's progress, then the lossy period; ``done`` once all have healed."""
        chaos, cfg = self.chaos, self.cfg
        try:
            plan = self.plan()
            for i, fault in enumerate(plan):
                at = 0.15 + 0.55 * i / max(1, len(plan))
                while not chaos.stop_event.is_set() and chaos._progress() < at:
                    time.sleep(0.3)
                if chaos.stop_event.is_set():
                    return
                with chaos.fault_lock:
                    if fault == "api":
                        self._api_cut()
                    elif fault == "embed":
                        self._embed_cut()
                    else:
                        self._cut(fault.split("-", 1)[1])
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

        return [tuple(r) for r in _sql(self.chaos.url, "bench_chaos_running_tasks")]

    def _active_runs(self) -> list[str]:
        from bench.chaos import _sql

        return [r[0] for r in _sql(self.chaos.dg_url, "bench_dagster_runs_in_status", {"statuses": list(ACTIVE_RUN)})]

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
        cut_at, held, runs, pids, found = self._at_cut()
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

    def _at_cut(self) -> tuple[float, list[tuple], list[str], list[int], list[str]]:
        """Taken as a link goes silent: when, the leases the run host holds, its active runs and run processes, and the
        stages those leases are at."""
        cut_at = time.monotonic()
        held = self._running()
        runs = self._active_runs()
        pids = [p.pid for p in self.chaos.dagster.run_processes()]
        return cut_at, held, runs, pids, sorted({s for _, _, s, _ in held if s})

    def _aftermath(self, record: dict[str, Any], held: list[tuple[int, int, str | None, bool]],
                   runs: list[str], pids: list[int], healed: float, label: str = "") -> None:
        """After the heal: until the leases held at the cut moved on and the runs active then ended (bounded)."""
        import psutil

        from bench.chaos import _sql

        chaos, cfg = self.chaos, self.cfg
        label = label or f"PostgreSQL cut {len(self.cuts)}"
        ids, attempts = [t for t, *_ in held], [a for _, a, *_ in held]
        bound = cfg.lease_seconds + 60
        deadline = healed + max(bound, cfg.lease_seconds * 4 + 40)
        leases_at = runs_at = None
        while time.monotonic() < deadline and not chaos.stop_event.is_set():
            now = time.monotonic()
            if leases_at is None:
                moved, total = _sql(chaos.url, "bench_chaos_leases_moved_on", {"task_ids": ids, "attempts": attempts})[0]
                if moved == total:
                    leases_at = now
            if runs_at is None:
                still = _sql(chaos.dg_url, "bench_dagster_count_runs_of_in_status",
                             {"run_ids": runs, "statuses": list(ACTIVE_RUN)})[0][0]
                if still == 0:
                    runs_at = now
            if leases_at is not None and runs_at is not None:
                break
            time.sleep(0.5)
        record["moved_on_as"] = {f"{status}{' (later attempt)' if later else ''}": n for status, later, n in _sql(
            chaos.url, "bench_chaos_leases_moved_on_as", {"task_ids": ids, "attempts": attempts})}
        # A later attempt is a takeover (a claim of the expired lease: RUNNING -> RUNNING) or a retry (the run
        # failed the task, e.g. INDEX_WRITE_FAILED when its connection died, and a claim took it from RETRY_WAIT).
        later, taken = _sql(chaos.url, "bench_chaos_leases_later_and_taken_over", {"task_ids": ids, "attempts": attempts})[0]
        record["taken_over"], record["retried_after_failing"] = int(taken), int(later) - int(taken)
        record["leases_moved_on_seconds_after_heal"] = None if leases_at is None else round(leases_at - healed, 1)
        record["runs_ended_seconds_after_heal"] = None if runs_at is None else round(runs_at - healed, 1)
        record["runs_not_ended_within_lease_plus_60s"] = 0 if runs_at is not None and runs_at - healed <= bound else len(
            _sql(chaos.dg_url, "bench_dagster_runs_of_in_status", {"run_ids": runs, "statuses": list(ACTIVE_RUN)}))
        record["run_processes_from_cut_still_alive"] = sum(1 for p in pids if psutil.pid_exists(p))
        chaos._note(f"after the {label}: {record['taken_over']}/{len(held)} lease(s) taken over, leases moved on"
                    f" {record['leases_moved_on_seconds_after_heal']} s and runs ended"
                    f" {record['runs_ended_seconds_after_heal']} s after the heal")

    # -- the API host cut off from PostgreSQL ------------------------------------------------------------

    def _auth(self, tenant: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.tokens[tenant]}"}

    def _api_cut(self) -> None:
        """Event streams open on unfinished tasks and searches running through the API when its link to PostgreSQL
        goes silent for ``net_api_cut_seconds``; then healed. See ``classify_api_requests`` / ``stream_outcome``."""
        import random

        import httpx

        from bench.net_services import ApiClient
        from resources.task_queue import TaskQueue

        chaos, cfg = self.chaos, self.cfg
        rng = random.Random(cfg.seed + 32)
        queue = TaskQueue(self.db)
        api = ApiClient(self.api_base, ceiling=API_CEILING_S)
        chaos.extra_backlog = API_BACKLOG
        filled = time.monotonic()
        while chaos._unfinished() < API_BACKLOG // 2 and time.monotonic() - filled < 20 and not chaos.stop_event.is_set():
            time.sleep(0.2)
        tasks = self.db.fetch_all("bench_chaos_open_tasks", {"n": API_STREAMS})
        streams = {t["task_id"]: api.stream(t["task_id"], self._auth(t["tenant_id"])) for t in tasks}
        got: dict[int, list[int]] = {t: [] for t in streams}
        ended: dict[int, float] = {}

        def drain() -> None:
            for task_id, stream in streams.items():
                while task_id not in ended:
                    try:
                        event = stream.next(0)
                    except TimeoutError:
                        break
                    if event is None:
                        ended[task_id] = time.monotonic()
                    else:
                        got[task_id].append(event[0])

        opened = time.monotonic()  # each stream live (its first event) or ended (its task finished meanwhile)
        while any(not got[t] and t not in ended for t in streams) and time.monotonic() - opened < 15:
            drain()
            time.sleep(0.1)
        requests: list[tuple[str, float, float, int | None, str | None]] = []
        stop = threading.Event()
        words = ("refund", "policy", "travel", "security", "leave", "payroll")

        def ask(paths: list[str]) -> None:
            client = ApiClient(self.api_base, ceiling=API_CEILING_S)
            try:
                while not stop.is_set():
                    for path in paths:
                        tenant = rng.choice(sorted(self.tokens))
                        params = {"q": rng.choice(words), "k": 5} if path == "/search" else None
                        started = time.monotonic()
                        try:
                            status, code, took = client.get(path, self._auth(tenant), params)
                        except httpx.TransportError as exc:  # the API itself unreachable: a wrong answer
                            status, code, took = 0, type(exc).__name__, time.monotonic() - started
                        requests.append((path, started, started + took, status, code))
                        time.sleep(0.25)
            finally:
                client.close()

        askers = [threading.Thread(target=ask, args=(paths,), name="chaos-api-probe", daemon=True)
                  for paths in (["/search"], ["/search"], ["/healthz"], ["/readyz"])]
        for t in askers:
            t.start()
        try:
            time.sleep(2.0)  # searches answered before the cut
            drain()
            open_at_cut = [t for t in streams if t not in ended]
            self.hosts.cut_api()
            cut_at = time.monotonic()
            chaos._note(f"API host cut off from PostgreSQL ({len(open_at_cut)} event stream(s) open, searches running)"
                        f" for {cfg.net_api_cut_seconds:.0f} s")
            try:
                while time.monotonic() - cut_at < cfg.net_api_cut_seconds and not chaos.stop_event.is_set():
                    drain()
                    time.sleep(0.2)
            finally:
                self.hosts.heal()
                healed = time.monotonic()
            drain()
            at_heal = {t: list(got[t]) for t in streams}
            written = {t: [e["event_id"] for e in queue.events(t, 0)] for t in streams}  # what the streams owe
            resumed: dict[int, float] = {}
            while time.monotonic() - healed < RESUME_BOUND_S and not chaos.stop_event.is_set():
                drain()
                for t in open_at_cut:
                    if t not in resumed and written[t] and got[t] and got[t][-1] >= written[t][-1]:
                        resumed[t] = time.monotonic()
                search_back = any(path == "/search" and status == 200 and start >= healed
                                  for path, start, _, status, _ in list(requests))
                if search_back and all(t in resumed or t in ended for t in open_at_cut):
                    break
                time.sleep(0.2)
            time.sleep(0.5)
        finally:
            chaos.extra_backlog = 0
            stop.set()
            for t in askers:
                t.join(API_CEILING_S + 5)
            for stream in streams.values():
                stream.close()
            api.close()
        drain()
        now = {t: [e["event_id"] for e in queue.events(t, 0)] for t in streams}
        record: dict[str, Any] = {"cut_seconds": round(healed - cut_at, 1), "streams_opened": len(streams),
                                  "streams_open_at_cut": len(open_at_cut)}
        outcomes = [stream_outcome(got[t], at_heal[t], written[t], now[t], ended.get(t), resumed.get(t), cut_at, healed)
                    for t in open_at_cut]
        record.update(summarize_streams(outcomes))
        record.update(classify_api_requests(requests, cut_at, healed))
        self.api_cuts.append(record)
        chaos._note(f"API host healed after {record['cut_seconds']} s: during the cut /healthz {record['healthz_during_cut']}"
                    f" answered ({record['healthz_not_200_within_ceiling']} not 200 in time), DB-backed requests"
                    f" {record['db_requests_during_cut']}, {record['db_requests_hung']} hung; streams resumed"
                    f" {record['sse_resume_seconds']} s after the heal; searches back after"
                    f" {record['search_ok_again_seconds_after_heal']} s")

    # -- the embedding host cut off mid-batch --------------------------------------------------------------

    def _embed_cut(self) -> None:
        """Wait (up to ``net_stage_wait`` s) for a task RUNNING at ``embed`` while the service is answering batches,
        cut the embedding host off for ``net_embed_cut_seconds``, heal, follow the aftermath as for a PostgreSQL
        cut; the runs' failures meanwhile by code, and (in ``report``) where the tasks held at the cut ended."""
        from bench.net_services import requests_served

        chaos, cfg = self.chaos, self.cfg
        assert self.embed_home is not None
        waited_from = time.monotonic()
        served = requests_served(self.embed_home)
        mid: list[Any] = []
        while time.monotonic() - waited_from < cfg.net_stage_wait:
            if chaos.stop_event.is_set():
                return
            time.sleep(0.1)
            now = requests_served(self.embed_home)
            mid = self.db.fetch_all("bench_chaos_mid_embed") if now > served else []
            if mid:
                break  # a batch answered in the last 0.1 s and a task with texts still to embed: mid-batch
            served = now
        mark = self.db.fetch_one("bench_chaos_event_watermark")["event_id"]
        self.hosts.cut_embed()
        cut_at, held, runs, pids, found = self._at_cut()
        chaos._note(f"embedding host cut off (held {len(held)} lease(s) at {found}, {len(runs)} run(s) active)"
                    f" for {cfg.net_embed_cut_seconds:.0f} s")
        record: dict[str, Any] = {
            "stage_reached": "embed" in found, "stages_held_at_cut": found,
            "waited_for_stage_seconds": round(cut_at - waited_from, 1), "leases_held_at_cut": len(held),
            "tasks_at_embed_at_cut": sum(1 for _, _, s, _ in held if s == "embed"), "mid_embed_when_cut": len(mid),
            "service_requests_before_cut": served, "runs_active_at_cut": len(runs), "held_task_ids": [t for t, *_ in held],
        }
        first_failure = None
        try:
            while time.monotonic() - cut_at < cfg.net_embed_cut_seconds and not chaos.stop_event.is_set():
                if first_failure is None and self.db.fetch_all("bench_chaos_failures_after", {"after": mark}):
                    first_failure = time.monotonic()
                time.sleep(0.3)
        finally:
            self.hosts.heal()
            healed = time.monotonic()
        record["cut_seconds"] = round(healed - cut_at, 1)
        record["first_failure_seconds_after_cut"] = None if first_failure is None else round(first_failure - cut_at, 1)
        record["service_requests_during_cut"] = requests_served(self.embed_home) - served
        chaos._note(f"embedding host healed after {record['cut_seconds']} s")
        self.embed_cuts.append(record)
        self._aftermath(record, held, runs, pids, healed, label=f"embedding host cut {len(self.embed_cuts)}")
        record["failures_by_code_since_cut"] = {r["error_code"]: int(r["n"]) for r in self.db.fetch_all(
            "bench_chaos_failures_after", {"after": mark})}

    def _lossy(self) -> None:
        """``net_loss_percent`` % of the link's packets dropped for ``net_loss_seconds`` (and, with the relay,
        ``net_delay_ms`` added each way), with what finished and what was taken over meanwhile."""
        from bench.chaos import _sql

        cfg, chaos = self.cfg, self.chaos
        delay = f", {cfg.net_delay_ms} ms added each way" if self.relay is not None else ""
        chaos._note(f"lossy link: {cfg.net_loss_percent} % of packets dropped{delay} for {cfg.net_loss_seconds:.0f} s")
        count = "bench_chaos_succeeded_and_takeovers"  # takeovers as the report counts them
        succeeded_before, takeovers_before = _sql(chaos.url, count)[0]
        self.active.set()
        started = time.monotonic()
        try:
            self.hosts.lose(cfg.net_loss_percent)
            if self.relay is not None:
                self.relay.slow()
            ended = "time"
            while time.monotonic() - started < cfg.net_loss_seconds and not chaos.stop_event.is_set():
                time.sleep(0.2 if not cfg.net_loss_until_done else 2.0)
                if cfg.net_loss_until_done and self._burst_done():
                    ended = "every task finished"
                    break
            dropped = self.hosts.dropped_packets()
        finally:
            if self.relay is not None:
                self.relay.fast()
            self.hosts.heal()
            self.healed_at = time.monotonic()
            self.active.clear()
        succeeded_after, takeovers_after = _sql(chaos.url, count)[0]
        self.loss = {"percent": cfg.net_loss_percent, "delay_ms_each_way": cfg.net_delay_ms if self.relay else 0,
                     "seconds": round(self.healed_at - started, 1), "ended_by": ended,
                     "tasks_unfinished_at_heal": chaos._unfinished(), "packets_dropped": dropped,
                     "tasks_succeeded_meanwhile": succeeded_after - succeeded_before,
                     "leases_taken_over_meanwhile": takeovers_after - takeovers_before}

    def _burst_done(self) -> bool:
        """Every task of the target published and none unfinished (a failed count asks again next time)."""
        import psycopg

        chaos = self.chaos
        if chaos.c.tasks_created < self.cfg.tasks:
            return False
        try:
            return chaos._unfinished() == 0
        except psycopg.Error:
            return False

    # -- figures -------------------------------------------------------------------------------------

    def report(self) -> dict[str, Any]:
        cuts = self.cuts
        for cut in self.embed_cuts:  # where the tasks the embedding host held at its cut ended (after quiescence)
            cut["held_tasks_ended_as"] = {f"{r['status']} {r['error_code']}".strip(): int(r["n"]) for r in self.db.fetch_all(
                "bench_chaos_task_outcomes", {"task_ids": cut["held_task_ids"]})} if self.db is not None else {}
        return {
            "postgres_host": self.hosts.remote_url("kbindex").split("@")[1].split("/")[0],
            "api_host": self.api_base, "embedding_host": self.dagster_env()["KBINDEX_EMBED_SERVICE"] if self.embed_home else None,
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
            "api_cuts": len(self.api_cuts),
            "api_cut_details": self.api_cuts,
            "embed_cuts": len(self.embed_cuts),
            "embed_cut_bounds": NET_EMBED_BOUNDS,
            "embed_cut_details": self.embed_cuts,
            **({"lossy_period": self.loss} if self.loss else {}),
        }

    def must_be_zero(self) -> dict[str, int]:
        """Runs active at a cut still holding their slot lease + 60 s after the heal (issue #32's bound), for the
        PostgreSQL and the embedding host's cuts; leases held at an embedding cut that never moved on; and the API
        host's cut: a /healthz not answered, a database-backed request hung or answered other than 503 with its
        stable code, an event stream closed, gapped or not resumed, searches not back within RESUME_BOUND_S."""
        api = self.api_cuts
        return {
            "cut_runs_not_ended_within_lease_plus_60s": sum(c.get("runs_not_ended_within_lease_plus_60s", 0)
                                                             for c in self.cuts),
            **({"api_cut_healthz_not_answered": sum(c["healthz_not_200_within_ceiling"] for c in api),
                "api_cut_db_requests_hung_or_not_503_with_code": sum(c["db_requests_hung"] + c["db_requests_wrong_answer"]
                                                                     for c in api),
                "api_cut_sse_streams_closed_gapped_or_not_resumed": sum(
                    c["streams_closed_during_cut"] + c["streams_with_gap_or_duplicate"] + c["streams_not_resumed"]
                    for c in api),
                "api_cut_searches_not_back_after_heal": sum(1 for c in api if c["search_ok_again_seconds_after_heal"] is None)}
               if self.cfg.net_api_cuts else {}),
            **({"embed_cut_runs_not_ended_within_lease_plus_60s": sum(c.get("runs_not_ended_within_lease_plus_60s", 0)
                                                                      for c in self.embed_cuts),
                "embed_cut_leases_not_moved_on": sum(1 for c in self.embed_cuts
                                                     if c.get("leases_moved_on_seconds_after_heal") is None)}
               if self.cfg.net_embed_cuts else {}),
        }


def classify_api_requests(requests: list[tuple[str, float, float, int | None, str | None]], cut_at: float,
                          healed: float) -> dict[str, Any]:
    """The API host's answers around its cut, from (path, started, ended, status or None for no answer within
    API_CEILING_S, error code). During the cut (started between cut and heal): ``/healthz`` must be 200 within
    HEALTH_CEILING_S; a database-backed request (``/search``, ``/readyz``) must not hang, and if answered before the
    heal must be 503 with API_DB_CODE (answered after the heal: either way, it raced the heal). After the heal: the
    first search answered 200, in seconds after it."""
    during = [r for r in requests if cut_at <= r[1] < healed]
    health = [r for r in during if r[0] == "/healthz"]
    backed = [r for r in during if r[0] != "/healthz"]
    answered_in_cut = [r for r in backed if r[3] is not None and r[2] < healed]
    codes = Counter(f"{r[3]} {r[4] or ''}".strip() for r in answered_in_cut)
    good_503 = [r for r in answered_in_cut if r[3] == 503 and r[4] == API_DB_CODE]
    back = [r[2] for r in requests if r[0] == "/search" and r[3] == 200 and r[1] >= cut_at and r[2] > healed]
    return {
        "healthz_during_cut": len(health),
        "healthz_not_200_within_ceiling": sum(1 for r in health if r[3] != 200 or r[2] - r[1] > HEALTH_CEILING_S),
        "slowest_healthz_seconds": round(max((r[2] - r[1] for r in health), default=0.0), 2),
        "searches_ok_before_cut": sum(1 for r in requests if r[0] == "/search" and r[3] == 200 and r[2] < cut_at),
        "searches_during_cut": sum(1 for r in backed if r[0] == "/search"),
        "db_requests_during_cut": dict(sorted(codes.items())),
        "db_requests_hung": sum(1 for r in backed if r[3] is None),
        "db_requests_wrong_answer": len(answered_in_cut) - len(good_503),
        "db_requests_answered_after_heal": sum(1 for r in backed if r[3] is not None and r[2] >= healed),
        "slowest_503_seconds": round(max((r[2] - r[1] for r in good_503), default=0.0), 2),
        "search_ok_again_seconds_after_heal": round(min(back) - healed, 1) if back else None,
    }


def stream_outcome(got: list[int], at_heal: list[int], written_at_heal: list[int], written_now: list[int],
                   ended: float | None, resumed: float | None, cut_at: float, healed: float) -> dict[str, Any]:
    """One event stream open at the API host's cut: ``got`` the event ids it sent (``at_heal`` those by the heal),
    ``written_*`` the task's event ids in the database at the heal and at the end, ``ended`` when it ended (None:
    still open), ``resumed`` when it had sent every event written by the heal. It must stay open through the cut,
    send exactly the database's events in order (no gap, no duplicate), and catch up after the heal."""
    missed = [e for e in written_at_heal if not at_heal or e > at_heal[-1]]
    expected = [e for e in written_now if got and e <= got[-1]]
    return {
        "closed_during_cut": ended is not None and cut_at <= ended < healed,
        "gap_or_duplicate": got != expected,
        "missed": len(missed),
        "resumed_seconds": None if not missed or resumed is None else round(resumed - healed, 1),
        "not_resumed": bool(missed) and resumed is None,
    }


def summarize_streams(outcomes: list[dict[str, Any]]) -> dict[str, Any]:
    resumed = [o["resumed_seconds"] for o in outcomes if o["resumed_seconds"] is not None]
    return {
        "streams_closed_during_cut": sum(o["closed_during_cut"] for o in outcomes),
        "streams_with_gap_or_duplicate": sum(o["gap_or_duplicate"] for o in outcomes),
        "streams_with_missed_events": sum(1 for o in outcomes if o["missed"]),
        "events_missed_during_cut": sum(o["missed"] for o in outcomes),
        "streams_not_resumed": sum(o["not_resumed"] for o in outcomes),
        "sse_resume_seconds": _max(resumed),
    }


def _max(values: Any) -> float | None:
    present = [v for v in values if v is not None]
    return max(present) if present else None
