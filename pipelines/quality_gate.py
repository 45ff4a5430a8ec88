"""The retrieval quality gate of a model migration as a Dagster asset (``kbindex profile gate`` in the UI).

Materialize ``profile_quality_gate`` (or launch ``profile_gate_job``) with config ``profile`` (default: the
single building profile), ``eval_dir`` (default: KBINDEX_EVAL_DIR) and ``tolerance``. It scores the shadow
profile and the active one on the eval set (nDCG@10, recall@10), each in the search mode it will serve
(its ``search_mode``: hybrid unless a migration changed it) with its own fusion (``fusion``, ``rrf_k``,
``lexical_weight``) and lexical analyzer (``lexical_analyzer``), records the result in ``profile_gate``
(activation requires the latest one to have passed) and reports the numbers as metadata; the asset check
``gate_passed`` turns red when the shadow profile is worse than the tolerance allows.
"""

import os

import dagster as dg

from resources.dagster_resources import DatabaseResource

GATE_ASSET = "profile_quality_gate"


class GateConfig(dg.Config):
    """Which profile to judge, on which eval set, with which tolerance."""

    profile: str = ""  # empty: the single building profile
    eval_dir: str = ""  # empty: KBINDEX_EVAL_DIR
    tolerance: float = 0.01


def _profile(database: DatabaseResource, configured: str) -> str:
    if configured:
        return configured
    building = database.db.fetch_all("index_profile_building")
    if len(building) != 1:
        names = ", ".join(b["name"] for b in building) or "none"
        raise dg.Failure(f"set config 'profile': {len(building)} profiles are building ({names})")
    return building[0]["name"]


@dg.asset(
    name=GATE_ASSET,
    group_name="migration",
    kinds={"python"},
    description="Shadow vs active profile on a retrieval eval set (nDCG@10, recall@10), recorded for activation.",
    check_specs=[dg.AssetCheckSpec("gate_passed", asset=GATE_ASSET, description="shadow within tolerance of active")],
)
def profile_quality_gate(context: dg.AssetExecutionContext, config: GateConfig, database: DatabaseResource) -> dg.MaterializeResult:
    from pipelines.domain.errors import KbindexError
    from resources.profiles import run_gate

    eval_dir = config.eval_dir or os.environ.get("KBINDEX_EVAL_DIR", "")
    if not eval_dir:
        raise dg.Failure("set config 'eval_dir' (or KBINDEX_EVAL_DIR) to a BEIR-layout eval folder")
    name = _profile(database, config.profile)
    try:
        row = run_gate(database.db, name, eval_dir, tolerance=config.tolerance)
    except KbindexError as exc:
        raise dg.Failure(f"{exc.code}: {exc.message}") from exc
    verdict = "passed" if row["passed"] else "FAILED"
    context.log.info(
        f"gate {verdict}: {name} nDCG@10 {row['shadow_ndcg']:.4f} recall@10 {row['shadow_recall']:.4f}; "
        f"{row['baseline_profile']} nDCG@10 {row['active_ndcg']:.4f} recall@10 {row['active_recall']:.4f}"
    )
    metadata = {
        "profile": name,
        "baseline_profile": row["baseline_profile"],
        "mode": row["mode"],  # the search mode each profile was scored in (its search_mode, hybrid by default)
        "baseline_mode": row["baseline_mode"],
        "lexical_analyzer": row["lexical_analyzer"],  # the analyzer each profile's BM25 side was scored with
        "baseline_lexical_analyzer": row["baseline_lexical_analyzer"],
        "passed": bool(row["passed"]),
        "ndcg_at_10": float(row["shadow_ndcg"]),
        "recall_at_10": float(row["shadow_recall"]),
        "baseline_ndcg_at_10": float(row["active_ndcg"]),
        "baseline_recall_at_10": float(row["active_recall"]),
        "tolerance": float(row["tolerance"]),
        "eval_set": row["eval_set"],
        "queries": int(row["queries"]),
        "documents": int(row["documents"]),
        "gate_id": int(row["gate_id"]),
        "seconds": float(row["seconds"]),
    }
    return dg.MaterializeResult(
        metadata=metadata,
        check_results=[
            dg.AssetCheckResult(
                check_name="gate_passed",
                passed=bool(row["passed"]),
                severity=dg.AssetCheckSeverity.ERROR,
                metadata={"profile": name, "ndcg_at_10": metadata["ndcg_at_10"], "baseline_ndcg_at_10": metadata["baseline_ndcg_at_10"]},
            )
        ],
    )


profile_gate_job = dg.define_asset_job(
    name="profile_gate_job",
    selection=dg.AssetSelection.assets(profile_quality_gate),
    executor_def=dg.in_process_executor,
    description="Run the retrieval quality gate of a shadow profile (config: profile, eval_dir, tolerance).",
)

gate_assets = [profile_quality_gate]
gate_jobs = [profile_gate_job]
"""Added to the code location by pipelines/definitions.py (one Definitions object per module)."""
