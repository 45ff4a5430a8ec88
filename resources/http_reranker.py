"""Reranking through an HTTP ``POST {base}/rerank`` endpoint (Cohere-, Jina- and TEI-style), for search.

    HttpReranker(config)     ``rerank(query, documents)`` -> (index, score) best first, every answer checked
    check_reranker(config)   InvalidRequest unless a profile's reranker recipe can work (offline check)
    reranker_for_profile(p)  the profile's reranker (None without one), one per recipe in a process

The transport is HttpEmbedder's (resources/http_embedder.py), not a copy: the same ProviderConfig recipe
(URL, remote model, the NAME of the API key's variable), the https / KBINDEX_EMBED_KEY_* rules checked
before every request, the shared per-machine rate limiter, bounded retries honouring Retry-After, timeouts
and the search-time budget (``for_queries``). So a failure raises the same stable codes as an HTTP embedding
provider: EMBEDDING_TIMEOUT, EMBEDDING_RATE_LIMITED, EMBEDDING_UNAVAILABLE, EMBEDDING_INVALID_RESPONSE.

The request carries the documents twice, as ``documents`` (Cohere, Jina) and ``texts`` (TEI), since the
answer shapes are told apart but the request cannot be. Two answer shapes are accepted:
``{"results": [{"index", "relevance_score"}]}`` (Cohere, Jina) and a bare list of ``{"index", "score"}`` (TEI).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx

from pipelines.domain.errors import EmbeddingInvalidResponse, InvalidRequest
from resources.http_embedder import ENV_NAME_RE, WINDOW_ENV, HttpEmbedder, ProviderConfig, transport_problem

MAX_CANDIDATES = 200
"""The most chunks one search sends to the reranker (and the CHECK of index_profile.rerank_candidates)."""


def rerank_endpoint(url: str) -> str:
    """``http://127.0.0.1:8080`` -> ``.../rerank``; a URL already ending in /rerank as is."""
    url = url.rstrip("/")
    return url if url.endswith("/rerank") else f"{url}/rerank"


def check_reranker(config: ProviderConfig, candidates: int) -> None:
    """InvalidRequest unless the recipe can work: an http(s) URL without credentials or query, a remote model,
    an environment variable NAME (never the key), 1..MAX_CANDIDATES candidates, and this process's transport
    rules (https, or plain http to loopback / KBINDEX_EMBED_HTTP_HOSTS; KBINDEX_EMBED_KEY_* key variables)."""
    from urllib.parse import urlsplit

    parts = urlsplit(config.url)
    if parts.scheme not in ("http", "https") or not parts.netloc or any(c.isspace() for c in config.url):
        raise InvalidRequest("--url must be an http(s) base URL such as http://127.0.0.1:8080 (POST /rerank is added)")
    if parts.username or parts.password or parts.query:
        raise InvalidRequest("--url must not carry credentials or a query: put the key in the variable named by --key-env")
    if not config.model.strip() or len(config.model) > 200:
        raise InvalidRequest("--model must name the remote reranking model (1-200 characters)")
    if config.api_key_env is not None and not ENV_NAME_RE.match(config.api_key_env):
        raise InvalidRequest("--key-env takes the NAME of an environment variable, never the key itself")
    if not 1 <= candidates <= MAX_CANDIDATES:
        raise InvalidRequest(f"--candidates must be between 1 and {MAX_CANDIDATES}")
    problem = transport_problem(config)
    if problem:
        raise InvalidRequest(problem)


def parse_rerank(payload: Any, documents: int) -> list[tuple[int, float]]:
    """(index, score) pairs of either answer shape, best first; EmbeddingInvalidResponse unless every index is an
    int in range, none repeats, every score is a finite number and there are at most ``documents`` of them."""
    rows = payload.get("results") if isinstance(payload, dict) else payload
    if not isinstance(rows, list):
        raise EmbeddingInvalidResponse("the reranker's answer is neither {\"results\": [...]} nor a list")
    if len(rows) > documents:
        raise EmbeddingInvalidResponse(f"the reranker returned {len(rows)} results for {documents} documents")
    out: list[tuple[int, float]] = []
    seen: set[int] = set()
    for row in rows:
        if not isinstance(row, dict):
            raise EmbeddingInvalidResponse("a reranker result is not an object")
        index = row.get("index")
        score = row.get("relevance_score", row.get("score"))
        if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < documents:
            raise EmbeddingInvalidResponse(f"the reranker returned index {index!r} for {documents} documents")
        if index in seen:
            raise EmbeddingInvalidResponse(f"the reranker returned index {index} twice")
        if not isinstance(score, (int, float)) or isinstance(score, bool) or not math.isfinite(score):
            raise EmbeddingInvalidResponse(f"the reranker's score for index {index} is not a finite number")
        seen.add(index)
        out.append((index, float(score)))
    out.sort(key=lambda pair: (-pair[1], pair[0]))
    return out


class HttpReranker(HttpEmbedder):
    """HttpEmbedder's transport pointed at ``/rerank``: ``rerank`` is the only call a search makes."""

    def _endpoint(self) -> str:
        return rerank_endpoint(self.config.url)

    def _parse(self, response: httpx.Response) -> tuple[Any, int | None]:
        try:
            return response.json(), None
        except ValueError as exc:
            raise EmbeddingInvalidResponse("the reranker's answer is not JSON") from exc

    def rerank(self, query: str, documents: Sequence[str]) -> list[tuple[int, float]]:
        """The documents' (index, score), best first, as the provider ranked them and checked (parse_rerank);
        documents it left out are not in the list. One request, within this instance's retry policy."""
        documents = list(documents)
        if not documents:
            return []
        tokens = self._tokenizer.count(query) * len(documents) + sum(self._tokenizer.count(d) for d in documents)
        body = {"model": self.config.model, "query": query, "documents": documents, "texts": documents,
                "top_n": len(documents)}
        return parse_rerank(self._send(body, max(1, tokens)), len(documents))


_RERANKERS: dict[tuple[Any, ...], HttpReranker] = {}
_LOCK = threading.Lock()


def reranker_config(profile: Mapping[str, Any]) -> ProviderConfig | None:
    """A profile row's reranker recipe (the rerank_* columns of migration 0048), None when it has none."""
    if not profile.get("rerank_url"):
        return None
    return ProviderConfig(url=str(profile["rerank_url"]), model=str(profile["rerank_model"]),
                          api_key_env=profile.get("rerank_key_env") or None)


def reranker_for_profile(profile: Mapping[str, Any], *, home: str | Path | None = None) -> HttpReranker | None:
    """The profile's reranker within the search budget (``for_queries``), one per recipe, home and window in a
    process so its connections are reused; None when the profile does not rerank."""
    import os

    from resources.settings import Settings

    config = reranker_config(profile)
    if config is None:
        return None
    home = Path(home) if home is not None else Settings.from_env().home
    key = (config, str(home), os.environ.get(WINDOW_ENV))
    with _LOCK:
        if key not in _RERANKERS:
            _RERANKERS[key] = HttpReranker(config, home=home)
        reranker = _RERANKERS[key]
    return reranker.for_queries()  # type: ignore[return-value]
