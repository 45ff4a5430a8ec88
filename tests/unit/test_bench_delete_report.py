"""bench/delete's verdicts and table from a report, without running the bench (tests/acceptance runs it)."""

from __future__ import annotations

from bench.delete import MEASURES, format_report, summary, targets


def _report(seconds: dict[str, float], texts: int = 0) -> dict:
    report = {"documents": 1, "gap_s": 5.0, "claim_wait_s": 3.5, "fast_in_process": {"delete_fast": 1, "metadata_fast": 0},
              "load_average_1m": {"cpus": 2, "min": 1.0, "p50": 1.5, "max": 2.0}}
    for m in MEASURES:
        report[m] = {**summary([seconds[m]]), "texts_embedded": [texts if m.startswith("metadata") else 0]}
        if m != "publish":
            report[m]["run_embed_step"] = [None if m.endswith("_fast") else {"embedded": 0, "copied_from": 1}]
        if not m.endswith("_fast"):
            report[m]["phases"] = [{"to_claim": 1.0, "claim_to_done": seconds[m] - 1.0}]
    return report


def test_each_path_is_judged_against_its_issue_target():
    report = _report({"publish": 6.0, "delete_pipeline": 5.5, "delete_fast": 0.1, "metadata_pipeline": 1.9,
                      "metadata_fast": 0.2})
    assert targets(report) == {"delete_pipeline": False, "delete_fast": True, "metadata_pipeline": True,
                               "metadata_fast": True}
    shown = format_report(report)
    assert "target delete p50 <= 5 s (#29), pipeline: MISSED" in shown
    assert "target metadata-only p50 <= 2 s with 0 texts embedded (#30), fast: met" in shown
    assert "deletes 1/1, metadata-only 0/1" in shown
    assert "a random 0-5 s pause before each; the sensor waits 3.5 s per daemon loop" in shown
    assert "shared by 1 claiming sensors" in shown  # a report from before KBINDEX_CLAIM_SENSORS
    assert "copied 1/1, embedded 0 texts" in shown


def test_a_fast_metadata_change_that_embedded_misses_its_target():
    report = _report({m: 0.1 for m in MEASURES}, texts=2)
    assert not targets(report)["metadata_fast"] and not targets(report)["metadata_pipeline"]
    assert targets(report)["delete_fast"]


def test_a_report_without_figures_says_why():
    assert format_report({"ok": False, "errors": ["boom"]}) == "no figures: boom"
