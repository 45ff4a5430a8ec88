"""Issue #17, the parts without a database: messages, ids, zip lists, logs, file modes, service keys, pins."""

from __future__ import annotations

import io
import logging
import os
import re
import stat
import tomllib
import zipfile
from pathlib import Path

import pytest

from pipelines.domain.errors import DocumentTooLarge, EmbeddingUnavailable, InvalidRequest, sanitize_message
from pipelines.domain.identifiers import validate_document_id
from pipelines.domain.parsing import zip_guard
from pipelines.domain.parsing.model import ParseLimits

ROOT = Path(__file__).resolve().parents[2]


# -- 8. smaller items ------------------------------------------------------------------------------

def test_sanitize_message_drops_credentials_inside_urls():
    for message in (
        "cannot fetch https://AKIA123:s3cr3t@bucket.example/docs/a.pdf",
        "connect to postgresql://kb:hunter2@db:5432/kb failed",
    ):
        clean = sanitize_message(message)
        assert "s3cr3t" not in clean and "AKIA123" not in clean and "hunter2" not in clean
        assert "<credentials>@" in clean


def test_document_ids_are_nfc_normalized():
    composed, decomposed = "caf\u00e9.md", "cafe\u0301.md"
    assert validate_document_id(decomposed) == validate_document_id(composed) == composed


def test_document_id_length_counts_utf8_bytes():
    assert validate_document_id("a" * 1000) == "a" * 1000
    with pytest.raises(InvalidRequest, match="bytes"):
        validate_document_id("\U0001f600" * 1000)  # 1,000 characters, 4,000 bytes: over the index limit
    with pytest.raises(InvalidRequest, match="bytes"):
        validate_document_id("\u00e9" * 501)


def _zip(members: int) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for i in range(members):
            archive.writestr(f"m{i}.txt", "")
    return buffer.getvalue()


def test_zip_member_limit_is_checked_before_the_file_list_is_read(monkeypatch):
    data = _zip(30)

    def no_list(*_a, **_k):
        raise AssertionError("the whole file list was read before the member limit was checked")

    monkeypatch.setattr(zip_guard.zipfile, "ZipFile", no_list)
    with pytest.raises(DocumentTooLarge, match="30 zip members"):
        zip_guard.check_ooxml_container(data, ParseLimits(max_zip_members=10), "x.docx")


def test_python_multipart_floor_excludes_versions_with_known_dos_bugs():
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    (spec,) = [d for d in deps if d.startswith("python-multipart")]
    floor = tuple(int(p) for p in re.search(r">=\s*([\d.]+)", spec).group(1).split("."))
    assert floor >= (0, 0, 31), spec  # 0.0.31: the last of the DoS advisories (negative Content-Length)
    from importlib.metadata import version

    assert tuple(int(p) for p in version("python-multipart").split(".")[:3]) >= floor


# -- 2. tokens never reach a log line --------------------------------------------------------------

def test_redaction_filter_blanks_query_tokens_and_bearer_credentials():
    from pipelines.api.auth import RedactTokens

    record = logging.LogRecord(
        "uvicorn.access", logging.INFO, __file__, 1, '%s - "%s %s HTTP/%s" %d',
        ("127.0.0.1:1", "GET", "/?token=tok-secret&x=1", "1.1", 200), None,
    )
    assert RedactTokens().filter(record)
    assert "tok-secret" not in record.getMessage() and "x=1" in record.getMessage()
    record = logging.LogRecord("kbindex.api", logging.WARNING, __file__, 1, "header Bearer tok-secret", None, None)
    RedactTokens().filter(record)
    assert "tok-secret" not in record.getMessage()


# -- 7. files readable by other local users --------------------------------------------------------

def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_blobs_are_0600_in_0700_folders(tmp_path):
    from resources.blob_store import BlobStore

    old = os.umask(0o022)
    try:
        store = BlobStore(str(tmp_path / "home" / "blobs"))
        digest = store.put(b"private")
    finally:
        os.umask(old)
    path = tmp_path / "home" / "blobs" / "sha256" / digest[:2] / digest[2:4] / digest
    assert _mode(path) == 0o600
    for folder in (path.parent, path.parent.parent, tmp_path / "home" / "blobs" / "sha256", tmp_path / "home"):
        assert _mode(folder) == 0o700, folder


def test_intermediate_pickles_are_0600_in_0700_folders(tmp_path):
    from resources.artifact_store import ArtifactStore

    old = os.umask(0o022)
    try:
        store = ArtifactStore(tmp_path / "artifacts")
        store.put("parsed_document", 1, {"text": "secret"})
    finally:
        os.umask(old)
    (pickle_file,) = list((tmp_path / "artifacts").rglob("*.pickle"))
    assert _mode(pickle_file) == 0o600
    for folder in (pickle_file.parent, pickle_file.parent.parent, tmp_path / "artifacts"):
        assert _mode(folder) == 0o700, folder


# -- 6. the embedding service's key ----------------------------------------------------------------

def _write_key(home: Path, text: str, mode: int) -> None:
    home.mkdir(mode=0o700, exist_ok=True)
    key = home / "embedder.key"
    key.write_text(text)
    os.chmod(key, mode)


@pytest.mark.parametrize(
    ("text", "mode", "why"),
    [("", 0o600, "empty"), ("a" * 64, 0o644, "readable or writable by others"), ("a" * 64, 0o620, "others")],
)
def test_a_weak_service_key_is_refused(tmp_path, text, mode, why):
    from resources.embedding_service import _key

    _write_key(tmp_path / "home", text, mode)
    with pytest.raises(EmbeddingUnavailable, match=why):
        _key(tmp_path / "home", create=False)


def test_a_service_key_of_another_user_is_refused(tmp_path, monkeypatch):
    from resources import embedding_service

    _write_key(tmp_path / "home", "a" * 64, 0o600)
    assert embedding_service._key(tmp_path / "home", create=False) == b"a" * 64
    other = os.geteuid() + 1
    monkeypatch.setattr(embedding_service.os, "geteuid", lambda: other)
    with pytest.raises(EmbeddingUnavailable, match="another user"):
        embedding_service._key(tmp_path / "home", create=False)


def test_a_symlinked_service_key_is_refused(tmp_path):
    from resources.embedding_service import _key

    _write_key(tmp_path / "elsewhere", "a" * 64, 0o600)
    (tmp_path / "home").mkdir(mode=0o700)
    (tmp_path / "home" / "embedder.key").symlink_to(tmp_path / "elsewhere" / "embedder.key")
    with pytest.raises(EmbeddingUnavailable):
        _key(tmp_path / "home", create=False)


def test_the_service_creates_its_home_0700_and_a_private_key(tmp_path):
    from resources.embedding_service import _key

    old = os.umask(0o022)
    try:
        home = tmp_path / "new" / "home"
        from resources.private_files import make_private_dirs

        make_private_dirs(home)
        key = _key(home, create=True)
    finally:
        os.umask(old)
    assert len(key) >= 32
    assert _mode(home) == 0o700 and _mode(tmp_path / "new") == 0o700
    assert _mode(home / "embedder.key") == 0o600
