"""The kbindex API on the client host (run by the tests inside namespace B): the real app under uvicorn, its
database over TCP to PostgreSQL on the other host, its HTTP on a Unix socket the test process reaches from
the root namespace (a Unix socket does not cross the link: only the API's database traffic does).

``api_server.py <database url> <unix socket path> <poll_seconds>``; tokens ``tok-acme`` (acme) and
``tok-globex`` (globex); /metrics public and cached 60 s; keep-alive comments every second.
"""

from __future__ import annotations

import shutil
import sys
import tempfile

import uvicorn

from pipelines.api import create_app
from resources.embedder import DEFAULT_MODEL_NAME, FakeEmbedder

TOKENS = {"tok-acme": "acme", "tok-globex": "globex"}

if __name__ == "__main__":
    url, uds, poll = sys.argv[1], sys.argv[2], float(sys.argv[3])
    tmp = tempfile.mkdtemp(prefix="kbindex-net-api-")
    try:
        app = create_app(url, tokens=TOKENS, tokens_file="", blob_url=f"{tmp}/blobs", artifacts_dir=f"{tmp}/artifacts",
                         embedder=FakeEmbedder(model_name=DEFAULT_MODEL_NAME), metrics_public=True,
                         metrics_cache_seconds=60.0, fast_publish=False, poll_seconds=poll, ping_seconds=1.0)
        uvicorn.run(app, uds=uds, log_level="warning", lifespan="off", timeout_graceful_shutdown=1)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
