"""Publishing a burst: ``Publisher.publish_many`` (one transaction, as `kbindex publish DIR` sends a folder) beside
``Publisher.publish`` called once per document, on the same documents, interleaved.

``python -m bench.publish [--corpus ../shared/corpus] [--docs 1000] [--rounds 3] [--http | --manifest [--metadata-bytes B]]
[--delay-ms D] [--json out.json]``

``--delay-ms D`` puts a slow link between the publisher and PostgreSQL (issue #32): bench/relay.py on 127.0.0.1,
D ms each way, in front of the scratch server's Unix socket (the embedded server only), so every round trip a
side makes costs 2 x D more. The tenant lookups that time each side go to the server directly.

``--http`` publishes through the API instead, served by uvicorn on 127.0.0.1 in this process: ``POST /documents``
(the batch endpoint, batches cut as the CLI cuts them) beside ``POST /documents/{id}/versions`` once per document.
``--manifest``: ``POST /documents`` both ways, each document with metadata and an allow list of the same sizes,
given once per batch (the shared ``metadata`` and ``allow`` parts) or per document (a ``manifest`` part): what
reading a manifest costs. ``--metadata-bytes B`` pads each version's metadata to about B bytes on both sides (the
limit is 8 KiB a version), so a batch of 1,000 sends a manifest near the API's 4-MiB limit at B = 4000.

Each round publishes the documents into a fresh tenant each way (so both sides create every version, task and
event; the blobs are shared by content hash: the first side of the first round stores them, later sides find
them), alternating which side goes first. Besides the wall time it prints how many writing transactions each
side made (a burst in one is due at once). Without the corpus it publishes generated paragraphs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack, contextmanager
from functools import partial
from pathlib import Path
from typing import Any

from bench import exit_on_sigterm, server_url
from bench.relay import url_through_relay
from pipelines.domain.metadata import MAX_STRING_CHARS

SIDES = ("publish_many", "publish each")
HTTP_SIDES = ("POST /documents", "POST each")
MANIFEST_SIDES = ("shared metadata", "manifest")


def documents(corpus: Path | None, n: int) -> list[tuple[str, bytes]]:
    """``n`` one-paragraph documents: cut from the corpus when given, else generated."""
    if corpus is not None and (corpus / "en-sotu").is_dir():
        from bench.scale.small_docs import paragraph_documents

        return paragraph_documents(corpus, n)
    return [(f"para-{i:06d}.txt", f"Paragraph {i}. Policy {i % 97} applies to team {i % 13}.".encode())
            for i in range(n)]


def _publish(publisher: Any, side: str, tenant: str, docs: list[tuple[str, bytes]]) -> None:
    from resources.publisher import PublishRequest

    if side == "publish_many":
        publisher.publish_all(tenant, [PublishRequest(n, b, n) for n, b in docs])  # publish_many, refusals raised
    else:
        for name, body in docs:
            publisher.publish(tenant, name, body, name)


def _post(http: Any, side: str, tenant: str, docs: list[tuple[str, bytes]], metadata_bytes: int = 0) -> int:
    """Publishes ``docs``; returns the largest metadata-carrying part sent (manifest or shared metadata), bytes."""
    from urllib.parse import quote

    from resources.publisher import batched

    headers = {"Authorization": f"Bearer tok-{tenant}"}
    largest = 0
    if side == "POST /documents":
        for batch in batched(docs, size=lambda d: len(d[1])):
            response = http.post("/documents", files=[("file", (n, b, "text/plain")) for n, b in batch], headers=headers)
            if response.status_code != 202 or any(r["status"] != 202 for r in response.json()["results"]):
                raise RuntimeError(f"batch publish answered {response.status_code}: {response.text[:300]}")
    elif side in MANIFEST_SIDES:
        for batch in batched(docs, size=lambda d: len(d[1])):
            files = [("file", (n, b, "text/plain")) for n, b in batch]
            if side == "manifest":  # each document its own values, as long as the shared ones
                entries = {n: {"metadata": _metadata(i, metadata_bytes), "allow": _allow(i)}
                           for i, (n, _) in enumerate(batch)}
                parts = {"manifest": json.dumps(entries)}
            else:
                parts = {"metadata": json.dumps(_metadata(0, metadata_bytes)), "allow": json.dumps(_allow(0))}
            largest = max(largest, len(next(iter(parts.values())).encode()))
            response = http.post("/documents", files=files, data=parts, headers=headers)
            if response.status_code != 202 or any(r["status"] != 202 for r in response.json()["results"]):
                raise RuntimeError(f"batch publish answered {response.status_code}: {response.text[:300]}")
    else:
        for name, body in docs:
            response = http.post(f"/documents/{quote(name, safe='/')}/versions",
                                 files={"file": (name, body, "text/plain")}, headers=headers)
            if response.status_code != 202:
                raise RuntimeError(f"publish answered {response.status_code}: {response.text[:300]}")
    return largest


def _metadata(i: int, size: int = 0) -> dict[str, str]:
    """A version's metadata; ``size``: padded to about that many bytes of JSON with ``notes_N`` strings (a string
    holds at most 1,000 characters)."""
    values = {"dept": f"dept-{i % 7:02d}", "owner": f"owner-{i % 13:03d}"}
    while (short := size - len(json.dumps(values))) > 0:
        key = f"notes_{len(values) - 2}"
        values[key] = "n" * max(0, min(MAX_STRING_CHARS, short - len(json.dumps({key: ""}))))
    return values


def _allow(i: int) -> list[str]:
    return [f"group:g{i % 5}", "user:auditor"]


def _tenant(r: int, side: str) -> str:
    return f"r{r}-{'many' if side in ('publish_many', 'POST /documents', 'shared metadata') else 'each'}"


def run(corpus: Path | None, n: int, rounds: int, out: Any = print, http: bool = False,
        manifest: bool = False, metadata_bytes: int = 0, delay_ms: float = 0) -> dict[str, Any]:
    from rich.progress import Progress

    from bench.pipeline.__main__ import scratch_databases
    from resources.blob_store import BlobStore
    from resources.database import Database
    from resources.publisher import Publisher

    docs = documents(corpus, n)
    http = http or manifest
    sides = MANIFEST_SIDES if manifest else HTTP_SIDES if http else SIDES
    samples: dict[str, list[dict[str, float]]] = {side: [] for side in sides}
    with server_url() as admin_url, scratch_databases(admin_url) as (kb_url, _), \
            Database(kb_url, max_size=2) as db, tempfile.TemporaryDirectory() as blobs, ExitStack() as stack:
        if http:
            import httpx

            from bench.http_server import serve
            from pipelines.api import create_app

            tenants = [_tenant(r, side) for r in range(rounds) for side in sides]
            app = create_app(kb_url, tokens={f"tok-{t}": t for t in tenants}, tokens_file="", blob_url=blobs,
                             artifacts_dir=str(Path(blobs) / "artifacts"))
            stack.callback(app.state.close)
            url = stack.enter_context(contextmanager(serve)(app))
            client = stack.enter_context(httpx.Client(base_url=url, timeout=300))
            publish = partial(_post, client, metadata_bytes=metadata_bytes)
        else:
            publish_url = url_through_relay(kb_url, delay_ms, stack) if delay_ms else kb_url
            publish_db = stack.enter_context(Database(publish_url, max_size=2)) if delay_ms else db
            publish = partial(_publish, Publisher(publish_db, BlobStore(blobs)))
        with Progress(transient=True, disable=not sys.stderr.isatty()) as bar:
            job = bar.add_task("publishing", total=rounds * len(sides))
            for r in range(rounds):
                for side in sides if r % 2 == 0 else sides[::-1]:
                    tenant = _tenant(r, side)
                    started = time.perf_counter()
                    sent = publish(side, tenant, docs) or 0
                    seconds = time.perf_counter() - started
                    row = db.fetch_one("bench_publish_burst", {"tenant_id": tenant})
                    samples[side].append({"seconds": seconds, "versions": row["versions"],
                                          "transactions": row["transactions"], "with_metadata": row["with_metadata"],
                                          "distinct_allow": row["distinct_allow"], "largest_part_bytes": sent})
                    out(f"round {r + 1}/{rounds} {side:<13} {seconds:6.2f} s  {row['transactions']} transaction(s)"
                        + (f", largest metadata part {sent:,} bytes" if manifest else ""))
                    bar.advance(job)
    report: dict[str, Any] = {"docs": len(docs), "rounds": rounds, "samples": samples, "sides": list(sides),
                              "delay_ms": delay_ms}
    report["median_seconds"] = {side: statistics.median(s["seconds"] for s in samples[side]) for side in sides}
    report["ratio"] = report["median_seconds"][sides[1]] / report["median_seconds"][sides[0]]
    report["metadata"] = {side: [s["with_metadata"] for s in samples[side]] for side in sides}
    report["distinct_allow"] = {side: [s["distinct_allow"] for s in samples[side]] for side in sides}
    return report


def render(report: dict[str, Any]) -> str:
    sides = report.get("sides", SIDES)
    link = f", through a relay adding {report['delay_ms']:g} ms each way" if report.get("delay_ms") else ""
    lines = [f"{report['docs']} one-paragraph documents, {report['rounds']} interleaved round(s){link}"]
    for side in sides:
        s = report["samples"][side]
        secs = [x["seconds"] for x in s]
        lines.append(f"{side:<13} median {statistics.median(secs):.2f} s ({min(secs):.2f}-{max(secs):.2f}), "
                     f"{statistics.median(x['transactions'] for x in s):.0f} writing transaction(s), "
                     f"{s[0]['versions']} versions")
    lines.append(f"{sides[1]} / {sides[0]}  {report['ratio']:.2f}x")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.publish", description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", type=Path, default=None, help="../shared/corpus (without it: generated text)")
    parser.add_argument("--docs", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    way = parser.add_mutually_exclusive_group()
    way.add_argument("--http", action="store_true", help="through the API: POST /documents vs one POST each")
    way.add_argument("--manifest", action="store_true",
                     help="through the API, POST /documents both ways: per-document manifest vs shared metadata")
    parser.add_argument("--metadata-bytes", type=int, default=0,
                        help="with --manifest: each version's metadata padded to about this many bytes (both sides)")
    parser.add_argument("--delay-ms", type=float, default=0,
                        help="in process only: publish through a local relay adding this many ms each way")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.metadata_bytes and not args.manifest:
        parser.error("--metadata-bytes goes with --manifest")
    if args.delay_ms and (args.http or args.manifest):
        parser.error("--delay-ms goes with the in-process sides (not --http or --manifest)")
    exit_on_sigterm()
    report = run(args.corpus, args.docs, args.rounds, out=lambda line: print(line, flush=True), http=args.http,
                 manifest=args.manifest, metadata_bytes=args.metadata_bytes, delay_ms=args.delay_ms)
    print(render(report))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
