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


def test_a_tenant_sees_only_its_own_migration_figures_and_no_provider_host(client, db, queue):
    """Issue #31 finding 9: the figures were global (every tenant's version counts and failure codes) and the
    model named the provider's host. Globex's failure and its documents stay out of acme's answer."""
    from resources.http_embedder import ProviderConfig
    from resources.profiles import create_profile, migration_progress
    from tests.api.conftest import GLOBEX

    publish(client, "a.md", b"# A\n\nalpha")
    for name in ("x.md", "y.md", "z.md"):
        publish(client, name, f"# {name}\n\nglobex".encode(), headers=GLOBEX)
    create_profile(db, "shadow-http", model="", chunk_tokens=128, overlap=16,
                   provider=ProviderConfig(url="https://embed.internal.example:8443/v1", model="e5-small"))
    globex_task = next(r["task_id"] for r in queue.list(tenant="globex", limit=50) if r["profile"] == "shadow-http")
    queue.fail(queue.claim_task(globex_task, "test").lease, "PARSE_ERROR", "globex's secret failure")

    (acme,) = client.get("/profiles/migrations", headers=ACME).json()["migrations"]
    assert (acme["done"], acme["total"], acme["pending"], acme["dead"]) == (0, 1, 1, 0)
    assert acme["failures_by_code"] == {}
    assert acme["model"] == "http:e5-small" and "embed.internal.example" not in str(acme)
    (globex,) = client.get("/profiles/migrations", headers=GLOBEX).json()["migrations"]
    assert (globex["total"], globex["dead"], globex["failures_by_code"]) == (3, 1, {"PARSE_ERROR": 1})
    (operator,) = migration_progress(db)  # the CLI's view: every tenant, the full model name
    assert (operator["total"], operator["model"]) == (4, "http:e5-small@embed.internal.example:8443")
