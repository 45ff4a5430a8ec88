"""CI-sized run of bench.migration_load: the live claim keeps working beside a REINDEX backlog."""

from bench.migration_load.__main__ import main


def test_migration_load_bench_runs_small(capsys):
    assert main(["--live", "200", "--backlog", "3000", "--seconds", "0.5"]) == 0
    out = capsys.readouterr().out
    assert "ratio with/without" in out
    after = float(out.split("with backlog:")[1].split()[0].replace(",", ""))
    assert after > 0  # live tasks were still claimed and completed with the backlog present
