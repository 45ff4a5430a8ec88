"""Model migration: shadow index profiles, their backfill progress, the quality gate, the global switch.

    create_profile     validate the recipe (name, local model of dimension 384, chunking), insert it
                       building, and one REINDEX task per current document version (one statement)
    migration_progress building profiles: done/total, tasks by status, failures by code, rate, ETA
    list_profiles      every profile with coverage and its latest gate result
    run_gate           score the shadow recipe and the active one on a BEIR-layout eval set, record it
    activate_profile   the switch, in one transaction: refused (IllegalTransition) unless the profile
                       covers every current version and its latest gate passed against the active one
    rollback_profile   back to the active profile's previous_active, in one transaction

While a profile is building, publishing indexes under it as well as under the active one
(``index_task_ensure``), so a backfill never chases a moving target. Search reads exactly one profile:
the active one (``index_profile_one_active``), so a switch is one committed UPDATE pair.

A "current version" is ``document.latest_version``; a profile covers it when its search pointer for
the document names that version.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np

from pipelines.domain.chunking import VersionIdentity, chunk_document, document_title
from pipelines.domain.errors import EmbeddingError, IllegalTransition, InvalidRequest
from pipelines.domain.identifiers import validate_profile_name
from pipelines.domain.lexical import (
    LexicalParams,
    bm25_matrix,
    check_mode,
    check_params,
    fuse_matrix,
    rrf_matrix,
)
from pipelines.domain.parsing.model import ParsedDocument, TextBlock
from pipelines.domain.retrieval_metrics import DEFAULT_K, RetrievalScores, evaluate, gate_passed
from resources.database import Database
from resources.embedder import PACKAGED_MODEL_NAME, Embedder, checked_embed, embedder_for_model, tokenizer_for_model
from resources.lexical import analyzer_for, lexical_text
from resources.search import hybrid_depth

INDEX_DIMENSION = 384  # chunk.embedding is vector(384)
MIN_CHUNK_TOKENS = 16  # index_profile CHECK
RATE_WINDOW_MINUTES = 5
DEFAULT_TOLERANCE = 0.01


# -- the recipe ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelInfo:
    """What a profile records about its model: the name it loads by, its dimension, its token budget."""

    model: str
    dimension: int
    max_content_tokens: int


def tokenizer_for(model: str) -> Any:
    """The chunker's tokenizer for a profile's model (the same one indexing uses)."""
    return tokenizer_for_model(model)


def probe_model(model: str) -> ModelInfo:
    """Check that ``model`` loads from local files and fits the index; InvalidRequest saying why not.

    ``model`` is the packaged ``all-MiniLM-L6-v2``, a local sentence-transformers folder (recorded as its
    absolute path), a model already in the local Hugging Face cache, or ``fake-*`` (the deterministic
    test embedder). Nothing is downloaded.
    """
    if not isinstance(model, str) or not model.strip():
        raise InvalidRequest("--model is empty: give all-MiniLM-L6-v2 or a local sentence-transformers folder")
    model = model.strip()
    folder = Path(model).expanduser()
    if model != PACKAGED_MODEL_NAME and not model.startswith("fake-") and folder.is_dir():
        model = str(folder.resolve())
    try:
        dimension = int(embedder_for_model(model).dimension)
    except EmbeddingError as exc:
        raise InvalidRequest(
            f"model {model!r} is not available locally ({exc.message}); use the packaged "
            f"{PACKAGED_MODEL_NAME!r} or the path of a local sentence-transformers folder (nothing is downloaded)"
        ) from exc
    if dimension != INDEX_DIMENSION:
        raise InvalidRequest(
            f"model {model!r} makes {dimension}-dimension embeddings; the index stores vector({INDEX_DIMENSION}) "
            f"(chunk.embedding), so a profile needs a {INDEX_DIMENSION}-dimension model"
        )
    try:
        tokenizer = tokenizer_for(model)
    except EmbeddingError as exc:
        raise InvalidRequest(f"model {model!r} has no usable tokenizer.json for chunking ({exc.message})") from exc
    return ModelInfo(model=model, dimension=dimension, max_content_tokens=int(tokenizer.max_content_tokens))


def _provider_info(provider: Any) -> ModelInfo:
    """An HTTP provider recipe, checked offline (resources/http_embedder.py); chunked by the packaged WordPiece."""
    from resources.http_embedder import check_provider

    check_provider(provider, dimension=INDEX_DIMENSION)
    model = provider.model_name
    return ModelInfo(model=model, dimension=provider.dimension,
                     max_content_tokens=int(tokenizer_for(model).max_content_tokens))


def validate_chunking(chunk_tokens: int, overlap: int, max_content_tokens: int) -> None:
    """The chunker's limits: at least 16 word pieces, at most what the model reads; overlap <= half."""
    if not MIN_CHUNK_TOKENS <= chunk_tokens <= max_content_tokens:
        raise InvalidRequest(
            f"--chunk-tokens must be between {MIN_CHUNK_TOKENS} and {max_content_tokens} "
            "(the model reads no more word pieces than that)"
        )
    if not 0 <= overlap <= chunk_tokens // 2:
        raise InvalidRequest(f"--overlap must be between 0 and {chunk_tokens // 2} (half of --chunk-tokens)")


# -- create ----------------------------------------------------------------------------------------


def create_profile(
    db: Database,
    name: str,
    *,
    model: str,
    chunk_tokens: int = 200,
    overlap: int = 32,
    max_attempts: int = 5,
    provider: Any = None,
    lexical: LexicalParams | None = None,
    context: bool = False,
) -> dict[str, Any]:
    """Insert a building profile and a REINDEX task for every current document version, in one transaction.

    ``lexical``: the profile's search mode, BM25/fusion parameters and lexical analyzer (default: hybrid, weighted
    fusion at weight 0.5, RRF k 60, k1 1.2, b 0.75, ``wordpiece``), so a migration can change how search ranks and
    the quality gate judges that change. The analyzer is fixed from here on: every lexical row depends on it.
    ``context``: embed each chunk with its document's title and heading path (``embed_context``, fixed for the
    profile's life: pipelines/domain/chunking.py).

    Returns the profile row plus ``reindex_tasks`` (how many tasks were created). InvalidRequest for a
    bad name, model or chunking; IllegalTransition if the name is taken. With ``provider`` (an
    http_embedder.ProviderConfig) the profile embeds through that HTTP endpoint and ``model`` is ignored:
    it becomes ``http:<remote model>@<host>``; nothing is sent to the provider here.
    """
    validate_profile_name(name)
    try:
        lexical = check_params(lexical or LexicalParams())
    except ValueError as exc:
        raise InvalidRequest(str(exc)) from exc
    info = probe_model(model) if provider is None else _provider_info(provider)
    validate_chunking(chunk_tokens, overlap, info.max_content_tokens)
    with db.transaction() as tx:
        row = tx.fetch_one(
            "index_profile_insert",
            {
                "name": name,
                "model": info.model,
                "dimension": info.dimension,
                "chunk_tokens": chunk_tokens,
                "chunk_overlap": overlap,
                **dataclasses.asdict(lexical),  # search_mode, lexical_weight, bm25_k1, bm25_b, fusion, rrf_k, analyzer
                "embed_context": bool(context),
            },
        )
        if row is None:
            raise IllegalTransition(f"a profile named {name!r} already exists", profile=name)
        if provider is not None:
            row = {**row, **tx.fetch_one("index_profile_provider_set", {"name": name, **provider.columns()})}
        tx.execute("document_table_lock")
        created = tx.fetch_one("index_task_reindex_profile", {"profile": name, "max_attempts": max_attempts})
        tx.execute(
            "index_profile_event_insert",
            {
                "profile": name,
                "action": "create",
                "from_profile": None,
                "forced": False,
                "detail": json.dumps({"reindex_tasks": created["created"] if created else 0}),
            },
        )
    return {**row, "reindex_tasks": created["created"] if created else 0}


# -- progress and listing -------------------------------------------------------------------------


def _progress_view(row: Mapping[str, Any]) -> dict[str, Any]:
    total, done = int(row["total"]), int(row["done"])
    rate = row["succeeded_last_5m"] / RATE_WINDOW_MINUTES
    remaining = max(0, total - done - int(row["dead"]) - int(row["cancelled"]))
    if remaining == 0:
        eta: float | None = 0.0
    elif rate > 0:
        eta = round(remaining / rate * 60.0, 1)
    else:
        eta = None  # nothing finished lately: no honest estimate
    return {
        "profile": row["profile"],
        "model": row["model"],
        "chunk_tokens": row["chunk_tokens"],
        "chunk_overlap": row["chunk_overlap"],
        "done": done,
        "total": total,
        "percent": round(100.0 * done / total, 1) if total else 100.0,
        "pending": row["pending"],
        "running": row["running"],
        "retry_wait": row["retry_wait"],
        "dead": row["dead"],
        "cancelled": row["cancelled"],
        "failures_by_code": {k: int(v) for k, v in (row["failures_by_code"] or {}).items()},
        "retrying_by_code": {k: int(v) for k, v in (row["retrying_by_code"] or {}).items()},
        "rate_per_minute": round(rate, 2),
        "eta_seconds": eta,
    }


def migration_progress(db: Database, *, tenant_id: str | None = None, now: datetime | None = None) -> list[dict[str, Any]]:
    """The backfill of each building profile, oldest first (empty list when no migration is under way).

    Each dict (JSON-ready): profile, model, chunk_tokens, chunk_overlap; ``done``/``total`` = current
    document versions indexed under it / all current versions, ``percent``; its tasks for current versions
    by status (pending, running, retry_wait, dead, cancelled); ``failures_by_code`` (DEAD by error code),
    ``retrying_by_code`` (RETRY_WAIT by code); ``rate_per_minute`` = its tasks SUCCEEDED per minute over
    the last 5 minutes; ``eta_seconds`` = the versions still to do (not done, not DEAD/CANCELLED) at that
    rate, 0.0 when none are left, None when the rate is 0. ``now`` pins the clock (tests).

    ``tenant_id``: that tenant's versions and tasks only, and an HTTP provider's model without its host
    (``http:<model>``): what the API shows a tenant (issue #31). None: every tenant, for the operator.
    """
    rows = db.fetch_all("index_profile_migration_progress", {"now": now, "tenant_id": tenant_id})
    views = [_progress_view(r) for r in rows]
    if tenant_id is not None:
        for view in views:
            if str(view["model"]).startswith("http:"):
                view["model"] = str(view["model"]).rsplit("@", 1)[0]  # 'http:<model>@<host>' names the provider's host
    return views


def coverage(db: Database, name: str) -> dict[str, Any]:
    """Current versions the profile covers, and why the rest are missing (``{"PENDING": 3, "DEAD PARSE_ERROR": 1}``)."""
    row = db.fetch_one("index_profile_coverage", {"profile": name})
    assert row is not None
    return _coverage_view(row)


def _coverage_view(row: Mapping[str, Any]) -> dict[str, Any]:
    current, missing = int(row["current_versions"]), int(row["missing_versions"])
    return {
        "current_versions": current,
        "covered_versions": current - missing,
        "missing_versions": missing,
        "missing_by_reason": {k: int(v) for k, v in (row["missing_by_reason"] or {}).items()},
        "ratio": round((current - missing) / current, 4) if current else 1.0,
    }


def _gate_view(row: Mapping[str, Any]) -> dict[str, Any] | None:
    if row.get("gate_id") is None:
        return None
    return {
        "gate_id": row["gate_id"],
        "passed": row["gate_passed"],
        "baseline_profile": row["gate_baseline"],
        "eval_set": row["gate_eval_set"],
        "ndcg_at_10": row["gate_ndcg"],
        "recall_at_10": row["gate_recall"],
        "baseline_ndcg_at_10": row["gate_baseline_ndcg"],
        "baseline_recall_at_10": row["gate_baseline_recall"],
        "tolerance": row["gate_tolerance"],
        "at": row["gate_at"],
        "lexical_analyzer": row.get("gate_lexical_analyzer") or "wordpiece",  # NULL: a gate from before 0045
    }


def list_profiles(db: Database) -> list[dict[str, Any]]:
    """Every profile (active first, then building, then the rest) with coverage, latest gate and, while
    building, its migration progress (as ``migration_progress``)."""
    rows = db.fetch_all("index_profile_list")
    progress = {p["profile"]: p for p in migration_progress(db)}
    out = []
    for r in rows:
        current, covered = int(r["current_versions"]), int(r["covered_versions"])
        out.append(
            {
                "name": r["name"],
                "model": r["model"],
                "dimension": r["dimension"],
                "chunk_tokens": r["chunk_tokens"],
                "chunk_overlap": r["chunk_overlap"],
                "search_mode": r["search_mode"],
                "fusion": r["fusion"],
                "rrf_k": r["rrf_k"],
                "lexical_weight": r["lexical_weight"],
                "lexical_analyzer": r["lexical_analyzer"],
                "is_active": r["is_active"],
                "building": r["building"],
                "activated_at": r["activated_at"],
                "previous_active": r["previous_active"],
                "created_at": r["created_at"],
                "embed_context": r["embed_context"],
                "rerank": None if r.get("rerank_url") is None else {
                    "url": r["rerank_url"], "model": r["rerank_model"], "key_env": r["rerank_key_env"],
                    "candidates": r["rerank_candidates"]},
                "coverage": {
                    "covered_versions": covered,
                    "current_versions": current,
                    "ratio": round(covered / current, 4) if current else 1.0,
                },
                "gate": _gate_view(r),
                "migration": progress.get(r["name"]),
            }
        )
    return out


# -- switch and rollback ----------------------------------------------------------------------------


def _find(rows: list[dict[str, Any]], name: str) -> dict[str, Any] | None:
    return next((r for r in rows if r["name"] == name), None)


def why_not_activatable(session: Any, name: str, active: str | None) -> list[str]:
    """Reasons the profile may not become active now (empty: it may), short enough to show together."""
    reasons = []
    cov = _coverage_view(session.fetch_one("index_profile_coverage", {"profile": name}))
    if cov["missing_versions"]:
        top = sorted(cov["missing_by_reason"].items(), key=lambda item: (-item[1], item[0]))[:3]
        detail = ", ".join(f"{n} {reason}" for reason, n in top)
        reasons.append(f"it covers {cov['covered_versions']}/{cov['current_versions']} current versions (missing: {detail})")
    gate = session.fetch_one("profile_gate_latest", {"profile": name})
    if gate is None:
        reasons.append("its quality gate was never run (kbindex profile gate NAME --eval DIR)")
    elif not gate["passed"]:
        reasons.append(
            f"its latest gate failed: nDCG@10 {gate['shadow_ndcg']:.4f} vs {gate['active_ndcg']:.4f}, "
            f"recall@10 {gate['shadow_recall']:.4f} vs {gate['active_recall']:.4f}, tolerance {gate['tolerance']:g}"
        )
    elif gate["baseline_profile"] != active:
        reasons.append(f"its latest gate was against {gate['baseline_profile']!r}, not the active {active!r}: gate it again")
    else:
        profile = session.fetch_one("index_profile_get", {"name": name})
        if profile is not None and not gate_scored_fusion(gate, profile):
            reasons.append("its fusion changed after its latest gate (`kbindex profile fusion`): gate it again")
        if profile is not None and not gate_scored_rerank(gate, profile):
            reasons.append("its reranker changed after its latest gate (`kbindex profile rerank`): gate it again")
    return reasons


def _fusion_of(params: LexicalParams) -> tuple[str, int | None, float]:
    """What decides a hybrid ranking besides BM25's k1 and b: the fusion, RRF's k (rrf only) and the weight."""
    return (params.fusion, params.rrf_k if params.fusion == "rrf" else None, round(params.lexical_weight, 9))


def gate_scored_fusion(gate: Mapping[str, Any], profile: Mapping[str, Any]) -> bool:
    """Whether a gate row scored the profile with the fusion it has now (a row from before migration 0044
    has no fusion recorded: it scored the weighted sum, at a weight it did not record)."""
    now = LexicalParams.of(profile)
    if gate.get("fusion") is None:
        return now.fusion == "weighted"
    scored = LexicalParams(fusion=gate["fusion"], rrf_k=int(gate["rrf_k"]), lexical_weight=float(gate["lexical_weight"]))
    return _fusion_of(scored) == _fusion_of(now)


def _rerank_of(row: Mapping[str, Any]) -> tuple[Any, Any, Any]:
    """What decides a reranked ranking: the reranker's URL, remote model and candidates (all None: none)."""
    return (row.get("rerank_url"), row.get("rerank_model"), row.get("rerank_candidates"))


def gate_scored_rerank(gate: Mapping[str, Any], profile: Mapping[str, Any]) -> bool:
    """Whether a gate row scored the profile with the reranker it has now (a row from before migration 0048
    scored none)."""
    return _rerank_of(gate) == _rerank_of(profile)


def set_rerank(db: Database, name: str, *, url: str | None, model: str | None = None, key_env: str | None = None,
               candidates: int = 50, force: bool = False) -> dict[str, Any]:
    """Give profile ``name`` an HTTP reranker (``url`` and ``model``; resources/http_reranker.py), or none (``url``
    None). Query-time only: nothing is re-indexed, search reranks from its next query, and nothing is sent to the
    provider here. As set_fusion: a shadow profile's latest gate no longer counts; the active profile changes only
    with ``force`` (IllegalTransition otherwise), recorded in the profile history. InvalidRequest for an unknown
    profile or a recipe that cannot work (check_reranker)."""
    from resources.http_embedder import ProviderConfig
    from resources.http_reranker import check_reranker

    validate_profile_name(name)
    if url is None:
        wanted: dict[str, Any] = {"rerank_url": None, "rerank_model": None, "rerank_key_env": None, "rerank_candidates": None}
    else:
        config = ProviderConfig(url=url, model=model or "", api_key_env=key_env or None)
        check_reranker(config, candidates)
        wanted = {"rerank_url": url, "rerank_model": model, "rerank_key_env": key_env or None,
                  "rerank_candidates": candidates}
    with db.transaction() as tx:
        rows = tx.fetch_all("index_profile_lock_all")
        if _find(rows, name) is None:
            raise InvalidRequest(f"no index profile named {name!r} (see `kbindex profile list`)")
        current = tx.fetch_one("index_profile_get", {"name": name})
        assert current is not None
        active = _find(rows, name)["is_active"]  # type: ignore[index]
        changed = _rerank_of(wanted) != _rerank_of(current) or wanted["rerank_key_env"] != current["rerank_key_env"]
        if active and not force and changed:
            raise IllegalTransition(
                f"profile {name!r} is active: a reranker change would alter search without a quality gate. Gate a "
                "shadow profile with this reranker first, then repeat with --force",
                profile=name,
            )
        row = tx.fetch_one("index_profile_rerank_set", {"name": name, **wanted})
        before = {k: current[k] for k in wanted}
        tx.execute(
            "index_profile_event_insert",
            {
                "profile": name,
                "action": "rerank",
                "from_profile": None,
                "forced": bool(active and force),
                "detail": json.dumps({"from": before, "to": wanted}),
            },
        )
    assert row is not None
    return dict(row)


def set_fusion(db: Database, name: str, *, fusion: str, rrf_k: int | None = None, lexical_weight: float | None = None,
               force: bool = False) -> dict[str, Any]:
    """Change how profile ``name`` fuses hybrid search: ``weighted`` or ``rrf``, RRF's ``rrf_k``, the ``lexical_weight``
    (None keeps the profile's). Query-time only: nothing is re-indexed, the change takes effect at the next search.

    A shadow profile: its latest gate no longer counts (it scored the old fusion), so activation asks for a new
    gate. The active profile: refused (IllegalTransition; search would change ungated) unless ``force``, which
    is recorded in the profile history. InvalidRequest for an unknown profile or a parameter out of range.
    """
    validate_profile_name(name)
    with db.transaction() as tx:
        rows = tx.fetch_all("index_profile_lock_all")
        if _find(rows, name) is None:
            raise InvalidRequest(f"no index profile named {name!r} (see `kbindex profile list`)")
        current = LexicalParams.of(tx.fetch_one("index_profile_get", {"name": name}))
        try:
            wanted = check_params(dataclasses.replace(
                current, fusion=fusion, rrf_k=current.rrf_k if rrf_k is None else rrf_k,
                lexical_weight=current.lexical_weight if lexical_weight is None else lexical_weight))
        except ValueError as exc:
            raise InvalidRequest(str(exc)) from exc
        active = _find(rows, name)["is_active"]  # type: ignore[index]
        if active and not force and _fusion_of(wanted) != _fusion_of(current):
            raise IllegalTransition(
                f"profile {name!r} is active: a fusion change would alter search without a quality gate. Score it "
                "first (`python -m bench.retrieval` prints both fusions on your eval set; or gate a shadow profile "
                "with this fusion), then repeat with --force",
                profile=name,
            )
        row = tx.fetch_one("index_profile_fusion_set", {"name": name, "fusion": wanted.fusion, "rrf_k": wanted.rrf_k,
                                                        "lexical_weight": wanted.lexical_weight})
        tx.execute(
            "index_profile_event_insert",
            {
                "profile": name,
                "action": "fusion",
                "from_profile": None,
                "forced": bool(active and force),
                "detail": json.dumps({"from": dataclasses.asdict(current), "to": dataclasses.asdict(wanted)}),
            },
        )
    assert row is not None
    return dict(row)


def request_backfill(db: Database, name: str) -> dict[str, Any]:
    """Ask the claiming sensor to build a building profile's backlog (its never-attempted REINDEX tasks).

    Idempotent. From then on each claiming tick fills the run capacity live indexing leaves free with
    that backlog, in ordinary bounded runs, so a migration of 10^5-10^6 versions needs no run or
    backfill record that lists them all. Returns the profile name and its backlog; InvalidRequest if
    the profile does not exist or is not building.
    """
    validate_profile_name(name)
    row = db.fetch_one("index_profile_request_backfill", {"name": name})
    if row is None:
        raise InvalidRequest(f"profile {name!r} is not a profile being built: create it with `kbindex profile create`")
    return dict(row)


def activate_profile(db: Database, name: str, *, force: bool = False) -> dict[str, Any]:
    """Make ``name`` the profile search reads, in one transaction (old: not active; new: active, not building,
    previous_active = old, activated_at = now).

    IllegalTransition (with every reason) unless it covers every current document version and its latest
    gate passed against the active profile; ``force`` skips those checks (recorded in the profile history).
    """
    validate_profile_name(name)
    with db.transaction() as tx:
        rows = tx.fetch_all("index_profile_lock_all")
        target = _find(rows, name)
        if target is None:
            raise InvalidRequest(f"no index profile named {name!r} (see `kbindex profile list`)")
        active = next((r["name"] for r in rows if r["is_active"]), None)
        if active == name:
            raise IllegalTransition(f"profile {name!r} is already active", profile=name)
        reasons = why_not_activatable(tx, name, active)
        if reasons and not force:
            raise IllegalTransition(
                f"profile {name!r} cannot be activated: " + "; ".join(reasons) + " (--force overrides)",
                profile=name,
                reasons=reasons,
            )
        tx.fetch_all("index_profile_deactivate")
        row = tx.fetch_one("index_profile_activate", {"name": name, "previous_active": active})
        tx.execute(
            "index_profile_event_insert",
            {
                "profile": name,
                "action": "activate",
                "from_profile": active,
                "forced": bool(force and reasons),
                "detail": json.dumps({"overridden": reasons} if force and reasons else {}),
            },
        )
    return {**row, "forced": bool(force and reasons), "overridden": reasons if force else []}


def rollback_profile(db: Database, *, max_attempts: int = 5) -> dict[str, Any]:
    """Make the active profile's ``previous_active`` active again, in one transaction; its chunks are still there.

    Current versions published while it was not a target get INDEX tasks in the same transaction
    (``catch_up_tasks``); until they finish, search shows their previous versions under it.
    IllegalTransition when the active profile has no previous one.
    """
    with db.transaction() as tx:
        # The document table first (as publishes take it), then the profile rows: no lock-order inversion.
        tx.execute("document_table_lock")
        rows = tx.fetch_all("index_profile_lock_all")
        active = next((r for r in rows if r["is_active"]), None)
        if active is None:
            raise IllegalTransition("no profile is active: activate one with `kbindex profile activate NAME`")
        previous = active["previous_active"]
        if previous is None:
            raise IllegalTransition(f"profile {active['name']!r} has no previous profile to roll back to")
        tx.fetch_all("index_profile_deactivate")
        row = tx.fetch_one("index_profile_restore", {"name": previous})
        caught_up = tx.fetch_one("index_task_catch_up_profile", {"profile": previous, "max_attempts": max_attempts})
        n = caught_up["created"] if caught_up else 0
        tx.execute(
            "index_profile_event_insert",
            {
                "profile": previous,
                "action": "rollback",
                "from_profile": active["name"],
                "forced": False,
                "detail": json.dumps({"catch_up_tasks": n}),
            },
        )
    return {**row, "rolled_back_from": active["name"], "catch_up_tasks": n}


# -- the quality gate --------------------------------------------------------------------------------


@dataclass(frozen=True)
class EvalSet:
    """A BEIR-layout retrieval eval set: paragraphs, questions, graded judgements."""

    name: str
    digest: str
    corpus: list[tuple[str, str, str]]  # (id, title, text)
    queries: list[tuple[str, str]]  # (id, text)
    qrels: dict[str, dict[str, float]]


def load_eval_set(path: str | Path) -> EvalSet:
    """Read ``corpus.jsonl``, ``queries.jsonl`` and ``qrels/test.tsv`` from a folder (BEIR layout)."""
    folder = Path(path).expanduser()
    files = [folder / "corpus.jsonl", folder / "queries.jsonl", folder / "qrels" / "test.tsv"]
    missing = [str(f.relative_to(folder)) for f in files if not f.is_file()]
    if missing:
        raise InvalidRequest(f"eval folder {folder.name!r} lacks {', '.join(missing)} (BEIR layout expected)")
    digest = hashlib.sha256()
    texts = []
    for f in files:
        data = f.read_bytes()
        digest.update(hashlib.sha256(data).digest())
        texts.append(data.decode("utf-8"))
    try:
        corpus = []
        for line in texts[0].splitlines():
            if line.strip():
                doc = json.loads(line)
                if str(doc.get("text") or "").strip():
                    corpus.append((str(doc["_id"]), str(doc.get("title") or ""), str(doc["text"])))
        queries = [
            (str(q["_id"]), str(q["text"])) for q in map(json.loads, filter(str.strip, texts[1].splitlines()))
        ]
        qrels: dict[str, dict[str, float]] = {}
        for i, line in enumerate(texts[2].splitlines()):
            parts = line.split("\t")
            if not line.strip() or (i == 0 and parts[0] == "query-id"):
                continue
            qrels.setdefault(parts[0], {})[parts[1]] = float(parts[2])
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        raise InvalidRequest(f"eval folder {folder.name!r} is not valid BEIR layout ({type(exc).__name__})") from exc
    known_docs = {d for d, _, _ in corpus}
    asked = {q for q, _ in queries}
    qrels = {q: {d: r for d, r in j.items() if d in known_docs} for q, j in qrels.items() if q in asked}
    if not corpus or not any(r > 0 for j in qrels.values() for r in j.values()):
        raise InvalidRequest(f"eval folder {folder.name!r} has no judged query over its corpus")
    return EvalSet(folder.resolve().name, digest.hexdigest(), corpus, queries, qrels)


def _embed(embedder: Embedder, profile: Mapping[str, Any], texts: list[str], cache: dict[tuple[str, str], np.ndarray]) -> np.ndarray:
    """Vectors for ``texts`` under the profile's model, through checked_embed; ``cache`` shares them across profiles."""
    model = profile["model"]
    todo = list(dict.fromkeys(t for t in texts if (model, t) not in cache))
    if todo:
        vectors = checked_embed(embedder, todo, expected_model=model, expected_dim=profile["dimension"])
        cache.update({(model, t): v for t, v in zip(todo, vectors, strict=True)})
    if not texts:
        return np.zeros((0, profile["dimension"]), dtype=np.float32)
    return np.stack([cache[(model, t)] for t in texts])


def evaluate_profile(
    profile: Mapping[str, Any],
    eval_set: EvalSet,
    *,
    embedder: Embedder | None = None,
    cache: dict[tuple[str, str], np.ndarray] | None = None,
    k: int = DEFAULT_K,
    mode: str | None = None,
    reranker: Any = None,
) -> RetrievalScores:
    """nDCG@k and recall@k of a profile's recipe on ``eval_set``, in memory (the index is not touched).

    Each paragraph is chunked as a one-section document (its title as the heading) with the profile's
    chunker and tokenizer (and, for a context profile, that title as the document's) and a paragraph scores the best of its chunks, ranked as search ranks in
    ``mode`` (default: the profile's ``search_mode``, the one search uses): cosine of the profile's
    model (dense), BM25 with the profile's k1, b and ``lexical_analyzer`` over the eval corpus (lexical), or
    their fusion as the profile's ``fusion`` says (hybrid: the weighted sum with ``lexical_weight``, or RRF with ``rrf_k`` over each
    side's ``hybrid_depth(k)`` best chunks, as search fuses), every chunk scored exactly. A profile with a
    reranker (migration 0048) then has each query's ``rerank_candidates`` best chunks reordered by it, as search
    does (``reranker`` overrides the profile's HTTP reranker; its failure fails the evaluation, it does not fall
    back: a gate must score what it says it scored).
    """
    params = LexicalParams.of(profile)
    mode = check_mode(mode or params.search_mode)
    cache = {} if cache is None else cache
    tokenizer = tokenizer_for(profile["model"])
    chunks: list[Any] = []
    starts: list[int] = []
    for doc_id, title, text in eval_set.corpus:
        doc = ParsedDocument(
            blocks=[TextBlock(text=text, heading_path=(title.replace("_", " "),) if title else ())],
            page_count=None,
            media_type="text/plain",
        )
        starts.append(len(chunks))
        chunks.extend(
            chunk_document(
                doc,
                tokenizer=tokenizer,
                chunk_tokens=profile["chunk_tokens"],
                overlap=profile["chunk_overlap"],
                identity=VersionIdentity("eval", doc_id, 1, profile["name"]),
                title=document_title(doc, f"{doc_id}.txt") if profile.get("embed_context") else None,
            )
        )
    queries = [q for _, q in eval_set.queries]
    scores = None
    if mode != "lexical":
        embedder = embedder or embedder_for_model(profile["model"])
        chunk_vectors = _embed(embedder, profile, [c.embed_text for c in chunks], cache)
        scores = _embed(embedder, profile, queries, cache) @ chunk_vectors.T
    if mode != "dense":
        analyze = analyzer_for(profile["model"], params.analyzer)
        bm25 = bm25_matrix(
            [analyze(lexical_text(tuple(c.heading_path), c.text, c.context_title)) for c in chunks],
            [analyze(q) for q in queries],
            params.bm25_k1,
            params.bm25_b,
        )
        if scores is None:
            scores = bm25
        elif params.fusion == "rrf":  # each side's ranks among its search-depth candidates, as search fuses
            scores = rrf_matrix(scores, bm25, params.rrf_k, params.lexical_weight, hybrid_depth(k))
        else:
            scores = fuse_matrix(scores, bm25, params.lexical_weight)
    assert scores is not None
    if profile.get("rerank_url") and profile.get("rerank_candidates"):
        if reranker is None:
            from resources.http_reranker import HttpReranker, reranker_config

            reranker = HttpReranker(reranker_config(profile))  # type: ignore[arg-type]
        scores = _reranked(scores, [c.text for c in chunks], queries, reranker, int(profile["rerank_candidates"]))
    per_paragraph = np.maximum.reduceat(scores, np.asarray(starts), axis=1)
    doc_ids = [d for d, _, _ in eval_set.corpus]
    top = np.argsort(-per_paragraph, axis=1, kind="stable")[:, :k]
    rankings = {qid: [doc_ids[j] for j in top[i]] for i, (qid, _) in enumerate(eval_set.queries)}
    return evaluate(rankings, eval_set.qrels, k)


def _reranked(scores: np.ndarray, texts: list[str], queries: list[str], reranker: Any, candidates: int) -> np.ndarray:
    """``scores`` with each query's ``candidates`` best chunks lifted above the rest in the reranker's order (as
    search returns them); candidates the reranker left out keep their score, below the ones it ranked."""
    out = np.array(scores, dtype=np.float64, copy=True)
    for i, query in enumerate(queries):
        cand = np.argsort(-out[i], kind="stable")[:candidates]
        ranked = reranker.rerank(query, [texts[j] for j in cand])
        top = float(out[i].max()) if out.shape[1] else 0.0
        for position, (index, _) in enumerate(ranked):
            out[i, cand[index]] = top + 1.0 + (len(ranked) - position)
    return out


def run_gate(
    db: Database,
    name: str,
    eval_dir: str | Path,
    *,
    tolerance: float = DEFAULT_TOLERANCE,
    embedders: Mapping[str, Embedder] | None = None,
) -> dict[str, Any]:
    """Evaluate profile ``name`` and the active profile on the eval set and record the result.

    Each profile is scored in its own ``search_mode`` (the mode search will use once it is active; the
    row records both modes), with its own lexical analyzer (the row records both) and lexical and fusion
    parameters (the row records the shadow's fusion: changing it afterwards makes the gate stale for activation).

    passed = shadow nDCG@10 >= active nDCG@10 - tolerance and shadow recall@10 >= active recall@10 - tolerance.
    A profile with an HTTP reranker is scored through it (one request per query; the row records the reranker).
    Returns the recorded ``profile_gate`` row. ``embedders`` (by model name) overrides the model loading (tests).
    """
    validate_profile_name(name)
    if not 0.0 <= tolerance <= 1.0:
        raise InvalidRequest("--tolerance must be between 0 and 1")
    shadow = db.fetch_one("index_profile_get", {"name": name})
    if shadow is None:
        raise InvalidRequest(f"no index profile named {name!r} (see `kbindex profile list`)")
    active = db.fetch_one("index_profile_active")
    if active is None:
        raise InvalidRequest("no profile is active: there is nothing to compare with")
    if active["name"] == name:
        raise InvalidRequest(f"profile {name!r} is the active one: gate a shadow profile against it")
    eval_set = load_eval_set(eval_dir)
    started = time.perf_counter()
    cache: dict[tuple[str, str], np.ndarray] = {}
    chosen = embedders or {}
    shadow_scores = evaluate_profile(shadow, eval_set, embedder=chosen.get(shadow["model"]), cache=cache)
    active_scores = evaluate_profile(active, eval_set, embedder=chosen.get(active["model"]), cache=cache)
    scored = LexicalParams.of(shadow)  # the search settings the gate scored the shadow with
    row = db.fetch_one(
        "profile_gate_insert",
        {
            "profile": name,
            "baseline_profile": active["name"],
            "eval_set": eval_set.name,
            "eval_digest": eval_set.digest,
            "documents": len(eval_set.corpus),
            "queries": shadow_scores.queries,
            "k": shadow_scores.k,
            "shadow_ndcg": shadow_scores.ndcg,
            "shadow_recall": shadow_scores.recall,
            "active_ndcg": active_scores.ndcg,
            "active_recall": active_scores.recall,
            "tolerance": tolerance,
            "passed": gate_passed(shadow_scores, active_scores, tolerance),
            "seconds": round(time.perf_counter() - started, 3),
            "mode": scored.search_mode,
            "baseline_mode": LexicalParams.of(active).search_mode,
            "fusion": scored.fusion,
            "rrf_k": scored.rrf_k,
            "lexical_weight": scored.lexical_weight,
            "lexical_analyzer": scored.analyzer,
            "baseline_lexical_analyzer": LexicalParams.of(active).analyzer,
            **dict(zip(("rerank_url", "rerank_model", "rerank_candidates"), _rerank_of(shadow), strict=True)),
        },
    )
    assert row is not None
    return row


__all__ = [
    "EvalSet",
    "ModelInfo",
    "activate_profile",
    "coverage",
    "create_profile",
    "evaluate_profile",
    "list_profiles",
    "load_eval_set",
    "migration_progress",
    "probe_model",
    "rollback_profile",
    "run_gate",
    "set_fusion",
    "set_rerank",
]
