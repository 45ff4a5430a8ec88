"""bench.scale.ui prints the README's "slowest query, s" row: per live-key count, the slowest first request
and the slowest warm median over the partitions tabs and the asset graph; and the "after a new key" row:
the slowest first and next partitions-tab request after one more key."""

from __future__ import annotations

from bench.scale.ui import Round, Timing, report


def test_the_slowest_row_takes_the_worst_first_and_warm_over_every_query(capsys):
    def t(first, warm):
        return Timing(first_seconds=first, warm_seconds=warm, response_bytes=2048, cpu_seconds=0.1)

    rounds = [Round(10_000, health={"a": t(0.48, 0.10), "b": t(0.20, 0.19)}, graph=t(0.30, 0.05)),
              Round(30_000, health={"a": t(0.90, 0.49), "b": t(1.02, 0.30)}, graph=t(0.50, 0.20))]
    assert report(1_000_000, rounds, None) is True
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("slowest query"))
    assert row.split()[-6:] == ["0.48", "/", "0.19", "1.02", "/", "0.49"]


def test_the_after_a_new_key_row_takes_the_slowest_first_and_next_over_the_partitions_tabs(capsys):
    def t(first, warm):
        return Timing(first_seconds=first, warm_seconds=warm, response_bytes=2048, cpu_seconds=0.1)

    rounds = [Round(10_000, health={"a": t(0.48, 0.10), "b": t(0.20, 0.19)}, graph=t(0.30, 0.05),
                    after_new_key={"a": (1.19, 0.20), "b": (0.97, 0.39)}),
              Round(30_000, health={"a": t(0.90, 0.49), "b": t(1.02, 0.30)}, graph=t(0.50, 0.20),
                    after_new_key={"a": (2.31, 0.50), "b": (2.40, 0.34)})]
    report(1_000_000, rounds, None)
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("slowest after a new key"))
    assert row.split()[-6:] == ["1.19", "/", "0.39", "2.40", "/", "0.50"]


def test_the_prune_line_says_what_each_storage_took_per_key(capsys):
    from bench.scale.ui import Prune

    def t(first, warm):
        return Timing(first_seconds=first, warm_seconds=warm, response_bytes=2048, cpu_seconds=0.1)

    rounds = [Round(30_000, health={"a": t(0.90, 0.49)}, graph=t(0.50, 0.20))]
    pruned = Prune(5000, 30.0, 0.2, 30_000, 30_000,
                   by_storage={"kbindex storage": (2500, 5.0), "dagster_postgres": (2500, 25.0)})
    report(140_000, rounds, pruned)
    lines = capsys.readouterr().out.splitlines()
    assert any("5,000 keys deleted in 30.0 s (6.0 ms/key" in line for line in lines)
    assert any("kbindex storage:" in line and "2,500 keys in 5.0 s (2.0 ms/key)" in line for line in lines)
    assert any("dagster_postgres:" in line and "2,500 keys in 25.0 s (10.0 ms/key)" in line for line in lines)
