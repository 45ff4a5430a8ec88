"""The fake embedder and checked_embed: every bad batch is refused, provider trouble maps to transient codes."""

from __future__ import annotations

import numpy as np
import pytest

from pipelines.domain.errors import (
    EmbeddingInvalidResponse,
    EmbeddingRateLimited,
    EmbeddingTimeout,
    EmbeddingUnavailable,
    is_retryable,
)
from resources.embedder import (
    Embedder,
    EmbeddingResponse,
    FakeEmbedder,
    Fault,
    ProviderHTTPError,
    SentenceTransformerEmbedder,
    checked_embed,
    fake_vector,
    text_fingerprint,
    translate_provider_error,
    validate_response,
)

TEXTS = [f"paragraph {i} about refunds and returns number {i}" for i in range(10)]


def _checked(embedder, texts=TEXTS, **kw):
    kw.setdefault("expected_model", "fake-384")
    kw.setdefault("expected_dim", 384)
    kw.setdefault("batch_size", 4)
    return checked_embed(embedder, texts, **kw)


def test_fake_is_deterministic_normalized_and_satisfies_the_protocol():
    a, b = FakeEmbedder(), FakeEmbedder(seed=99)
    assert isinstance(a, Embedder)
    va, vb = a.embed(TEXTS), b.embed(TEXTS)
    assert va.shape == (10, 384) and va.dtype == np.float32
    np.testing.assert_array_equal(va, vb)
    np.testing.assert_allclose(np.linalg.norm(va, axis=1), 1.0, atol=1e-5)
    assert a.model_name == "fake-384" and a.dimension == 384


def test_fake_vectors_reward_shared_words_including_chinese():
    q = fake_vector("refund policy")
    assert q @ fake_vector("our refund policy for customers") > q @ fake_vector("holiday schedule for staff")
    zh = fake_vector("退款政策")
    assert zh @ fake_vector("本公司的退款政策如下") > zh @ fake_vector("员工假期安排")


def test_checked_embed_returns_all_rows_in_order_and_reports_progress():
    progress: list[tuple[int, int]] = []
    fake = FakeEmbedder()
    out = _checked(fake, on_batch=lambda done, total: progress.append((done, total)))
    np.testing.assert_array_equal(out, np.stack([fake_vector(t) for t in TEXTS]))
    assert sorted(fake.calls) == [2, 4, 4]
    assert progress == [(4, 10), (8, 10), (10, 10)]


def test_empty_input_makes_no_call():
    fake = FakeEmbedder()
    assert _checked(fake, texts=[]).shape == (0, 384)
    assert fake.calls == []


@pytest.mark.parametrize(
    "fault",
    [Fault.WRONG_COUNT, Fault.WRONG_ORDER, Fault.WRONG_DIMENSION, Fault.WRONG_MODEL, Fault.NON_FINITE],
)
def test_each_invalid_response_fails_permanently(fault):
    fake = FakeEmbedder(schedule={2: fault})
    with pytest.raises(EmbeddingInvalidResponse) as info:
        _checked(fake)
    assert info.value.code == "EMBEDDING_INVALID_RESPONSE"
    assert not is_retryable(info.value.code)
    assert len(fake.calls) == 2, "stops at the bad batch"


@pytest.mark.parametrize(
    ("fault", "error", "code"),
    [
        (Fault.TIMEOUT, EmbeddingTimeout, "EMBEDDING_TIMEOUT"),
        (Fault.RATE_LIMIT, EmbeddingRateLimited, "EMBEDDING_RATE_LIMITED"),
        (Fault.UNAVAILABLE, EmbeddingUnavailable, "EMBEDDING_UNAVAILABLE"),
    ],
)
def test_provider_trouble_maps_to_transient_codes(fault, error, code):
    fake = FakeEmbedder(schedule={3: fault})
    with pytest.raises(error) as info:
        _checked(fake)
    assert info.value.code == code and is_retryable(code)
    assert info.value.__cause__ is not None, "raised from the provider's exception"


def test_schedule_fails_exactly_the_named_call():
    fake = FakeEmbedder(schedule={3: Fault.TIMEOUT})
    fake.embed(["a"])
    fake.embed(["b"])
    with pytest.raises(TimeoutError):
        fake.embed(["c"])
    fake.embed(["d"])
    assert fake.faults == [(3, Fault.TIMEOUT)]


def test_rates_are_seeded_and_replay_exactly():
    def run(seed: int) -> list[tuple[int, Fault]]:
        fake = FakeEmbedder(rates={Fault.RATE_LIMIT: 0.2, Fault.WRONG_ORDER: 0.1}, seed=seed)
        for i in range(200):
            try:
                fake.respond([f"t{i}", f"u{i}"])
            except ProviderHTTPError:
                pass
        return fake.faults

    first = run(7)
    assert first == run(7)
    kinds = [k for _, k in first]
    assert 20 < kinds.count(Fault.RATE_LIMIT) < 65
    assert 5 < kinds.count(Fault.WRONG_ORDER) < 40
    assert first != run(8)


def test_wrong_order_is_a_real_permutation_caught_by_the_echo():
    fake = FakeEmbedder(schedule={1: Fault.WRONG_ORDER})
    response = fake.respond(TEXTS[:5])
    good = np.stack([fake_vector(t) for t in TEXTS[:5]])
    assert sorted(map(tuple, response.vectors.tolist())) == sorted(map(tuple, good.tolist()))
    assert not np.array_equal(response.vectors, good)
    with pytest.raises(EmbeddingInvalidResponse, match="out of order"):
        validate_response(response, TEXTS[:5], expected_model="fake-384", expected_dim=384)


def test_unnormalized_or_misnamed_embedder_is_refused_before_any_call():
    fake = FakeEmbedder(model_name="other")
    with pytest.raises(EmbeddingInvalidResponse):
        _checked(fake)
    with pytest.raises(EmbeddingInvalidResponse):
        _checked(FakeEmbedder(dimension=768))
    assert fake.calls == []
    bad = EmbeddingResponse("fake-384", np.full((1, 384), 0.5, dtype=np.float32), (text_fingerprint("x"),))
    with pytest.raises(EmbeddingInvalidResponse, match="unit length"):
        validate_response(bad, ["x"], expected_model="fake-384", expected_dim=384)


def test_plain_embedder_without_respond_is_checked_too():
    class Plain:
        model_name = "plain"
        dimension = 3

        def __init__(self, rows: int) -> None:
            self.rows = rows

        def embed(self, texts):
            v = np.zeros((self.rows, 3), dtype=np.float32)
            v[:, 0] = 1
            return v

    assert checked_embed(Plain(2), ["a", "b"], expected_model="plain", expected_dim=3).shape == (2, 3)
    with pytest.raises(EmbeddingInvalidResponse):
        checked_embed(Plain(1), ["a", "b"], expected_model="plain", expected_dim=3)


def test_http_status_and_exception_names_translate():
    assert isinstance(translate_provider_error(ProviderHTTPError(429)), EmbeddingRateLimited)
    assert isinstance(translate_provider_error(ProviderHTTPError(503)), EmbeddingUnavailable)
    assert isinstance(translate_provider_error(ProviderHTTPError(504)), EmbeddingTimeout)

    class ReadTimeout(Exception):
        pass

    assert isinstance(translate_provider_error(ReadTimeout()), EmbeddingTimeout)
    assert isinstance(translate_provider_error(ConnectionResetError()), EmbeddingUnavailable)
    assert translate_provider_error(ValueError("bug")) is None


def test_unexpected_errors_are_not_disguised():
    class Broken(FakeEmbedder):
        def respond(self, texts):
            raise ValueError("a bug")

    with pytest.raises(ValueError):
        _checked(Broken())


def test_missing_model_folder_is_unavailable_with_advice(tmp_path):
    embedder = SentenceTransformerEmbedder(tmp_path / "no-such-model")
    with pytest.raises(EmbeddingUnavailable, match="KBINDEX_MODEL"):
        checked_embed(embedder, ["x"], expected_model="no-such-model", expected_dim=384)
    empty = tmp_path / "empty-model"
    empty.mkdir()
    with pytest.raises(EmbeddingUnavailable, match="KBINDEX_MODEL"):
        SentenceTransformerEmbedder(empty).dimension


@pytest.fixture(scope="module")
def real_embedder() -> SentenceTransformerEmbedder:
    """The packaged all-MiniLM-L6-v2, loaded once (the module cache shares it with every other test)."""
    return SentenceTransformerEmbedder()


def test_real_model_gives_normalized_384_vectors_and_ranks_similar_text_higher(real_embedder):
    texts = [
        "How do I get my money back for a returned item?",
        "Refunds are paid to the original card within 14 days of the return.",
        "The cafeteria serves lunch from noon until two.",
    ]
    vectors = checked_embed(real_embedder, texts, expected_model="all-MiniLM-L6-v2", expected_dim=384, batch_size=2)
    assert vectors.shape == (3, 384) and vectors.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-4)
    assert vectors[0] @ vectors[1] > vectors[0] @ vectors[2] + 0.2
    assert SentenceTransformerEmbedder().model is real_embedder.model, "loaded once per process"


def test_embedder_for_model_picks_one_embedder_per_profile_model():
    from resources.embedder import embedder_for_model

    fake = embedder_for_model("fake-384")
    assert isinstance(fake, FakeEmbedder) and fake.model_name == "fake-384"
    packaged = embedder_for_model("all-MiniLM-L6-v2", batch_size=16)
    assert isinstance(packaged, SentenceTransformerEmbedder) and packaged.model_name == "all-MiniLM-L6-v2"
    assert packaged.batch_size == 16
    other = embedder_for_model("/models/e5-small")
    assert other.model_name == "/models/e5-small" and other.model_path == "/models/e5-small"


def test_rows_come_back_in_input_order_whatever_the_lengths():
    texts = [("word " * n).strip() + f" {n}" for n in (3, 40, 1, 17, 8, 25, 2)]
    out = checked_embed(FakeEmbedder(), texts, expected_model="fake-384", expected_dim=384, batch_size=3)
    np.testing.assert_array_equal(out, np.stack([fake_vector(t) for t in texts]))


def _unsalted_fake_vector(text: str) -> np.ndarray:
    """fake-384's vectors as they were before fake models were salted (tests and benches pin them)."""
    import hashlib
    import re

    vector = np.zeros(384, dtype=np.float32)
    for token in re.findall(r"[\u3400-\u9fff\uf900-\ufaff]|[^\W_]+", text.lower()):
        seed = int.from_bytes(hashlib.blake2b(token.encode("utf-8"), digest_size=8).digest(), "little")
        vector += np.random.default_rng(seed).standard_normal(384).astype(np.float32)
    return vector / np.linalg.norm(vector)


def test_fake_384_is_unsalted_and_every_other_fake_model_is_a_really_different_model():
    texts = ["refund policy for damaged goods", "员工假期安排", "travel per-diem and hotel booking"]
    plain = FakeEmbedder().embed(texts)
    np.testing.assert_array_equal(plain, np.stack([_unsalted_fake_vector(t) for t in texts]))
    other = FakeEmbedder(model_name="fake-b-384")
    salted = other.embed(texts)
    np.testing.assert_array_equal(salted, other.embed(texts))  # deterministic
    np.testing.assert_array_equal(salted, np.stack([fake_vector(t, model="fake-b-384") for t in texts]))
    np.testing.assert_allclose(np.linalg.norm(salted, axis=1), 1.0, atol=1e-5)
    assert np.abs(np.sum(plain * salted, axis=1)).max() < 0.3  # same text, another model: unrelated vectors
    assert np.abs(np.sum(salted * FakeEmbedder(model_name="fake-c-384").embed(texts), axis=1)).max() < 0.3
    q = fake_vector("refund policy", model="fake-b-384")  # still a bag of words within its own model
    assert q @ salted[0] > q @ salted[2]
    # A fake standing in for a real model's name keeps the plain vectors (tests index with it).
    np.testing.assert_array_equal(FakeEmbedder(model_name="all-MiniLM-L6-v2").embed(texts), plain)
