"""bench.scale.runs: warm-up rounds first and discarded, repeats in a shuffled order, medians and spread."""

from __future__ import annotations

from bench.scale.runs import Round, schedule, summary


def test_warm_up_rounds_come_first_then_every_count_repeats_in_a_seeded_shuffle():
    plan = schedule([1000, 100_000], repeats=3, warmup=1, seed=0)
    assert plan[0] == ("w0", 1000)
    measured = plan[1:]
    assert sorted(measured) == sorted((f"r{i}", k) for k in (1000, 100_000) for i in range(3))
    assert schedule([1000, 100_000], repeats=3, warmup=1, seed=0) == plan  # the seed fixes the order
    orders = {tuple(schedule([1000, 100_000], repeats=3, warmup=1, seed=s)[1:]) for s in range(20)}
    assert len(orders) > 1 and any(o[0][1] == 100_000 for o in orders)  # not always the small count first


def test_the_summary_takes_medians_of_measured_rounds_only():
    r = lambda keys, tick, run: Round(keys, 0.1, tick, run, 30)  # noqa: E731
    rounds = [("w0", r(1000, 9.0, 90.0)),  # a slow cold first round: listed, not counted
              ("r0", r(100_000, 1.1, 11.0)), ("r0", r(1000, 1.0, 10.0)), ("r1", r(1000, 3.0, 12.0)),
              ("r1", r(100_000, 1.3, 13.0)), ("r2", r(1000, 2.0, 14.0)), ("r2", r(100_000, 5.0, 12.0))]
    lines = summary(rounds, [1000, 100_000])
    assert "(warm-up, not counted)" in lines[1]
    small = next(line for line in lines if line.strip().startswith("1,000 "))
    big = next(line for line in lines if line.strip().startswith("100,000 "))
    assert small.split()[:3] == ["1,000", "3", "2.00"] and "[ 1.00.. 3.00]" in small
    assert big.split()[:3] == ["100,000", "3", "1.30"] and "[ 1.10.. 5.00]" in big
    assert big.split()[-2:] == ["0.65", "1.00"]  # medians 1.3/2.0 and 12/12
