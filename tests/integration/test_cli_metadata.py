"""`kbindex publish --meta --allow`, `kbindex search --filter --as --all` and `kbindex task` in process (issue 30),
with the fast path on: a metadata-only change is searchable when `publish` returns."""

from __future__ import annotations

import json

import psycopg

from resources.embedder import DEFAULT_MODEL_NAME, FakeEmbedder
from resources.task_queue import TaskQueue
from tests.integration.test_delete import CountingBlobs, index


def test_publish_with_metadata_then_filter_and_search_as_principals(cli, db, db_url, tmp_path, monkeypatch):
    doc = tmp_path / "bands.md"
    doc.write_text("# Salary bands\n\nGrade 4 earns between 40k and 50k.\n")
    first = cli("publish", str(doc), "--tenant", "acme", "--meta", "dept=hr", "--meta", "effective=2026-01-01",
                "--meta", "tags=pay", "--meta", "tags=grades", "--allow", "group:hr", "--json")
    assert first.exit_code == 0, first.output
    row = json.loads(first.stdout)
    assert row["metadata"] == {"dept": "hr", "effective": "2026-01-01", "tags": ["grades", "pay"]}
    assert (row["allow"], row["status"]) == (["group:hr"], "PENDING")
    kb = {"queue": TaskQueue(db), "blobs": CountingBlobs(str(tmp_path / "blobs")),
          "fake": FakeEmbedder(model_name=DEFAULT_MODEL_NAME)}
    index(db, db_url, kb, row["task_id"], "bands.md", 1)

    import resources.embedder as embedder_module  # the CLI embeds queries with the profile's model: use the fake
    monkeypatch.setattr(embedder_module, "embedder_for_profile", lambda profile, **kw: kb["fake"])

    def found(*args: str) -> list[dict]:
        result = cli("search", "salary grade", "--tenant", "acme", "--json", *args)
        assert result.exit_code == 0, result.output
        return json.loads(result.stdout)

    assert found() == [], "no --as: only versions without an allow list"
    assert found("--as", "group:finance") == []
    (hit,) = found("--as", "group:hr", "-k", "1")
    assert hit["metadata"]["dept"] == "hr"
    assert found("--all", "-k", "1") and found("--all", "--filter", "dept=finance") == []
    assert found("--all", "--filter", "effective>=2026-01-01", "--filter", "tags=pay", "-k", "1")
    assert found("--all", "--filter", "effective>2026-01-01") == []
    bad = cli("search", "salary", "--tenant", "acme", "--filter", "dept>>hr")
    assert bad.exit_code != 0 and "INVALID_FILTER" in bad.output

    # The same bytes with a widened allow list: the fast path copies and publishes before `publish` returns.
    widened = cli("publish", str(doc), "--tenant", "acme", "--meta", "dept=hr", "--meta", "effective=2026-01-01",
                  "--meta", "tags=pay", "--meta", "tags=grades", "--allow", "group:hr", "--allow", "group:finance",
                  "--json", KBINDEX_FAST_PUBLISH="1")
    assert widened.exit_code == 0, widened.output
    row2 = json.loads(widened.stdout)
    assert (row2["version"], row2["status"]) == (2, "SUCCEEDED")
    (hit,) = found("--as", "group:finance", "-k", "1")
    assert hit["version_number"] == 2

    shown = cli("task", str(row2["task_id"]))
    assert shown.exit_code == 0, shown.output
    assert '"dept": "hr"' in shown.stdout and "group:finance, group:hr" in shown.stdout, shown.stdout
    bad_meta = cli("publish", str(doc), "--tenant", "acme", "--meta", "9lives=x")
    assert bad_meta.exit_code != 0 and "INVALID_METADATA" in bad_meta.output


def test_publish_a_directory_with_a_manifest_gives_each_document_its_own_metadata(cli, tmp_path):
    folder = tmp_path / "docs"
    (folder / "hr").mkdir(parents=True)
    (folder / "hr" / "bands.md").write_text("# Bands\n\nGrade 4.\n")
    (folder / "open.md").write_text("# Open\n\nEveryone.\n")
    (folder / "plain.md").write_text("# Plain\n\nShared.\n")
    (folder / "broken.md").write_text("# Broken\n\nBad entry.\n")
    manifest = tmp_path / "manifest.json"
    manifest.write_text(json.dumps({
        "hr/bands.md": {"metadata": {"dept": "hr", "title": "Salary bands"}, "allow": ["group:hr"]},
        "open.md": {"allow": None},
        "broken.md": {"metadata": "not an object"},
    }))
    result = cli("publish", str(folder), "--tenant", "acme", "--meta", "dept=all", "--allow", "group:staff",
                 "--manifest", str(manifest), "--json")
    assert result.exit_code != 0, "a refused document fails the command"
    rows = {row["document_id"]: row for row in map(json.loads, result.stdout.splitlines())}
    assert rows["hr/bands.md"]["metadata"] == {"dept": "hr", "title": "Salary bands"}
    assert rows["hr/bands.md"]["allow"] == ["group:hr"]
    assert rows["open.md"]["metadata"] == {"dept": "all"} and rows["open.md"]["allow"] is None
    assert rows["plain.md"]["metadata"] == {"dept": "all"} and rows["plain.md"]["allow"] == ["group:staff"]
    assert rows["broken.md"]["error_code"] == "INVALID_METADATA" and "'broken.md'" in rows["broken.md"]["message"]
    assert "version" not in rows["broken.md"], "a refused document is not published"


def test_a_manifest_naming_a_document_not_published_refuses_the_command_before_anything_is_stored(
        cli, db_url, tmp_path):
    doc = tmp_path / "one.md"
    doc.write_text("one")
    manifest = tmp_path / "manifest.json"
    manifest.write_text(json.dumps({"one.md": {}, "tow.md": {"allow": []}}))
    result = cli("publish", str(doc), "--tenant", "acme", "--manifest", str(manifest))
    assert result.exit_code != 0 and "INVALID_METADATA" in result.output and "'tow.md'" in result.output
    with psycopg.connect(db_url) as conn:
        assert conn.execute("SELECT count(*) FROM document_version").fetchone() == (0,)
    missing = cli("publish", str(doc), "--tenant", "acme", "--manifest", str(tmp_path / "absent.json"))
    assert missing.exit_code != 0 and "cannot read the manifest absent.json" in missing.output
