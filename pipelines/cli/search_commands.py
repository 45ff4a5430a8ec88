"""`kbindex search QUERY --tenant T [-k N] [--mode hybrid|dense|lexical] [--filter EXPR] [--as PRINCIPAL | --all]
[--json]`: the tenant's best chunks of current versions that the principals may read and the filters keep."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import typer
from rich.console import Group
from rich.padding import Padding
from rich.text import Text

from pipelines.cli.app import JsonOption, app, console, err_console, errors_to_exit, open_database, print_json
from pipelines.domain.errors import InvalidRequest
from pipelines.domain.lexical import MODES

if TYPE_CHECKING:
    from resources.search import SearchHit


@app.command("search")
def search_command(
    query: str = typer.Argument(..., help="What to look for (any language the model reads)."),
    tenant: str = typer.Option(..., "--tenant", help="Tenant whose documents are searched."),
    k: int = typer.Option(10, "-k", "--k", min=1, max=1000, help="How many chunks to return."),
    mode: str = typer.Option(
        None,
        "--mode",
        help="hybrid (BM25 + vectors, fused), dense (vectors) or lexical (BM25). Default: the profile's, hybrid.",
    ),
    filters: list[str] = typer.Option(
        [], "--filter", help="Metadata condition: key=v, key=a|b, key!=v, key>=2026-01-01, key<10, key (exists), "
        "!key (absent). Repeat to AND them."),
    principals: list[str] = typer.Option(
        [], "--as", help="Search on behalf of this principal (group:NAME, user:NAME); repeat for several."),
    see_all: bool = typer.Option(
        False, "--all", help="Operator override: every version, whatever its allow list. Without --as or --all, "
        "only versions without an allow list are searched."),
    as_json: bool = JsonOption,
) -> None:
    """Search the active profile's index: only the versions the search pointers name, best first."""
    from pipelines.domain.metadata import ReadScope
    from resources.embedder import embedder_for_profile
    from resources.search import active_profile, search
    from resources.settings import Settings

    with open_database() as db, errors_to_exit():
        if see_all and principals:
            raise InvalidRequest("--all already shows every version: drop --as, or drop --all")
        read = ReadScope.of(principals, see_all=see_all, filters=filters)
        profile = active_profile(db)  # remembered: the search below reads it only inside its own transaction
        if mode is not None and mode not in MODES:
            raise InvalidRequest(f"--mode must be one of {', '.join(MODES)}")
        embedder = embedder_for_profile(profile, home=Settings.from_env().home)  # `kbindex dev` keeps one warm
        hits = search(db, embedder, query, tenant_id=tenant, k=k, mode=mode, read=read)
    rerank_error = getattr(hits, "rerank_error", None)
    if rerank_error:  # stderr: the JSON on stdout stays the list of hits it always was
        err_console.print(f"rerank failed ({rerank_error}): results in the unreranked order", highlight=False)
    if as_json:
        print_json([hit.to_dict() for hit in hits])
        return
    if not hits:
        console.print(f"no results for tenant {tenant}", highlight=False)
        return
    console.print(hits_view(hits))


SNIPPET_CHARS = 160
SNIPPET_INDENT = 3


def hit_heading(rank: int, hit: SearchHit) -> Text:
    """`1  0.831  policies/refunds.md  v3  Refunds > Time limits (p. 4)`: what the hit is, on one line."""
    section = " > ".join(hit.heading_path) + (f" (p. {hit.page})" if hit.page else "")
    heading = Text.assemble((str(rank), "bold"), f"  {hit.score:.3f}  ", (hit.document_id, "bold"),
                            f"  v{hit.version_number}")
    if section.strip():
        heading.append(f"  {section.strip()}", style="dim")
    if hit.metadata:
        heading.append("  " + " ".join(f"{k}={_shown(v)}" for k, v in hit.metadata.items()), style="cyan")
    return heading


def _shown(value: object) -> str:
    return "|".join(value) if isinstance(value, list) else str(value).lower() if isinstance(value, bool) else str(value)


def hits_view(hits: Sequence[SearchHit]) -> Group:
    """Each hit a block: its heading line, then the snippet wrapped to the terminal's width, a blank line between.

    Text is data, never rich markup (a document id may hold brackets).
    """
    blocks: list[Text | Padding] = []
    for rank, hit in enumerate(hits, 1):
        snippet = " ".join(hit.text.split())
        if len(snippet) > SNIPPET_CHARS:
            snippet = snippet[:SNIPPET_CHARS - 3] + "…"
        if blocks:
            blocks.append(Text(""))
        blocks += [hit_heading(rank, hit), Padding(Text(snippet), (0, 0, 0, SNIPPET_INDENT), expand=False)]
    return Group(*blocks)
