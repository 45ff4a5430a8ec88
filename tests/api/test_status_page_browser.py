"""The status page in headless Chromium: upload, watch the bar move live over SSE, see SEARCHABLE, search.

Needs Debian's ``chromium`` + ``chromium-driver`` and the ``selenium`` package; skips (with the reason)
when any is missing. The test plays the worker: TaskQueue claim/progress and a fenced publish of chunks.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest

from tests.api.conftest import claim_task, index_task

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")

pytestmark = pytest.mark.skipif(
    CHROMIUM is None or CHROMEDRIVER is None,
    reason="chromium/chromedriver not installed (apt-get install -y chromium chromium-driver): browser test skipped",
)


@pytest.fixture
def browser():
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium not installed: browser test skipped")
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="kbindex-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage", f"--user-data-dir={profile}", "--window-size=1200,900"):
        options.add_argument(flag)
    try:
        driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    except Exception as exc:  # noqa: BLE001 - a broken local browser install is a skip, not a failure
        shutil.rmtree(profile, ignore_errors=True)
        pytest.skip(f"chromium could not be started: {type(exc).__name__}: {str(exc)[:200]}")
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def test_upload_watch_searchable_search(browser, live_url, db, queue, embedder, tmp_path: Path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    wait = WebDriverWait(browser, 15, poll_frequency=0.05)
    find = browser.find_element

    def progress() -> float:
        return float(find(By.ID, "progress").get_property("value"))

    browser.get(f"{live_url}/?token=tok-acme")
    assert "token=" not in browser.current_url  # taken into localStorage, out of the address bar
    wait.until(lambda d: "no documents yet" in find(By.ID, "documents-body").text)

    document = tmp_path / "refund-policy.md"
    document.write_text("# Refunds\n\nThe refund window is thirty days from delivery.\n", encoding="utf-8")
    find(By.ID, "document-id").send_keys("policies/refund-policy.md")
    find(By.ID, "file").send_keys(str(document))
    find(By.ID, "upload-button").click()

    wait.until(lambda d: find(By.ID, "task-id").text.isdigit())
    task_id = int(find(By.ID, "task-id").text)
    assert find(By.ID, "task-status").text == "PENDING" and progress() == 0
    assert "new version v1" in find(By.ID, "message").text

    lease = claim_task(queue, task_id)
    wait.until(lambda d: find(By.ID, "task-status").text == "RUNNING")
    queue.progress(lease, "embed", 5, 10)
    wait.until(lambda d: progress() == 52.5)  # the bar moved live, from an SSE event
    assert "embed 5/10" in find(By.ID, "task-stage").text and find(By.ID, "progress-text").text == "52.5%"
    assert find(By.ID, "cancel-button").is_displayed()

    index_task(db, queue, embedder, task_id, ["The refund window is thirty days from delivery."], lease=lease)
    wait.until(lambda d: find(By.ID, "task-status").text == "SUCCEEDED" and progress() == 100)
    status_cell = '#documents-body tr[data-document-id="policies/refund-policy.md"] td[data-role="status"]'
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, status_cell)
               and d.find_element(By.CSS_SELECTOR, status_cell).text == "SEARCHABLE")

    find(By.ID, "query").send_keys("how long is the refund window")
    find(By.ID, "search-button").click()
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#results .hit"))
    first = browser.find_elements(By.CSS_SELECTOR, "#results .hit")[0].text
    assert "policies/refund-policy.md v1" in first and "refund window is thirty days" in first

    # Publishing the same bytes again is recognized, not duplicated.
    find(By.ID, "file").send_keys(str(document))
    find(By.ID, "upload-button").click()
    wait.until(lambda d: "same bytes as v1" in find(By.ID, "message").text)
    assert int(find(By.ID, "task-id").text) == task_id
