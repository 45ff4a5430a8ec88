"""Interleaved passes of bench.pipeline and bench.scale.small_docs: pipeline, bare encode, bare system, repeated.

Each pass publishes the same documents to a tenant of its own (embedding reuse and chunk ids are per
tenant, so every pass does the same work) through the running ``dagster dev``; then, with Dagster and the
embedding service left idle (not paused: a SIGSTOPped code server
misses its heartbeats and shuts down; their idle CPU over the bare phases is reported), bare ``model.encode`` of the pass's distinct texts (bench/pipeline/bare.py:
one process, and one process per core; the faster is the yardstick) and the bare system (bare_system.py:
the same documents into the same tenant of a fresh scratch database, plain SQL, no Dagster, no queue).
Both databases then hold the tenant's rows; the counts are compared (equal work on both sides). Both keep
their earlier passes' tenants, so from pass 2 on both insert vectors equal to pass 1's, which pgvector's HNSW
stores as extra heap TIDs of the existing elements (no neighbour updates): cheaper than a first index, and
alike on both sides (bench/scale/migration.py had that on one side only).

Two ratios per pass, each as a throughput ratio on the same work:
``pipeline / bare encode`` = (distinct texts / pipeline wall) / bare encode's texts/s, and
``pipeline / bare system`` = bare system seconds / pipeline wall (the same documents, the same rows).
The report gives the median of each over the passes with its min-max.
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Callable, Sequence
from typing import Any

from bench.pipeline.bare import bare_encode, bare_encode_parallel
from bench.cpu import CpuMeter, render_parts
from bench.pipeline.bare_system import BareSystem, rows_of_tenant

ROWS = ("chunks", "lexical", "postings", "pointers")


def pass_tenant(base: str, i: int) -> str:
    """Pass 1 keeps ``base`` (the figures of the single-pass report), pass i its own tenant."""
    return base if i == 0 else f"{base}-pass{i + 1}"


def interleaved_passes(bench: Any, documents: Sequence[tuple[str, bytes]], *, passes: int, admin_url: str,
                       model: str, embed_batch: int, tenant: str, timeout: float,
                       idle_pids: Callable[[], list[int | None]], bare_parallel: bool = True,
                       out: Callable[[str], None] = print) -> list[dict[str, Any]]:
    """``passes`` rounds of (pipeline burst, bare encode, bare system); one dict per pass."""
    bare = BareSystem(admin_url, model)
    results: list[dict[str, Any]] = []
    try:
        for i in range(passes):
            name = pass_tenant(tenant, i)
            out(f"pass {i + 1}/{passes}: pipeline ({name})…")
            t = bench.throughput(list(documents), timeout, tenant=name)
            t["dagster"] = bench.runs(name)
            texts = bench.embed_texts(name)
            unique = list(dict.fromkeys(texts))
            idle = CpuMeter(dict(zip(("Dagster", "embedding service"), idle_pids(), strict=True)), parts_of="Dagster")
            idle.start()
            out(f"pass {i + 1}/{passes}: bare model.encode of {len(unique)} distinct texts…")
            one = bare_encode(unique, model, embed_batch)
            many = bare_encode_parallel(unique, model, embed_batch, os.cpu_count() or 1) if bare_parallel else None
            out(f"pass {i + 1}/{passes}: bare system ({len(documents)} documents into a scratch database)…")
            system = bare.run(name, documents)
            spent = idle.spent()
            spent.pop("bench client", None)
            idle_parts = idle.parts_spent()
            results.append(pass_figures(t, texts, one, many, system,
                                        rows_of_tenant(bench.kb_url, name), bare.rows(name)))
            results[-1]["idle_during_bare"] = spent
            results[-1]["idle_dagster_parts"] = idle_parts
    finally:
        bare.close()
    return results


def pass_figures(t: dict[str, Any], texts: list[str], one: dict[str, Any], many: dict[str, Any] | None,
                 system: dict[str, Any], pipeline_rows: dict[str, int], bare_rows: dict[str, int]) -> dict[str, Any]:
    distinct = len(dict.fromkeys(texts))
    fastest = max((b for b in (one, many) if b), key=lambda b: b["chunks_per_second"])
    wall = t["wall_seconds"]
    texts_per_second = distinct / wall if wall else 0.0
    return {
        "throughput": t,
        "chunks": len(texts),
        "distinct_texts": distinct,
        "bare_one_process": one,
        "bare_processes": many,
        "bare_encode": fastest,
        "bare_system": system,
        "ratio_encode": _figure(texts_per_second / fastest["chunks_per_second"]) if fastest["chunks_per_second"] else None,
        "ratio_system": _figure(system["seconds"] / wall) if wall else None,
        "rows": {"pipeline": pipeline_rows, "bare_system": bare_rows},
        "equal_work": pipeline_rows == bare_rows and system["chunks"] == len(texts),
    }


def _figure(ratio: float) -> float:
    """Three significant digits: the fake model's bare encode takes milliseconds, and three decimals made its
    ratio 0.0."""
    return float(f"{ratio:.3g}")


def spread(values: list[float | None]) -> dict[str, Any]:
    known = [v for v in values if v is not None]
    if not known:
        return {"median": None, "min": None, "max": None, "values": values}
    return {"median": _figure(statistics.median(known)), "min": min(known), "max": max(known), "values": values}


def summary(passes: list[dict[str, Any]]) -> dict[str, Any]:
    """Median and min-max of both ratios over the passes, and whether every pass did equal work."""
    return {
        "passes": len(passes),
        "ratio_encode": spread([p["ratio_encode"] for p in passes]),
        "ratio_system": spread([p["ratio_system"] for p in passes]),
        "equal_work": all(p["equal_work"] for p in passes),
    }


def render(passes: list[dict[str, Any]], floor: dict[str, Any]) -> str:
    lines = [f"passes               {floor['passes']} interleaved: pipeline, bare encode, bare system (a tenant each)"]
    for i, p in enumerate(passes):
        t, e, s = p["throughput"], p["bare_encode"], p["bare_system"]
        cpu = t["cpu_seconds"]
        lines.append(
            f"  pass {i + 1}  pipeline {t['wall_seconds']:.1f} s ({sum(cpu.values()):.1f} core-s: "
            + ", ".join(f"{k} {v:.1f}" for k, v in cpu.items())
            + f") | bare encode {e['seconds']:.2f} s ({e['cpu_seconds']:.2f} core-s, "
            f"{e.get('processes', 1)} process(es)) | bare system {s['seconds']:.1f} s ("
            + ", ".join(f"{k} {v:.2f}" for k, v in s["core_seconds"].items())
            + " core-s; " + ", ".join(f"{k} {v:.2f} s" for k, v in s["part_seconds"].items()) + ")"
            f" | ratios encode {p['ratio_encode']} system {p['ratio_system']}"
            + (" | idle meanwhile " + ", ".join(f"{k} {v:.1f} core-s" for k, v in p["idle_during_bare"].items())
               if p.get("idle_during_bare") else ""))
        if t.get("dagster_parts"):
            lines.append(f"          Dagster by part: {render_parts(t['dagster_parts'])}")
        if p.get("idle_dagster_parts"):
            lines.append(f"          Dagster idle by part, over the bare phases: {render_parts(p['idle_dagster_parts'])}")
    for key, label in (("ratio_encode", "pipeline / bare encode"), ("ratio_system", "pipeline / bare system")):
        r = floor[key]
        lines.append(f"{label:<22} median {r['median']}  (min {r['min']} - max {r['max']} over {floor['passes']} passes)")
    rows = passes[0]["rows"]["pipeline"] if passes else {}
    lines.append(f"equal work           {'yes' if floor['equal_work'] else 'NO'}: pipeline rows "
                 f"{[p['rows']['pipeline'] for p in passes] if not floor['equal_work'] else rows}"
                 + ("" if floor["equal_work"] else f", bare system rows {[p['rows']['bare_system'] for p in passes]}")
                 + " (chunks, lexical rows, postings, pointers per pass)")
    return "\n".join(lines)
