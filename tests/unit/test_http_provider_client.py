"""The HTTP embedding provider against the local fake server (bench/fake_embedding_server.py): every
fault maps to its stable code, Retry-After is honoured, every answer is checked, and the shared
requests/min limit holds across real processes. Nothing here calls a real provider."""

from __future__ import annotations

import email.utils
import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from bench.fake_embedding_server import FakeEmbeddingServer, max_in_window
from pipelines.domain.errors import EmbeddingRateLimited, EmbeddingUnavailable, InvalidRequest
from resources.embedder import checked_embed, fake_vector
from resources.http_embedder import (
    MAX_RETRY_AFTER,
    HttpEmbedder,
    ProviderConfig,
    SharedRateLimiter,
    check_provider,
    http_model_name,
    parse_retry_after,
)

ROOT = Path(__file__).resolve().parents[2]
TEXTS = [f"refund rule {i}: orders of class {i} are paid back within {i % 7 + 2} days" for i in range(10)]


def embedder(server: FakeEmbeddingServer, tmp_path: Path, **options) -> HttpEmbedder:
    config_keys = {"requests_per_minute", "tokens_per_minute", "max_batch", "api_key_env"}
    config = ProviderConfig(url=server.url, model="fake-remote", **{k: v for k, v in options.items() if k in config_keys})
    kwargs = {"timeout": 0.5, "max_attempts": 2, "backoff": 0.01, "window_seconds": 60.0}
    kwargs.update({k: v for k, v in options.items() if k not in config_keys})
    return HttpEmbedder(config, home=tmp_path, **kwargs)


def embed_checked(e: HttpEmbedder, texts: list[str]) -> np.ndarray:
    return checked_embed(e, texts, expected_model=e.model_name, expected_dim=384, batch_size=64)


def test_vectors_come_back_checked_in_input_order_with_the_key_sent_and_384_dimensions_asked(tmp_path, monkeypatch):
    monkeypatch.setenv("KBINDEX_EMBED_KEY_FAKE", "sk-test-not-a-real-key")
    with FakeEmbeddingServer() as server:
        e = embedder(server, tmp_path, max_batch=4, api_key_env="KBINDEX_EMBED_KEY_FAKE")
        vectors = embed_checked(e, TEXTS)
        records = server.stats()["records"]
    assert np.allclose(vectors, np.stack([fake_vector(t) for t in TEXTS]), atol=1e-6)
    assert [r["inputs"] for r in records] == [4, 4, 2]  # batches of at most max_batch
    assert all(r["auth"] for r in records)
    assert e.model_name == http_model_name(server.url, "fake-remote") == f"http:fake-remote@{server.url.split('/')[2]}"


@pytest.mark.parametrize(
    ("fault", "code", "requests"),
    [
        ("rate_limit", "EMBEDDING_RATE_LIMITED", 2),
        ("timeout", "EMBEDDING_TIMEOUT", 2),
        ("drop", "EMBEDDING_UNAVAILABLE", 2),
        ("unavailable", "EMBEDDING_UNAVAILABLE", 2),
        ("wrong_dimension", "EMBEDDING_INVALID_RESPONSE", 1),
        ("wrong_count", "EMBEDDING_INVALID_RESPONSE", 1),
        ("shuffled", "EMBEDDING_INVALID_RESPONSE", 1),
        ("nan", "EMBEDDING_INVALID_RESPONSE", 1),
    ],
)
def test_each_fault_maps_to_its_stable_code_after_bounded_retries(tmp_path, fault, code, requests):
    """Transient faults are retried max_attempts (2) times, then raise their transient code; a bad answer
    is never retried and never returned."""
    with FakeEmbeddingServer(faults={fault: 1.0}, retry_after=0.05, hang=2.0) as server:
        e = embedder(server, tmp_path)
        with pytest.raises(Exception) as info:
            embed_checked(e, TEXTS[:3])
        records = server.stats()["records"]
    assert getattr(info.value, "code", None) == code, info.value
    assert len(records) == requests


def test_retry_after_in_seconds_is_honoured_and_pauses_every_process(tmp_path):
    with FakeEmbeddingServer(schedule={1: "rate_limit"}, retry_after=1.5) as server:
        e = embedder(server, tmp_path)
        vectors = embed_checked(e, TEXTS[:2])
        first, second = server.stats()["records"]
    assert vectors.shape == (2, 384)
    assert second["at"] - first["at"] >= 1.45
    state = json.loads(e.limiter.path.read_text())
    assert state["blocked_until"] >= first["at"] + 1.4  # written to the shared state, not only slept on


def test_retry_after_as_an_http_date_is_honoured(tmp_path):
    with FakeEmbeddingServer(schedule={1: "rate_limit"}, retry_after=2.0, retry_after_date=True) as server:
        embed_checked(embedder(server, tmp_path), TEXTS[:2])
        first, second = server.stats()["records"]
    assert second["at"] - first["at"] >= 0.9  # an HTTP date has 1 s resolution


def test_a_retry_after_beyond_the_call_budget_gives_up_at_once_with_rate_limited(tmp_path):
    with FakeEmbeddingServer(faults={"rate_limit": 1.0}, retry_after=30) as server:
        e = embedder(server, tmp_path, max_attempts=5, max_wait=2.0)
        started = time.monotonic()
        with pytest.raises(EmbeddingRateLimited):
            embed_checked(e, TEXTS[:2])
        assert time.monotonic() - started < 1.5
        assert len(server.stats()["records"]) == 1


def test_parse_retry_after():
    now = time.time()
    assert parse_retry_after("7") == 7.0
    assert parse_retry_after("0.5") == 0.5
    assert parse_retry_after(None) is None and parse_retry_after("soon") is None
    date = email.utils.formatdate(now + 10, usegmt=True)
    assert 8.5 <= parse_retry_after(date, now=now) <= 10.5
    assert parse_retry_after(email.utils.formatdate(now - 100, usegmt=True), now=now) == 0.0


@pytest.mark.parametrize("value", ["inf", "Infinity", "-inf", "nan", "NaN", "1e12", "1e+12", "-5", "+5", "0x10",
                                   "soon", "12abc", "5 seconds", "", "   ", "Thu, 99 Foo 2026 00:00:00 GMT"])
def test_parse_retry_after_ignores_what_is_not_delay_seconds_or_a_date(value):
    """Issue #31 finding 4: float() took inf, nan and 1e12; now anything but digits or an HTTP date is
    ignored (None: the caller's own backoff applies)."""
    assert parse_retry_after(value) is None


def test_parse_retry_after_is_capped():
    now = time.time()
    assert parse_retry_after("1000000000000") == MAX_RETRY_AFTER == 300.0
    assert parse_retry_after("301") == MAX_RETRY_AFTER
    assert parse_retry_after("300") == 300.0 and parse_retry_after("0") == 0.0
    assert parse_retry_after("Fri, 31 Dec 9999 23:59:59 GMT", now=now) == MAX_RETRY_AFTER
    assert parse_retry_after(email.utils.formatdate(now + 3600, usegmt=True), now=now) == MAX_RETRY_AFTER
    assert parse_retry_after(email.utils.formatdate(now - 100, usegmt=True), now=now) == 0.0


@pytest.mark.parametrize("on_disk", ["Infinity", "NaN", "1e12", "-Infinity", '"soon"', "null", "[1]"])
def test_an_impossible_blocked_until_already_in_the_shared_file_does_not_block(tmp_path, on_disk):
    """Before, ``Infinity`` (written by an older client after ``Retry-After: inf``) blocked every process on the
    machine across restarts, and round(inf) raised an untyped OverflowError; ``1e12`` blocked for ever."""
    path = tmp_path / "l.json"
    path.write_text('{"blocked_until": %s, "grants": [[Infinity, 5, "a"], [NaN, 1, "b"], [1e12, 1, "c"], '
                    '"junk", [1, 2]]}' % on_disk)
    limiter = SharedRateLimiter(path, requests=2, tokens=None, window_seconds=60)
    assert limiter.acquire(1, give_up_after=0)  # at once: nothing on disk may hold it back
    assert limiter.acquire(1, give_up_after=0)  # the bad grants were not counted either (requests=2)
    state = json.loads(path.read_text())  # repaired on disk: every value finite, only our two grants
    assert state["blocked_until"] == 0.0
    assert len(state["grants"]) == 2 and all(g[0] < time.time() + 61 for g in state["grants"])


def test_a_plausible_blocked_until_in_the_shared_file_still_blocks(tmp_path):
    path = tmp_path / "l.json"
    path.write_text(json.dumps({"blocked_until": time.time() + 100, "grants": []}))
    limiter = SharedRateLimiter(path, requests=None, tokens=None)
    with pytest.raises(EmbeddingRateLimited) as info:
        limiter.acquire(1, give_up_after=0)
    assert 95 <= info.value.data["wait"] <= 100


@pytest.mark.parametrize("retry_after", [float("inf"), 1e12])
def test_an_absurd_retry_after_falls_back_to_backoff_and_never_reaches_the_shared_file(tmp_path, retry_after):
    """``Retry-After: inf`` / ``1e+12`` from the provider: the client backs off as for a 429 without the header
    (the second attempt passes) and the shared file never says Infinity."""
    with FakeEmbeddingServer(schedule={1: "rate_limit"}, retry_after=retry_after) as server:
        e = embedder(server, tmp_path)
        vectors = embed_checked(e, TEXTS[:2])
        first, second = server.stats()["records"]
    assert vectors.shape == (2, 384) and (first["status"], second["status"]) == (429, 200)
    assert json.loads(e.limiter.path.read_text())["blocked_until"] == 0.0
    assert e.limiter.acquire(1, give_up_after=0)


def test_a_query_gives_up_on_a_long_retry_after_at_once_and_the_next_query_sends_nothing(tmp_path):
    """Issue #31 finding 1: indexing's policy (max_wait 300 s) sleeps through a 60 s Retry-After; a search's
    query embedding (for_queries, a 5 s budget) gives up on it with EMBEDDING_RATE_LIMITED and the wait, and
    the next query fails from the shared limiter without calling the provider again."""
    with FakeEmbeddingServer(faults={"rate_limit": 1.0}, retry_after=60) as server:
        e = embedder(server, tmp_path, max_attempts=4, max_wait=300.0)
        query = e.for_queries(5.0)
        assert (query.max_wait, query.max_attempts, e.max_wait, e.max_attempts) == (5.0, 2, 300.0, 4)
        assert query.limiter is e.limiter and e.for_queries() is e.for_queries()
        for _ in range(2):
            with pytest.raises(EmbeddingRateLimited) as info:
                embed_checked(query, ["refund window"])
            assert 55 <= info.value.data["wait"] <= 60
        assert len(server.stats()["records"]) == 1


def test_a_missing_api_key_variable_fails_unavailable_without_sending(tmp_path, monkeypatch):
    monkeypatch.delenv("KBINDEX_EMBED_KEY_NO_SUCH_VAR", raising=False)
    with FakeEmbeddingServer() as server:
        with pytest.raises(EmbeddingUnavailable) as info:
            embed_checked(embedder(server, tmp_path, api_key_env="KBINDEX_EMBED_KEY_NO_SUCH_VAR"), TEXTS[:1])
        assert server.stats()["records"] == []
    assert "KBINDEX_EMBED_KEY_NO_SUCH_VAR" in info.value.message


def test_a_refused_request_is_not_retried(tmp_path):
    with FakeEmbeddingServer() as server:
        config = ProviderConfig(url=server.url.replace("/v1", "/nowhere"), model="m")
        e = HttpEmbedder(config, home=tmp_path, timeout=0.5, max_attempts=3)
        with pytest.raises(EmbeddingUnavailable, match="HTTP 404"):
            embed_checked(e, TEXTS[:1])


def test_token_limit_splits_requests_and_the_limiter_waits_for_tokens(tmp_path):
    limiter = SharedRateLimiter(tmp_path / "l.json", requests=None, tokens=100, window_seconds=60)
    limiter.acquire(80, give_up_after=0)
    with pytest.raises(EmbeddingRateLimited):
        limiter.acquire(30, give_up_after=0.1)  # 110 > 100 within the window
    limiter.acquire(20, give_up_after=0)
    with FakeEmbeddingServer() as server:
        e = embedder(server, tmp_path, tokens_per_minute=200, max_batch=64)
        slices = e.batches(TEXTS)
    assert len(slices) > 1 and all(tokens <= 50 for _, _, tokens in slices)  # a quarter of 200 per request
    assert [s for s, _, _ in slices][0] == 0 and slices[-1][1] == len(TEXTS)


def test_check_provider_refuses_keys_credentials_and_other_dimensions():
    good = ProviderConfig(url="https://api.example.com/v1", model="m", api_key_env="KBINDEX_EMBED_KEY_OPENAI")
    check_provider(good, dimension=384)
    for bad in (
        ProviderConfig(url="ftp://x/v1", model="m"),
        ProviderConfig(url="https://user:pw@api.example.com/v1", model="m"),
        ProviderConfig(url="https://api.example.com/v1", model=""),
        ProviderConfig(url="https://api.example.com/v1", model="m", dimension=1536),
        ProviderConfig(url="https://api.example.com/v1", model="m", api_key_env="sk-live-abc123"),
        ProviderConfig(url="https://api.example.com/v1", model="m", requests_per_minute=0),
        ProviderConfig(url="https://api.example.com/v1", model="m", max_batch=0),
    ):
        with pytest.raises(InvalidRequest):
            check_provider(bad, dimension=384)


WORKER = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from resources.http_embedder import HttpEmbedder, ProviderConfig
    url, home, name = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
    config = ProviderConfig(url=url, model="fake-remote", requests_per_minute=5, max_batch=1)
    e = HttpEmbedder(config, home=home, timeout=5, window_seconds=3.0)
    e.embed([f"{name} text {i}" for i in range(6)])
    """
)


def test_the_requests_limit_holds_across_three_processes(tmp_path):
    """3 processes x 6 requests under one 5-requests-per-3s limit: no 3 s window at the server holds more
    than 5, and the server never had to refuse one."""
    with FakeEmbeddingServer(rpm=5, window=3.0) as server:
        procs = [subprocess.Popen([sys.executable, "-c", WORKER, server.url, str(tmp_path), f"p{i}"], cwd=ROOT)
                 for i in range(3)]
        for p in procs:
            assert p.wait(timeout=120) == 0
        records = server.stats()["records"]
    assert len(records) == 18
    assert all(r["status"] == 200 for r in records)
    assert max_in_window([r["at"] for r in records], 3.0) <= 5
    assert records[-1]["at"] - records[0]["at"] >= 9.0  # 18 requests at 5 per 3 s: at least 3 full windows


def test_a_request_in_flight_holds_its_token_until_it_finishes_then_one_window_more(tmp_path):
    """The provider sees a request arrive before it finished, so its token returns a window after the end."""
    limiter = SharedRateLimiter(tmp_path / "l.json", requests=1, tokens=None, window_seconds=0.5)
    grant = limiter.acquire(1, give_up_after=0, in_flight=10.0)
    with pytest.raises(EmbeddingRateLimited):
        limiter.acquire(1, give_up_after=1.0)  # still in flight: not back before 10.5 s
    time.sleep(0.3)
    limiter.settle(grant)
    finished = time.time()
    limiter.acquire(1, give_up_after=2.0)
    assert time.time() - finished >= 0.45


def test_check_provider_refuses_plain_http_to_a_remote_host_and_key_variables_outside_the_prefix(monkeypatch):
    """Finding 6 of issue #31: http:// anywhere sent the key in clear, and api_key_env could name any secret
    of the worker's environment. Loopback and the operator's allow-lists stay open."""
    monkeypatch.delenv("KBINDEX_EMBED_HTTP_HOSTS", raising=False)
    monkeypatch.delenv("KBINDEX_EMBED_KEY_VARS", raising=False)
    for url in ("http://127.0.0.1:8080/v1", "http://[::1]:8080/v1", "http://localhost/v1", "https://api.example.com/v1"):
        check_provider(ProviderConfig(url=url, model="m", api_key_env="KBINDEX_EMBED_KEY_X"), dimension=384)
    with pytest.raises(InvalidRequest, match="KBINDEX_EMBED_HTTP_HOSTS"):
        check_provider(ProviderConfig(url="http://gateway.internal/v1", model="m"), dimension=384)
    for stolen in ("AWS_SECRET_ACCESS_KEY", "KBINDEX_DATABASE_URL", "OPENAI_API_KEY"):
        with pytest.raises(InvalidRequest, match="KBINDEX_EMBED_KEY_"):
            check_provider(ProviderConfig(url="https://api.example.com/v1", model="m", api_key_env=stolen), dimension=384)
    monkeypatch.setenv("KBINDEX_EMBED_HTTP_HOSTS", "Gateway.Internal, other.lan")
    monkeypatch.setenv("KBINDEX_EMBED_KEY_VARS", "OPENAI_API_KEY")
    check_provider(ProviderConfig(url="http://gateway.internal/v1", model="m", api_key_env="OPENAI_API_KEY"), dimension=384)
    with pytest.raises(InvalidRequest):  # the allow-list names exactly, it does not open every variable
        check_provider(ProviderConfig(url="https://api.example.com/v1", model="m", api_key_env="KBINDEX_DATABASE_URL"),
                       dimension=384)


@pytest.mark.parametrize(
    ("url", "key_env"),
    [("https://attacker.example/v1", "KBINDEX_DATABASE_URL"), ("http://attacker.example/v1", "KBINDEX_EMBED_KEY_X")],
)
def test_a_profile_stored_before_the_rule_sends_nothing(tmp_path, monkeypatch, url, key_env):
    """The check runs again before every request, with the worker's environment: a recipe already in the
    database (no check at creation then) fails EMBEDDING_UNAVAILABLE and no request leaves the process."""
    import httpx

    monkeypatch.setenv("KBINDEX_DATABASE_URL", "postgresql://kb:secret-password@db/kb")
    monkeypatch.setenv("KBINDEX_EMBED_KEY_X", "sk-secret")
    sent: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        return httpx.Response(200, json={"data": [{"index": 0, "embedding": [1.0] * 384}]})

    row = {"provider_url": url, "provider_model": "m", "api_key_env": key_env, "dimension": 384}
    e = HttpEmbedder(ProviderConfig.from_row(row), home=tmp_path, transport=httpx.MockTransport(handler), max_attempts=1)
    with pytest.raises(EmbeddingUnavailable) as info:
        e.embed(["hello"])
    assert info.value.code == "EMBEDDING_UNAVAILABLE" and sent == []
