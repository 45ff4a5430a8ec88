"""``python -m bench.peers --corpus ../shared/corpus --docs 150``: kbindex beside LlamaIndex (see __init__)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from bench.peers import EDIT_SHARE, PeersUnavailable, render, run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.peers", description=__doc__)
    parser.add_argument("--corpus", type=Path, default=Path("../shared/corpus"),
                        help="folder with en-peps/ and en-sotu/ (default ../shared/corpus)")
    parser.add_argument("--docs", type=int, default=150)
    parser.add_argument("--edit-share", type=float, default=EDIT_SHARE, help="share of documents edited (0.10)")
    parser.add_argument("--batch-size", type=int, default=int(os.environ.get("KBINDEX_EMBED_BATCH", "64")))
    parser.add_argument("--no-bare-parallel", dest="bare_parallel", action="store_false",
                        help="bare model.encode in one process only (not also one process per core)")
    parser.add_argument("--no-kbindex", dest="kbindex", action="store_false",
                        help="LlamaIndex only: no kbindex re-run/edit rounds (no database)")
    parser.add_argument("--kbindex-model", default=None,
                        help="model of kbindex's scratch profile (default: the packaged one; fake-384: counts only)")
    parser.add_argument("--json", type=Path, default=None, help="also write the report here as JSON")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

    from bench.pipeline.__main__ import BenchSkipped, select_documents

    try:
        files = select_documents(args.corpus, args.docs)
    except BenchSkipped as exc:
        print(f"bench.peers skipped: {exc}")
        return 0
    documents = [(p.name, p.read_bytes()) for p in files]
    try:
        report = run(documents, batch_size=args.batch_size, edit_share=args.edit_share,
                     bare_parallel=args.bare_parallel, kbindex=args.kbindex, kbindex_model=args.kbindex_model,
                     out=lambda line: print(line, flush=True))
    except PeersUnavailable as exc:
        print(f"bench.peers skipped: {exc}")
        return 0
    print(render(report))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
