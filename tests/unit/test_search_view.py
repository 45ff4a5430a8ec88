"""`kbindex search` at 80 columns: each hit a block, its facts on one line and the snippet at full width."""

from __future__ import annotations

import io

from rich.console import Console

from pipelines.cli.search_commands import hits_view
from resources.search import SearchHit

TEXT = ("Refunds are paid within fourteen days of the returned goods arriving at our warehouse, to the card or "
        "account the customer paid with; a refund for a damaged item needs a photograph of the damage.")


def _hit(**fields) -> SearchHit:
    row = dict(document_id="policies/refunds-2024.md", version_number=3, heading_path=("Refunds", "Time limits"),
               text=TEXT, score=0.8312, chunk_id="c1", page=None)
    return SearchHit(**{**row, **fields})


def _render(renderable, width: int = 80) -> list[str]:
    out = io.StringIO()
    Console(file=out, width=width, color_system=None, highlight=False).print(renderable)
    return [line.rstrip() for line in out.getvalue().splitlines()]


def test_each_hit_is_a_heading_line_then_its_snippet_at_full_width() -> None:
    lines = _render(hits_view([_hit(), _hit(document_id="faq", version_number=1, heading_path=(), page=4,
                                        text="Short   answer\nhere.", score=0.5)]))
    assert lines[0] == "1  0.831  policies/refunds-2024.md  v3  Refunds > Time limits"
    snippet = lines[1:lines.index("")]
    assert " ".join(line.strip() for line in snippet) == TEXT[:157] + "…"  # whitespace folded, long text cut
    assert len(snippet) <= 3 and max(map(len, snippet)) > 70  # wrapped at the terminal's width, not a column's
    assert lines[lines.index("") + 1:] == ["2  0.500  faq  v1  (p. 4)", "   Short answer here."]


def test_ids_and_text_are_data_not_markup() -> None:
    out = "\n".join(_render(hits_view([_hit(document_id="[bold]x[/]", heading_path=("[red]h",), text="a [/] b")])))
    assert "[bold]x[/]" in out and "[red]h" in out and "a [/] b" in out
