"""bench.scale.ui prints the README's "slowest query, s" row: per live-key count, the slowest first request
and the slowest warm median over the partitions tabs and the asset graph."""

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
