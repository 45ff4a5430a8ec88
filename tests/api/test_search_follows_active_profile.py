"""API search embeds with the active profile's model, chosen at each request (issue #12, defect 9).

Before, the API picked its embedder once from KBINDEX_MODEL and kept it for the life of the process,
so after `kbindex profile activate` to another model every search failed. Nothing is injected here:
the app's own default embedder is what is tested.
"""

from __future__ import annotations

import psycopg
from fastapi.testclient import TestClient

from resources.embedder import FakeEmbedder
from resources.profiles import activate_profile, create_profile
from tests.api.conftest import ACME, index_task, publish


def test_api_search_follows_profile_activation_to_another_model(make_app, db, db_url, queue):
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("UPDATE index_profile SET model = 'fake-a' WHERE is_active")
    client = TestClient(make_app(embedder=None), raise_server_exceptions=False)
    task_id = publish(client, "refunds.md", b"Refunds are paid within 14 days.").json()["task_id"]
    index_task(db, queue, FakeEmbedder(model_name="fake-a"), task_id, ["Refunds are paid within 14 days."])

    first = client.get("/search", params={"q": "refund window"}, headers=ACME)
    assert first.status_code == 200, first.text
    assert [h["document_id"] for h in first.json()["hits"]] == ["refunds.md"]

    create_profile(db, "shadow-b", model="fake-b", chunk_tokens=64, overlap=8)
    shadow_task = next(t["task_id"] for t in queue.list() if t["profile"] == "shadow-b")
    index_task(db, queue, FakeEmbedder(model_name="fake-b"), shadow_task, ["Refunds are paid within 14 days."],
               lease=queue.claim_task(shadow_task, "backfill").lease)  # REINDEX: the backfill's to claim
    activate_profile(db, "shadow-b", force=True)

    after = client.get("/search", params={"q": "refund window"}, headers=ACME)
    assert after.status_code == 200, after.text  # the same process, now embedding with fake-b
    assert [h["document_id"] for h in after.json()["hits"]] == ["refunds.md"]
