"""The claiming sensors across a silent partition (issue #32 with #34's three sensors): a tick waiting on its
LISTEN connection when the link goes silent ends at its window's deadline, the loop's later ticks return at once
without a statement, no tick outlasts its bound while the link is down, and after it heals a publish is claimed
within a loop or so, on a new LISTEN connection.

It found that a tick whose pool had given up reconnecting during the cut (psycopg_pool stops after
KBINDEX_PG_RECONNECT_S and retries only for the next request) waited out its whole 30-s pool wait after the
heal: no claim 15 s after it. resources/database.py ``_retry_while_waited_for`` now restarts the series while a
request waits: claimed 0.8 s after the heal.

The ticks run in a client process on the other host, one after another as Dagster's sensor daemon runs them
(tests/network/client.py ``sensors``), with the tests' connection bounds (conftest.FAST_BOUNDS) and a 3-s window.
"""

from __future__ import annotations

import time

from bench.netns import Hosts
from resources.blob_store import BlobStore
from resources.database import Database
from resources.publisher import Publisher
from tests.network.conftest import FAST_BOUNDS
from tests.network.test_partition import Client

WAIT_S = 3.0
CUT_S = 12.0
"""Longer than a loop (5 s) plus a silent connection's bound (~4 s): the next loop's first tick meets the cut."""
POOL_WAIT_S = 30.0
"""A sensor's pool waits this long for a connection (resources.database, role ``run``)."""
TICK_CEILING_S = WAIT_S + POOL_WAIT_S + 8.0
"""No tick lasts longer: its window, the pool's wait, a dead connection's check, scheduling slack."""
CLAIM_CEILING_S = 15.0
"""A publish after the heal is claimed within this: the loop's reconnect (1 s), one loop, slack."""


def ticks_until(client: Client, prefix: str, timeout: float) -> list[str]:
    """The client's lines up to and including the first that starts with ``prefix``."""
    seen = []
    deadline = time.monotonic() + timeout
    while True:
        line = client.expect("", max(0.01, deadline - time.monotonic()))
        seen.append(line)
        if line.startswith(prefix):
            return seen


def test_claiming_ticks_stay_bounded_across_a_silent_partition_and_claim_again_after_it_heals(
        hosts: Hosts, net_db, tmp_path):
    """Fails without resources/database.py ``_retry_while_waited_for`` (the heal's claim waits ~30 s)."""
    client = Client(hosts, "sensors", hosts.remote_url(net_db),
                    env={**FAST_BOUNDS, "KBINDEX_CLAIM_WAIT_SECONDS": str(WAIT_S)})
    try:
        ticks_until(client, "LOOP 2", 90)  # one whole loop done: pools and the instance are warm
        time.sleep(1.0)  # the loop's first tick found nothing due and waits on its LISTEN connection
        hosts.cut()
        cut_at = time.monotonic()
        during = ticks_until(client, "TICK claim_index_tasks_3", WAIT_S + 10)
        first, second, third = [line.split() for line in during if line.startswith("TICK")]
        assert first[1] == "claim_index_tasks" and first[3] == "SKIP", during
        assert float(first[2]) <= WAIT_S + 1.5, f"the waiting tick outlived its window on a silent link: {first}"
        assert second[3] == third[3] == "SKIP" and float(second[2]) < 0.5 and float(third[2]) < 0.5, (
            f"a later tick of the cut loop queried the silent link instead of returning at once: {during}")

        time.sleep(max(0.0, cut_at + CUT_S - time.monotonic()))
        hosts.heal()
        healed_at = time.monotonic()
        with Database(hosts.local_url(net_db), max_size=1) as db:
            task_id = Publisher(db, BlobStore(str(tmp_path / "blobs"))).publish("acme", "policy", b"refunds",
                                                                                 "p.txt").task_id
        after: list[str] = []
        deadline = healed_at + CLAIM_CEILING_S
        while True:
            try:
                line = client.expect("", max(0.01, deadline - time.monotonic()))
            except TimeoutError:
                raise AssertionError(f"no claim {CLAIM_CEILING_S:g} s after the heal; the client said {after}, "
                                     f"before it {during}; its log: {client.close()[-3000:]}") from None
            after.append(line)
            if line.startswith("TICK") and line.split()[3] == "OK":
                break
        claimed_in = time.monotonic() - healed_at
        assert line.split()[4] == "1", line
        print(f"claim partition: cut {CUT_S:g} s; task {task_id} claimed {claimed_in:.1f} s after the heal, "
              f"by {line.split()[1]}")
        for tick in (line.split() for line in during + after if line.startswith("TICK")):
            assert float(tick[2]) <= TICK_CEILING_S, f"a tick outlasted its bound: {tick}"
    finally:
        hosts.heal()
        client.close()
