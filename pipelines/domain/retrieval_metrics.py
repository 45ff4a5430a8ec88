"""Retrieval quality measures for the profile quality gate: nDCG@k and recall@k, pure functions.

``rankings`` maps a query id to the document ids it retrieved, best first; ``qrels`` maps a query id
to ``{document id: graded relevance}`` (BEIR ``qrels/test.tsv``). Gains are linear (``rel /
log2(rank + 1)``, as trec_eval and BEIR compute them); documents with relevance <= 0 are not
relevant. Only queries with at least one relevant document are scored, each counting once; a query
the system did not answer scores 0. Scores are means over those queries.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

DEFAULT_K = 10


@dataclass(frozen=True)
class RetrievalScores:
    """Mean nDCG@k and recall@k over ``queries`` judged queries."""

    ndcg: float
    recall: float
    queries: int
    k: int = DEFAULT_K

    def to_dict(self) -> dict[str, float | int]:
        return {"ndcg": self.ndcg, "recall": self.recall, "queries": self.queries, "k": self.k}


def _relevant(judgements: Mapping[str, float]) -> dict[str, float]:
    return {doc: float(rel) for doc, rel in judgements.items() if rel > 0}


def _dedupe(ranked: Sequence[str]) -> list[str]:
    """A document retrieved twice counts once, at its best rank."""
    seen: set[str] = set()
    return [d for d in ranked if not (d in seen or seen.add(d))]


def ndcg_at_k(ranked: Sequence[str], judgements: Mapping[str, float], k: int = DEFAULT_K) -> float:
    """Normalized discounted cumulative gain of the first ``k`` of ``ranked`` (0.0 when nothing is relevant)."""
    if k < 1:
        raise ValueError("k must be at least 1")
    relevant = _relevant(judgements)
    if not relevant:
        return 0.0
    dcg = sum(relevant.get(doc, 0.0) / math.log2(i + 2) for i, doc in enumerate(_dedupe(ranked)[:k]))
    ideal = sorted(relevant.values(), reverse=True)[:k]
    idcg = sum(rel / math.log2(i + 2) for i, rel in enumerate(ideal))
    return dcg / idcg


def recall_at_k(ranked: Sequence[str], judgements: Mapping[str, float], k: int = DEFAULT_K) -> float:
    """Share of the relevant documents found in the first ``k`` of ``ranked`` (0.0 when nothing is relevant)."""
    if k < 1:
        raise ValueError("k must be at least 1")
    relevant = _relevant(judgements)
    if not relevant:
        return 0.0
    found = sum(1 for doc in _dedupe(ranked)[:k] if doc in relevant)
    return found / len(relevant)


def evaluate(
    rankings: Mapping[str, Sequence[str]], qrels: Mapping[str, Mapping[str, float]], k: int = DEFAULT_K
) -> RetrievalScores:
    """Mean nDCG@k and recall@k over the queries of ``qrels`` that have a relevant document."""
    judged = [q for q, judgements in qrels.items() if _relevant(judgements)]
    if not judged:
        raise ValueError("no query has a relevant document: nothing to evaluate")
    ndcg = sum(ndcg_at_k(rankings.get(q, ()), qrels[q], k) for q in judged) / len(judged)
    recall = sum(recall_at_k(rankings.get(q, ()), qrels[q], k) for q in judged) / len(judged)
    return RetrievalScores(ndcg=ndcg, recall=recall, queries=len(judged), k=k)


_EPSILON = 1e-12  # float noise must not fail a gate that is exactly at the tolerance


def gate_passed(shadow: RetrievalScores, active: RetrievalScores, tolerance: float) -> bool:
    """The quality gate: the shadow recipe is no worse than the active one by more than ``tolerance``
    on nDCG@k and on recall@k (an improvement always passes)."""
    if not 0.0 <= tolerance <= 1.0:
        raise ValueError("tolerance must be between 0 and 1")
    return (
        shadow.ndcg >= active.ndcg - tolerance - _EPSILON
        and shadow.recall >= active.recall - tolerance - _EPSILON
    )
