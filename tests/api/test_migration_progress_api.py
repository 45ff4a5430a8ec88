"""GET /profiles/migrations reports a shadow profile's build progress (needs a token)."""

from tests.api.conftest import ACME, publish


def test_migration_progress_is_reported_while_a_profile_builds(client, db):
    from resources.profiles import create_profile

    assert client.get("/profiles/migrations").status_code == 401
    assert client.get("/profiles/migrations", headers=ACME).json() == {"migrations": []}
    publish(client, "a.md", b"# A\n\nalpha")
    publish(client, "b.md", b"# B\n\nbeta")
    create_profile(db, "shadow-test", model="fake-384", chunk_tokens=128, overlap=16)
    (m,) = client.get("/profiles/migrations", headers=ACME).json()["migrations"]
    assert (m["profile"], m["done"], m["total"], m["pending"]) == ("shadow-test", 0, 2, 2)
    assert m["eta_seconds"] is None and m["rate_per_minute"] == 0
