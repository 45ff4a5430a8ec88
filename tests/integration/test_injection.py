"""Injection and escape: hostile strings through every input change nothing but what they name.

Every input (tenant, document id, filename, search query, profile name, task ids on the CLI) reaches
SQL only as a bound parameter, so SQL-looking text is data: table counts and the schema stay exactly as
they were, and valid-but-odd document ids round-trip byte for byte. Filenames are labels, never paths:
bytes live under their content hash, so ``../`` cannot leave the blob store. What reaches a caller is
sanitized: no SQL, no server path, no traceback.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import psycopg
import pytest
from psycopg import sql as pgsql
from typer.testing import CliRunner

from pipelines.cli import app
from pipelines.domain.errors import InvalidRequest, sanitize_message
from pipelines.domain.identifiers import validate_profile_name
from resources.blob_store import BlobStore
from resources.embedder import FakeEmbedder
from resources.publisher import Publisher, safe_filename
from resources.search import search
from resources.task_queue import TaskQueue
from resources.verifier import verify

INJECTIONS = [
    "'; DROP TABLE index_task; --",
    "' OR '1'='1",
    "\" OR \"\"=\"",
    "admin'--",
    "1; SELECT pg_sleep(30); --",
    "Robert'); DELETE FROM document_version WHERE ('1'='1",
    "$$; DROP TABLE chunk; $$",
    "$tag$ TRUNCATE search_pointer $tag$",
    "\\x00",
    "\\'; DROP TABLE search_pointer; --",
    "/* */ UNION SELECT usename, passwd FROM pg_shadow --",
    "%(tenant_id)s",
    "%s %s %%",
    "{0} {tenant}",
    "‘ OR ‘1’=‘1’ --",
    "＇ OR １=１ --",
    "ʼ; DROP TABLE chunk; --",
    "../../../../etc/passwd",
    "/etc/passwd",
    "C:\\Windows\\System32\\config",
    "NULL",
    "\u202eevil\u202c text",
    "emoji 😀 漢字 ✓",
    "a...b",
    " leading and trailing ",
]
"""Printable strings: valid document ids (any printable text), hostile as SQL, paths or format strings."""

VALID_TENANTS = {"NULL"}
"""The only INJECTIONS that are valid tenants (letters, digits, '_', '.', '-')."""

REJECTED_DOCUMENT_IDS = ["\x00", "x\x00y", "line1\nline2", "tab\there", "", "   ", "a" * 1001]
"""Control characters (PostgreSQL text cannot even hold NUL), blank, too long: refused before any SQL."""


# --- helpers ------------------------------------------------------------------------------------------


def _rows(db_url: str, statement: str, params: tuple = ()) -> list[tuple]:
    with psycopg.connect(db_url, autocommit=True) as conn:
        return conn.execute(statement, params).fetchall()  # type: ignore[arg-type]


def table_counts(db_url: str) -> dict[str, int]:
    with psycopg.connect(db_url, autocommit=True) as conn:
        tables = [r[0] for r in conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'public' ORDER BY tablename").fetchall()]
        return {
            t: conn.execute(pgsql.SQL("SELECT count(*) FROM {}").format(pgsql.Identifier(t))).fetchone()[0]
            for t in tables
        }


def schema_fingerprint(db_url: str) -> str:
    """Tables, columns, indexes, constraints, triggers and functions of the public schema, as one digest."""
    parts = _rows(db_url, "SELECT table_name, column_name, data_type, is_nullable FROM information_schema.columns "
                          "WHERE table_schema = 'public' ORDER BY 1, 2")
    parts += _rows(db_url, "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = 'public' ORDER BY 1")
    parts += _rows(db_url, "SELECT conname, pg_get_constraintdef(c.oid) FROM pg_constraint c "
                          "JOIN pg_namespace n ON n.oid = c.connamespace WHERE n.nspname = 'public' ORDER BY 1, 2")
    parts += _rows(db_url, "SELECT tgname, tgenabled::text FROM pg_trigger WHERE NOT tgisinternal ORDER BY 1")
    parts += _rows(db_url, "SELECT proname, md5(prosrc) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace "
                          "WHERE n.nspname = 'public' ORDER BY 1, 2")
    return hashlib.sha256(repr(parts).encode()).hexdigest()


class Snapshot:
    def __init__(self, db_url: str) -> None:
        self.db_url = db_url
        self.counts = table_counts(db_url)
        self.schema = schema_fingerprint(db_url)

    def assert_unchanged(self, **grown: int) -> None:
        """Schema identical; counts identical except the tables named, which grew by exactly that much."""
        assert schema_fingerprint(self.db_url) == self.schema
        expected = {t: n + grown.get(t, 0) for t, n in self.counts.items()}
        assert table_counts(self.db_url) == expected


def index_by_hand(db_url: str, tenant: str, document: str, version: int, task_id: int, text: str) -> None:
    """A searchable version, written with raw SQL (a chunk, the pointer, the task SUCCEEDED with its event)."""
    vector = "[" + ",".join(["0.02"] * 384) + "]"
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO chunk (chunk_id, tenant_id, document_id, version_number, profile, ordinal, text, "
            "token_count, content_digest, embedding) VALUES (%s, %s, %s, %s, 'minilm-v1', 0, %s, 3, %s, %s::vector)",
            (hashlib.sha256(f"{tenant}/{document}/{version}".encode()).hexdigest()[:32], tenant, document, version,
             text, hashlib.sha256(text.encode()).hexdigest(), vector),
        )
        conn.execute(
            "INSERT INTO search_pointer (tenant_id, document_id, profile, version_number, task_id, chunk_count) "
            "VALUES (%s, %s, 'minilm-v1', %s, %s, 1)", (tenant, document, version, task_id),
        )


@pytest.fixture
def blob_root(tmp_path: Path) -> Path:
    return tmp_path / "store" / "blobs"


@pytest.fixture
def safe_publisher(db, blob_root: Path) -> Publisher:
    return Publisher(db, BlobStore(str(blob_root)))


def blob_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file())


# --- document ids, tenants, filenames -----------------------------------------------------------------


def test_odd_document_ids_round_trip_exactly_and_change_nothing_else(db, db_url: str, safe_publisher: Publisher) -> None:
    before = Snapshot(db_url)
    for i, document_id in enumerate(INJECTIONS):
        result = safe_publisher.publish("acme", document_id, f"body {i}".encode(), "doc.txt")
        assert result.document_id == document_id and result.version == 1 and result.created
        (stored,) = _rows(db_url, "SELECT document_id FROM document_version WHERE tenant_id = 'acme' "
                                  "AND document_id = %s", (document_id,))
        assert stored[0] == document_id
        (task,) = _rows(db_url, "SELECT document_id FROM index_task WHERE task_id = %s", (result.task_id,))
        assert task[0] == document_id
    n = len(INJECTIONS)
    before.assert_unchanged(document=n, document_version=n, index_task=n, task_event=n, tenant_storage=1)  # acme's byte total
    stored_ids = {r[0] for r in _rows(db_url, "SELECT document_id FROM document")}
    assert stored_ids == set(INJECTIONS)
    assert verify(db).ok


def test_publishing_the_same_odd_id_again_finds_the_same_document(db_url: str, safe_publisher: Publisher) -> None:
    for document_id in INJECTIONS[:8]:
        first = safe_publisher.publish("acme", document_id, b"same bytes", "doc.txt")
        again = safe_publisher.publish("acme", document_id, b"same bytes", "doc.txt")
        assert (again.task_id, again.version, again.created) == (first.task_id, 1, False)


def test_a_literal_id_equal_to_a_digest_key_is_its_own_document(safe_publisher: Publisher) -> None:
    safe_publisher.publish("acme", "a...b", b"one", "one.txt")
    lookalike = "~" + hashlib.sha256(b"a...b").hexdigest()[:24]
    assert safe_publisher.publish("acme", lookalike, b"two", "two.txt").version == 1


def test_rejected_document_ids_and_tenants_change_nothing(db_url: str, safe_publisher: Publisher, blob_root: Path) -> None:
    before = Snapshot(db_url)
    for document_id in REJECTED_DOCUMENT_IDS:
        with pytest.raises(InvalidRequest):
            safe_publisher.publish("acme", document_id, b"body", "doc.txt")
    for tenant in [t for t in INJECTIONS if t not in VALID_TENANTS] + ["", "a" * 65, "acme\x00"]:
        with pytest.raises(InvalidRequest) as refused:
            safe_publisher.publish(tenant, "doc", b"body", "doc.txt")
        assert tenant.strip() == "" or tenant not in refused.value.message  # refusals do not echo the input
    before.assert_unchanged()
    assert blob_files(blob_root) == []  # refused before the bytes were stored


def test_odd_but_valid_tenants_round_trip(db_url: str, safe_publisher: Publisher) -> None:
    for tenant in ["NULL", "None", "0", "a.b-c_d", "A" * 64]:
        result = safe_publisher.publish(tenant, "doc", b"body", "doc.txt")
        (stored,) = _rows(db_url, "SELECT tenant_id FROM index_task WHERE task_id = %s", (result.task_id,))
        assert stored[0] == tenant


def test_every_valid_tenant_yields_a_partition_key_dagster_accepts(db_url: str, safe_publisher: Publisher) -> None:
    from dagster._core.definitions.partitions.utils import raise_error_on_invalid_partition_key_substring

    for tenant in sorted(VALID_TENANTS):
        result = safe_publisher.publish(tenant, "doc", b"body", "doc.txt")
        (key,) = _rows(db_url, "SELECT partition_key FROM document_version WHERE tenant_id = %s AND version_number = %s",
                       (tenant, result.version))
        raise_error_on_invalid_partition_key_substring([key[0]])


def test_every_odd_document_id_yields_a_partition_key_dagster_accepts(db_url: str, safe_publisher: Publisher) -> None:
    from dagster._core.definitions.partitions.utils import raise_error_on_invalid_partition_key_substring

    for i, document_id in enumerate(INJECTIONS):
        safe_publisher.publish("acme", document_id, f"body {i}".encode(), "doc.txt")
    keys = [r[0] for r in _rows(db_url, "SELECT partition_key FROM document_version")]
    raise_error_on_invalid_partition_key_substring(keys)
    assert len(set(keys)) == len(INJECTIONS)


def test_filenames_are_labels_and_never_leave_the_blob_store(db_url: str, safe_publisher: Publisher, tmp_path: Path,
                                                            blob_root: Path) -> None:
    outside = tmp_path / "store" / "escaped.txt"
    names = [
        "../escaped.txt",
        "../../escaped.txt",
        f"{tmp_path}/store/escaped.txt",
        f"{blob_root}/../escaped.txt",
        "..\\..\\escaped.txt",
        "/etc/passwd",
        "sha256/../../escaped.txt",
        "C:\\Windows\\escaped.txt",
        "",
        "..",
        ".",
        "name\x00.txt",
        "new\nline.txt",
    ] + INJECTIONS
    for i, name in enumerate(names):
        result = safe_publisher.publish("acme", f"doc-{i}", f"bytes {i}".encode(), name)
        (stored,) = _rows(db_url, "SELECT filename FROM document_version WHERE tenant_id = 'acme' AND document_id = %s",
                          (f"doc-{i}",))
        label = stored[0]
        assert label == safe_filename(name)
        assert "/" not in label and "\\" not in label and "\x00" not in label and label.isprintable()
        assert result.content_hash == hashlib.sha256(f"bytes {i}".encode()).hexdigest()
    assert not outside.exists()
    assert not (tmp_path / "escaped.txt").exists()
    # Everything written is under the store, named by content hash only.
    written = sorted(p for p in (tmp_path / "store").rglob("*") if p.is_file())
    assert written == blob_files(blob_root) and len(written) == len(names)
    for path in written:
        relative = path.relative_to(blob_root).parts
        assert relative[0] == "sha256" and relative[3] == hashlib.sha256(path.read_bytes()).hexdigest()
        assert relative[1:3] == (relative[3][:2], relative[3][2:4])


def test_blob_store_refuses_anything_but_a_content_hash(blob_root: Path) -> None:
    store = BlobStore(str(blob_root))
    for key in ["../../etc/passwd", "/etc/passwd", "a" * 63, "g" * 64, "A" * 64, "", "0" * 64 + "/.."]:
        with pytest.raises(InvalidRequest):
            store.get(key)
        with pytest.raises(InvalidRequest):
            store.exists(key)


# --- search queries and profile names ----------------------------------------------------------------


def use_fake_profile(db_url: str) -> None:
    """Make a fake-model profile the active one (model ``fake-*``: the deterministic FakeEmbedder)."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("INSERT INTO index_profile (name, model, dimension, chunk_tokens, chunk_overlap) "
                     "VALUES ('fake-v1', 'fake-384', 384, 200, 32)")
        conn.execute("UPDATE index_profile SET is_active = false")
        conn.execute("UPDATE index_profile SET is_active = true WHERE name = 'fake-v1'")
        conn.execute("UPDATE chunk SET profile = 'fake-v1'")
        conn.execute("UPDATE search_pointer SET profile = 'fake-v1'")


@pytest.fixture
def searchable(db_url: str, safe_publisher: Publisher, queue: TaskQueue) -> str:
    """One searchable document for tenant acme under the fake profile; returns its document id."""
    result = safe_publisher.publish("acme", "refund-policy", b"Refunds within 30 days.", "refund.md")
    (claimed,) = queue.claim("w1", limit=1)
    index_by_hand(db_url, "acme", "refund-policy", 1, result.task_id, "Refunds within 30 days.")
    queue.complete(claimed.lease, chunk_count=1)
    use_fake_profile(db_url)
    return "refund-policy"


def test_search_queries_are_data(db, db_url: str, searchable: str) -> None:
    before = Snapshot(db_url)
    embedder = FakeEmbedder(model_name="fake-384")
    for query in INJECTIONS:
        hits = search(db, embedder, query, tenant_id="acme", k=5)
        assert [h.document_id for h in hits] == [searchable]  # the one current chunk, whatever the text
        assert search(db, embedder, query, tenant_id="globex", k=5) == []  # and never another tenant's
    for tenant in INJECTIONS:
        if tenant in VALID_TENANTS:
            assert search(db, embedder, "refunds", tenant_id=tenant) == []
            continue
        with pytest.raises(InvalidRequest):
            search(db, embedder, "refunds", tenant_id=tenant)
    before.assert_unchanged()


def test_cli_search_with_injection_strings(db_url: str, searchable: str) -> None:
    before = Snapshot(db_url)
    env = {"KBINDEX_DATABASE_URL": db_url}
    for query in INJECTIONS[:6]:
        result = runner.invoke(app, ["search", query, "--tenant", "acme", "--json"], env=env)
        assert result.exit_code == 0, result.output
        assert [h["document_id"] for h in json.loads(result.stdout)] == [searchable]
    result = runner.invoke(app, ["search", "refunds", "--tenant", "' OR '1'='1"], env=env)
    assert result.exit_code == 2 and "INVALID_REQUEST" in result.output
    before.assert_unchanged()


def test_profile_names_are_validated_and_looked_up_as_data(db, db_url: str) -> None:
    before = Snapshot(db_url)
    for name in INJECTIONS + ["minilm-v1'--", "MINILM-V1", "minilm-v1 "]:
        if name != "a...b":  # the one valid profile name among them
            with pytest.raises(InvalidRequest):
                validate_profile_name(name)
        assert db.fetch_one("index_profile_get", {"name": name}) is None
    before.assert_unchanged()


def test_cli_profile_commands_refuse_injected_names(db_url: str) -> None:
    commands = {c.name for group in app.registered_groups if group.name == "profile"
                for c in group.typer_instance.registered_commands}
    if "activate" not in commands:
        pytest.skip("kbindex profile is not registered")
    before = Snapshot(db_url)
    env = {"KBINDEX_DATABASE_URL": db_url}
    for name in INJECTIONS[:8]:
        result = runner.invoke(app, ["profile", "activate", name], env=env)
        assert result.exit_code in (1, 2, 3), result.output
        assert "Traceback" not in result.output
    before.assert_unchanged()
    (active,) = _rows(db_url, "SELECT name FROM index_profile WHERE is_active")
    assert active[0] == "minilm-v1"


# --- the CLI: task ids, filters, publish ------------------------------------------------------------------

runner = CliRunner()


@pytest.mark.parametrize("command", ["task", "cancel", "retry", "watch"])
def test_cli_task_id_strings_are_usage_errors(db_url: str, safe_publisher: Publisher, command: str) -> None:
    safe_publisher.publish("acme", "doc", b"body", "doc.txt")
    before = Snapshot(db_url)
    for task_id in ["1; DROP TABLE index_task", "1 OR 1=1", "' OR '1'='1", "1)--", "0x1", "１", "$$1$$", "-1e9"]:
        result = runner.invoke(app, [command, task_id], env={"KBINDEX_DATABASE_URL": db_url})
        assert result.exit_code == 2, (task_id, result.output)
        assert "Traceback" not in result.output
    before.assert_unchanged()


def test_cli_filters_and_publish_options_are_data(db_url: str, tmp_path: Path) -> None:
    env = {"KBINDEX_DATABASE_URL": db_url, "KBINDEX_BLOB_URL": str(tmp_path / "blobs")}
    source = tmp_path / "policy.txt"
    source.write_text("Refunds within 30 days.")
    before = Snapshot(db_url)
    for tenant in INJECTIONS[:6]:
        result = runner.invoke(app, ["tasks", "--tenant", tenant, "--json"], env=env)
        assert result.exit_code == 0 and json.loads(result.stdout) == []
        result = runner.invoke(app, ["publish", str(source), "--tenant", tenant], env=env)
        assert result.exit_code == 1 and "INVALID_REQUEST" in result.output  # publish: a failed file exits 1
    result = runner.invoke(app, ["tasks", "--status", "RUNNING' OR '1'='1"], env=env)
    assert result.exit_code == 2
    before.assert_unchanged()
    odd = "../../etc/passwd'; DROP TABLE chunk; --"
    result = runner.invoke(app, ["publish", str(source), "--tenant", "acme", "--document-id", odd, "--json"], env=env)
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["document_id"] == odd
    before.assert_unchanged(document=1, document_version=1, index_task=1, task_event=1, tenant_storage=1)
    assert not (tmp_path.parent.parent / "etc").exists()


# --- what callers see -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "must_not_contain"),
    [
        ('relation "chunk" does not exist\nLINE 1: SELECT * FROM chunk WHERE tenant_id = $1', ["SELECT", "LINE 1"]),
        ("duplicate key: INSERT INTO chunk (chunk_id) VALUES ('x')", ["INSERT INTO", "VALUES"]),
        ('could not open file "/var/lib/postgresql/18/main/base/16384/2619": Permission denied', ["/var/lib", "16384"]),
        ("FileNotFoundError: [Errno 2] /srv/kbindex/blobs/sha256/ab/cd/abcd: missing", ["/srv/kbindex", "sha256/ab"]),
        ("Traceback (most recent call last):\n  File \"/app/pipelines/steps.py\", line 3\nKeyError: 'x'", ["/app", "line 3"]),
        ("C:\\Users\\svc\\kbindex\\state failed; update index_task set status = 'DEAD' where 1=1", ["where 1=1"]),
    ],
)
def test_sanitize_message_removes_sql_paths_and_tracebacks(raw: str, must_not_contain: list[str]) -> None:
    clean = sanitize_message(raw)
    assert "\n" not in clean and len(clean) <= 300
    for fragment in must_not_contain:
        assert fragment.lower() not in clean.lower(), clean


def test_stored_failure_messages_are_sanitized(db_url: str, safe_publisher: Publisher, queue: TaskQueue) -> None:
    result = safe_publisher.publish("acme", "doc", b"body", "doc.txt")
    (claimed,) = queue.claim("w1", limit=1)
    raw = ("cannot read /srv/kbindex/blobs/sha256/ab/cd/abcdef: SELECT content FROM blobs WHERE id = 1\n"
           "Traceback (most recent call last):\n  File \"/app/x.py\"")
    queue.fail(claimed.lease, "PARSE_ERROR", raw)
    (task,) = _rows(db_url, "SELECT error_message FROM index_task WHERE task_id = %s", (result.task_id,))
    events = _rows(db_url, "SELECT message FROM task_event WHERE task_id = %s AND message IS NOT NULL "
                           "AND to_status = 'DEAD'", (result.task_id,))
    for message in [task[0]] + [e[0] for e in events]:
        assert "/srv" not in message and "SELECT" not in message and "Traceback" not in message, message


@pytest.mark.parametrize("command", [["verify"], ["tasks"], ["stats"], ["task", "1"]])
def test_cli_database_errors_show_no_sql_or_server_path(db_url: str, pg_server_url: str, command: list[str]) -> None:
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("DROP TABLE index_task CASCADE")
        (data_dir,) = conn.execute("SELECT current_setting('data_directory')").fetchone()
    result = runner.invoke(app, command, env={"KBINDEX_DATABASE_URL": db_url})
    assert result.exit_code == 1, result.output
    assert "INDEX_WRITE_FAILED" in result.output
    for leak in ("SELECT", "FROM", "index_task", "LINE 1", "Traceback", data_dir, "/tmp", "psycopg"):
        assert leak not in result.output, (leak, result.output)
