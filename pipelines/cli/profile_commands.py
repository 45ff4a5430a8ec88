"""`kbindex profile create | list | activate | rollback | gate`: model migration (resources/profiles.py).

A migration: ``create`` a shadow profile (REINDEX tasks for every current version), ``backfill`` it (or
launch the ``backfill_profile`` job in the Dagster UI; the claiming sensor builds it in bounded runs),
``gate`` it on
an eval set, ``activate`` it (one transaction), and ``rollback`` if it disappoints. Exit codes: 0 ok,
1 error (or a gate that did not pass), 2 usage, 3 conflict (activation refused, nothing to roll back).
"""

from __future__ import annotations

from pathlib import Path

import typer
from rich.table import Table

from pipelines.cli.app import EXIT_ERROR, JsonOption, app, console, errors_to_exit, open_database, print_json
from pipelines.domain.lexical import DEFAULT_ANALYZER

profile_app = typer.Typer(help="Index profiles: build a new model or chunking beside the active one, then switch.", no_args_is_help=True)
app.add_typer(profile_app, name="profile")


def _pct(ratio: float) -> str:
    return f"{100.0 * ratio:.1f}%"


def _eta(seconds: float | None) -> str:
    if seconds is None:
        return "unknown"
    if seconds < 90:
        return f"{seconds:.0f}s"
    if seconds < 5400:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"


def progress_line(p: dict) -> str:
    """One line of a building profile's migration progress (also what `kbindex stats` may print)."""
    failures = ", ".join(f"{code} {n}" for code, n in sorted(p["failures_by_code"].items())) or "none"
    return (
        f"{p['done']}/{p['total']} ({p['percent']:.1f}%), pending {p['pending']}, running {p['running']}, "
        f"retrying {p['retry_wait']}, failed: {failures}; {p['rate_per_minute']:.1f}/min, ETA {_eta(p['eta_seconds'])}"
    )


@profile_app.command("create")
def create_command(
    name: str = typer.Argument(..., help="Lower-case letters, digits, '_', '.', '-' (up to 63)."),
    model: str = typer.Option("", "--model", help="all-MiniLM-L6-v2 (packaged) or a local sentence-transformers folder."),
    chunk_tokens: int = typer.Option(200, "--chunk-tokens", help="Word pieces per chunk (16 to the model's limit)."),
    overlap: int = typer.Option(32, "--overlap", help="Word pieces shared by consecutive chunks (at most half)."),
    provider_url: str = typer.Option("", "--provider-url", help="Embed through an OpenAI-compatible endpoint: its base URL (https://host/v1; plain http only to loopback or KBINDEX_EMBED_HTTP_HOSTS)."),
    provider_model: str = typer.Option("", "--provider-model", help="The remote model name (with --provider-url); 384 dimensions are requested."),
    api_key_env: str = typer.Option("", "--api-key-env", help="NAME of the environment variable holding the API key, KBINDEX_EMBED_KEY_* or listed in KBINDEX_EMBED_KEY_VARS (the key is never stored)."),
    rpm: int = typer.Option(0, "--rpm", help="Provider requests per minute, shared by every run on the machine (0: no limit of ours)."),
    tpm: int = typer.Option(0, "--tpm", help="Provider tokens per minute, shared likewise (0: no limit of ours)."),
    max_batch: int = typer.Option(64, "--max-batch", help="Texts per provider request."),
    search_mode: str = typer.Option("hybrid", "--search-mode", help="How search ranks once this profile is active: hybrid, dense or lexical."),
    lexical_weight: float = typer.Option(0.5, "--lexical-weight", help="Hybrid fusion: the BM25 share of the score (0..1)."),
    fusion: str = typer.Option("weighted", "--fusion", help="Hybrid fusion: weighted (score sum) or rrf (reciprocal rank fusion)."),
    rrf_k: int = typer.Option(60, "--rrf-k", help="RRF rank constant (1..100000; with --fusion rrf)."),
    bm25_k1: float = typer.Option(1.2, "--bm25-k1", help="BM25 term-frequency saturation (>= 0)."),
    bm25_b: float = typer.Option(0.75, "--bm25-b", help="BM25 length normalisation (0..1)."),
    context: bool = typer.Option(False, "--context", help="Embed each chunk with its document's title and heading path (fixed for the profile's life; the snippet shown stays the chunk text)."),
    analyzer: str = typer.Option(DEFAULT_ANALYZER, "--analyzer", help="Lexical terms: english (stemmed words, stop words out) or wordpiece (the model's word pieces); CJK n-grams either way. Fixed for the profile's life."),
    as_json: bool = JsonOption,
) -> None:
    """Create a shadow profile (building) and a REINDEX task for every current document version."""
    from pipelines.domain.errors import InvalidRequest
    from pipelines.domain.lexical import LexicalParams
    from resources.http_embedder import ProviderConfig
    from resources.profiles import create_profile

    with open_database(writes=True) as db, errors_to_exit():
        provider = None
        if provider_url or provider_model:
            if model:
                raise InvalidRequest("give either --model or --provider-url/--provider-model, not both")
            provider = ProviderConfig(url=provider_url, model=provider_model, api_key_env=api_key_env or None,
                                      requests_per_minute=rpm or None, tokens_per_minute=tpm or None,
                                      max_batch=max_batch)
        elif not model:
            raise InvalidRequest("--model (or --provider-url with --provider-model) is required")
        lexical = LexicalParams(search_mode=search_mode, lexical_weight=lexical_weight, bm25_k1=bm25_k1, bm25_b=bm25_b,
                                fusion=fusion, rrf_k=rrf_k, analyzer=analyzer)
        row = create_profile(db, name, model=model, chunk_tokens=chunk_tokens, overlap=overlap, provider=provider,
                             lexical=lexical, context=context)
    if as_json:
        print_json(row)
        return
    console.print(
        f"profile {row['name']} created (building): model {row['model']}, {row['chunk_tokens']} tokens, "
        f"overlap {row['chunk_overlap']}, search {row['search_mode']} ({_fusion_text(row)}), lexical analyzer "
        f"{row['lexical_analyzer']}, {_context_text(row)}; "
        f"{row['reindex_tasks']} REINDEX tasks queued.\n"
        f"  next: `kbindex profile backfill {row['name']}` (or the backfill_profile job in the Dagster UI), "
        f"then `kbindex profile gate {row['name']} --eval DIR`",
        highlight=False,
    )


def _context_text(row: dict) -> str:
    return "chunks embedded with title + headings" if row.get("embed_context") else "chunks embedded with headings"


def _fusion_text(row: dict) -> str:
    if row["fusion"] == "rrf":
        return f"rrf k {row['rrf_k']}, lexical weight {row['lexical_weight']:g}"
    return f"weighted, lexical weight {row['lexical_weight']:g}"


@profile_app.command("fusion")
def fusion_command(
    name: str = typer.Argument(...),
    fusion: str = typer.Option(..., "--fusion", help="weighted (score sum) or rrf (reciprocal rank fusion)."),
    rrf_k: int = typer.Option(None, "--rrf-k", help="RRF rank constant (1..100000); default: the profile's."),
    lexical_weight: float = typer.Option(None, "--lexical-weight", help="BM25 share (0..1); default: the profile's."),
    force: bool = typer.Option(False, "--force", help="Change the ACTIVE profile's fusion without a gate (recorded)."),
    as_json: bool = JsonOption,
) -> None:
    """Change how NAME fuses hybrid search; query-time only, nothing is re-indexed (a shadow profile needs a new gate;
    the active profile only with --force, exit 3 otherwise)."""
    from resources.profiles import set_fusion

    with open_database(writes=True) as db, errors_to_exit():
        row = set_fusion(db, name, fusion=fusion, rrf_k=rrf_k, lexical_weight=lexical_weight, force=force)
    if as_json:
        print_json(row)
        return
    state = "active: search uses it now" if row["is_active"] else "gate it again before activating"
    console.print(f"profile {row['name']}: fusion {_fusion_text(row)} ({state})", highlight=False)


def _rerank_text(row: dict) -> str:
    rerank = row.get("rerank")
    if not rerank:
        return "no reranker"
    key = f", key ${rerank['key_env']}" if rerank.get("key_env") else ""
    return f"reranked by {rerank['model']} at {rerank['url']} (top {rerank['candidates']}{key})"


@profile_app.command("rerank")
def rerank_command(
    name: str = typer.Argument(...),
    url: str = typer.Option(None, "--url", help="The reranker's base URL: POST {url}/rerank (Cohere, Jina or TEI style)."),
    model: str = typer.Option(None, "--model", help="The remote reranking model, e.g. BAAI/bge-reranker-base."),
    key_env: str = typer.Option(None, "--key-env", help="NAME of the environment variable holding the API key (KBINDEX_EMBED_KEY_*)."),
    candidates: int = typer.Option(50, "--candidates", help="How many of search's best chunks the reranker reorders (1..200)."),
    off: bool = typer.Option(False, "--off", help="No reranking for NAME."),
    force: bool = typer.Option(False, "--force", help="Change the ACTIVE profile's reranker without a gate (recorded)."),
    as_json: bool = JsonOption,
) -> None:
    """Rerank NAME's search results through an HTTP reranker, or stop (--off); query-time only, nothing is
    re-indexed (a shadow profile needs a new gate; the active profile only with --force, exit 3 otherwise)."""
    from pipelines.domain.errors import InvalidRequest
    from resources.profiles import set_rerank

    with open_database(writes=True) as db, errors_to_exit():
        if off == bool(url or model):
            raise InvalidRequest("give --url and --model, or --off")
        if not off and not (url and model):
            raise InvalidRequest("--url and --model are both required")
        row = set_rerank(db, name, url=None if off else url, model=model, key_env=key_env, candidates=candidates,
                         force=force)
    if as_json:
        print_json(row)
        return
    shown = {"rerank": None if row["rerank_url"] is None else {
        "url": row["rerank_url"], "model": row["rerank_model"], "key_env": row["rerank_key_env"],
        "candidates": row["rerank_candidates"]}}
    state = "active: search uses it now" if row["is_active"] else "gate it again before activating"
    console.print(f"profile {row['name']}: {_rerank_text(shown)} ({state})", highlight=False)


@profile_app.command("list")
def list_command(as_json: bool = JsonOption) -> None:
    """Profiles with model, chunking, state, coverage, latest gate and (while building) migration progress."""
    from resources.profiles import list_profiles

    with open_database() as db, errors_to_exit():
        rows = list_profiles(db)
    if as_json:
        print_json(rows)
        return
    table = Table("name", "state", "model", "tokens/overlap", "coverage", "gate")
    for r in rows:
        state = "active" if r["is_active"] else "building" if r["building"] else "-"
        cov = r["coverage"]
        gate = r["gate"]
        gate_text = "never run" if gate is None else (
            f"{'passed' if gate['passed'] else 'FAILED'} nDCG {gate['ndcg_at_10']:.3f}/{gate['baseline_ndcg_at_10']:.3f} "
            f"vs {gate['baseline_profile']}"
        )
        table.add_row(
            r["name"],
            state,
            r["model"],
            f"{r['chunk_tokens']}/{r['chunk_overlap']}",
            f"{cov['covered_versions']}/{cov['current_versions']} ({_pct(cov['ratio'])})",
            gate_text,
        )
    console.print(table)
    for r in rows:  # below the table, which has no room left in 80 columns
        console.print(f"{r['name']}: search {r['search_mode']} ({_fusion_text(r)}), lexical analyzer "
                      f"{r['lexical_analyzer']}, {_context_text(r)}, {_rerank_text(r)}", highlight=False)
    for r in rows:
        if r["migration"]:
            console.print(f"migration to {r['name']}: {progress_line(r['migration'])}", highlight=False)


@profile_app.command("backfill")
def backfill_command(name: str = typer.Argument(...), as_json: bool = JsonOption) -> None:
    """Build NAME's backlog with the claiming sensor, in bounded runs beside live indexing (any size)."""
    from resources.profiles import request_backfill

    with open_database(writes=True) as db, errors_to_exit():
        row = request_backfill(db, name)
    if as_json:
        print_json(row)
        return
    console.print(f"backfill of {row['name']} requested: {row['backlog']} version(s) to build; "
                  "follow it with `kbindex profile list`", highlight=False)


@profile_app.command("activate")
def activate_command(
    name: str = typer.Argument(...),
    force: bool = typer.Option(False, "--force", help="Skip the coverage and quality-gate checks (recorded)."),
    as_json: bool = JsonOption,
) -> None:
    """Switch search to NAME in one transaction (exit 3 unless it covers every current version and passed its gate)."""
    from resources.profiles import activate_profile

    with open_database(writes=True) as db, errors_to_exit():
        row = activate_profile(db, name, force=force)
    if as_json:
        print_json(row)
        return
    console.print(f"profile {row['name']} is active (was {row['previous_active']})", highlight=False)
    for reason in row["overridden"]:
        console.print(f"[yellow]forced past[/]: {reason}", highlight=False)


@profile_app.command("rollback")
def rollback_command(as_json: bool = JsonOption) -> None:
    """Switch search back to the previous profile at once (exit 3 when there is none)."""
    from resources.profiles import rollback_profile

    with open_database(writes=True) as db, errors_to_exit():
        row = rollback_profile(db)
    if as_json:
        print_json(row)
        return
    console.print(
        f"profile {row['name']} is active again (rolled back from {row['rolled_back_from']}); "
        f"{row['catch_up_tasks']} versions published meanwhile queued for it",
        highlight=False,
    )


@profile_app.command("gate")
def gate_command(
    name: str = typer.Argument(..., help="The shadow profile to judge."),
    eval_dir: Path = typer.Option(..., "--eval", help="BEIR-layout folder: corpus.jsonl, queries.jsonl, qrels/test.tsv."),
    tolerance: float = typer.Option(0.01, "--tolerance", min=0.0, max=1.0, help="Allowed drop in nDCG@10 and recall@10."),
    as_json: bool = JsonOption,
) -> None:
    """Score NAME and the active profile on an eval set (nDCG@10, recall@10) and record it; exit 1 if it did not pass."""
    from resources.profiles import run_gate

    with open_database(writes=True) as db, errors_to_exit():
        row = run_gate(db, name, eval_dir, tolerance=tolerance)
    if as_json:
        print_json(row)
    else:
        table = Table("profile", "nDCG@10", "recall@10")
        table.add_row(f"{row['profile']} (shadow)", f"{row['shadow_ndcg']:.4f}", f"{row['shadow_recall']:.4f}")
        table.add_row(f"{row['baseline_profile']} (active)", f"{row['active_ndcg']:.4f}", f"{row['active_recall']:.4f}")
        console.print(table)
        console.print(
            f"gate {'PASSED' if row['passed'] else 'FAILED'} (tolerance {row['tolerance']}, {row['queries']} queries, "
            f"{row['documents']} paragraphs of {row['eval_set']}, {row['seconds']:.1f}s)",
            highlight=False,
        )
    if not row["passed"]:
        raise typer.Exit(EXIT_ERROR)
