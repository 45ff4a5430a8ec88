"""all-MiniLM-L6-v2-int8: built offline from the packaged MiniLM on first use under KBINDEX_HOME, once
and atomically even when two processes ask at once; its vectors are its own (close to MiniLM's, never
equal), so checked_embed never lets them pass for MiniLM's. No PostgreSQL needed."""

from __future__ import annotations

import json
from collections.abc import Iterator
import os
import socket
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from pipelines.domain.errors import EmbeddingInvalidResponse, EmbeddingUnavailable
from resources import derived_models
from resources.derived_models import (
    INT8_MODEL_NAME,
    MANIFEST,
    MODEL_FILE,
    DerivedModelEmbedder,
    ensure_built,
)
from resources.embedder import PACKAGED_MODEL_NAME, SentenceTransformerEmbedder, checked_embed, embedder_for_model

ROOT = Path(__file__).resolve().parents[2]
SENTENCES = [
    "How long do refunds take?",
    "Refunds are issued within 14 days of receiving the returned item in its original packaging.",
    "The embedded PostgreSQL server listens on a Unix socket only.",
    "PEP 8 describes indentation, naming conventions and line length for Python code. " * 6,
    "hello",
]


def _refuse_network(mp: pytest.MonkeyPatch) -> None:
    """Any TCP/UDP connection attempt fails the build (Unix sockets stay allowed)."""
    real_connect = socket.socket.connect

    def connect(self, address):  # type: ignore[no-untyped-def]
        if self.family in (socket.AF_INET, socket.AF_INET6):
            raise AssertionError(f"network access during the build: {address}")
        return real_connect(self, address)

    mp.setattr(socket.socket, "connect", connect)


@pytest.fixture(autouse=True, scope="module")
def _models_under_home() -> Iterator[None]:
    """These tests are about the KBINDEX_HOME layout: no session-wide models folder (tests/conftest.py)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("KBINDEX_MODELS_DIR", raising=False)
        yield


@dataclass(frozen=True)
class Built:
    home: Path
    folder: Path
    builds: int
    seconds: float


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    """One real build, offline, shared by this module's tests."""
    home = tmp_path_factory.mktemp("kbindex-home")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_HUB_OFFLINE", "1")
        mp.setenv("TRANSFORMERS_OFFLINE", "1")
        _refuse_network(mp)
        before = derived_models.builds_in_this_process
        started = time.monotonic()
        folder = ensure_built(INT8_MODEL_NAME, home)
        seconds = time.monotonic() - started
    return Built(home, folder, derived_models.builds_in_this_process - before, seconds)


@pytest.fixture(scope="module")
def int8_and_torch_vectors(built: Built) -> tuple[np.ndarray, np.ndarray]:
    int8 = DerivedModelEmbedder(INT8_MODEL_NAME, home=built.home).embed(SENTENCES)
    torch = SentenceTransformerEmbedder().embed(SENTENCES)
    return int8, torch


def test_first_use_builds_once_into_kbindex_home_models(built: Built) -> None:
    assert built.folder == built.home / "models" / INT8_MODEL_NAME
    assert built.builds == 1
    for name in (MODEL_FILE, MANIFEST, "tokenizer.json", "vocab.txt"):
        assert (built.folder / name).is_file(), name
    manifest = json.loads((built.folder / MANIFEST).read_text())
    assert manifest["recipe"] == derived_models.DERIVED_MODELS[INT8_MODEL_NAME]
    assert manifest["dimension"] == 384
    assert not list((built.home / "models").glob(f".{INT8_MODEL_NAME}.building-*"))  # the temp folder was renamed


def test_second_call_reuses_the_cached_model(built: Built) -> None:
    model_file = built.folder / MODEL_FILE
    before = (model_file.stat().st_ino, model_file.stat().st_mtime_ns, derived_models.builds_in_this_process)
    assert ensure_built(INT8_MODEL_NAME, built.home) == built.folder
    assert (model_file.stat().st_ino, model_file.stat().st_mtime_ns, derived_models.builds_in_this_process) == before


def test_embedder_for_model_loads_it_from_kbindex_home_under_its_own_name(
    built: Built, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KBINDEX_HOME", str(built.home))
    embedder = embedder_for_model(INT8_MODEL_NAME, batch_size=2)
    assert isinstance(embedder, DerivedModelEmbedder)
    assert embedder.model_name == INT8_MODEL_NAME and embedder.dimension == 384
    vectors = checked_embed(embedder, SENTENCES, expected_model=INT8_MODEL_NAME, expected_dim=384, batch_size=2)
    assert vectors.shape == (len(SENTENCES), 384)
    with pytest.raises(EmbeddingInvalidResponse):  # a migration can never take them for MiniLM's vectors
        checked_embed(embedder, SENTENCES, expected_model=PACKAGED_MODEL_NAME, expected_dim=384)


def test_vectors_are_unit_length_and_differ_from_minilm_but_rank_alike(int8_and_torch_vectors) -> None:
    int8, torch = int8_and_torch_vectors
    assert int8.shape == (len(SENTENCES), 384) and int8.dtype == np.float32
    assert np.allclose(np.linalg.norm(int8, axis=1), 1.0, atol=1e-3)
    assert np.abs(int8 - torch).max() > 1e-4  # really another model
    assert np.all(np.sum(int8 * torch, axis=1) > 0.95)  # ... derived from the same one
    query_int8, query_torch = int8[0] @ int8[1:].T, torch[0] @ torch[1:].T
    assert np.argmax(query_int8) == np.argmax(query_torch) == 0  # the refund question finds the refund answer


def test_a_text_gets_the_same_vector_whatever_it_is_embedded_with(built: Built) -> None:
    embedder = DerivedModelEmbedder(INT8_MODEL_NAME, home=built.home)
    together = embedder.embed(SENTENCES)
    alone = np.stack([embedder.embed([text])[0] for text in SENTENCES])
    assert np.array_equal(together, alone)
    assert embedder.embed([]).shape == (0, 384)


def test_two_processes_asking_at_once_both_get_the_model_from_one_build(tmp_path: Path) -> None:
    script = textwrap.dedent(
        f"""
        from resources import derived_models
        folder = derived_models.ensure_built({INT8_MODEL_NAME!r}, {str(tmp_path)!r})
        print(derived_models.builds_in_this_process, folder)
        """
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    procs = [
        subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    results = [proc.communicate(timeout=540) for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0], [err[-2000:] for _, err in results]
    answers = [out.split() for out, _ in results]
    assert sorted(int(builds) for builds, _ in answers) == [0, 1]
    assert {folder for _, folder in answers} == {str(tmp_path / "models" / INT8_MODEL_NAME)}


# --------------------------------------------------------------------------------------------------
# failure paths (a fake exporter where the real build adds nothing but minutes)


def _fake_export(name: str, source: Path, out: Path, recipe: dict) -> int:
    (out / derived_models._model_file(recipe)).write_bytes(b"not a model")
    return 384


def test_a_folder_built_by_another_recipe_is_rebuilt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(derived_models, "_export", _fake_export)
    folder = ensure_built(INT8_MODEL_NAME, tmp_path)
    manifest = json.loads((folder / MANIFEST).read_text())
    manifest["recipe"] = {**manifest["recipe"], "recipe_version": 0}
    (folder / MANIFEST).write_text(json.dumps(manifest))
    (folder / "left-by-the-old-build").write_text("x")
    builds = derived_models.builds_in_this_process
    assert ensure_built(INT8_MODEL_NAME, tmp_path) == folder
    assert derived_models.builds_in_this_process == builds + 1
    assert json.loads((folder / MANIFEST).read_text())["recipe"] == derived_models.DERIVED_MODELS[INT8_MODEL_NAME]
    assert not (folder / "left-by-the-old-build").exists()
    assert sorted(p.name for p in (tmp_path / "models").iterdir()) == [f".{INT8_MODEL_NAME}.lock", INT8_MODEL_NAME]


def test_a_failed_build_leaves_nothing_behind_and_says_why(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def crash(name: str, source: Path, out: Path, recipe: dict) -> int:
        (out / MODEL_FILE).write_bytes(b"half")
        raise RuntimeError("export exploded")

    leftover = tmp_path / "models" / f".{INT8_MODEL_NAME}.building-killed"  # from a builder killed mid-way
    leftover.mkdir(parents=True)
    monkeypatch.setattr(derived_models, "_export", crash)
    with pytest.raises(EmbeddingUnavailable, match="export exploded"):
        ensure_built(INT8_MODEL_NAME, tmp_path)
    assert [p.name for p in (tmp_path / "models").iterdir()] == [f".{INT8_MODEL_NAME}.lock"]


def test_a_build_that_disagrees_with_minilm_is_refused() -> None:
    reference = np.eye(3, 384, dtype=np.float32)
    derived_models._check_agreement(reference.copy(), reference)
    drifted = reference.copy()
    drifted[1] = np.eye(1, 384, 7, dtype=np.float32)
    with pytest.raises(EmbeddingUnavailable, match="disagrees"):
        derived_models._check_agreement(drifted, reference)
    with pytest.raises(EmbeddingUnavailable):
        derived_models._check_agreement(np.full_like(reference, np.nan), reference)


def test_an_unknown_derived_name_is_unavailable(tmp_path: Path) -> None:
    with pytest.raises(EmbeddingUnavailable, match="not a derived model"):
        ensure_built("all-MiniLM-L6-v2-int4", tmp_path)
    with pytest.raises(EmbeddingUnavailable):
        DerivedModelEmbedder("all-MiniLM-L6-v2-int4")


def test_without_onnxruntime_the_model_is_unavailable_and_says_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # import onnxruntime -> ImportError
    with pytest.raises(EmbeddingUnavailable, match="pip install onnx onnxruntime"):
        ensure_built(INT8_MODEL_NAME, tmp_path)
    assert not (tmp_path / "models" / INT8_MODEL_NAME).exists()
    with pytest.raises(EmbeddingUnavailable, match="pip install onnxruntime"):
        derived_models._session(tmp_path / MODEL_FILE)


def test_a_damaged_model_folder_is_unavailable_and_says_to_remove_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(derived_models, "_export", _fake_export)  # its model.onnx is garbage
    embedder = DerivedModelEmbedder(INT8_MODEL_NAME, home=tmp_path)
    with pytest.raises(EmbeddingUnavailable, match="remove its folder in KBINDEX_HOME's models folder"):
        embedder.embed(["hello"])


def test_a_builder_that_holds_the_lock_too_long_makes_others_give_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import fcntl

    monkeypatch.setattr(derived_models, "LOCK_TIMEOUT_S", 0.3)
    lock = tmp_path / "models" / f".{INT8_MODEL_NAME}.lock"
    lock.parent.mkdir(parents=True)
    with open(lock, "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        with pytest.raises(EmbeddingUnavailable, match="another process has been building"):
            ensure_built(INT8_MODEL_NAME, tmp_path)
