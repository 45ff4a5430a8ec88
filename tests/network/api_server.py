"""The kbindex API on the client host (run by the tests inside namespace B): the real app under uvicorn, its
database over TCP to PostgreSQL on the other host, its HTTP on a Unix socket the test process reaches from
the root namespace (a Unix socket does not cross the link: only the API's database traffic does).

``api_server.py <database url> <unix socket path> <poll_seconds> <work dir>``; tokens ``tok-acme`` (acme) and
``tok-globex`` (globex); /metrics public and cached 60 s; keep-alive comments every second. Blobs and artifacts go
under the work dir, which the test owns (its tmp_path): the tests SIGKILL this server, so it cannot clean up.
"""

from __future__ import annotations

import sys

import uvicorn

from pipelines.api import create_app
from resources.embedder import DEFAULT_MODEL_NAME, FakeEmbedder

TOKENS = {"tok-acme": "acme", "tok-globex": "globex"}

if __name__ == "__main__":
    url, uds, poll, work = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
    app = create_app(url, tokens=TOKENS, tokens_file="", blob_url=f"{work}/blobs", artifacts_dir=f"{work}/artifacts",
                     embedder=FakeEmbedder(model_name=DEFAULT_MODEL_NAME), metrics_public=True,
                     metrics_cache_seconds=60.0, fast_publish=False, poll_seconds=poll, ping_seconds=1.0)
    uvicorn.run(app, uds=uds, log_level="warning", lifespan="off", timeout_graceful_shutdown=1)
