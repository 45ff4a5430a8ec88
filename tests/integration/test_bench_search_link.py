"""The CI-sized bench.search_link round: the product's search direct and through a delaying relay, same answers,
round trips counted per mode."""

from __future__ import annotations

from bench.search_link import render, run


def test_a_hybrid_search_over_a_slow_link_shares_its_waits():
    """10 ms each way. A dense search costs ~1.1 round trips (BEGIN, the snapshot, settings, the active profile, the
    tenant's size and the walk all go out together, planned from the size the last search read, and come back with
    COMMIT), a lexical one ~2.2 (its statistics first; dense too while it waited for the tenant's size), a hybrid
    ~3.3 (its dense candidates' BM25 comes back with COMMIT), since the tenant's size goes with the lexical
    statistics and the lexical statement with the dense walk (7.6 when each waited alone). Before the profile was
    read inside the transaction: 4.3 and 5.5; before the last statement came back with COMMIT: 3.1-3.2 and 4.2-4.3.
    The bench itself fails if the two sides answer differently."""
    lines: list[str] = []
    report = run(None, 40, 5, 1, 10, out=lines.append)
    shown = "\n".join(lines) + "\n" + render(report)
    modes = report["modes"]
    assert report["chunks"] >= 40, shown
    assert 0.5 < modes["dense"]["round_trips"] < 1.6, shown  # the link is in the way, and only once
    assert 1.5 < modes["lexical"]["round_trips"] < 2.8, shown
    assert modes["hybrid"]["round_trips"] < 3.8, shown
    assert "a relay adding 10 ms each way" in shown, shown
