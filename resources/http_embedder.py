"""Embedding through an OpenAI-compatible ``POST {base}/embeddings`` endpoint, within the provider's limits.

    ProviderConfig        a profile's provider recipe: base URL, remote model, dimension (384), the NAME of
                          the environment variable holding the API key (the key is never stored), limits
    SharedRateLimiter     requests/min and tokens/min, shared by every process on the machine
    HttpEmbedder          the Embedder: ``respond(texts)`` splits into provider-sized requests, waits for
                          the limiter, retries 429/5xx/timeouts/dropped connections a bounded number of
                          times (honouring Retry-After), and returns the rows with their ``index`` as echo,
                          so ``checked_embed`` checks count, order, dimension and finite values
    http_embedder_for_model(model)   the embedder of an ``http:`` model, its recipe read from the database

Why a file and not a PostgreSQL row for the shared limit: every embedding call would otherwise cost a
database round trip under a row lock, search queries (which embed too) would depend on the database being
writable, and a stuck transaction would stall every run. ``flock`` on a file under ``KBINDEX_HOME`` costs
microseconds, works for threads and processes alike, and the kernel drops the lock of a process that dies.
Its reach is one machine (one ``KBINDEX_HOME``): several machines sharing one provider account would each
need a share of the limit.

The limit is a token bucket in its strict form: each request (and its tokens) returns to the bucket one
window (60 s) after the request *finished* (answer, error or timeout); while it is in flight it counts as
finishing at its timeout. The provider sees a request arrive after we sent it and before it finished, so
a request sent once an earlier one's token came back arrives a full window after it: no window of 60 s,
wherever it starts, holds more than ``requests_per_minute`` requests or ``tokens_per_minute`` tokens at the
provider, whatever the network latency, while a fresh bucket still allows a burst. A 429's Retry-After pauses every process, not just the
one that got it. Token counts are estimated with the packaged WordPiece tokenizer before sending, then
corrected with the provider's ``usage.prompt_tokens`` when it reports it.
"""

from __future__ import annotations

import copy
import email.utils
import hashlib
import json
import logging
import math
import os
import random
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import numpy as np

from pipelines.domain.errors import (
    EmbeddingError,
    EmbeddingInvalidResponse,
    EmbeddingRateLimited,
    EmbeddingTimeout,
    EmbeddingUnavailable,
    InvalidRequest,
)
from resources.embedder import EmbeddingResponse, text_fingerprint, translate_provider_error

log = logging.getLogger("kbindex")

HTTP_PREFIX = "http:"
DEFAULT_MAX_BATCH = 64
WINDOW_ENV = "KBINDEX_RATE_WINDOW_SECONDS"
"""The limiter's window (default 60 s): tests and benches shrink it to run a scaled-down minute."""
TIMEOUT_ENV = "KBINDEX_PROVIDER_TIMEOUT_SECONDS"
"""Seconds one provider request may take (default 30)."""
KEY_ENV_PREFIX = "KBINDEX_EMBED_KEY_"
"""A profile's ``api_key_env`` must start with this, so whoever may create a profile cannot make the worker
send another secret of its environment (AWS_SECRET_ACCESS_KEY, KBINDEX_DATABASE_URL) as a bearer token."""
KEY_VARS_ENV = "KBINDEX_EMBED_KEY_VARS"
"""The operator's comma-separated list of further variable names a profile may use (e.g. OPENAI_API_KEY)."""
HTTP_HOSTS_ENV = "KBINDEX_EMBED_HTTP_HOSTS"
"""The operator's comma-separated list of hosts a provider URL may reach over plain http (besides loopback)."""
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "::1", "localhost"})
RATE_LOCK_TIMEOUT_S = 30.0
"""Seconds the limiter waits for its state file's lock (held microseconds by a healthy process) before
EMBEDDING_UNAVAILABLE: a stuck or hostile holder must not hang every embedding and search."""
QUERY_BUDGET_ENV = "KBINDEX_SEARCH_EMBED_SECONDS"
"""Seconds a search's query embedding may take in all (default 5): waiting for the shared limiter, the
request, one retry. Past it the search answers EMBEDDING_RATE_LIMITED / _TIMEOUT / _UNAVAILABLE (503) at once
instead of holding a thread for the indexing policy's minutes."""
DEFAULT_QUERY_BUDGET = 5.0
MAX_RETRY_AFTER = 300.0
"""The longest pause a provider's Retry-After can impose (seconds): a longer one is cut to this, so a
misbehaving provider (``Retry-After: 1e12``) cannot stop every process on the machine for good."""
GRANT_HORIZON = 600.0
"""How far ahead of now a grant in the shared file may say it finishes (3 x the longest sane timeout):
a grant beyond it was not written by a working client and is dropped."""


def http_model_name(provider_url: str, provider_model: str) -> str:
    """What a profile records as its model: ``http:<provider model>@<host>``, so vectors (keyed by
    profile and model) from two providers, or two remote models, are never taken for one another."""
    host = urlsplit(provider_url).netloc
    return f"{HTTP_PREFIX}{provider_model}@{host}"


def embeddings_endpoint(provider_url: str) -> str:
    """``https://api.example.com/v1`` -> ``.../v1/embeddings``; a URL already ending in /embeddings as is."""
    url = provider_url.rstrip("/")
    return url if url.endswith("/embeddings") else f"{url}/embeddings"


@dataclass(frozen=True)
class ProviderConfig:
    """One profile's provider recipe (index_profile.provider_* columns)."""

    url: str
    model: str
    dimension: int = 384
    api_key_env: str | None = None
    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None
    max_batch: int = DEFAULT_MAX_BATCH

    @property
    def model_name(self) -> str:
        return http_model_name(self.url, self.model)

    @property
    def limit_key(self) -> str:
        """Who shares a limit: one endpoint, remote model and key variable (one provider account)."""
        raw = "\0".join((embeddings_endpoint(self.url), self.model, self.api_key_env or ""))
        return hashlib.sha256(raw.encode()).hexdigest()[:24]

    def columns(self) -> dict[str, Any]:
        """The index_profile columns of this recipe (index_profile_provider_set)."""
        return {"provider_url": self.url, "provider_model": self.model, "api_key_env": self.api_key_env,
                "requests_per_minute": self.requests_per_minute, "tokens_per_minute": self.tokens_per_minute,
                "max_batch": self.max_batch}

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> ProviderConfig:
        return cls(
            url=str(row["provider_url"]),
            model=str(row["provider_model"]),
            dimension=int(row.get("dimension") or 384),
            api_key_env=row.get("api_key_env") or None,
            requests_per_minute=row.get("requests_per_minute") or None,
            tokens_per_minute=row.get("tokens_per_minute") or None,
            max_batch=int(row.get("max_batch") or DEFAULT_MAX_BATCH),
        )


ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")


def check_provider(config: ProviderConfig, *, dimension: int) -> None:
    """InvalidRequest unless the recipe can work: http(s) URL without credentials, a remote model name,
    the index's dimension, an environment variable NAME (not a key), positive limits, batch 1-2048."""
    parts = urlsplit(config.url)
    if parts.scheme not in ("http", "https") or not parts.netloc or any(c.isspace() for c in config.url):
        raise InvalidRequest("--provider-url must be an http(s) base URL such as https://api.openai.com/v1")
    if parts.username or parts.password or parts.query:
        raise InvalidRequest("--provider-url must not carry credentials or a query: put the key in the "
                             "variable named by --api-key-env")
    if not config.model.strip() or len(config.model) > 200:
        raise InvalidRequest("--provider-model must name the remote model (1-200 characters)")
    if config.dimension != dimension:
        raise InvalidRequest(f"the index stores vector({dimension}): the provider must return {dimension} "
                             "dimensions (sent as `dimensions` in every request)")
    if config.api_key_env is not None and not ENV_NAME_RE.match(config.api_key_env):
        raise InvalidRequest(f"--api-key-env takes the NAME of an environment variable (e.g. {KEY_ENV_PREFIX}OPENAI), "
                             "never the key itself")
    problem = transport_problem(config)
    if problem:
        raise InvalidRequest(problem)
    for flag, value in (("--rpm", config.requests_per_minute), ("--tpm", config.tokens_per_minute)):
        if value is not None and value < 1:
            raise InvalidRequest(f"{flag} must be at least 1")
    if not 1 <= config.max_batch <= 2048:
        raise InvalidRequest("--max-batch must be between 1 and 2048")


def _listed(env: Mapping[str, str], name: str) -> set[str]:
    return {item.strip() for item in (env.get(name) or "").split(",") if item.strip()}


def transport_problem(config: ProviderConfig, env: Mapping[str, str] | None = None) -> str | None:
    """Why this process must not send texts and the key to the profile's provider, or None.

    Plain http only to a loopback host or one the operator lists in KBINDEX_EMBED_HTTP_HOSTS (the key and
    the texts would cross the network in clear); ``api_key_env`` only a KBINDEX_EMBED_KEY_* variable or one
    the operator lists in KBINDEX_EMBED_KEY_VARS. Checked when a profile is created and again before every
    request, with this process's environment: a profile stored before the rule sends nothing either.
    """
    env = os.environ if env is None else env
    parts = urlsplit(config.url)
    host = (parts.hostname or "").lower()
    if parts.scheme != "https" and host not in LOOPBACK_HOSTS and host not in {h.lower() for h in _listed(env, HTTP_HOSTS_ENV)}:
        return (f"the provider URL must be https:// (plain http only to 127.0.0.1, ::1 or localhost, or to a host "
                f"the operator lists in {HTTP_HOSTS_ENV})")
    name = config.api_key_env
    if name and not name.startswith(KEY_ENV_PREFIX) and name not in _listed(env, KEY_VARS_ENV):
        return (f"the API key variable must be named {KEY_ENV_PREFIX}<something> (e.g. {KEY_ENV_PREFIX}OPENAI), "
                f"or be one the operator lists in {KEY_VARS_ENV}")
    return None


# -- the shared limit ------------------------------------------------------------------------------


class SharedRateLimiter:
    """Requests and tokens per window, shared through ``path`` (a JSON state file) under ``flock``.

    State: the grants of the last window as ``[finished at, tokens, id]`` and ``blocked_until`` (a Retry-After
    someone received). Wall-clock time, so every process on the machine reads the same clock.
    """

    def __init__(
        self,
        path: Path,
        *,
        requests: int | None,
        tokens: int | None,
        window_seconds: float = 60.0,
        sleep: Callable[[float], None] = time.sleep,
        lock_timeout: float = RATE_LOCK_TIMEOUT_S,
    ) -> None:
        self.path = Path(path)
        self.requests, self.tokens = requests, tokens
        self.window = float(window_seconds)
        self.sleep = sleep
        self.lock_timeout = float(lock_timeout)

    @contextmanager
    def _state(self) -> Iterator[dict[str, Any]]:
        """The state under the lock, written back (0600) on a clean exit. EMBEDDING_UNAVAILABLE (transient)
        if the lock is not ours within ``lock_timeout``: a stuck holder must not hang every embedding."""
        from resources.file_lock import exclusive_file_lock
        from resources.private_files import write_private

        lock = self.path.with_suffix(".lock")
        with exclusive_file_lock(lock, self.lock_timeout, lambda: EmbeddingUnavailable(
                f"another process has held the provider's rate-limit lock for over {self.lock_timeout:g} s")):
            try:
                state = json.loads(self.path.read_text() or "{}")
            except (FileNotFoundError, ValueError):
                state = {}
            state = _sane_state(state, time.time())
            yield state
            tmp = self.path.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
            write_private(tmp, json.dumps(state).encode())
            os.replace(tmp, self.path)

    def _wait_for(self, state: dict[str, Any], tokens: int, now: float) -> float:
        """Seconds until a request of ``tokens`` fits (0: now). Drops grants older than the window."""
        grants = sorted((g for g in state["grants"] if g[0] > now - self.window), key=lambda g: g[0])
        state["grants"] = grants
        wait = max(0.0, float(state["blocked_until"]) - now)
        if self.requests is not None and len(grants) >= self.requests:
            wait = max(wait, grants[len(grants) - self.requests][0] + self.window - now)
        if self.tokens is not None and grants:
            used = sum(g[1] for g in grants)
            for t, spent, _ in grants:  # wait until enough of the oldest tokens come back
                if used + tokens <= self.tokens:
                    break
                used -= spent
                wait = max(wait, t + self.window - now)
        return wait

    def acquire(self, tokens: int, *, give_up_after: float, in_flight: float = 60.0) -> str:
        """Wait until one request of ``tokens`` fits, record it as finishing ``in_flight`` seconds from now
        (its timeout) until ``settle`` says when it did, return its id. EMBEDDING_RATE_LIMITED if waiting
        would take longer than ``give_up_after`` seconds (the task retries later)."""
        deadline = time.time() + give_up_after
        while True:
            with self._state() as state:
                now = time.time()
                wait = self._wait_for(state, tokens, now)
                if wait <= 0:
                    grant = uuid.uuid4().hex[:12]
                    state["grants"].append([now + in_flight, tokens, grant])
                    return grant
            if now + wait > deadline:
                raise EmbeddingRateLimited(f"the provider's limit leaves no room for {wait:.0f}s", wait=round(wait))
            self.sleep(min(wait, 1.0) + random.uniform(0, 0.01))

    def settle(self, grant: str, tokens: int | None = None) -> None:
        """The request finished now; replace its estimated tokens by what the provider counted, if known."""
        with self._state() as state:
            for g in state["grants"]:
                if g[2] == grant:
                    g[0] = min(g[0], time.time())
                    if tokens is not None:
                        g[1] = int(tokens)

    def block_for(self, seconds: float) -> None:
        """A Retry-After: no process sends to this provider for ``seconds`` (at most MAX_RETRY_AFTER)."""
        if not math.isfinite(seconds) or seconds <= 0:
            return
        with self._state() as state:
            state["blocked_until"] = max(float(state["blocked_until"]), time.time() + min(seconds, MAX_RETRY_AFTER))


def _finite(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) else None


def _sane_state(state: Any, now: float) -> dict[str, Any]:
    """The shared state as the limiter may trust it, whatever is on disk (a crash, a hand edit, an older
    client that wrote ``Infinity`` or ``1e12`` from a provider's Retry-After): a ``blocked_until`` that is not
    a finite number, or lies further ahead than block_for ever writes (MAX_RETRY_AFTER), is dropped (0);
    so is a grant ``[finished at, tokens, id]`` that is malformed or says it finishes more than
    GRANT_HORIZON from now. The repaired state is what the caller writes back."""
    if not isinstance(state, dict):
        state = {}
    blocked = _finite(state.get("blocked_until"))
    if blocked is None or blocked > now + MAX_RETRY_AFTER + 1.0:  # 1 s: clock steps between processes
        if state.get("blocked_until") not in (None, 0, 0.0):
            log.warning("rate-limit state: dropped an impossible blocked_until (%.40r)", state.get("blocked_until"))
        blocked = 0.0
    state["blocked_until"] = blocked
    grants = []
    for g in state.get("grants") if isinstance(state.get("grants"), list) else []:
        if not isinstance(g, list) or len(g) != 3:
            continue
        at, tokens = _finite(g[0]), _finite(g[1])
        if at is None or tokens is None or not 0 <= tokens <= 1e12 or at > now + GRANT_HORIZON:
            continue
        grants.append([at, int(tokens), str(g[2])])
    state["grants"] = grants
    return state


_DELAY_SECONDS = re.compile(r"^[0-9]{1,15}(?:\.[0-9]{1,6})?$")


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Retry-After as seconds, at most MAX_RETRY_AFTER: delay-seconds (digits, a decimal fraction tolerated)
    or an HTTP date (a past one is 0). None when absent or anything else (``inf``, ``nan``, ``-5``, ``1e12``,
    garbage): the caller falls back to its own backoff."""
    if not value:
        return None
    value = value.strip()
    if _DELAY_SECONDS.match(value):
        return min(float(value), MAX_RETRY_AFTER)
    if value[:1].isdigit() or value[:1] in "+-.":  # a number the grammar does not allow; never a date
        return None
    try:
        when = email.utils.parsedate_to_datetime(value)
        seconds = when.timestamp() - (time.time() if now is None else now)
    except (TypeError, ValueError, OverflowError, IndexError):
        return None
    if not math.isfinite(seconds):
        return None
    return min(max(0.0, seconds), MAX_RETRY_AFTER)


def query_budget() -> float:
    """$KBINDEX_SEARCH_EMBED_SECONDS (default 5, within 0.1-60): a search's total time for embedding its query."""
    try:
        value = float(os.environ.get(QUERY_BUDGET_ENV) or DEFAULT_QUERY_BUDGET)
    except ValueError:
        return DEFAULT_QUERY_BUDGET
    return min(max(value, 0.1), 60.0) if math.isfinite(value) else DEFAULT_QUERY_BUDGET


# -- the embedder ----------------------------------------------------------------------------------


class _Retry(Exception):
    """One attempt failed in a way worth retrying: the error to raise if no attempt is left."""

    def __init__(self, error: EmbeddingError, wait: float | None = None) -> None:
        super().__init__(error.message)
        self.error, self.wait = error, wait


class HttpEmbedder:
    """An Embedder over an OpenAI-compatible endpoint (see the module docstring).

    ``timeout`` bounds each HTTP request; ``max_attempts`` the requests per batch on 429 / 5xx /
    timeouts / dropped connections; ``max_wait`` the seconds one batch may spend waiting (limiter,
    Retry-After, backoff) before it gives up with the transient code, so the task goes RETRY_WAIT.
    """

    def __init__(
        self,
        config: ProviderConfig,
        *,
        home: str | Path | None = None,
        timeout: float | None = None,
        max_attempts: int = 4,
        max_wait: float = 300.0,
        backoff: float = 1.0,
        window_seconds: float | None = None,
        transport: httpx.BaseTransport | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        from resources.settings import Settings
        from resources.tokenizer import ModelTokenizer

        self.config = config
        self.max_attempts, self.max_wait, self.backoff, self.sleep = max_attempts, max_wait, backoff, sleep
        timeout = timeout if timeout is not None else float(os.environ.get(TIMEOUT_ENV) or 30)
        self.timeout = timeout
        window = window_seconds if window_seconds is not None else float(os.environ.get(WINDOW_ENV) or 60)
        state = Path(home or Settings.from_env().home) / "ratelimits" / f"{config.limit_key}.json"
        self.limiter = SharedRateLimiter(state, requests=config.requests_per_minute,
                                         tokens=config.tokens_per_minute, window_seconds=window, sleep=sleep)
        self._tokenizer = ModelTokenizer()  # the packaged WordPiece: an estimate of the provider's count
        self._client = httpx.Client(timeout=httpx.Timeout(timeout, connect=min(timeout, 10.0)), transport=transport)
        self._queries: HttpEmbedder | None = None

    def for_queries(self, budget: float | None = None) -> HttpEmbedder:
        """This provider for a search's query, within a short total ``budget`` (default
        $KBINDEX_SEARCH_EMBED_SECONDS, 5 s): two attempts, each request and every wait for the shared limiter
        or a Retry-After within what is left of it; past it the typed error at once. The same limiter and
        connections as indexing (the provider's limit is shared); indexing keeps its own retry policy.
        Built once per embedder for the default budget."""
        if budget is None:
            if self._queries is None:
                self._queries = self.for_queries(query_budget())
            return self._queries
        sibling = copy.copy(self)
        sibling.max_wait = max(0.0, float(budget))
        sibling.max_attempts = min(self.max_attempts, 2)
        sibling.timeout = max(0.1, min(self.timeout, sibling.max_wait))
        sibling.backoff = min(self.backoff, sibling.max_wait / 4)
        sibling._queries = sibling
        return sibling

    @property
    def model_name(self) -> str:
        return self.config.model_name

    @property
    def dimension(self) -> int:
        return self.config.dimension

    def close(self) -> None:
        self._client.close()

    def batches(self, texts: Sequence[str]) -> list[tuple[int, int, int]]:
        """``(start, end, tokens)`` slices of ``texts``: at most max_batch texts and, when the profile
        limits tokens, at most a quarter of tokens_per_minute per request (so requests interleave)."""
        cap = max(1, self.config.tokens_per_minute // 4) if self.config.tokens_per_minute else None
        out: list[tuple[int, int, int]] = []
        start, used = 0, 0
        for i, text in enumerate(texts):
            n = self._tokenizer.count(text) or 1
            if i > start and (i - start >= self.config.max_batch or (cap is not None and used + n > cap)):
                out.append((start, i, used))
                start, used = i, 0
            used += n
        if start < len(texts):
            out.append((start, len(texts), used))
        return out

    def respond(self, texts: list[str]) -> EmbeddingResponse:
        """The provider's rows for ``texts`` (several requests if needed), echoing each row's ``index``."""
        vectors: list[np.ndarray] = []
        echo: list[str] = []
        for start, end, tokens in self.batches(texts):
            batch = texts[start:end]
            got, indices = self._request(batch, tokens)
            vectors.append(got)
            echo.extend(text_fingerprint(batch[i]) if isinstance(i, int) and 0 <= i < len(batch) else "?"
                        for i in indices)
        if not vectors:
            return EmbeddingResponse(self.model_name, np.zeros((0, self.dimension), dtype=np.float32), ())
        widths = {v.shape[1] for v in vectors}
        if len(widths) > 1:
            raise EmbeddingInvalidResponse(f"the provider returned vectors of {sorted(widths)} dimensions")
        return EmbeddingResponse(self.model_name, np.concatenate(vectors), tuple(echo))

    def embed(self, texts: list[str]) -> np.ndarray:
        return self.respond(list(texts)).vectors

    def _headers(self) -> dict[str, str]:
        problem = transport_problem(self.config)  # a profile stored before the rule, or another process's env
        if problem:
            raise EmbeddingUnavailable(problem)
        headers = {"Content-Type": "application/json"}
        name = self.config.api_key_env
        if name:
            key = os.environ.get(name)
            if not key:
                raise EmbeddingUnavailable(f"the API key variable {name} is not set in this process", variable=name)
            headers["Authorization"] = f"Bearer {key}"
        return headers

    def _request(self, batch: list[str], tokens: int) -> tuple[np.ndarray, list[Any]]:
        """One provider request, retried within bounds; (vectors, row indices) or a typed error."""
        body = {"model": self.config.model, "input": batch, "dimensions": self.config.dimension,
                "encoding_format": "float"}
        return self._send(body, tokens)

    def _send(self, body: dict[str, Any], tokens: int) -> Any:
        """POST ``body`` to ``_endpoint()`` under the shared limiter, retried within bounds; what ``_parse`` makes
        of the answer, or a typed error. The reranker (resources/http_reranker.py) shares this loop."""
        headers = self._headers()  # a missing key fails before anything is spent
        deadline = time.time() + self.max_wait
        error: EmbeddingError | None = None
        for attempt in range(1, self.max_attempts + 1):
            grant = self.limiter.acquire(tokens, give_up_after=max(0.0, deadline - time.time()),
                                         in_flight=self.timeout * 3)  # connect + write + read, at worst
            used: list[int | None] = [None]
            # Each phase of the request within what is left of the budget (at least 0.1 s to try at all).
            left = max(0.1, min(self.timeout, deadline - time.time()))
            try:
                try:
                    return self._post(body, headers, used, httpx.Timeout(left, connect=min(left, 10.0)))
                finally:
                    self.limiter.settle(grant, used[0])  # it finished: its token returns one window after now
            except _Retry as retry:
                error = retry.error
                wait = retry.wait if retry.wait is not None else self.backoff * 2 ** (attempt - 1) * random.uniform(1, 1.5)
                if retry.wait is not None and isinstance(error, EmbeddingRateLimited) and time.time() + wait > deadline:
                    error = EmbeddingRateLimited(f"the embedding provider asks to wait {wait:.0f}s", wait=round(wait))
                if attempt == self.max_attempts or time.time() + wait > deadline:
                    break
                log.info("embedding provider: %s; retry %d in %.1fs", error.code, attempt, wait)
                self.sleep(wait)
        assert error is not None
        raise error

    def _endpoint(self) -> str:
        return embeddings_endpoint(self.config.url)

    def _parse(self, response: httpx.Response) -> tuple[Any, int | None]:
        """(what the caller gets, the provider's token count) of a 200 answer."""
        vectors, indices, used = _parse_rows(response)
        return (vectors, indices), used

    def _post(self, body: dict[str, Any], headers: dict[str, str], used: list[int | None],
              timeout: httpx.Timeout | None = None) -> Any:
        """One HTTP request; ``used[0]`` gets the provider's token count. _Retry for what may pass later."""
        try:
            response = self._client.post(self._endpoint(), json=body, headers=headers,
                                         timeout=timeout if timeout is not None else self._client.timeout)
        except httpx.TimeoutException as exc:
            raise _Retry(EmbeddingTimeout(f"the embedding provider did not answer in time ({type(exc).__name__})")) from exc
        except httpx.TransportError as exc:  # refused, reset, dropped mid-answer
            raise _Retry(EmbeddingUnavailable(f"the embedding provider could not be reached ({type(exc).__name__})")) from exc
        status = response.status_code
        if status == 429:
            wait = parse_retry_after(response.headers.get("Retry-After"))
            if wait is not None:
                self.limiter.block_for(wait)  # every process pauses, not only this one
            raise _Retry(EmbeddingRateLimited("the embedding provider is rate limiting", status=status), wait)
        if status >= 400:
            mapped = translate_provider_error(_Status(status))
            if status in (408,) or status >= 500:
                raise _Retry(mapped or EmbeddingUnavailable(f"HTTP {status}", status=status),
                             parse_retry_after(response.headers.get("Retry-After")))
            # 400/401/403/404/413/422: our request or key is wrong; retrying now would not help.
            raise EmbeddingUnavailable(f"the embedding provider refused the request (HTTP {status}); check the "
                                       "profile's URL, model, dimension and API key", status=status)
        result, used[0] = self._parse(response)
        return result


class _Status(Exception):
    def __init__(self, status_code: int) -> None:
        super().__init__(f"HTTP {status_code}")
        self.status_code = status_code


def _parse_rows(response: httpx.Response) -> tuple[np.ndarray, list[Any], int | None]:
    """Rows in the order the provider sent them, their ``index`` fields, the provider's token count.

    Vectors are L2-normalized here (cosine search needs unit length; some providers do not normalize);
    a NaN/infinite or all-zero row stays as it is, so validate_response rejects it.
    """
    try:
        payload = response.json()
        rows = payload["data"]
        indices = [row.get("index") for row in rows]
        matrix = [row["embedding"] for row in rows]
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise EmbeddingInvalidResponse(f"the provider's answer is not an embeddings list ({type(exc).__name__})") from exc
    if len({len(v) if isinstance(v, list) else -1 for v in matrix}) > 1:
        raise EmbeddingInvalidResponse("the provider's rows have different dimensions")
    try:
        vectors = np.asarray(matrix, dtype=np.float64).reshape(len(matrix), -1) if matrix else np.zeros((0, 0))
    except (ValueError, TypeError) as exc:
        raise EmbeddingInvalidResponse("the provider's vectors are not numbers") from exc
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        norms = np.linalg.norm(vectors, axis=1, keepdims=True) if len(matrix) else np.ones((0, 1))
        ok = np.isfinite(norms) & (norms > 0)
        vectors = np.where(ok, vectors / np.where(ok, norms, 1.0), vectors)
    usage = payload.get("usage") if isinstance(payload, dict) else None
    used = usage.get("prompt_tokens") if isinstance(usage, dict) else None
    return vectors.astype(np.float32), indices, used if isinstance(used, int) and not math.isnan(used) else None


# -- from a profile --------------------------------------------------------------------------------

_EMBEDDERS: dict[tuple[Any, ...], HttpEmbedder] = {}
_RECIPES: dict[tuple[str, str], ProviderConfig] = {}
_LOCK = threading.Lock()


def http_embedder_for_profile(profile: Mapping[str, Any], *, home: str | Path | None = None) -> HttpEmbedder:
    """The HttpEmbedder of a profile row that has ``provider_url``: one per recipe, home and window in
    a process, so its HTTP connections are reused across the run's tasks."""
    from resources.settings import Settings

    config = ProviderConfig.from_row(profile)
    home = Path(home) if home is not None else Settings.from_env().home
    key = (config, str(home), os.environ.get(WINDOW_ENV))
    with _LOCK:
        if key not in _EMBEDDERS:
            _EMBEDDERS[key] = HttpEmbedder(config, home=home)
        return _EMBEDDERS[key]


def http_embedder_for_model(model: str) -> HttpEmbedder:
    """The embedder of an ``http:`` model, its recipe read once per process from the profile that names
    it (KBINDEX_DATABASE_URL or the embedded PostgreSQL): the pipeline resolves embedders by model."""
    from resources.database import Database
    from resources.settings import Settings, resolve_database_url

    settings = Settings.from_env()
    where = (model, settings.database_url or "", str(settings.home))
    with _LOCK:
        config = _RECIPES.get(where)
    if config is None:
        with Database(resolve_database_url(settings), max_size=1, role="run") as db:
            row = db.fetch_one("index_profile_provider_by_model", {"model": model})
        if row is None:
            raise EmbeddingUnavailable(f"no profile configures the HTTP provider of {model!r}", model=model)
        config = ProviderConfig.from_row(row)
        with _LOCK:
            _RECIPES[where] = config
    return http_embedder_for_profile({"model": model, **config.columns(), "dimension": config.dimension})
