"""bench.chaos --network without the hosts: the skip where namespaces are not permitted, the cut figures, the order
of the faults, and how the API host's cut and the embedding host's cut are judged (what must be zero)."""

from __future__ import annotations

import time
from types import SimpleNamespace

from bench.chaos import __main__ as chaos_main
from bench.chaos import ChaosConfig
from bench.chaos.network import (
    API_CEILING_S,
    NetworkFaults,
    classify_api_requests,
    stream_outcome,
    summarize_streams,
)


def test_network_round_skips_with_the_reason(monkeypatch, capsys):
    monkeypatch.setattr("bench.netns.unavailable", lambda: "network fault tests need root (ip netns, nftables)")
    monkeypatch.setattr(chaos_main, "run_chaos", lambda *a, **k: (_ for _ in ()).throw(AssertionError("ran")))
    assert chaos_main.main(["--network"]) == 0
    assert "bench.chaos --network skipped: network fault tests need root" in capsys.readouterr().out


def _faults(cuts, api_cuts=(), embed_cuts=(), **config):
    f = NetworkFaults.__new__(NetworkFaults)
    f.cuts, f.loss, f.healed_at, f.grace = cuts, {}, 0.0, 15.0
    f.api_cuts, f.embed_cuts, f.embed_home, f.db, f.api_base = list(api_cuts), list(embed_cuts), None, None, ""
    f.cfg = ChaosConfig(network=True, **config)
    f.hosts = SimpleNamespace(remote_url=lambda db: f"postgresql://postgres@10.77.0.1:5432/{db}")
    import threading

    f.active = threading.Event()
    return f


def test_runs_still_active_past_the_bound_are_a_must_be_zero_figure():
    cut = {"target_stage": "publish", "stage_reached": True, "cut_seconds": 30.1, "leases_held_at_cut": 4,
           "taken_over": 3, "of_them_reserved_for_runs_not_started": 0, "leases_moved_on_seconds_after_heal": 9.0, "runs_ended_seconds_after_heal": None,
           "runs_not_ended_within_lease_plus_60s": 1}
    f = _faults([cut], net_api_cuts=0, net_embed_cuts=0)
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


def test_the_faults_are_taken_in_turn_while_each_kind_has_some_left():
    assert _faults([]).plan() == ["postgres-embed", "api", "embed", "postgres-publish"]  # the defaults
    assert _faults([], net_cuts=0, net_api_cuts=2, net_embed_cuts=0).plan() == ["api", "api"]
    assert _faults([], net_cuts=3, net_api_cuts=0, net_embed_cuts=1).plan() == [
        "postgres-embed", "embed", "postgres-publish", "postgres-embed"]


CUT, HEALED = 100.0, 115.0


def test_api_answers_during_its_cut_healthz_at_once_and_503_with_the_code_never_a_hang():
    requests = [
        ("/search", 97.0, 97.1, 200, None),  # before the cut
        ("/search", 99.9, 104.2, 503, "INDEX_WRITE_FAILED"),  # started before the cut: not judged
        ("/healthz", 101.0, 101.01, 200, None),
        ("/search", 101.0, 105.5, 503, "INDEX_WRITE_FAILED"),
        ("/readyz", 101.1, 105.0, 503, "INDEX_WRITE_FAILED"),
        ("/search", 112.0, 116.0, 200, None),  # raced the heal: either answer is fine
        ("/search", 116.0, 116.3, 200, None),  # after the heal
    ]
    r = classify_api_requests(requests, CUT, HEALED)
    assert r["healthz_during_cut"] == 1 and r["healthz_not_200_within_ceiling"] == 0
    assert r["db_requests_during_cut"] == {"503 INDEX_WRITE_FAILED": 2}
    assert (r["db_requests_hung"], r["db_requests_wrong_answer"], r["db_requests_answered_after_heal"]) == (0, 0, 1)
    assert r["slowest_503_seconds"] == 4.5 and r["searches_ok_before_cut"] == 1 and r["searches_during_cut"] == 2
    assert r["search_ok_again_seconds_after_heal"] == 1.0

    bad = classify_api_requests([
        ("/healthz", 101.0, 104.0, 200, None),  # too slow for a liveness probe
        ("/healthz", 102.0, 102.1, 503, "INDEX_WRITE_FAILED"),  # asked the database
        ("/search", 101.0, 101.0 + API_CEILING_S, None, None),  # no answer: hung
        ("/search", 103.0, 107.0, 500, "INTERNAL_ERROR"),  # not the stable 503
        ("/readyz", 104.0, 108.0, 503, "-"),  # a 503 without a code
    ], CUT, HEALED)
    assert bad["healthz_not_200_within_ceiling"] == 2
    assert (bad["db_requests_hung"], bad["db_requests_wrong_answer"]) == (1, 2)
    assert bad["search_ok_again_seconds_after_heal"] is None


def test_an_event_stream_must_stay_open_send_exactly_the_missed_events_and_catch_up():
    ok = stream_outcome(got=[1, 5, 9, 12], at_heal=[1, 5], written_at_heal=[1, 5, 9, 12], written_now=[1, 5, 9, 12, 20],
                        ended=None, resumed=117.5, cut_at=CUT, healed=HEALED)
    assert ok == {"closed_during_cut": False, "gap_or_duplicate": False, "missed": 2, "resumed_seconds": 2.5,
                  "not_resumed": False}
    gap = stream_outcome([1, 9, 12], [1], [1, 5, 9, 12], [1, 5, 9, 12], None, 117.0, CUT, HEALED)
    dup = stream_outcome([1, 5, 5, 9], [1, 5], [1, 5, 9], [1, 5, 9], None, 117.0, CUT, HEALED)
    closed = stream_outcome([1], [1], [1, 5], [1, 5], 108.0, None, CUT, HEALED)
    stuck = stream_outcome([1], [1], [1, 5], [1, 5], None, None, CUT, HEALED)
    idle = stream_outcome([1], [1], [1], [1], None, None, CUT, HEALED)  # nothing happened to its task meanwhile
    assert gap["gap_or_duplicate"] and dup["gap_or_duplicate"]
    assert closed["closed_during_cut"] and closed["not_resumed"] and stuck["not_resumed"] and not stuck["closed_during_cut"]
    assert idle == {"closed_during_cut": False, "gap_or_duplicate": False, "missed": 0, "resumed_seconds": None,
                    "not_resumed": False}
    summary = summarize_streams([ok, gap, dup, closed, stuck, idle])
    assert summary == {"streams_closed_during_cut": 1, "streams_with_gap_or_duplicate": 2,
                       "streams_with_missed_events": 5, "events_missed_during_cut": 2 + 3 + 1 + 1 + 1,
                       "streams_not_resumed": 2, "sse_resume_seconds": 2.5}


def _api_cut_record(**changes):
    record = {"healthz_not_200_within_ceiling": 0, "db_requests_hung": 0, "db_requests_wrong_answer": 0,
              "streams_closed_during_cut": 0, "streams_with_gap_or_duplicate": 0, "streams_not_resumed": 0,
              "search_ok_again_seconds_after_heal": 1.2}
    return {**record, **changes}


def test_the_api_and_embedding_cuts_violations_are_must_be_zero_figures():
    clean = _faults([], [_api_cut_record()], [{"runs_not_ended_within_lease_plus_60s": 0,
                                               "leases_moved_on_seconds_after_heal": 8.0}])
    assert set(clean.must_be_zero().values()) == {0}
    assert set(clean.must_be_zero()) == {
        "cut_runs_not_ended_within_lease_plus_60s", "api_cut_healthz_not_answered",
        "api_cut_db_requests_hung_or_not_503_with_code", "api_cut_sse_streams_closed_gapped_or_not_resumed",
        "api_cut_searches_not_back_after_heal", "embed_cut_runs_not_ended_within_lease_plus_60s",
        "embed_cut_leases_not_moved_on"}
    broken = _faults([], [_api_cut_record(healthz_not_200_within_ceiling=1, db_requests_hung=2, db_requests_wrong_answer=1,
                                          streams_not_resumed=1, streams_with_gap_or_duplicate=1,
                                          search_ok_again_seconds_after_heal=None)],
                     [{"runs_not_ended_within_lease_plus_60s": 2, "leases_moved_on_seconds_after_heal": None}])
    assert broken.must_be_zero() == {
        "cut_runs_not_ended_within_lease_plus_60s": 0, "api_cut_healthz_not_answered": 1,
        "api_cut_db_requests_hung_or_not_503_with_code": 3, "api_cut_sse_streams_closed_gapped_or_not_resumed": 2,
        "api_cut_searches_not_back_after_heal": 1, "embed_cut_runs_not_ended_within_lease_plus_60s": 2,
        "embed_cut_leases_not_moved_on": 1}
    r = broken.report()
    assert (r["api_cuts"], r["embed_cuts"]) == (1, 1) and r["embed_cut_details"][0]["held_tasks_ended_as"] == {}


def test_the_new_flags_reach_the_config(monkeypatch):
    seen = {}
    monkeypatch.setattr("bench.netns.unavailable", lambda: None)
    monkeypatch.setattr(chaos_main, "run_chaos", lambda config, out: seen.setdefault("config", config) and {"ok": True})
    monkeypatch.setattr(chaos_main, "format_report", lambda report: "")
    chaos_main.main(["--network", "--net-api-cuts", "2", "--net-api-cut-seconds", "12", "--net-embed-cuts", "0",
                     "--net-embed-cut-seconds", "9"])
    c = seen["config"]
    assert (c.net_api_cuts, c.net_api_cut_seconds, c.net_embed_cuts, c.net_embed_cut_seconds) == (2, 12.0, 0, 9.0)
    seen.clear()
    chaos_main.main(["--network", "--net-loss-until-done", "--backlog", "200"])
    assert (seen["config"].net_loss_until_done, seen["config"].backlog) == (True, 200)


def test_a_burst_over_the_slow_link_ends_its_lossy_period_only_when_every_task_of_the_target_finished():
    f = _faults([], net_loss_until_done=True, tasks=200)
    unfinished = {"n": 0}

    def count():
        if unfinished["n"] is None:
            import psycopg

            raise psycopg.OperationalError("server closed the connection")
        return unfinished["n"]

    f.chaos = SimpleNamespace(c=SimpleNamespace(tasks_created=150), _unfinished=count)
    assert not f._burst_done()  # not all published yet, though none is unfinished
    f.chaos.c.tasks_created = 200
    unfinished["n"] = 3
    assert not f._burst_done()
    unfinished["n"] = None
    assert not f._burst_done()  # a failed count is not an end
    unfinished["n"] = 0
    assert f._burst_done()
