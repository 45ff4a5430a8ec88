"""Model migration on the real database: create (bulk REINDEX), dual indexing, coverage and gate checks on
activation (CLI exit 3), the one-transaction switch and rollback, migration progress, hostile names; plus the
pure retrieval measures the gate uses.

These use the deterministic ``fake-384`` model so they stay fast; tests/acceptance/test_migration_e2e.py runs
the whole migration with the real packaged model.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
import pytest
from typer.testing import CliRunner

from pipelines.cli import app
from pipelines.domain.errors import IllegalTransition, InvalidRequest
from pipelines.domain.retrieval_metrics import RetrievalScores, evaluate, gate_passed, ndcg_at_k, recall_at_k
from resources import profiles
from resources.embedder import FakeEmbedder

EVAL_DIR = Path(__file__).resolve().parents[1] / "fixtures" / "eval" / "small-en"
HOSTILE_NAMES = [
    "x'; DROP TABLE chunk; --",
    "minilm'); DELETE FROM index_profile; --",
    "Robert\"; TRUNCATE document CASCADE; --",
    "a b",
    "UPPER",
    "",
    "-leading-dash",
    "x" * 64,
    "naïve",
    "../etc/passwd",
]


# -- helpers -------------------------------------------------------------------------------------------


def _sql(db_url: str, statement: str, params: tuple = ()) -> list[tuple]:
    with psycopg.connect(db_url, autocommit=True) as conn:
        cur = conn.execute(statement, params)
        return cur.fetchall() if cur.description else []


def _index(db_url: str, task_id: int) -> None:
    """Pretend a run indexed the task: SUCCEEDED now and the profile's pointer at its version."""
    _sql(
        db_url,
        """
        WITH t AS (
            UPDATE index_task SET status = 'SUCCEEDED', attempts = attempts + 1, finished_at = now(),
                                  updated_at = now(), chunk_count = 0
            WHERE task_id = %s
            RETURNING tenant_id, document_id, version_number, profile, task_id
        )
        INSERT INTO search_pointer (tenant_id, document_id, profile, version_number, task_id, chunk_count)
        SELECT tenant_id, document_id, profile, version_number, task_id, 0 FROM t
        ON CONFLICT (tenant_id, document_id, profile)
        DO UPDATE SET version_number = EXCLUDED.version_number, task_id = EXCLUDED.task_id
        """,
        (task_id,),
    )


def _tasks(db_url: str, profile: str) -> list[tuple]:
    return _sql(
        db_url,
        "SELECT document_id, version_number, task_type, status FROM index_task WHERE profile = %s ORDER BY 1, 2, 3",
        (profile,),
    )


def _activate(cli, name: str) -> tuple[int, str]:
    """Exit code and the output with rich's line wrapping undone."""
    result = cli("profile", "activate", name)
    return result.exit_code, " ".join(result.output.split())


def _record_gate(db, profile: str, baseline: str, shadow: float, active: float, passed: bool) -> None:
    db.fetch_one(
        "profile_gate_insert",
        {
            "profile": profile, "baseline_profile": baseline, "eval_set": "synthetic", "eval_digest": "0" * 64,
            "documents": 1, "queries": 1, "k": 10, "shadow_ndcg": shadow, "shadow_recall": shadow,
            "active_ndcg": active, "active_recall": active, "tolerance": 0.01, "passed": passed, "seconds": 0.0,
            "mode": "hybrid", "baseline_mode": "hybrid",
            "fusion": None, "rrf_k": None, "lexical_weight": None,  # as a row from before migration 0044
            "lexical_analyzer": None, "baseline_lexical_analyzer": None,  # ... and 0045
            "rerank_url": None, "rerank_model": None, "rerank_candidates": None,  # ... and 0048
        },
    )


@pytest.fixture
def cli(db_url, monkeypatch, tmp_path):
    monkeypatch.setenv("KBINDEX_DATABASE_URL", db_url)
    monkeypatch.setenv("KBINDEX_HOME", str(tmp_path / "home"))
    runner = CliRunner()

    def run(*args: str):
        return runner.invoke(app, list(args))

    return run


@pytest.fixture
def fake_active(db_url):
    """The active profile minilm-v1 embeds with the fake model (what the gate compares against)."""
    _sql(db_url, "UPDATE index_profile SET model = 'fake-384' WHERE is_active")
    return "minilm-v1"


# -- retrieval measures (pure) ---------------------------------------------------------------------------


def test_ndcg_and_recall_by_hand():
    judgements = {"a": 1, "b": 2, "z": 0}
    assert ndcg_at_k(["b", "a"], judgements) == pytest.approx(1.0)
    # b at rank 2, a at rank 3: (2/log2(3) + 1/log2(4)) / (2/1 + 1/log2(3))
    expected = (2 / 1.5849625 + 1 / 2) / (2 + 1 / 1.5849625)
    assert ndcg_at_k(["x", "b", "a"], judgements) == pytest.approx(expected, rel=1e-6)
    assert recall_at_k(["x", "b"], judgements) == 0.5
    assert recall_at_k([f"x{i}" for i in range(10)] + ["a"], judgements) == 0.0  # beyond k
    assert recall_at_k(["x"] * 10 + ["a"], judgements) == 0.5  # a document retrieved twice counts once
    assert ndcg_at_k(["a"], {"z": 0}) == 0.0
    scores = evaluate({"q1": ["a"], "q2": []}, {"q1": {"a": 1}, "q2": {"b": 1}, "q3": {"c": 0}})
    assert (scores.ndcg, scores.recall, scores.queries) == (0.5, 0.5, 2)  # q3 has nothing relevant: not scored
    with pytest.raises(ValueError):
        evaluate({}, {"q": {"a": 0}})


def test_gate_rule_is_tolerance_on_both_measures():
    active = RetrievalScores(ndcg=0.90, recall=0.95, queries=10)
    assert gate_passed(RetrievalScores(0.89, 0.94, 10), active, 0.01)  # exactly at the tolerance
    assert not gate_passed(RetrievalScores(0.95, 0.93, 10), active, 0.01)  # better nDCG, worse recall
    assert not gate_passed(RetrievalScores(0.88, 0.99, 10), active, 0.01)
    assert gate_passed(RetrievalScores(0.91, 0.96, 10), active, 0.0)


# -- create ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", HOSTILE_NAMES)
def test_hostile_profile_names_are_refused_and_change_nothing(db, db_url, name):
    with pytest.raises(InvalidRequest):
        profiles.create_profile(db, name, model="fake-384")
    with pytest.raises(InvalidRequest):
        profiles.activate_profile(db, name)
    assert _sql(db_url, "SELECT name FROM index_profile") == [("minilm-v1",)]
    assert _sql(db_url, "SELECT to_regclass('chunk') IS NOT NULL, to_regclass('document') IS NOT NULL") == [(True, True)]


def test_hostile_profile_name_via_cli_is_a_usage_error(cli, db_url):
    result = cli("profile", "create", "x'; DROP TABLE chunk; --", "--model", "fake-384")
    assert result.exit_code == 2, result.output
    assert _sql(db_url, "SELECT count(*) FROM index_profile") == [(1,)]


def test_create_refuses_models_that_cannot_serve_the_index(db, monkeypatch, tmp_path):
    with pytest.raises(InvalidRequest, match="is not available locally"):
        profiles.create_profile(db, "missing", model=str(tmp_path / "no-such-model"))
    monkeypatch.setattr(profiles, "embedder_for_model", lambda model: FakeEmbedder(dimension=768, model_name=model))
    with pytest.raises(InvalidRequest, match=r"768-dimension.*vector\(384\)"):
        profiles.create_profile(db, "wide", model="fake-768")
    monkeypatch.undo()
    with pytest.raises(InvalidRequest, match="--chunk-tokens"):
        profiles.create_profile(db, "huge", model="fake-384", chunk_tokens=400)
    with pytest.raises(InvalidRequest, match="--overlap"):
        profiles.create_profile(db, "lap", model="fake-384", chunk_tokens=64, overlap=40)
    assert db.fetch_all("index_profile_building") == []


def test_create_queues_one_reindex_task_per_current_version_in_one_go(db, db_url, publish_task):
    publish_task(document="a")
    publish_task(document="b")
    publish_task(document="b")  # b has v1 and v2: only v2 is current
    row = profiles.create_profile(db, "minilm-c128", model="fake-384", chunk_tokens=128, overlap=16)
    assert row["reindex_tasks"] == 2 and row["building"] and not row["is_active"]
    assert _tasks(db_url, "minilm-c128") == [("a", 1, "REINDEX", "PENDING"), ("b", 2, "REINDEX", "PENDING")]
    events = _sql(
        db_url,
        "SELECT e.to_status, e.message FROM task_event e JOIN index_task t USING (task_id) WHERE t.profile = %s",
        ("minilm-c128",),
    )
    assert events == [("PENDING", "created for a model migration")] * 2
    with pytest.raises(IllegalTransition, match="already exists"):
        profiles.create_profile(db, "minilm-c128", model="fake-384")


def test_a_version_published_while_a_profile_builds_gets_an_index_task_under_both(db, db_url, publish_task):
    profiles.create_profile(db, "minilm-c128", model="fake-384", chunk_tokens=128, overlap=16)
    published = publish_task(document="policy")
    assert published.profile == "minilm-v1"  # the task reported to the publisher is the active profile's
    rows = _sql(
        db_url,
        "SELECT profile, task_type, status FROM index_task WHERE document_id = 'policy' ORDER BY profile",
    )
    assert rows == [("minilm-c128", "INDEX", "PENDING"), ("minilm-v1", "INDEX", "PENDING")]


# -- activation -------------------------------------------------------------------------------------------


def test_activation_is_refused_until_covered_and_gated_then_switches_in_one_go(db, db_url, publish_task, cli):
    a = publish_task(document="a")
    publish_task(document="b")
    profiles.create_profile(db, "minilm-c128", model="fake-384", chunk_tokens=128, overlap=16)
    new_tasks = dict(
        (r[0], r[1]) for r in _sql(db_url, "SELECT document_id, task_id FROM index_task WHERE profile = 'minilm-c128'")
    )
    _index(db_url, new_tasks["a"])

    # Coverage 1/2 and no gate: refused with both reasons, exit 3.
    code, said = _activate(cli, "minilm-c128")
    assert code == 3, said
    assert "covers 1/2 current versions (missing: 1 PENDING)" in said and "gate was never run" in said

    _index(db_url, new_tasks["b"])
    code, said = _activate(cli, "minilm-c128")
    assert code == 3 and "never run" in said and "covers" not in said

    _record_gate(db, "minilm-c128", "minilm-v1", shadow=0.70, active=0.90, passed=False)
    code, said = _activate(cli, "minilm-c128")
    assert code == 3 and "latest gate failed: nDCG@10 0.7000 vs 0.9000" in said

    _record_gate(db, "minilm-c128", "minilm-v1", shadow=0.90, active=0.90, passed=True)
    assert db.fetch_one("index_profile_active")["name"] == "minilm-v1"  # nothing changed so far
    result = cli("profile", "activate", "minilm-c128", "--json")
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    assert (out["name"], out["previous_active"], out["forced"]) == ("minilm-c128", "minilm-v1", False)
    rows = _sql(db_url, "SELECT name, is_active, building, previous_active, activated_at IS NOT NULL FROM index_profile ORDER BY name")
    assert rows == [("minilm-c128", True, False, "minilm-v1", True), ("minilm-v1", False, False, None, True)]
    # Publishing now targets only the new profile.
    publish_task(document="c")
    assert _sql(db_url, "SELECT profile FROM index_task WHERE document_id = 'c'") == [("minilm-c128",)]
    assert a.profile == "minilm-v1"

    result = cli("profile", "activate", "minilm-c128")
    assert result.exit_code == 3 and "already active" in result.output


def test_a_gate_against_another_active_profile_is_stale(db, db_url, publish_task):
    profiles.create_profile(db, "p2", model="fake-384")
    profiles.create_profile(db, "p3", model="fake-384", chunk_tokens=64, overlap=8)
    _record_gate(db, "p3", "p2", shadow=0.9, active=0.9, passed=True)  # judged against p2, but v1 is active
    with pytest.raises(IllegalTransition, match="gate was against 'p2', not the active 'minilm-v1'"):
        profiles.activate_profile(db, "p3")


def test_force_activates_incomplete_ungated_profile_and_records_it(db, db_url, publish_task, cli):
    publish_task(document="a")
    profiles.create_profile(db, "minilm-c128", model="fake-384", chunk_tokens=128, overlap=16)
    result = cli("profile", "activate", "minilm-c128", "--force")
    assert result.exit_code == 0, result.output
    assert "forced past" in result.output
    (event,) = db.fetch_all("index_profile_events", {"profile": "minilm-c128"})[1:]
    assert event["action"] == "activate" and event["forced"] and len(event["detail"]["overridden"]) == 2


def test_rollback_restores_the_previous_profile_and_catches_it_up(db, db_url, publish_task, cli):
    result = cli("profile", "rollback")
    assert result.exit_code == 3 and "no previous profile" in result.output

    publish_task(document="a")
    v1_task = _sql(db_url, "SELECT task_id FROM index_task WHERE profile = 'minilm-v1'")[0][0]
    _index(db_url, v1_task)
    profiles.create_profile(db, "minilm-c128", model="fake-384", chunk_tokens=128, overlap=16)
    profiles.activate_profile(db, "minilm-c128", force=True)
    publish_task(document="b")  # only minilm-c128 is a target now
    publish_task(document="a")  # a v2: ditto

    result = cli("profile", "rollback", "--json")
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    assert (out["name"], out["rolled_back_from"], out["catch_up_tasks"]) == ("minilm-v1", "minilm-c128", 2)
    assert db.fetch_one("index_profile_active")["name"] == "minilm-v1"
    assert _tasks(db_url, "minilm-v1") == [
        ("a", 1, "INDEX", "SUCCEEDED"), ("a", 2, "INDEX", "PENDING"), ("b", 1, "INDEX", "PENDING"),
    ]
    rows = _sql(db_url, "SELECT name, is_active, building FROM index_profile ORDER BY name")
    assert rows == [("minilm-c128", False, False), ("minilm-v1", True, False)]
    # minilm-v1 has no previous profile: a second rollback is a conflict.
    with pytest.raises(IllegalTransition):
        profiles.rollback_profile(db)


# -- progress, listing, gate ---------------------------------------------------------------------------------


def test_migration_progress_counts_rate_failures_and_eta(db, db_url, publish_task):
    for doc in "abcdef":
        publish_task(document=doc)
    assert profiles.migration_progress(db) == []
    profiles.create_profile(db, "minilm-c128", model="fake-384", chunk_tokens=128, overlap=16)
    ids = dict(_sql(db_url, "SELECT document_id, task_id FROM index_task WHERE profile = 'minilm-c128'"))
    _index(db_url, ids["a"])
    _index(db_url, ids["b"])
    _sql(db_url, "UPDATE index_task SET status = 'DEAD', error_code = 'PARSE_ERROR' WHERE task_id = %s", (ids["c"],))
    _sql(db_url, "UPDATE index_task SET status = 'RETRY_WAIT', error_code = 'EMBEDDING_TIMEOUT' WHERE task_id = %s", (ids["d"],))
    (p,) = profiles.migration_progress(db)
    assert (p["profile"], p["done"], p["total"], p["pending"], p["retry_wait"], p["dead"]) == ("minilm-c128", 2, 6, 2, 1, 1)
    assert p["failures_by_code"] == {"PARSE_ERROR": 1} and p["retrying_by_code"] == {"EMBEDDING_TIMEOUT": 1}
    assert p["rate_per_minute"] == pytest.approx(0.4)  # 2 SUCCEEDED in the last 5 minutes
    assert p["eta_seconds"] == pytest.approx(3 / 0.4 * 60)  # d, e, f left
    later = datetime.now(UTC) + timedelta(minutes=10)
    (stale,) = profiles.migration_progress(db, now=later)
    assert stale["rate_per_minute"] == 0 and stale["eta_seconds"] is None
    json.dumps(profiles.migration_progress(db))  # JSON-ready for `kbindex stats --json` and the API


def test_profile_list_shows_state_coverage_gate_and_progress(db, db_url, publish_task, cli):
    publish_task(document="a")
    profiles.create_profile(db, "minilm-c128", model="fake-384", chunk_tokens=128, overlap=16)
    _record_gate(db, "minilm-c128", "minilm-v1", shadow=0.91, active=0.90, passed=True)
    result = cli("profile", "list", "--json")
    assert result.exit_code == 0, result.output
    active, building = json.loads(result.output)
    assert (active["name"], active["is_active"], active["migration"]) == ("minilm-v1", True, None)
    assert building["building"] and building["chunk_tokens"] == 128 and building["model"] == "fake-384"
    assert building["coverage"] == {"covered_versions": 0, "current_versions": 1, "ratio": 0.0}
    assert building["gate"]["passed"] and building["gate"]["baseline_profile"] == "minilm-v1"
    assert building["migration"]["done"] == 0 and building["migration"]["total"] == 1
    table = cli("profile", "list")
    assert table.exit_code == 0 and "minilm-c128" in table.output and "building" in table.output


def test_gate_scores_both_recipes_on_the_eval_set_and_records_them(db, db_url, fake_active, cli):
    profiles.create_profile(db, "tiny", model="fake-384", chunk_tokens=16, overlap=0)
    result = cli("profile", "gate", "tiny", "--eval", str(EVAL_DIR), "--tolerance", "1", "--json")
    assert result.exit_code == 0, result.output
    row = json.loads(result.output)
    assert (row["profile"], row["baseline_profile"], row["eval_set"]) == ("tiny", "minilm-v1", "small-en")
    assert (row["documents"], row["queries"], row["k"]) == (40, 60, 10)
    assert 0 < row["shadow_ndcg"] <= 1 and 0 < row["active_ndcg"] <= 1 and row["passed"]
    assert db.fetch_one("profile_gate_latest", {"profile": "tiny"})["gate_id"] == row["gate_id"]

    with pytest.raises(InvalidRequest, match="active one"):
        profiles.run_gate(db, "minilm-v1", EVAL_DIR)
    with pytest.raises(InvalidRequest, match="BEIR"):
        profiles.run_gate(db, "tiny", EVAL_DIR / "qrels")


def test_the_dagster_gate_asset_judges_the_building_profile_and_records_it(db, db_url, fake_active):
    import dagster as dg

    from pipelines.quality_gate import profile_quality_gate
    from resources.dagster_resources import DatabaseResource

    profiles.create_profile(db, "tiny", model="fake-384", chunk_tokens=16, overlap=0)
    result = dg.materialize(
        [profile_quality_gate],
        resources={"database": DatabaseResource(url=db_url)},
        run_config={"ops": {"profile_quality_gate": {"config": {"eval_dir": str(EVAL_DIR), "tolerance": 1.0}}}},
    )
    assert result.success
    (mat,) = result.asset_materializations_for_node("profile_quality_gate")
    assert mat.metadata["profile"].value == "tiny" and mat.metadata["passed"].value is True
    (check,) = result.get_asset_check_evaluations()
    assert check.passed
    latest = db.fetch_one("profile_gate_latest", {"profile": "tiny"})
    assert latest["gate_id"] == mat.metadata["gate_id"].value and latest["baseline_profile"] == "minilm-v1"
