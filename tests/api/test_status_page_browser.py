"""The status page in headless Chromium: upload, watch the bar move live over SSE, see SEARCHABLE, search.

Needs Debian's ``chromium`` + ``chromium-driver`` and the ``selenium`` package; skips (with the reason)
when any is missing. The test plays the worker: TaskQueue claim/progress and a fenced publish of chunks.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

import pytest

from tests.api.conftest import ACME, GLOBEX, claim_task, fail_task, index_task, publish

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


def sign_in(browser, live_url: str, token: str) -> None:
    """Enter ``token`` in the page's form (a token in the URL is never taken: issue #17)."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get(f"{live_url}/")
    field = browser.find_element(By.ID, "token")
    field.clear()
    field.send_keys(token)
    browser.find_element(By.CSS_SELECTOR, "#token-form button").click()
    tenant = {"tok-acme": "acme", "tok-globex": "globex"}[token]
    WebDriverWait(browser, 30).until(lambda d: d.find_element(By.ID, "tenant").text == tenant)


def test_a_token_in_a_link_is_ignored_and_the_page_shows_its_tenant(browser, live_url):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    sign_in(browser, live_url, "tok-acme")
    browser.get(f"{live_url}/?token=tok-globex")  # an attacker's link
    WebDriverWait(browser, 30).until(lambda d: d.find_element(By.ID, "tenant").text == "acme")
    assert "token=" not in browser.current_url
    assert browser.find_element(By.ID, "token-link-warning").is_displayed()
    assert browser.execute_script("return sessionStorage.getItem('kbindex.token')") == "tok-acme"
    assert browser.execute_script("return localStorage.getItem('kbindex.token')") is None  # this tab only
    # The Content-Security-Policy (pipelines/api/security.py) lets the page's own script and style run: no violation.
    assert not [e for e in browser.get_log("browser") if "Content Security Policy" in e.get("message", "")]


def test_upload_watch_searchable_search(browser, live_url, db, queue, embedder, tmp_path: Path):
    from selenium.webdriver.common.by import By
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.support.ui import WebDriverWait

    wait = WebDriverWait(browser, 60, poll_frequency=0.05, ignored_exceptions=(StaleElementReferenceException,))
    find = browser.find_element

    def progress() -> float:
        return float(find(By.ID, "progress").get_property("value"))

    sign_in(browser, live_url, "tok-acme")
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


def test_overview_failures_filters_and_pages(browser, live_url, client, db, queue, embedder):
    """The overview on top: counts, one bar with rate and ETA, failures by code linking to their documents;
    the list filtered and paged; another tenant's token sees none of it."""
    from selenium.webdriver.common.by import By
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.support.ui import WebDriverWait

    wait = WebDriverWait(browser, 60, poll_frequency=0.05, ignored_exceptions=(StaleElementReferenceException,))
    find = browser.find_element

    def listed() -> list[str]:  # read in one script: the table is re-rendered under us
        return browser.execute_script(
            "return [...document.querySelectorAll('#documents-body tr[data-document-id]')].map(r => r.dataset.documentId)")

    def count(status: str) -> str:
        return find(By.CSS_SELECTOR, f'#counts .count[data-status="{status}"] .n').text

    ids = {}
    for name, headers in (("reports/ok.md", ACME), ("reports/broken.md", ACME), ("globex-secret.md", GLOBEX),
                          ("reports/flaky.md", ACME)):
        ids[name] = publish(client, name, name.encode(), headers=headers).json()["task_id"]
    index_task(db, queue, embedder, ids["reports/ok.md"], ["all fine"])
    assert fail_task(queue, ids["reports/broken.md"], "PARSE_ERROR", "the file is damaged") == "DEAD"
    assert fail_task(queue, ids["globex-secret.md"], "ENCRYPTED_DOCUMENT", "globex's secret failure") == "DEAD"
    assert fail_task(queue, ids["reports/flaky.md"], "EMBEDDING_TIMEOUT", "the model timed out") == "RETRY_WAIT"
    bulk = [f"bulk/doc-{i:02d}.md" for i in range(52)]
    for name in bulk:
        assert publish(client, name, name.encode()).status_code == 202

    sign_in(browser, live_url, "tok-acme")
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, '#counts .count[data-status="DEAD"]'))
    assert (count("PENDING"), count("RETRY_WAIT"), count("SUCCEEDED"), count("DEAD"), count("CANCELLED")) == ("52", "1", "1", "1", "0")
    assert find(By.CSS_SELECTOR, "#counts .count .n").text == "55"  # documents
    # Two finished since the oldest open task was queued, 53 open; one success in the last minute.
    assert find(By.ID, "flight-done").text == "2 of 55 tasks done (3.6%), 53 open"
    assert float(find(By.ID, "flight-progress").get_property("value")) == pytest.approx(3.6)
    assert find(By.ID, "flight-rate").text == "1.0 succeeded/min over the last 60 s"
    assert find(By.ID, "flight-eta").text == "ETA: 53 min"
    codes = browser.execute_script(  # in one script: the overview re-renders under us
        "return [...document.querySelectorAll('#failures-body tr[data-code]')].map(r => r.dataset.code)")
    assert codes == ["EMBEDDING_TIMEOUT", "PARSE_ERROR"]
    assert "globex" not in find(By.TAG_NAME, "body").text and "ENCRYPTED_DOCUMENT" not in find(By.TAG_NAME, "body").text
    browser.save_screenshot(str(Path(tempfile.gettempdir()) / "status_page.png"))  # for a person to look at

    # The list pages 50 at a time, newest first.
    wait.until(lambda d: len(listed()) == 50)
    assert listed() == bulk[::-1][:50] and find(By.ID, "page-text").text == "page 1: 1-50"
    assert find(By.ID, "newer-button").get_property("disabled")
    find(By.ID, "older-button").click()
    wait.until(lambda d: find(By.ID, "page-text").text == "page 2: 51-55")
    assert listed() == bulk[:2][::-1] + ["reports/flaky.md", "reports/broken.md", "reports/ok.md"]
    assert find(By.ID, "older-button").get_property("disabled")
    find(By.ID, "newer-button").click()
    wait.until(lambda d: find(By.ID, "page-text").text == "page 1: 1-50")

    # A failure group links to exactly its documents; the filter goes into the address bar.
    find(By.CSS_SELECTOR, '#failures-body tr[data-code="PARSE_ERROR"] a').click()
    wait.until(lambda d: listed() == ["reports/broken.md"])
    assert "error_code=PARSE_ERROR" in browser.current_url
    assert "DEAD or RETRY_WAIT with PARSE_ERROR" in find(By.ID, "filter-text").text
    row = find(By.CSS_SELECTOR, '#documents-body tr[data-document-id="reports/broken.md"]').text
    assert "FAILED" in row and "PARSE_ERROR: the file is damaged" in row
    browser.refresh()  # the filter survives a reload
    wait.until(lambda d: listed() == ["reports/broken.md"] and find(By.ID, "filter-code").get_property("value") == "PARSE_ERROR")

    # A count filters by the latest version's task status (the counts render after the reload on their own
    # request: wait for them, as for the list).
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, '#counts .count[data-status="RETRY_WAIT"]'))
    find(By.CSS_SELECTOR, '#counts .count[data-status="RETRY_WAIT"]').click()
    wait.until(lambda d: listed() == ["reports/flaky.md"])
    assert "task_status=RETRY_WAIT" in browser.current_url and "error_code" not in browser.current_url
    assert "last error EMBEDDING_TIMEOUT" in find(By.CSS_SELECTOR, '#documents-body tr[data-document-id="reports/flaky.md"]').text
    find(By.CSS_SELECTOR, '#counts .count[data-status="PENDING"]').click()
    wait.until(lambda d: len(listed()) == 50 and not find(By.ID, "older-button").get_property("disabled"))
    find(By.ID, "older-button").click()
    wait.until(lambda d: listed() == bulk[:2][::-1])
    find(By.ID, "clear-filter-button").click()
    wait.until(lambda d: len(listed()) == 50 and find(By.ID, "page-text").text == "page 1: 1-50")
    assert "?" not in browser.current_url

    # Another tenant's token: its own figures and failures only.
    sign_in(browser, live_url, "tok-globex")
    wait.until(lambda d: listed() == ["globex-secret.md"])
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#failures-body tr[data-code]"))
    codes = browser.execute_script(  # in one script: the overview re-renders under us
        "return [...document.querySelectorAll('#failures-body tr[data-code]')].map(r => r.dataset.code)")
    assert codes == ["ENCRYPTED_DOCUMENT"] and count("DEAD") == "1" and count("PENDING") == "0"
    assert find(By.CSS_SELECTOR, "#counts .count .n").text == "1"
    assert "reports/" not in find(By.TAG_NAME, "body").text and "PARSE_ERROR" not in find(By.TAG_NAME, "body").text


# Holds every fetch made with the acme token for 1.5 s, in the page itself: its replies land after globex's.
SLOW_ACME = """
const original = window.fetch;
window.fetch = async (path, options) => {
  const reply = await original(path, options);
  if (((options || {}).headers || {})["Authorization"] === "Bearer tok-acme") {
    await new Promise(resolve => setTimeout(resolve, 1500));
  }
  return reply;
};
"""


def test_a_reply_for_the_token_replaced_meanwhile_is_never_drawn(browser, live_url, client, queue):
    """Switching tokens while the old one's requests are in flight: their replies come back after the new
    token's and are dropped, so the page never shows the previous tenant's failures or documents under the new
    one (seen once in the suite as a race: acme's failures on globex's page)."""
    from selenium.webdriver.common.by import By

    acme = publish(client, "reports/broken.md", b"broken", headers=ACME).json()["task_id"]
    globex = publish(client, "globex-secret.md", b"secret", headers=GLOBEX).json()["task_id"]
    assert fail_task(queue, acme, "PARSE_ERROR", "the file is damaged") == "DEAD"
    assert fail_task(queue, globex, "ENCRYPTED_DOCUMENT", "globex's secret failure") == "DEAD"
    browser.get(f"{live_url}/")
    browser.execute_script(SLOW_ACME)

    def use(token: str) -> None:
        field = browser.find_element(By.ID, "token")
        field.clear()
        field.send_keys(token)
        browser.find_element(By.CSS_SELECTOR, "#token-form button").click()

    use("tok-acme")  # its replies are held
    use("tok-globex")  # at once: globex's replies come back first
    seen = []
    deadline = time.monotonic() + 4  # past the 1.5-s hold: acme's replies have come back by then
    while time.monotonic() < deadline:
        seen.append(browser.execute_script(
            "return [document.getElementById('tenant').textContent,"
            " [...document.querySelectorAll('#failures-body tr[data-code]')].map(r => r.dataset.code).join(),"
            " [...document.querySelectorAll('#documents-body tr[data-document-id]')].map(r => r.dataset.documentId).join()]"))
        time.sleep(0.05)
    assert seen[-1] == ["globex", "ENCRYPTED_DOCUMENT", "globex-secret.md"], seen[-1]
    assert not [s for s in seen if s[0] == "acme" or "PARSE_ERROR" in s[1] or "reports/" in s[2]], \
        "the previous token's replies were drawn under the new one"
