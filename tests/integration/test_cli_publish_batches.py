"""`kbindex publish DIR`: a directory's documents in publish_many batches, a bad file refused alone."""

from __future__ import annotations

import json

import psycopg

import pipelines.cli.publish_commands as publish_commands
import resources.publisher as publisher_module


def _transactions(db_url: str) -> list[tuple[int, int]]:
    """(documents, versions) per transaction that wrote versions: xmin names the writing transaction."""
    with psycopg.connect(db_url) as conn:
        return conn.execute("SELECT count(DISTINCT document_id)::int, count(*)::int FROM document_version "
                            "GROUP BY xmin::text ORDER BY 2 DESC").fetchall()


def test_a_directory_is_published_in_one_transaction(cli, db_url, tmp_path):
    folder = tmp_path / "docs"
    (folder / "sub").mkdir(parents=True)
    for i in range(6):
        (folder / ("sub" if i % 2 else "") / f"d{i}.md").write_text(f"# Doc {i}\nbody {i}")
    result = cli("publish", str(folder), "--tenant", "acme", "--json")
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert sorted(r["document_id"] for r in rows) == ["d0.md", "d2.md", "d4.md", "sub/d1.md", "sub/d3.md", "sub/d5.md"]
    assert all(r["version"] == 1 and r["status"] == "PENDING" for r in rows)
    assert _transactions(db_url) == [(6, 6)]


def test_batches_are_cut_by_count_and_a_bad_file_is_refused_alone(cli, db_url, tmp_path, monkeypatch):
    folder = tmp_path / "docs"
    folder.mkdir()
    for i in range(7):
        (folder / f"d{i}.md").write_text(f"# Doc {i}")
    monkeypatch.setattr(publisher_module, "BATCH_DOCUMENTS", 3)
    real = publish_commands._read
    monkeypatch.setattr(publish_commands, "_read", lambda path: None if path.name == "d4.md" else real(path))
    result = cli("publish", str(folder), "--tenant", "acme", "--json")
    assert result.exit_code == 1  # a failed file exits 1; the others are published
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert [r["document_id"] for r in rows] == [f"d{i}.md" for i in range(7)]  # in order, the refusal in its place
    assert rows[4]["error_code"] == "INVALID_REQUEST" and "cannot read d4.md" in rows[4]["message"]
    assert all("version" in r for i, r in enumerate(rows) if i != 4)
    assert _transactions(db_url) == [(3, 3), (2, 2), (1, 1)]  # d0-d2, d3+d5 (d4 unreadable), d6
