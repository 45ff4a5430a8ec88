"""How derived models batch: fp32 backends run texts of equal token length together (never padded),
capped at the batch size; int8 runs one text per call. A fake runner records each call's shape."""

from __future__ import annotations

import numpy as np
from resources.derived_models import DERIVED_MODELS, INT8_MODEL_NAME, ONNX_MODEL_NAME, _embed_texts


class Runner:
    def __init__(self) -> None:
        self.shapes: list[tuple[int, int]] = []

    def __call__(self, feed: dict[str, np.ndarray]) -> np.ndarray:
        ids = feed["input_ids"]
        assert feed["attention_mask"].all()  # no padding was computed
        self.shapes.append(ids.shape)
        vectors = np.zeros((ids.shape[0], 4), dtype=np.float32)
        vectors[:, 0] = ids.shape[1]  # a row says how long its text was
        vectors[:, 1] = ids[:, 1]  # ... and its first word piece
        return vectors


def _tok():
    from resources.derived_models import _tokenizer
    from resources.embedder import packaged_model_path

    return _tokenizer(packaged_model_path(), 256)


TEXTS = ["hello", "world", "a longer sentence here", "again", "one two three four", "cat"]  # 3,3,6,3,6,3 pieces


def test_equal_length_texts_share_a_call_and_rows_keep_their_order() -> None:
    run = Runner()
    out = _embed_texts(run, _tok(), TEXTS, 4, DERIVED_MODELS[ONNX_MODEL_NAME], batch_size=2)
    assert sorted(run.shapes) == [(2, 3), (2, 3), (2, 6)]  # four texts of 3 pieces in two calls (cap 2)
    for row, text in enumerate(TEXTS):
        ids = _tok().encode(text).ids
        assert out[row, 0] == len(ids) and out[row, 1] == ids[1]


def test_int8_runs_one_text_per_call() -> None:
    run = Runner()
    _embed_texts(run, _tok(), TEXTS, 4, DERIVED_MODELS[INT8_MODEL_NAME], batch_size=64)
    assert [s[0] for s in run.shapes] == [1] * len(TEXTS)
