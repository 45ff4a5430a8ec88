"""A local, fake OpenAI-compatible embeddings server with faults, for tests and benches (no real provider).

    python -m bench.fake_embedding_server --port 8765 --rpm 60 --faults rate_limit=0.05,timeout=0.02 --seed 1

``POST /v1/embeddings`` answers ``{"data": [{"index", "embedding"}], "model", "usage"}`` with
deterministic vectors (resources.embedder.fake_vector, so a test can recompute them) of the requested
``dimensions``. It enforces its own limit like a provider: more than ``rpm`` requests or ``tpm`` tokens
in any window of ``window`` seconds (by arrival) get 429 with Retry-After. Faults, by rate (seeded) or
by request number (``--schedule 3=timeout``):

    rate_limit       429 with Retry-After (--retry-after seconds, or an HTTP date with --retry-after-date)
    timeout          sleeps --hang seconds before answering (the client times out)
    drop             closes the connection without an answer
    unavailable      503
    wrong_dimension  vectors of dimensions+1
    wrong_count      one row short
    shuffled         rows (with their index) in reverse order
    nan              a NaN in the first row

``POST /v1/rerank`` (Cohere/Jina/TEI-style: ``query`` and ``documents`` or ``texts``) scores each document by
the words it shares with the query (deterministic), answering ``{"results": [{"index", "relevance_score"}]}``
or, with ``rerank_shape="tei"``, a bare list of ``{"index", "score"}``. The same faults apply, numbered among
rerank requests; the data faults become: wrong_dimension an index out of range, wrong_count an index twice,
nan a NaN score (shuffled answers in reverse order, which is still a valid answer). Its records keep the
query and documents received (``kind: "rerank"``), so a test can check what was sent.

``GET /stats`` returns every request: arrival time, inputs, tokens, status, fault, and for each answered
request the inputs' sha256 digests, so a test can check the rate held and nothing was embedded twice.
"""

from __future__ import annotations

import argparse
import email.utils
import hashlib
import json
import random
import re
import socket
import threading
import time
from collections import deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

FAULTS = ("rate_limit", "timeout", "drop", "unavailable", "wrong_dimension", "wrong_count", "shuffled", "nan")


def parse_faults(spec: str) -> dict[str, float]:
    """``rate_limit=0.1,drop=0.05`` -> {fault: probability per request}."""
    out: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        name, _, rate = part.partition("=")
        if name not in FAULTS:
            raise ValueError(f"unknown fault {name!r}; known: {', '.join(FAULTS)}")
        out[name] = float(rate or 1.0)
    return out


def parse_schedule(spec: str) -> dict[int, str]:
    """``1=timeout,3=nan`` -> {request number (1-based, POSTs only): fault}."""
    out: dict[int, str] = {}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        number, _, name = part.partition("=")
        if name not in FAULTS:
            raise ValueError(f"unknown fault {name!r}")
        out[int(number)] = name
    return out


def count_tokens(text: str) -> int:
    """The packaged WordPiece count (what the client estimates with, so the two agree)."""
    from resources.tokenizer import ModelTokenizer

    global _TOKENIZER
    if _TOKENIZER is None:
        _TOKENIZER = ModelTokenizer()
    return _TOKENIZER.count(text) or 1


_TOKENIZER: Any = None


class FakeEmbeddingServer:
    """The server in a background thread: ``start()``, ``url`` (base, ending in /v1), ``records``, ``stop()``."""

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        rpm: int | None = None,
        tpm: int | None = None,
        window: float = 60.0,
        faults: dict[str, float] | None = None,
        schedule: dict[int, str] | None = None,
        seed: int = 0,
        retry_after: float = 1.0,
        retry_after_date: bool = False,
        hang: float = 5.0,
        latency: float = 0.0,
        rerank_shape: str = "cohere",
    ) -> None:
        self.rerank_shape = rerank_shape
        self.rpm, self.tpm, self.window = rpm, tpm, window
        self.faults, self.schedule = dict(faults or {}), dict(schedule or {})
        self.retry_after, self.retry_after_date, self.hang, self.latency = retry_after, retry_after_date, hang, latency
        self.records: list[dict[str, Any]] = []
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._arrivals: deque[tuple[float, int]] = deque()
        self._httpd = ThreadingHTTPServer((host, port), self._handler())
        self._httpd.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}/v1"

    def start(self) -> FakeEmbeddingServer:
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="fake-embeddings", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    def __enter__(self) -> FakeEmbeddingServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stats(self) -> dict[str, Any]:
        with self._lock:
            return {"rpm": self.rpm, "tpm": self.tpm, "window": self.window, "records": list(self.records)}

    # -- one request ------------------------------------------------------------------------------

    def _admit(self, tokens: int, kind: str = "embeddings") -> tuple[int, str | None, float]:
        """Record the arrival; (request number, fault, seconds until the limit has room) under the lock."""
        with self._lock:
            now = time.time()
            while self._arrivals and self._arrivals[0][0] <= now - self.window:
                self._arrivals.popleft()
            over = 0.0
            if self.rpm is not None and len(self._arrivals) >= self.rpm:
                over = self._arrivals[len(self._arrivals) - self.rpm][0] + self.window - now
            if self.tpm is not None and sum(t for _, t in self._arrivals) + tokens > self.tpm:
                over = max(over, self._arrivals[0][0] + self.window - now if self._arrivals else 0.0)
            self._arrivals.append((now, tokens))  # a refused request counts too, as providers count them
            number = sum(1 for r in self.records if r["kind"] == kind) + 1
            fault = self.schedule.get(number)
            if fault is None:
                for name, rate in self.faults.items():
                    if self._rng.random() < rate:
                        fault = name
                        break
            return number, fault, over

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:  # quiet
                pass

            def _send(self, status: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

            def _send_raw(self, status: int, body: Any) -> None:
                data = json.dumps(body).encode()  # NaN as the bare literal, as a faulty provider would send it
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:  # noqa: N802
                if self.path.rstrip("/").endswith("/stats"):
                    self._send(200, server.stats())
                else:
                    self._send(404, {"error": {"message": "not found"}})

            def do_POST(self) -> None:  # noqa: N802
                arrived = time.time()
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                rerank = self.path.rstrip("/").endswith("/rerank")
                if not rerank and not self.path.rstrip("/").endswith("/v1/embeddings"):
                    self._send(404, {"error": {"message": "not found"}})
                    return
                if rerank:
                    texts = [str(t) for t in (body.get("documents") or body.get("texts") or [])]
                    query = str(body.get("query") or "")
                    dimensions = 0
                    tokens = sum(count_tokens(t) for t in texts) + count_tokens(query) * len(texts)
                else:
                    texts = body.get("input")
                    texts = [texts] if isinstance(texts, str) else list(texts or [])
                    dimensions = int(body.get("dimensions") or 384)
                    tokens = sum(count_tokens(t) for t in texts)
                kind = "rerank" if rerank else "embeddings"
                number, fault, over = server._admit(tokens, kind)
                record: dict[str, Any] = {"kind": kind, "number": number, "at": arrived, "inputs": len(texts),
                                          "tokens": tokens, "fault": fault, "status": None, "digests": [],
                                          "auth": self.headers.get("Authorization") is not None}
                if rerank:
                    record.update(query=query, documents=texts)
                with server._lock:
                    server.records.append(record)
                if server.latency:
                    time.sleep(server.latency)
                if over > 0:
                    record.update(status=429, fault="over_limit")
                    self._send(429, {"error": {"message": "rate limit", "type": "rate_limit"}},
                               {"Retry-After": f"{max(1, round(over + 0.5))}"})
                    return
                if fault == "rate_limit":
                    record["status"] = 429
                    after = (email.utils.formatdate(time.time() + server.retry_after, usegmt=True)
                             if server.retry_after_date else f"{server.retry_after:g}")
                    self._send(429, {"error": {"message": "slow down", "type": "rate_limit"}}, {"Retry-After": after})
                    return
                if fault == "timeout":
                    time.sleep(server.hang)
                if fault == "drop":
                    record["status"] = 0
                    self.close_connection = True
                    try:
                        self.connection.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass
                    return
                if fault == "unavailable":
                    record["status"] = 503
                    self._send(503, {"error": {"message": "overloaded"}})
                    return
                try:
                    if rerank:
                        self._send_raw(200, server.rerank_answer(query, texts, fault))
                    else:
                        self._send(200, server.answer(texts, dimensions, body.get("model"), fault, tokens))
                except (BrokenPipeError, ConnectionResetError):  # the client gave up (a timeout fault)
                    record["status"] = "client gone"
                    return
                record["status"] = 200
                if fault is None:  # embedded and delivered (a timed-out answer is wasted work, not a delivery)
                    record["digests"] = [hashlib.sha256(t.encode("utf-8", "surrogatepass")).hexdigest() for t in texts]

        return Handler

    def answer(self, texts: list[str], dimensions: int, model: Any, fault: str | None, tokens: int) -> dict[str, Any]:
        """The JSON body of a 200, with the data faults applied."""
        from resources.embedder import fake_vector

        width = dimensions + 1 if fault == "wrong_dimension" else dimensions
        rows = [{"object": "embedding", "index": i, "embedding": [float(x) for x in fake_vector(t, width)]}
                for i, t in enumerate(texts)]
        if fault == "wrong_count" and rows:
            rows = rows[:-1]
        elif fault == "shuffled" and len(rows) > 1:
            rows = rows[::-1]
        elif fault == "nan" and rows:
            rows[0]["embedding"][0] = float("nan")
        return {"object": "list", "data": rows, "model": model, "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}

    def rerank_answer(self, query: str, texts: list[str], fault: str | None) -> Any:
        """The JSON body of a 200 to /rerank (Cohere/Jina shape, or TEI's with rerank_shape="tei"), best first,
        with the data faults applied."""
        ranked = sorted(range(len(texts)), key=lambda i: (-overlap_score(query, texts[i]), i))
        rows: list[dict[str, Any]] = [{"index": i, "score": overlap_score(query, texts[i])} for i in ranked]
        if fault == "wrong_dimension" and rows:
            rows[0]["index"] = len(texts)
        elif fault == "wrong_count" and len(rows) > 1:
            rows[1]["index"] = rows[0]["index"]
        elif fault == "shuffled":
            rows = rows[::-1]
        elif fault == "nan" and rows:
            rows[0]["score"] = float("nan")
        if self.rerank_shape == "tei":
            return rows
        return {"results": [{"index": r["index"], "relevance_score": r["score"]} for r in rows]}


def overlap_score(query: str, document: str) -> float:
    """The fake reranker's relevance: the share of the query's distinct words the document contains."""
    words = set(re.findall(r"\w+", query.lower()))
    return len(words & set(re.findall(r"\w+", document.lower()))) / len(words) if words else 0.0


def max_in_window(times: list[float], window: float) -> int:
    """The most arrivals in any half-open window of ``window`` seconds."""
    times = sorted(times)
    best, lo = 0, 0
    for hi, t in enumerate(times):
        while times[lo] <= t - window:
            lo += 1
        best = max(best, hi - lo + 1)
    return best


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--rpm", type=int, default=None, help="requests per window before 429")
    parser.add_argument("--tpm", type=int, default=None, help="tokens per window before 429")
    parser.add_argument("--window", type=float, default=60.0, help="seconds of the limit's window")
    parser.add_argument("--faults", default="", help="fault=rate,... (" + ", ".join(FAULTS) + ")")
    parser.add_argument("--schedule", default="", help="n=fault,...: the fault of the n-th request")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--retry-after", type=float, default=1.0)
    parser.add_argument("--retry-after-date", action="store_true", help="send Retry-After as an HTTP date")
    parser.add_argument("--hang", type=float, default=5.0, help="seconds a timeout fault sleeps")
    parser.add_argument("--latency", type=float, default=0.0, help="seconds every request takes")
    args = parser.parse_args(argv)
    server = FakeEmbeddingServer(host=args.host, port=args.port, rpm=args.rpm, tpm=args.tpm, window=args.window,
                                 faults=parse_faults(args.faults), schedule=parse_schedule(args.schedule),
                                 seed=args.seed, retry_after=args.retry_after, retry_after_date=args.retry_after_date,
                                 hang=args.hang, latency=args.latency)
    print(f"fake embeddings at {server.url} (rpm={args.rpm}, window={args.window}s, faults={args.faults or 'none'})",
          flush=True)
    try:
        server._httpd.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
