"""bench.chaos --network without the hosts: the skip where namespaces are not permitted, and the cut figures."""

from __future__ import annotations

import time
from types import SimpleNamespace

from bench.chaos import __main__ as chaos_main
from bench.chaos.network import NetworkFaults


def test_network_round_skips_with_the_reason(monkeypatch, capsys):
    monkeypatch.setattr("bench.netns.unavailable", lambda: "network fault tests need root (ip netns, nftables)")
    monkeypatch.setattr(chaos_main, "run_chaos", lambda *a, **k: (_ for _ in ()).throw(AssertionError("ran")))
    assert chaos_main.main(["--network"]) == 0
    assert "bench.chaos --network skipped: network fault tests need root" in capsys.readouterr().out


def _faults(cuts):
    f = NetworkFaults.__new__(NetworkFaults)
    f.cuts, f.loss, f.healed_at, f.grace = cuts, {}, 0.0, 15.0
    f.hosts = SimpleNamespace(remote_url=lambda db: f"postgresql://postgres@10.77.0.1:5432/{db}")
    import threading

    f.active = threading.Event()
    return f


def test_runs_still_active_past_the_bound_are_a_must_be_zero_figure():
    cut = {"target_stage": "publish", "stage_reached": True, "cut_seconds": 30.1, "leases_held_at_cut": 4,
           "taken_over": 3, "of_them_reserved_for_runs_not_started": 0, "leases_moved_on_seconds_after_heal": 9.0, "runs_ended_seconds_after_heal": None,
           "runs_not_ended_within_lease_plus_60s": 1}
    f = _faults([cut])
    assert f.must_be_zero() == {"cut_runs_not_ended_within_lease_plus_60s": 1}
    r = f.report()
    assert r["cuts"] == 1 and r["cuts_at_target_stage"] == {"embed": 0, "publish": 1}
    assert r["postgres_host"] == "10.77.0.1:5432" and r["max_seconds_heal_to_runs_ended"] is None


def test_errors_are_expected_during_a_cut_and_for_the_grace_after():
    f = _faults([])
    assert not f.expected()
    f.active.set()
    assert f.expected()
    f.active.clear()
    f.healed_at = time.monotonic()
    assert f.expected()
    f.healed_at = time.monotonic() - 16
    assert not f.expected()
