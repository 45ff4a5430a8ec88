"""bench.embed at CI size: every backend x layout measured and scored on the fixtures, the recommendation
rule, and a clean skip without the shared corpus."""

from __future__ import annotations

import json
from pathlib import Path

from bench.embed.__main__ import faster_lossier, main, recommend, table
from resources.derived_models import models_dir

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"


def test_the_bench_runs_every_backend_and_layout_on_the_fixtures(tmp_path: Path) -> None:
    report_file = tmp_path / "report.json"
    code = main([
        "--documents", str(FIXTURES / "documents"), "--pattern", "pep-0257.rst", "--max-chunks", "12",
        "--eval", str(FIXTURES / "eval" / "small-en"), "--backends", "all-MiniLM-L6-v2,all-MiniLM-L6-v2-onnx",
        "--layouts", "1x2,2x1", "--repeats", "1", "--home", str(tmp_path / "home"), "--json", str(report_file),
    ])
    assert code == 0
    report = json.loads(report_file.read_text())
    assert report["chunks"] == 12 and report["eval"] == "small-en"
    for row in report["backends"].values():
        assert set(row["layouts"]) == {"1x2", "2x1"} and all(s[0] > 0 for s in row["layouts"].values())
        assert 0 < row["ndcg"]["ndcg"] <= 1
    torch, onnx = report["backends"]["all-MiniLM-L6-v2"], report["backends"]["all-MiniLM-L6-v2-onnx"]
    assert abs(torch["ndcg"]["ndcg"] - onnx["ndcg"]["ndcg"]) <= 0.005  # the same network, fp32
    assert report["recommended"]["backend"] in report["backends"]
    assert (models_dir(tmp_path / "home") / "all-MiniLM-L6-v2-onnx" / "model.onnx").is_file()  # built there


def test_without_the_corpus_the_bench_skips_cleanly(tmp_path: Path, capsys) -> None:
    assert main(["--corpus", str(tmp_path / "absent"), "--json", str(tmp_path / "r.json")]) == 0
    assert "skipped" in json.loads((tmp_path / "r.json").read_text())
    assert "skipped" in capsys.readouterr().out


def _row(speed: float, ndcg: float) -> dict:
    return {"best_chunks_per_second": speed, "best_layout": "2x1", "ndcg": {"ndcg": ndcg}}


def test_the_recommendation_is_the_fastest_within_0_005_ndcg_of_torch() -> None:
    rows = {"all-MiniLM-L6-v2": _row(10, 0.80), "fast-same": _row(20, 0.796), "faster-lossy": _row(40, 0.79)}
    chosen = recommend(rows)
    assert chosen is not None and chosen["backend"] == "fast-same" and chosen["speedup_vs_torch"] == 2.0
    assert recommend({"fast-same": _row(20, 0.8)}) is None  # no torch row to compare with


def test_the_faster_lossier_choice_is_the_fastest_beyond_the_recommendation() -> None:
    rows = {"all-MiniLM-L6-v2": _row(10, 0.80), "fast-same": _row(20, 0.796), "faster-lossy": _row(40, 0.79),
            "slow-lossy": _row(15, 0.70)}
    rec = recommend(rows)
    fast = faster_lossier(rows, rec)
    assert fast == {"backend": "faster-lossy", "layout": "2x1", "speedup_vs_recommended": 2.0,
                    "ndcg_delta_vs_torch": -0.01}
    assert "faster, lossier: faster-lossy" in table({"backends": {}, "recommended": rec, "faster_lossier": fast})
    assert faster_lossier({"all-MiniLM-L6-v2": _row(10, 0.80), "fast-same": _row(20, 0.8)},
                          recommend({"all-MiniLM-L6-v2": _row(10, 0.80), "fast-same": _row(20, 0.8)})) is None
