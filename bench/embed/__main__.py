"""``python -m bench.embed``: local embedding backends side by side (see __init__)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from bench.embed.workers import make_embedder, throughput  # noqa: E402
from resources.derived_models import (  # noqa: E402
    DERIVED_MODELS,
    INT8_MODEL_NAME,
    ONNX_MODEL_NAME,
    OPENVINO_MODEL_NAME,
    ensure_built,
)
from resources.embedder import PACKAGED_MODEL_NAME  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
BACKENDS = (PACKAGED_MODEL_NAME, ONNX_MODEL_NAME, OPENVINO_MODEL_NAME, INT8_MODEL_NAME)
LAYOUTS = ((1, 2), (2, 1))  # (processes, threads per process)
NDCG_TOLERANCE = 0.005
CHUNK_TOKENS, OVERLAP = 200, 32  # the default profile's


def chunk_texts(folder: Path, pattern: str, docs: int, max_chunks: int) -> list[str]:
    """Distinct ``embed_text`` of the chunks of ``docs`` files matching ``pattern``, spread over the folder."""
    from pipelines.domain.chunking import VersionIdentity, chunk_document
    from pipelines.domain.parsing import parse_document
    from resources.embedder import tokenizer_for_model

    files = sorted(folder.glob(pattern))
    if docs and len(files) > docs:
        files = [files[i * len(files) // docs] for i in range(docs)]
    tokenizer = tokenizer_for_model(PACKAGED_MODEL_NAME)
    texts: dict[str, None] = {}
    for file in files:
        parsed = parse_document(file.read_bytes(), filename=file.name)
        for chunk in chunk_document(parsed, tokenizer=tokenizer, chunk_tokens=CHUNK_TOKENS, overlap=OVERLAP,
                                    identity=VersionIdentity("bench", file.name, 1, "bench")):
            texts.setdefault(chunk.embed_text, None)
    distinct = list(texts)
    if max_chunks and len(distinct) > max_chunks:  # evenly spread, so every document's lengths count
        distinct = [distinct[i * len(distinct) // max_chunks] for i in range(max_chunks)]
    return distinct


def ndcg(model: str, home: str, eval_dir: Path) -> dict[str, float]:
    """nDCG@10 and recall@10 of a default profile on ``model``, dense ranking, as the quality gate scores it."""
    from resources.profiles import evaluate_profile, load_eval_set

    profile = {"name": "bench", "model": model, "dimension": 384, "chunk_tokens": CHUNK_TOKENS,
               "chunk_overlap": OVERLAP, "search_mode": "dense"}
    started = time.perf_counter()
    scores = evaluate_profile(profile, load_eval_set(eval_dir), embedder=make_embedder(model, home, None), mode="dense")
    return {"ndcg": round(scores.ndcg, 4), "recall": round(scores.recall, 4), "queries": scores.queries,
            "seconds": round(time.perf_counter() - started, 1)}


def recommend(rows: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    """The fastest backend whose nDCG@10 is within NDCG_TOLERANCE of torch's, with its speed-up over torch."""
    torch = rows.get(PACKAGED_MODEL_NAME)
    if torch is None or "ndcg" not in torch:
        return None
    floor = torch["ndcg"]["ndcg"] - NDCG_TOLERANCE
    fit = [m for m, r in rows.items() if "ndcg" in r and r["ndcg"]["ndcg"] >= floor and r.get("best_chunks_per_second")]
    if not fit:
        return None
    best = max(fit, key=lambda m: rows[m]["best_chunks_per_second"])
    return {"backend": best, "layout": rows[best]["best_layout"],
            "chunks_per_second": rows[best]["best_chunks_per_second"],
            "speedup_vs_torch": round(rows[best]["best_chunks_per_second"] / torch["best_chunks_per_second"], 2)
            if torch.get("best_chunks_per_second") else None,
            "ndcg_delta_vs_torch": round(rows[best]["ndcg"]["ndcg"] - torch["ndcg"]["ndcg"], 4)}


def faster_lossier(rows: dict[str, dict[str, Any]], recommended: dict[str, Any] | None) -> dict[str, Any] | None:
    """The fastest backend faster than the recommendation but outside its nDCG tolerance: the issue's
    "faster, lossier" profile, for the quality gate to judge on a corpus of one's own."""
    torch = rows.get(PACKAGED_MODEL_NAME)
    if recommended is None or torch is None or "ndcg" not in torch:
        return None
    faster = [m for m, r in rows.items() if "ndcg" in r and (r.get("best_chunks_per_second") or 0)
              > recommended["chunks_per_second"]]
    if not faster:
        return None
    best = max(faster, key=lambda m: rows[m]["best_chunks_per_second"])
    return {"backend": best, "layout": rows[best]["best_layout"],
            "speedup_vs_recommended": round(rows[best]["best_chunks_per_second"] / recommended["chunks_per_second"], 2),
            "ndcg_delta_vs_torch": round(rows[best]["ndcg"]["ndcg"] - torch["ndcg"]["ndcg"], 4)}


def run(args: argparse.Namespace) -> dict[str, Any]:
    corpus = Path(args.corpus)
    documents = Path(args.documents) if args.documents else corpus / "en-peps"
    eval_dir = Path(args.eval) if args.eval else corpus / "eval" / "xquad-en"
    if not documents.is_dir() or not any(documents.glob(args.pattern)):
        return {"skipped": f"no {args.pattern} files in {documents} (the shared corpus is optional)"}
    home = str(Path(args.home or os.environ.get("KBINDEX_HOME") or ROOT / ".kbindex").resolve())
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    unknown = [b for b in backends if b != PACKAGED_MODEL_NAME and b not in DERIVED_MODELS]
    if unknown:
        raise SystemExit(f"unknown backend(s) {unknown}: known {', '.join((PACKAGED_MODEL_NAME, *DERIVED_MODELS))}")
    layouts = [tuple(int(x) for x in layout.split("x")) for layout in args.layouts.split(",") if layout.strip()]
    texts = chunk_texts(documents, args.pattern, args.docs, args.max_chunks)
    print(f"{len(texts)} distinct chunks from {documents}; models under {home}/models", file=sys.stderr)
    rows: dict[str, dict[str, Any]] = {}
    for model in backends:
        rows[model] = {"layouts": {}}
        if model != PACKAGED_MODEL_NAME:
            started = time.perf_counter()
            ensure_built(model, home)
            rows[model]["build_or_load_seconds"] = round(time.perf_counter() - started, 1)
    for repeat in range(args.repeats):
        for model in backends:
            for processes, threads in layouts:
                speed = throughput(model, home, texts, processes, threads)
                samples = rows[model]["layouts"].setdefault(f"{processes}x{threads}", [])
                samples.append(round(speed, 2))
                print(f"pass {repeat + 1}: {model} {processes}x{threads}: {speed:.1f} chunks/s", file=sys.stderr)
    for model, row in rows.items():
        if row["layouts"]:
            layout, samples = max(row["layouts"].items(), key=lambda kv: max(kv[1]))
            row["best_layout"], row["best_chunks_per_second"] = layout, max(samples)
        if eval_dir.is_dir():
            row["ndcg"] = ndcg(model, home, eval_dir)
            print(f"{model}: nDCG@10 {row['ndcg']['ndcg']}", file=sys.stderr)
    return {"chunks": len(texts), "mean_chars": round(sum(map(len, texts)) / max(1, len(texts))),
            "eval": eval_dir.name if eval_dir.is_dir() else None, "repeats": args.repeats,
            "load_average": [round(x, 2) for x in os.getloadavg()], "cpus": os.cpu_count(),
            "backends": rows, "recommended": (rec := recommend(rows)), "faster_lossier": faster_lossier(rows, rec)}


def table(report: dict[str, Any]) -> str:
    layouts = sorted({lay for row in report["backends"].values() for lay in row["layouts"]})
    head = f"{'backend':<28}" + "".join(f"{lay + ' chunks/s':>16}" for lay in layouts) + f"{'nDCG@10':>10}"
    lines = [head]
    for model, row in report["backends"].items():
        cells = "".join(f"{max(row['layouts'][lay]) if lay in row['layouts'] else '-':>16}" for lay in layouts)
        lines.append(f"{model:<28}{cells}{row.get('ndcg', {}).get('ndcg', '-'):>10}")
    rec = report["recommended"]
    lines.append(f"recommended: {rec['backend']} ({rec['layout']}, {rec['speedup_vs_torch']}x torch, "
                 f"nDCG {rec['ndcg_delta_vs_torch']:+})" if rec else "recommended: none (no torch row or nDCG)")
    fast = report.get("faster_lossier")
    if fast:
        lines.append(f"faster, lossier: {fast['backend']} ({fast['layout']}, {fast['speedup_vs_recommended']}x the "
                     f"recommended, nDCG {fast['ndcg_delta_vs_torch']:+} vs torch): a profile for the quality gate")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.embed", description=__doc__)
    parser.add_argument("--corpus", default=str(ROOT.parent / "shared" / "corpus"))
    parser.add_argument("--documents", help="folder of documents to chunk (default: CORPUS/en-peps)")
    parser.add_argument("--pattern", default="pep-*.rst")
    parser.add_argument("--docs", type=int, default=60, help="documents to chunk, spread over the folder (0: all)")
    parser.add_argument("--max-chunks", type=int, default=1200, help="at most this many distinct chunks (0: all)")
    parser.add_argument("--eval", help="BEIR eval folder for nDCG@10 (default: CORPUS/eval/xquad-en)")
    parser.add_argument("--backends", default=",".join(BACKENDS))
    parser.add_argument("--layouts", default=",".join(f"{p}x{t}" for p, t in LAYOUTS),
                        help="PxT: P processes x T threads each")
    parser.add_argument("--repeats", type=int, default=2, help="interleaved passes (best of)")
    parser.add_argument("--home", help="where derived models are built and cached (default: KBINDEX_HOME)")
    parser.add_argument("--json", help="also write the report here")
    args = parser.parse_args(argv)
    report = run(args)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2), encoding="utf-8")
    if "skipped" in report:
        print(f"skipped: {report['skipped']}")
        return 0
    print(table(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
