"""`kbindex publish --meta --allow`, `kbindex search --filter --as --all` and `kbindex task` in process (issue 30),
with the fast path on: a metadata-only change is searchable when `publish` returns."""

from __future__ import annotations

import json

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
