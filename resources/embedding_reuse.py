"""Incremental re-embedding: a new version embeds only the chunks whose embedded text is new.

    embed_with_reuse(db, embedder, tenant_id=, profile=, model=, dimension=, texts=, batch_size=)
        -> (vectors in input order, ReuseStats(reused, embedded, calls))

Every chunk row records ``embed_digest`` = sha256 of the exact text its vector was computed from
(``Chunk.embed_text``: heading prefix + text; written by resources/index_sink.py). Before embedding,
the digests of the new texts are looked up among the stored chunks of the SAME tenant under the SAME
profile (``chunk_reuse_lookup``: the newest stored copy of each digest, one index probe per distinct
digest however many versions repeat the text); a hit's stored vector is used as is, byte for byte, and
only the misses go through ``checked_embed``. Why it stays correct:

- A profile fixes one model and one dimension, and the lookup also requires the profile row to still
  name the task's model and dimension, so a reused vector is one this model computed (invariant 6).
  Profiles never share vectors (a model migration builds a new profile from scratch) and tenants
  never see each other's rows.
- Stored vectors were validated by checked_embed before the publish transaction wrote them; they are
  checked again here (dimension, finite, unit length); one that fails is embedded again instead.
- The digest covers the exact embedded text, not the normalized content digest: two texts that
  normalize the same but differ in whitespace embed differently, and are embedded separately.
- Duplicate texts inside one request are embedded once.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from resources.database import Database
from resources.embedder import NORM_TOLERANCE, Embedder, checked_embed

LOOKUP_BATCH = 1000


def embed_digest(text: str) -> str:
    """sha256 (hex) of the exact text a vector is computed from; equals the SQL
    ``encode(sha256(convert_to(text, 'UTF8')), 'hex')``."""
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


@dataclass(frozen=True)
class ReuseStats:
    """How many texts took a stored vector, how many were embedded, and in how many embed calls."""

    reused: int
    embedded: int
    calls: int

    def to_dict(self) -> dict[str, int]:
        return {"reused": self.reused, "embedded": self.embedded, "calls": self.calls}


def stored_vectors(
    db: Database, *, tenant_id: str, profile: str, model: str, dimension: int, digests: Sequence[str]
) -> dict[str, np.ndarray]:
    """The stored vector of each digest found under (tenant, profile), if the profile uses ``model``/``dimension``."""
    wanted = sorted(set(digests))
    found: dict[str, np.ndarray] = {}
    with db.session() as s:
        for start in range(0, len(wanted), LOOKUP_BATCH):
            rows = s.fetch_all(
                "chunk_reuse_lookup",
                {
                    "tenant_id": tenant_id,
                    "profile": profile,
                    "model": model,
                    "dimension": dimension,
                    "digests": wanted[start : start + LOOKUP_BATCH],
                },
            )
            for row in rows:
                vector = _as_vector(row["embedding"], dimension)
                if vector is not None:
                    found[row["embed_digest"]] = vector
    return found


def embed_with_reuse(
    db: Database,
    embedder: Embedder,
    *,
    tenant_id: str,
    profile: str,
    model: str,
    dimension: int,
    texts: Sequence[str],
    batch_size: int,
    on_batch: Callable[[int, int], None] | None = None,
) -> tuple[np.ndarray, ReuseStats]:
    """Vectors for ``texts`` (shape (len(texts), dimension), float32, input order), embedding only the new ones.

    Raises what ``checked_embed`` raises (EmbeddingInvalidResponse on a wrong model, count, order or
    dimension; the transient codes on provider trouble). ``on_batch(done, total)`` counts over all of ``texts``: once after the lookup
    (if anything was reused) and after every embedded batch, e.g. to heartbeat the lease.
    """
    if batch_size < 1:
        raise ValueError("batch_size must be >= 1")
    texts = list(texts)
    total = len(texts)
    digests = [embed_digest(t) for t in texts]
    found = stored_vectors(db, tenant_id=tenant_id, profile=profile, model=model, dimension=dimension, digests=digests)

    # The distinct texts that have no stored vector, in first-seen order.
    missing: dict[str, str] = {}
    for digest, text in zip(digests, texts, strict=True):
        if digest not in found and digest not in missing:
            missing[digest] = text
    reused = sum(1 for d in digests if d in found)
    if on_batch is not None and reused:
        on_batch(reused, total)

    calls = 0

    def progress(done: int, _: int) -> None:
        nonlocal calls
        calls += 1
        if on_batch is not None:
            on_batch(min(total, reused + done), total)

    new_texts = list(missing.values())
    if new_texts:
        fresh = checked_embed(
            embedder,
            new_texts,
            expected_model=model,
            expected_dim=dimension,
            batch_size=batch_size,
            on_batch=progress,
        )
        found.update(zip(missing.keys(), fresh, strict=True))

    out = np.empty((total, dimension), dtype=np.float32)
    for i, digest in enumerate(digests):
        out[i] = found[digest]
    return out, ReuseStats(reused=reused, embedded=len(new_texts), calls=calls)


def _as_vector(value: object, dimension: int) -> np.ndarray | None:
    """A stored embedding as float32, or None (embed it again) unless it fits the profile:
    right size, finite, unit length."""
    vector = np.asarray(getattr(value, "to_numpy", lambda: value)(), dtype=np.float32)
    if vector.shape != (dimension,) or not np.isfinite(vector).all():
        return None
    if abs(float(np.linalg.norm(vector)) - 1.0) > NORM_TOLERANCE:
        return None
    return vector
