"""Lexical retrieval, pure: the terms of a text, BM25, and the fusion of BM25 with cosine similarity.

Terms (int ids, so the index is an ``integer[]`` with a GIN index), by the profile's ``lexical_analyzer``
(migration 0045; set when the profile is created, since it decides every lexical row):

``wordpiece`` (the default):

- every word piece of the model's WordPiece tokenizer is a term (its vocabulary id, < 2^24): English and
  other space-separated text is lower-cased and split the way the model reads it;
- a CJK ideograph is its own term (``CJK_BASE + code point``), and each pair of adjacent ideographs is a
  term too (``BIGRAM_BASE + crc32(pair) mod 2^30``). WordPiece alone maps many ideographs to [UNK] and
  single characters are weak evidence; character bigrams are the classic answer for Chinese without a
  word segmenter. Measured (paragraph-level BM25, nDCG@10): WordPiece only 0.61 xquad-zh / 0.33
  cmrc2018; WordPiece + CJK unigrams and bigrams 0.970 / 0.976, English 0.966; whole words instead of
  word pieces + the same CJK n-grams 0.966 / 0.983, English 0.960.

``english`` (``english_term_counts``): whole words (runs of letters and digits, inner apostrophes kept, a
possessive ``'s`` dropped), case-folded, Lucene's 33 English stop words removed, stemmed by the Snowball
English stemmer (PyStemmer), each word hashed to ``WORD_BASE + blake2b(word) mod WORD_SPACE``: a range of its
own between the CJK unigrams and the bigrams, so no word can take a WordPiece, unigram or bigram id. CJK
ideographs keep exactly the unigrams and bigrams above. What Lucene's EnglishAnalyzer does, minus its
tokenizer's finer rules. Measured with ``python -m bench.retrieval`` (the default int8 profile, weighted fusion,
all queries), nDCG@10 wordpiece / english: xquad-en lexical 0.9663 / 0.9647, hybrid 0.9796 / 0.9753; xquad-zh
lexical 0.9656 / 0.9616, hybrid 0.9635 / 0.9598; cmrc2018-dev lexical 0.9736 / 0.9810, hybrid 0.9690 / 0.9759.
These sets are answered by copying the paragraph's words, so they show no regression, not the analyzer's worth;
``wordpiece`` stays the default until an English set where BM25 is far from 1.0 decides.

BM25 (Lucene's idf, always positive): ``idf(t) = ln(1 + (N - df + 0.5) / (df + 0.5))`` and
``w(t, d) = idf * tf * (k1 + 1) / (tf + k1 * (1 - b + b * len(d) / avglen))``, summed over the distinct
query terms. N, df and avglen count only the current versions of one tenant under one profile.

Fusion, per profile (``fusion``, migration 0044), query-time only:

- ``weighted`` (``fuse``, the default): ``lexical_weight * bm25 / max_bm25 + (1 - lexical_weight) *
  max(cosine, 0)`` over both sides' candidates, each scored by both measures. The score sum keeps the
  cosine unstretched, so a model that sees noise adds little.
- ``rrf`` (``fuse_rrf``): reciprocal rank fusion, ``(1 - lexical_weight) / (rrf_k + dense rank) +
  lexical_weight / (rrf_k + lexical rank)``; a chunk outside one side's candidate list gets nothing from
  that side. Ranks only, so it needs no score normalisation, but a model that does not read the language
  ranks noise as confidently as signal and drags the order down.

Measured with ``python -m bench.retrieval`` (the default int8 profile, k 60, weight 0.5, through the real
index and search): xquad-en nDCG@10 weighted 0.9796, RRF 0.9691 (recall@10 0.9966 / 0.9975); xquad-zh
weighted 0.9635, RRF 0.6558 (MiniLM does not read Chinese: dense 0.3426), so the default stays ``weighted``.
"""

from __future__ import annotations

import hashlib
import math
import re
import zlib
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

CJK_BASE = 1 << 24
BIGRAM_BASE = 1 << 30
BIGRAM_SPACE = (1 << 30) - 1
WORD_BASE = 1 << 25
"""Whole-word term ids (``english``): [2^25, 2^30), above every CJK unigram (< 2^24 + 2^21) and below the bigrams."""
WORD_SPACE = BIGRAM_BASE - WORD_BASE
ANALYZERS = ("wordpiece", "english")
DEFAULT_ANALYZER = "english"
"""What a new profile analyzes with unless told (measured best: bench.retrieval on pep-titles, README)."""
LEGACY_ANALYZER = "wordpiece"
"""What a profile row without the column (from before migration 0045) analyzes with."""
ENGLISH_STOP_WORDS = frozenset((
    "a an and are as at be but by for if in into is it no not of on or such that the their then there these they "
    "this to was will with"
).split())
"""Lucene's English stop set (EnglishAnalyzer.ENGLISH_STOP_WORDS_SET): short, so BM25's idf handles the rest."""
MODES = ("hybrid", "dense", "lexical")
FUSIONS = ("weighted", "rrf")
DEFAULT_RRF_K = 60
MAX_RRF_K = 100_000


class PieceTokenizer(Protocol):
    """What term extraction needs: each word piece's vocabulary id and character span."""

    def pieces(self, text: str) -> list[tuple[int, int, int]]: ...


@dataclass(frozen=True)
class LexicalParams:
    """A profile's lexical and fusion parameters (index_profile columns of migration 0022)."""

    search_mode: str = "hybrid"
    lexical_weight: float = 0.5
    bm25_k1: float = 1.2
    bm25_b: float = 0.75
    fusion: str = "weighted"
    """How hybrid fuses its two sides: ``weighted`` (``fuse``) or ``rrf`` (``fuse_rrf``); migration 0044."""
    rrf_k: int = DEFAULT_RRF_K
    """RRF's rank constant (used when ``fusion`` is ``rrf``): larger flattens the top ranks' advantage."""
    analyzer: str = DEFAULT_ANALYZER
    """How text becomes terms (column ``lexical_analyzer``, migration 0045): ``wordpiece`` or ``english``. Every
    lexical row depends on it, so it is fixed when the profile is created."""

    @classmethod
    def of(cls, profile: Mapping[str, object]) -> LexicalParams:
        """The parameters recorded on a profile row (defaults for a row that predates them)."""
        return cls(
            search_mode=str(profile.get("search_mode") or cls.search_mode),
            lexical_weight=float(profile.get("lexical_weight", cls.lexical_weight)),  # type: ignore[arg-type]
            bm25_k1=float(profile.get("bm25_k1", cls.bm25_k1)),  # type: ignore[arg-type]
            bm25_b=float(profile.get("bm25_b", cls.bm25_b)),  # type: ignore[arg-type]
            fusion=str(profile.get("fusion") or cls.fusion),
            rrf_k=int(profile.get("rrf_k", cls.rrf_k)),  # type: ignore[call-overload]
            analyzer=str(profile.get("lexical_analyzer") or LEGACY_ANALYZER),
        )


def is_cjk_ideograph(ch: str) -> bool:
    """The code points BERT's tokenizer splits into single characters (its ``_is_chinese_char``)."""
    cp = ord(ch)
    return (
        0x4E00 <= cp <= 0x9FFF
        or 0x3400 <= cp <= 0x4DBF
        or 0x20000 <= cp <= 0x2A6DF
        or 0x2A700 <= cp <= 0x2B73F
        or 0x2B740 <= cp <= 0x2B81F
        or 0x2B820 <= cp <= 0x2CEAF
        or 0xF900 <= cp <= 0xFAFF
        or 0x2F800 <= cp <= 0x2FA1F
    )


def _bigram_id(a: str, b: str) -> int:
    return BIGRAM_BASE + zlib.crc32((a + b).encode("utf-8")) % BIGRAM_SPACE


def term_counts(text: str, tokenizer: PieceTokenizer) -> Counter[int]:
    """Term id -> frequency in ``text`` (word pieces; CJK ideographs and their adjacent pairs)."""
    counts: Counter[int] = Counter()
    previous: str | None = None
    previous_end = -1
    for piece_id, start, end in tokenizer.pieces(text):
        piece = text[start:end]
        if len(piece) == 1 and is_cjk_ideograph(piece):
            counts[CJK_BASE + ord(piece)] += 1
            if previous is not None and start == previous_end:
                counts[_bigram_id(previous, piece)] += 1
            previous, previous_end = piece, end
        else:
            counts[piece_id] += 1
            previous = None
    return counts


_CJK_CLASS = (
    "\u4e00-\u9fff\u3400-\u4dbf\U00020000-\U0002a6df\U0002a700-\U0002b73f\U0002b740-\U0002b81f"
    "\U0002b820-\U0002ceaf\uf900-\ufaff\U0002f800-\U0002fa1f"
)
_WORD_CHAR = f"(?:(?![{_CJK_CLASS}])[^\\W_])"
_TOKEN = re.compile(f"(?P<cjk>[{_CJK_CLASS}])|(?P<word>{_WORD_CHAR}+(?:['\u2019]{_WORD_CHAR}+)*)")


def word_id(word: str) -> int:
    """A whole word's term id in [WORD_BASE, BIGRAM_BASE): the same in every process (blake2b, not ``hash``)."""
    digest = hashlib.blake2b(word.encode("utf-8"), digest_size=8).digest()
    return WORD_BASE + int.from_bytes(digest, "big") % WORD_SPACE


def _english_word(token: str) -> str | None:
    """A word token as the ``english`` analyzer keeps it (case-folded, possessive dropped), None for a stop word."""
    word = token.casefold().replace("\u2019", "'")
    if word.endswith("'s"):
        word = word[:-2]
    return None if word in ENGLISH_STOP_WORDS else word


def english_words(text: str) -> list[str]:
    """The words of ``text`` the ``english`` analyzer stems, in order (CJK ideographs are not words:
    ``english_term_counts`` counts them as n-grams)."""
    return [w for m in _TOKEN.finditer(text) if m.group("word") and (w := _english_word(m.group("word")))]


def english_term_counts(text: str, stem_words: Callable[[list[str]], list[str]]) -> Counter[int]:
    """Term id -> frequency in ``text`` for the ``english`` analyzer: stemmed whole words (``word_id``), CJK
    ideographs and their adjacent pairs exactly as ``term_counts``. ``stem_words``: the Snowball English stemmer
    over a list of words (PyStemmer's ``stemWords``; injected so this stays free of the C extension)."""
    counts: Counter[int] = Counter()
    words: list[str] = []
    previous: str | None = None
    previous_end = -1
    for m in _TOKEN.finditer(text):
        ideograph = m.group("cjk")
        if ideograph is not None:
            counts[CJK_BASE + ord(ideograph)] += 1
            if previous is not None and m.start() == previous_end:
                counts[_bigram_id(previous, ideograph)] += 1
            previous, previous_end = ideograph, m.end()
            continue
        previous = None
        if word := _english_word(m.group("word")):
            words.append(word)
    for stem in stem_words(words) if words else ():
        counts[word_id(stem)] += 1
    return counts


def check_analyzer(analyzer: str) -> str:
    """``analyzer`` if it is one of ANALYZERS; ValueError otherwise."""
    if analyzer not in ANALYZERS:
        raise ValueError(f"analyzer must be one of {', '.join(ANALYZERS)}")
    return analyzer


def idf(n_chunks: int, df: int) -> float:
    """BM25 inverse document frequency (Lucene's form: never negative)."""
    return math.log(1.0 + (n_chunks - df + 0.5) / (df + 0.5))


def bm25_term(tf: float, length: float, avg_length: float, term_idf: float, k1: float, b: float) -> float:
    """One term's BM25 contribution to one chunk."""
    norm = k1 * (1.0 - b + b * length / avg_length) if avg_length > 0 else k1
    return term_idf * tf * (k1 + 1.0) / (tf + norm)


def term_bound(term_idf: float, k1: float, b: float, avg_length: float, max_tf: int | None = None,
               min_length_per_tf: float | None = None) -> float:
    """The most one term adds to any chunk's BM25 whose posting has tf <= ``max_tf`` and length / tf >=
    ``min_length_per_tf`` (migration 0052 keeps both per term): ``bm25_term`` is ``idf x (k1 + 1) / (1 +
    k1 (1 - b) / tf + k1 b (length / tf) / avglen)``, growing with tf and shrinking with length / tf. Without
    them, its limit as tf grows: idf x (k1 + 1). MaxScore pruning (``lazy_terms``) sums these."""
    slack = k1 * (1.0 - b) / max_tf if max_tf else 0.0
    if min_length_per_tf is not None and avg_length > 0:
        slack += k1 * b * min_length_per_tf / avg_length
    return term_idf * (k1 + 1.0) / (1.0 + slack)


def candidate_terms(dfs: Mapping[int, int], budget: int) -> list[int]:
    """The rarest query terms whose postings add up to at most ``budget`` chunks (at least the rarest one).

    Search scores with these terms: a term left out is a very common one (lowest idf), and leaving it out
    bounds a query's work at a million chunks. Below the budget (every eval set here) BM25 is exact.
    """
    chosen, total = [], 0
    for term, df in sorted(((t, d) for t, d in dfs.items() if d > 0), key=lambda item: (item[1], item[0])):
        if chosen and total + df > budget:
            break
        chosen.append(term)
        total += df
    return chosen


LAZY_RATIO = 4
"""How many times the walked terms' postings the lazy ones' must be (lazy_terms)."""

PROBE_COST = 3
"""lexical_hits_pruned reads the probed terms by chunk id only for fewer than 1/PROBE_COST of the chunks
they are in, and walks them otherwise. On bench.scale.search's 1M-chunk database (EXPLAIN ANALYZE of a few
queries, one-off): a posting read by id ~3.3 us, one walked and summed ~0.7 us; the chunks to read count
every version, the terms' dfs current chunks only (~1.5 postings a current chunk there): 4.5 / 1.5. With 4
two queries of sixty ran slower than the full walk; with 3 none did (the same database)."""


def lazy_terms(dfs: Mapping[int, int], idfs: Mapping[int, float], walk_at_least: int, k1: float,
               ratio: float = LAZY_RATIO, bounds: Mapping[int, float] | None = None) -> list[int]:
    """The common query terms that lexical_hits_pruned may probe instead of walk (MaxScore pruning); none:
    lexical_hits walks them all. ``dfs`` / ``idfs``: term -> current chunks holding it / its idf.

    The others are walked first; their sums must rank ``walk_at_least`` chunks (the walk's cut) at a score
    ``theta``, and the lazy terms' most (their bounds summed) must stay below it, or the statement walks
    them after all. A probed term costs a probe per chunk the walk found that can still rank. So the lazy
    terms are the longest run of commonest terms that holds at least LAZY_RATIO x the others' postings and
    whose most stays below ``theta_estimate`` of the others (``bounds``: each term's most, ``term_bound``;
    without, idf x (k1 + 1); ``ratio``: another LAZY_RATIO, for bench.scale.lexical_bounds). The answer does
    not depend on it, only the work."""
    ranked = sorted(dfs, key=lambda t: (-dfs[t], t))
    best: list[int] = []
    for i in range(1, len(ranked)):
        lazy, rest = ranked[:i], ranked[i:]
        rest_postings = sum(dfs[t] for t in rest)
        if rest_postings < max(walk_at_least, 1):
            break
        if (sum(dfs[t] for t in lazy) >= ratio * rest_postings
                and (sum(bounds[t] for t in lazy) if bounds is not None else sum(idfs[t] for t in lazy) * (k1 + 1))
                < theta_estimate(dfs, idfs, rest, walk_at_least)):
            best = lazy
    return sorted(best)


def theta_estimate(dfs: Mapping[int, int], idfs: Mapping[int, float], walked: Sequence[int], cut: int) -> float:
    """A guess at the score of the walk's ``cut``-th best chunk over the ``walked`` terms: the idf of the term
    at which their chunks, rarest term first, reach ``cut`` (one occurrence in a chunk of average length
    scores its idf); 0 when they hold fewer."""
    held = 0
    for term in sorted(walked, key=lambda t: (dfs[t], t)):
        held += dfs[term]
        if held >= cut:
            return idfs[term]
    return 0.0


POSTINGS_CAP = 50_000


def postings_budget(n_chunks: int) -> int:
    """How many postings a query reads at most: twice the corpus (measured on cmrc2018, chunk-free BM25:
    nDCG@10 0.9758 with every term, 0.9760 at 2N with a third of the postings), never more than
    POSTINGS_CAP (a million-chunk tenant), never less than 1,000."""
    return min(POSTINGS_CAP, max(1_000, 2 * n_chunks))


def scoring_terms(dfs: Mapping[int, int], n_chunks: int) -> list[int]:
    """The query terms BM25 sums over, search and quality gate alike (``candidate_terms`` within the budget)."""
    return sorted(candidate_terms(dfs, postings_budget(n_chunks)))


def fuse(
    cosines: Mapping[str, float], bm25: Mapping[str, float], lexical_weight: float
) -> list[tuple[str, float]]:
    """Chunk ids by ``lexical_weight * bm25 / max bm25 + (1 - lexical_weight) * max(cosine, 0)``, best first.

    Both maps should hold the same ids (scores computed for the union of both sides' candidates); a
    missing score counts as 0.
    """
    top = max(bm25.values(), default=0.0)
    ids = set(cosines) | set(bm25)
    scored = [
        (
            cid,
            lexical_weight * (bm25.get(cid, 0.0) / top if top > 0 else 0.0)
            + (1.0 - lexical_weight) * max(cosines.get(cid, 0.0), 0.0),
        )
        for cid in ids
    ]
    scored.sort(key=lambda item: (-item[1], item[0]))
    return scored


def competition_ranks(scores: Mapping[str, float]) -> dict[str, int]:
    """Id -> 1 + how many ids score strictly higher: tied scores share a rank, so the fusion of a tie does
    not depend on how either side happened to order it."""
    ordered = sorted(scores.values(), reverse=True)
    ranks: dict[float, int] = {}
    for i, value in enumerate(ordered):
        ranks.setdefault(value, i + 1)
    return {cid: ranks[value] for cid, value in scores.items()}


def fuse_rrf(
    dense: Mapping[str, float], lexical: Mapping[str, float], rrf_k: int, lexical_weight: float = 0.5
) -> list[tuple[str, float]]:
    """Chunk ids by reciprocal rank fusion, best first (ties by id).

    ``dense``: each dense candidate's cosine, ``lexical``: each lexical candidate's BM25 (each side's own
    candidate list, not cross-scored). A chunk's score is ``(1 - lexical_weight) / (rrf_k + its dense rank)
    + lexical_weight / (rrf_k + its lexical rank)``, ranks from 1 (``competition_ranks``); a side that did
    not bring the chunk adds nothing. With one side empty the order is the other side's.
    """
    if rrf_k < 1:
        raise ValueError("rrf_k must be >= 1")
    dense_ranks, lexical_ranks = competition_ranks(dense), competition_ranks(lexical)
    scored = [
        (
            cid,
            ((1.0 - lexical_weight) / (rrf_k + dense_ranks[cid]) if cid in dense_ranks else 0.0)
            + (lexical_weight / (rrf_k + lexical_ranks[cid]) if cid in lexical_ranks else 0.0),
        )
        for cid in set(dense_ranks) | set(lexical_ranks)
    ]
    scored.sort(key=lambda item: (-item[1], item[0]))
    return scored


def check_params(params: LexicalParams) -> LexicalParams:
    """``params`` if every field is in range (the index_profile CHECKs); ValueError naming the field otherwise."""
    check_mode(params.search_mode)
    if not 0.0 <= params.lexical_weight <= 1.0:
        raise ValueError("lexical_weight must be between 0 and 1")
    if params.bm25_k1 < 0:
        raise ValueError("bm25_k1 must be >= 0")
    if not 0.0 <= params.bm25_b <= 1.0:
        raise ValueError("bm25_b must be between 0 and 1")
    check_fusion(params.fusion)
    check_analyzer(params.analyzer)
    if isinstance(params.rrf_k, bool) or not isinstance(params.rrf_k, int) or not 1 <= params.rrf_k <= MAX_RRF_K:
        raise ValueError(f"rrf_k must be an integer between 1 and {MAX_RRF_K}")
    return params


def check_fusion(fusion: str) -> str:
    """``fusion`` if it is one of FUSIONS; ValueError otherwise."""
    if fusion not in FUSIONS:
        raise ValueError(f"fusion must be one of {', '.join(FUSIONS)}")
    return fusion


def check_mode(mode: str) -> str:
    """``mode`` if it is one of MODES; ValueError otherwise."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}")
    return mode


def bm25_matrix(
    chunk_terms: Sequence[Mapping[int, int]], query_terms: Iterable[Iterable[int]], k1: float, b: float
):  # -> numpy array (queries x chunks)
    """BM25 of every query against every chunk, in memory, over the same ``scoring_terms`` search uses (the
    quality gate's lexical side), rounded to 1e-9 as the search statements round each chunk's sum
    (sql/queries/lexical.sql), so a tie the gate sees is the tie search breaks by chunk id."""
    import numpy as np
    from scipy import sparse

    vocab: dict[int, int] = {}
    rows, cols, tfs = [], [], []
    lengths = np.array([sum(t.values()) for t in chunk_terms], dtype=np.float64)
    for i, terms in enumerate(chunk_terms):
        for term, tf in terms.items():
            rows.append(i)
            cols.append(vocab.setdefault(term, len(vocab)))
            tfs.append(tf)
    n = len(chunk_terms)
    df = np.bincount(np.asarray(cols, dtype=np.int64), minlength=len(vocab))
    avg = float(lengths.mean()) if n else 0.0
    r, c, tf = np.asarray(rows, dtype=np.int64), np.asarray(cols, dtype=np.int64), np.asarray(tfs, dtype=np.float64)
    norm = k1 * (1.0 - b + b * lengths[r] / avg) if avg > 0 else np.full(len(r), k1)
    weights = sparse.csr_matrix((tf * (k1 + 1.0) / (tf + norm), (r, c)), shape=(n, len(vocab)))
    q_rows, q_cols, q_vals = [], [], []
    queries = [set(q) for q in query_terms]
    for i, terms in enumerate(queries):
        known = {t: int(df[vocab[t]]) for t in terms if t in vocab}
        for term in scoring_terms(known, n):
            j = vocab.get(term)
            if j is not None:
                q_rows.append(i)
                q_cols.append(j)
                q_vals.append(idf(n, int(df[j])))
    q = sparse.csr_matrix((q_vals, (q_rows, q_cols)), shape=(len(queries), len(vocab)))
    return np.round(np.asarray((q @ weights.T).todense()) * 1e9) / 1e9


def fuse_matrix(cosines, bm25, lexical_weight: float):  # numpy arrays (queries x chunks) -> same shape
    """``fuse`` over whole score matrices (the quality gate scores every chunk): bm25 normalised by each
    query's best chunk, cosine clipped at 0."""
    import numpy as np

    top = bm25.max(axis=1, keepdims=True) if bm25.size else np.zeros((bm25.shape[0], 1))
    lexical = np.divide(bm25, top, out=np.zeros_like(bm25, dtype=np.float64), where=top > 0)
    return lexical_weight * lexical + (1.0 - lexical_weight) * np.clip(cosines, 0.0, None)


def rrf_matrix(cosines, bm25, rrf_k: int, lexical_weight: float, depth: int):  # numpy (queries x chunks) -> same
    """``fuse_rrf`` over whole score matrices (the quality gate scores every chunk), as search fuses: each side
    contributes only for its ``depth`` best chunks (search's candidate lists, ``hybrid_depth``), ranks shared by
    ties (``competition_ranks``), and the lexical side only for chunks with a BM25 above 0 (a chunk sharing no
    term with the query is not a lexical candidate)."""
    import numpy as np
    from scipy.stats import rankdata

    out = np.zeros(cosines.shape, dtype=np.float64)
    if not cosines.size:
        return out
    dense_rank = rankdata(-cosines, method="min", axis=1)
    out += np.where(dense_rank <= depth, (1.0 - lexical_weight) / (rrf_k + dense_rank), 0.0)
    lexical_rank = rankdata(-bm25, method="min", axis=1)
    out += np.where((lexical_rank <= depth) & (bm25 > 0), lexical_weight / (rrf_k + lexical_rank), 0.0)
    return out
