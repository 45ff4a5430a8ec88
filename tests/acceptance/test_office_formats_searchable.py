"""Issue 16 end to end, in process: slides, a workbook, a CSV, an e-mail with an attachment and a scanned
PDF are published, run through the four assets with ``dg.materialize``, and found by ``search`` with a
phrase that only they contain; their sections (slide title, sheet name, subject, attachment) and pages
show in the hits. The fake embedder compares tokens, so an exact phrase ranks its document first."""

from __future__ import annotations

import io

import dagster as dg
import pytest

from pipelines.assets import indexing_assets
from pipelines.partitions import VERSIONS_PARTITIONS_NAME
from resources.blob_store import BlobStore
from resources.dagster_resources import LEASES_TAG, OWNER_TAG, default_resources, encode_leases
from resources.database import Database
from resources.embedder import FakeEmbedder
from resources.publisher import Publisher
from resources.search import search
from resources.task_queue import TaskQueue


def _pptx() -> bytes:
    import pptx

    deck = pptx.Presentation()
    slide = deck.slides.add_slide(deck.slide_layouts[1])
    slide.shapes.title.text = "Warehouse safety"
    slide.placeholders[1].text_frame.text = "Forklift drivers renew their licence every two years"
    slide.notes_slide.notes_text_frame.text = "Remind everyone about the sprinkler inspection in Bremen"
    out = io.BytesIO()
    deck.save(out)
    return out.getvalue()


def _xlsx() -> bytes:
    import openpyxl

    book = openpyxl.Workbook()
    sheet = book.active
    sheet.title = "Mileage"
    sheet.append(["Vehicle class", "Rate per kilometre"])
    sheet.append(["Electric scooter", 0.17])
    sheet.append(["Company van", 0.42])
    out = io.BytesIO()
    book.save(out)
    return out.getvalue()


def _eml() -> bytes:
    from email.message import EmailMessage

    message = EmailMessage()
    message["From"], message["To"], message["Subject"] = "hr@example.com", "all@example.com", "Parental leave"
    message.set_content("Parental leave requests reach human resources eight weeks ahead.")
    message.add_attachment(b"Grandparents receive two extra care days per year.", maintype="text", subtype="plain",
                           filename="care-days.txt")
    return message.as_bytes()


def _scanned_pdf() -> bytes:
    """What a scanner writes: one image per page, no text layer."""
    from PIL import Image, ImageDraw, ImageFont

    image = Image.new("L", (900, 120), 255)
    ImageDraw.Draw(image).text((20, 35), "Invoice payable within fourteen days", fill=0,
                               font=ImageFont.load_default(size=36))
    out = io.BytesIO()
    image.save(out, "PDF", resolution=100)
    return out.getvalue()


DOCUMENTS = {
    "safety.pptx": (_pptx, "sprinkler inspection in Bremen", ("Warehouse safety", "Speaker notes"), 1),
    "mileage.xlsx": (_xlsx, "Company van rate per kilometre", ("Mileage",), None),
    "offices.csv": (lambda: b"office,phone extension\nLisbon,4417\nOslo,5521\n", "Oslo office phone extension", (), None),
    "leave.eml": (_eml, "Grandparents receive two extra care days",
                  ("Parental leave", "Attachment: care-days.txt"), None),
    "scan.pdf": (_scanned_pdf, "invoice payable within fourteen days", (), 1),
}


@pytest.mark.timeout(600)
def test_slides_sheets_mail_and_scans_become_searchable(db_url, kb_env, fake_profile):
    db = Database(db_url)
    try:
        publisher = Publisher(db, BlobStore(kb_env["KBINDEX_BLOB_URL"]))
        queue = TaskQueue(db, lease_seconds=600)
        published = {name: publisher.publish("acme", name, make(), name) for name, (make, *_) in DOCUMENTS.items()}
        claimed = queue.claim("office-test", limit=10)
        assert len(claimed) == len(DOCUMENTS)
        keys = [r["partition_key"] for r in db.fetch_all(
            "document_version_partition_keys", {"task_ids": [t.lease.task_id for t in claimed]})]
        instance = dg.DagsterInstance.ephemeral()
        instance.add_dynamic_partitions(VERSIONS_PARTITIONS_NAME, keys)
        pairs = [(t.lease.task_id, t.lease.attempt) for t in claimed]
        result = dg.materialize(
            indexing_assets, resources=default_resources(), instance=instance, raise_on_error=False,
            tags={LEASES_TAG: encode_leases(pairs), OWNER_TAG: "office-test",
                  "dagster/asset_partition_range_start": keys[0], "dagster/asset_partition_range_end": keys[-1]},
        )
        assert result.success
        for name, outcome in published.items():
            task = queue.get(outcome.task_id)
            assert task["status"] == "SUCCEEDED", (name, task["error_code"], task.get("error_message"))
        embedder = FakeEmbedder(model_name="fake-384")
        for name, (_, phrase, heading_path, page) in DOCUMENTS.items():
            hits = search(db, embedder, phrase, tenant_id="acme", k=3)
            assert hits and hits[0].document_id == name, (phrase, [(h.document_id, h.text) for h in hits])
            assert hits[0].heading_path[: len(heading_path)] == heading_path
            assert hits[0].page == page
    finally:
        db.close()
