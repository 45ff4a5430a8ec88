"""The faster local backends of all-MiniLM-L6-v2 (fp32 ONNX, OpenVINO): built offline from the packaged
model under KBINDEX_HOME with no socket opened, equal to torch's vectors within float noise, cached and
rebuilt when their recipe changes, and a text's vector does not depend on the texts batched with it.
No PostgreSQL needed."""

from __future__ import annotations

import json
from collections.abc import Iterator
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from pipelines.domain.errors import EmbeddingUnavailable
from resources import derived_models
from resources.derived_models import (
    BATCH_DRIFT_BOUND,
    DERIVED_MODELS,
    MANIFEST,
    ONNX_MODEL_NAME,
    OPENVINO_MODEL_NAME,
    DerivedModelEmbedder,
    ensure_built,
)
from resources.embedder import SentenceTransformerEmbedder, embedder_for_model, tokenizer_for_model

ROOT = Path(__file__).resolve().parents[2]
FP32_BACKENDS = (ONNX_MODEL_NAME, OPENVINO_MODEL_NAME)
MIN_COSINE_TO_TORCH = 0.9999
TEXTS = [
    "How long do refunds take?",
    "Refunds are issued within 14 days of receiving the returned item in its original packaging.",
    "Refunds are issued within 15 days of receiving the returned item in its original packaging.",
    "PEP 8 describes indentation, naming conventions and line length for Python code. " * 6,
    "hello",
    "world",
    "数据库索引",
]


@pytest.fixture(autouse=True, scope="module")
def _models_under_home() -> Iterator[None]:
    """These tests are about the KBINDEX_HOME layout: no session-wide models folder (tests/conftest.py)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("KBINDEX_MODELS_DIR", raising=False)
        yield


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[tuple]]:
    """Both fp32 backends built into one home with HF offline and every socket connection recorded."""
    home = tmp_path_factory.mktemp("kbindex-home")
    attempts: list[tuple] = []
    real_connect = socket.socket.connect

    def connect(self, address):  # type: ignore[no-untyped-def]
        if self.family in (socket.AF_INET, socket.AF_INET6):
            attempts.append(address)  # recorded, not raised: a library swallowing the error is caught too
        return real_connect(self, address)

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_HUB_OFFLINE", "1")
        mp.setenv("TRANSFORMERS_OFFLINE", "1")
        mp.setattr(socket.socket, "connect", connect)
        for name in FP32_BACKENDS:
            ensure_built(name, home)
            DerivedModelEmbedder(name, home=home).embed(TEXTS[:2])  # loading and running too
    return home, attempts


@pytest.fixture(scope="module")
def torch_vectors() -> np.ndarray:
    return SentenceTransformerEmbedder().embed(TEXTS)


def test_nothing_reaches_the_network_while_building_and_running(built) -> None:
    home, attempts = built
    assert attempts == []
    for name in FP32_BACKENDS:
        manifest = json.loads((home / "models" / name / MANIFEST).read_text())
        assert manifest["recipe"] == DERIVED_MODELS[name] and manifest["dimension"] == 384


@pytest.mark.parametrize("name", FP32_BACKENDS)
def test_a_backend_gives_torchs_vectors(built, torch_vectors: np.ndarray, name: str) -> None:
    vectors = DerivedModelEmbedder(name, home=built[0]).embed(TEXTS)
    assert vectors.shape == (len(TEXTS), 384) and vectors.dtype == np.float32
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert np.min(np.sum(vectors * torch_vectors, axis=1)) >= MIN_COSINE_TO_TORCH


@pytest.mark.parametrize("name", FP32_BACKENDS)
def test_a_texts_vector_does_not_depend_on_its_batch_mates(built, name: str) -> None:
    embedder = DerivedModelEmbedder(name, home=built[0], threads=1)
    together = embedder.embed(TEXTS * 3)  # "hello" and "world" have one length: they run as one batch
    alone = np.stack([embedder.embed([text])[0] for text in TEXTS])
    for copy in range(3):
        assert np.abs(together[copy * len(TEXTS):(copy + 1) * len(TEXTS)] - alone).max() <= BATCH_DRIFT_BOUND


def test_profiles_pick_a_backend_by_model_name_with_minilms_tokenizer(built, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KBINDEX_HOME", str(built[0]))
    for name in FP32_BACKENDS:
        embedder = embedder_for_model(name)
        assert isinstance(embedder, DerivedModelEmbedder) and embedder.model_name == name
        assert tokenizer_for_model(name).max_content_tokens == 254


def test_importing_openvino_here_sends_no_telemetry(tmp_path: Path) -> None:
    """openvino's import reports usage to Google Analytics and writes ~/intel unless its telemetry is off."""
    script = textwrap.dedent(
        """
        import sys
        connects = []
        sys.addaudithook(lambda event, args: connects.append(args) if event == "socket.connect" else None)
        from resources import derived_models
        derived_models._import_openvino("x").Core()
        print(len(connects), "openvino_telemetry" in sys.modules and sys.modules["openvino_telemetry"] is not None)
        """
    )
    env = {**os.environ, "HOME": str(tmp_path), "PYTHONPATH": str(ROOT)}
    env.pop("CI", None)  # openvino's telemetry stays quiet in CI: test the default a user gets
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["0", "False"]
    assert not (tmp_path / "intel").exists()


def test_without_openvino_its_backend_is_unavailable_and_says_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "openvino", None)  # import openvino -> ImportError
    with pytest.raises(EmbeddingUnavailable, match="pip install openvino"):
        ensure_built(OPENVINO_MODEL_NAME, tmp_path)
    assert not (tmp_path / "models" / OPENVINO_MODEL_NAME).exists()


# --------------------------------------------------------------------------------------------------
# caching and recipes (a fake exporter: the real build adds nothing but time here)


def _fake_export(name: str, source: Path, out: Path, recipe: dict) -> int:
    (out / derived_models._model_file(recipe)).write_bytes(b"not a model")
    return 384


@pytest.mark.parametrize("name", FP32_BACKENDS)
def test_a_built_backend_is_cached_and_rebuilt_when_its_recipe_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    monkeypatch.setattr(derived_models, "_export", _fake_export)
    builds = derived_models.builds_in_this_process
    folder = ensure_built(name, tmp_path)
    assert ensure_built(name, tmp_path) == folder
    assert derived_models.builds_in_this_process == builds + 1  # the second call reused it
    changed = {**DERIVED_MODELS[name], "recipe_version": DERIVED_MODELS[name]["recipe_version"] + 1}
    monkeypatch.setitem(DERIVED_MODELS, name, changed)
    assert ensure_built(name, tmp_path) == folder
    assert derived_models.builds_in_this_process == builds + 2
    assert json.loads((folder / MANIFEST).read_text())["recipe"] == changed


def test_a_build_without_its_model_file_is_rebuilt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(derived_models, "_export", _fake_export)
    folder = ensure_built(OPENVINO_MODEL_NAME, tmp_path)
    (folder / "model.xml").unlink()
    builds = derived_models.builds_in_this_process
    ensure_built(OPENVINO_MODEL_NAME, tmp_path)
    assert derived_models.builds_in_this_process == builds + 1 and (folder / "model.xml").is_file()
