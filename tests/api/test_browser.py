"""The explorer in headless Chromium (Debian's ``chromium`` driven by Playwright for Python) against a real
devnet (``node devnet --model tiny``: four node processes on 127.0.0.1).

Navigates home → block → receipt → its worker's account → a job; searches by height, receipt id and garbage;
checks that a job titled ``<img src=x onerror=alert(1)>`` shows that text literally and runs no script; checks
that the live refresh runs under the page's CSP and that /docs renders Swagger UI from local files. Screenshots
go to ``test-artifacts/browser/``. Skipped only where no ``chromium`` is installed outside CI (CI installs it).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "test-artifacts" / "browser"
XSS = "<img src=x onerror=alert(1)>"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]

# ~60 s with its devnet: in CI's slow step since the default suite reached 18 min on this machine
pytestmark = pytest.mark.slow

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
if CHROMIUM is None and not os.environ.get("CI"):
    pytest.skip("no chromium installed (apt-get install chromium; CI installs it)", allow_module_level=True)


@pytest.fixture(scope="module")
def devnet(tmp_path_factory):
    """``node devnet --model tiny --no-tabs`` left running after its demo; yields (api URL, data dir). Receipt by
    receipt: each receipt is its own transaction in a block, the path this test walks (block -> receipt -> worker);
    the pages of tabs and epoch batches are tests/api/test_tab_pages.py's and tests/e2e/test_tabs_flow.py's."""
    tmp = tmp_path_factory.mktemp("devnet")
    root = tmp / "net"
    log = open(tmp / "devnet.log", "w+")  # noqa: SIM115 - the devnet's log, read while it runs
    proc = subprocess.Popen([sys.executable, "-m", "node.cli", "devnet", "--model", "tiny", "--data-dir", str(root),
                             "--api-port", "0", "--model-cache", str(tmp / "models"), "--no-tabs"],
                            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 240
        api = None
        while api is None:
            log.seek(0)
            m = re.search(r"The swarm stays up\. API: (http://127\.0\.0\.1:\d+)/docs", log.read())
            if m:
                api = m.group(1)
            elif proc.poll() is not None or time.monotonic() > deadline:
                log.seek(0)
                pytest.fail(f"devnet did not come up (exit {proc.poll()}):\n{log.read()[-4000:]}")
            else:
                time.sleep(0.5)
        yield api, root
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def _post_job(api: str, token: str) -> str:
    """Post a fine-tune job titled with markup through the marketplace API (the devnet's servers accept jobs);
    its id once it is on the ledger."""
    body = {"title": XSS, "text": "to be or not to be, that is the question. " * 200, "steps": 4,
            "segment_steps": 2, "batch_size": 1, "seq_len": 16, "price_per_step": "0.001", "deadline_blocks": 500}
    r = httpx.post(f"{api}/v1/jobs", json=body, headers={"Authorization": f"Bearer {token}"}, timeout=60)
    assert r.status_code == 200, r.text
    jid = r.json()["job_id"]
    deadline = time.monotonic() + 30
    while httpx.get(f"{api}/v1/jobs/{jid}", timeout=30).status_code != 200:
        assert time.monotonic() < deadline, "the job never reached the ledger"
        time.sleep(0.5)
    return jid


def test_explorer_in_chromium(devnet):
    from playwright.sync_api import sync_playwright

    api, root = devnet
    token = (root / "node0" / "api_token").read_text().strip()
    # the demo's newest inference receipt, final before the job is posted: the job's training receipts come after
    # it on the home page, and the newest of those may still be with its committee when the page is read
    demo = httpx.get(f"{api}/v1/receipts", params={"status": "valid", "limit": 1}, timeout=30).json()["receipts"]
    assert len(demo) == 1 and demo[0]["kind"] == "inference", demo
    job_id = _post_job(api, token)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    dialogs, errors = [], []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.set_default_timeout(15_000)

        def shot(name: str) -> None:
            page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)

        # home: head, finality, validators, peers, coverage; the live refresh moves the head on its own
        page.goto(f"{api}/")
        head0 = page.text_content("#head-link")
        assert re.fullmatch(r"#\d+", head0) and "final" in page.text_content("main")
        assert page.locator("svg.chart rect.span").count() == 3  # three servers in the coverage chart
        page.wait_for_function("h => document.getElementById('head-link').textContent !== h", arg=head0)
        shot("01-home")

        # home → the demo's latest inference receipt → its block → its worker's account
        page.click(f"#latest-receipts tbody td:first-child a[href='/receipts/{demo[0]['id']}']")
        page.wait_for_url(re.compile(r"/receipts/[0-9a-f]{64}$"))
        rid = page.url.rsplit("/", 1)[1]
        assert rid == demo[0]["id"]
        assert page.text_content("#verdict").strip().startswith("valid")
        assert page.locator("#committee tbody tr").count() == 2
        assert page.locator("#committee .s-valid").count() == 2 and page.locator("#payouts tbody tr").count() == 3
        shot("03-receipt")
        page.click("#receipt-block")
        page.wait_for_url(re.compile(r"/blocks/\d+$"))
        height = int(page.text_content("#block-height"))
        assert page.locator(f"#block-txs a[href='/tx/{rid}']").count() == 1
        shot("02-block")
        page.go_back()
        page.wait_for_url(re.compile(r"/receipts/"))
        page.click("#receipt-worker a")
        page.wait_for_url(re.compile(r"/accounts/12D3KooW"))
        assert page.text_content("#bond").strip() == "200" and page.locator("#history tbody tr").count() >= 2
        assert "payout" in page.text_content("#history")
        shot("04-account")

        # search: a height, a receipt id, garbage
        for q, url in [(str(height), f"/blocks/{height}"), (rid, f"/receipts/{rid}")]:
            page.fill("#search", q)
            page.press("#search", "Enter")
            page.wait_for_url(f"{api}{url}")
        page.fill("#search", XSS)
        page.press("#search", "Enter")
        page.wait_for_url(re.compile(r"/search\?q="))
        assert XSS in page.text_content("#search-result")
        shot("05-search-miss")

        # swarm coverage and verification charts
        page.goto(f"{api}/swarm")
        assert page.text_content("#covered") == "6" and page.locator("svg.chart rect.cell").count() == 6
        shot("06-swarm")
        page.goto(f"{api}/verification")
        assert int(page.text_content("#v-valid")) >= 3 and page.locator("svg.chart rect.k-valid").count() >= 1
        shot("07-verification")
        page.goto(f"{api}/validators")
        shot("08-validators")

        # /docs: Swagger UI from this node's own files
        page.goto(f"{api}/docs")
        page.wait_for_selector(".swagger-ui .info .title")
        assert page.locator(".opblock").count() >= 20
        shot("09-docs")

        # a job whose title is markup: shown literally, no script runs
        page.goto(f"{api}/")
        page.click("nav a[href='/jobs']")
        page.wait_for_url(f"{api}/jobs")
        assert XSS in page.text_content("#jobs")
        page.click(f"#jobs a[href='/jobs/{job_id}']")
        page.wait_for_url(f"{api}/jobs/{job_id}")
        assert page.text_content("#job-title") == XSS
        assert page.locator("main img").count() == 0
        # a worker trains it: progress and the loss curve arrive by live refresh, the title stays text
        page.wait_for_selector("#loss-chart polyline", timeout=120_000)
        page.wait_for_function("() => document.querySelector('main .badge').textContent === 'settled'",
                               timeout=120_000)
        assert page.text_content("#job-progress").startswith("4 of 4")
        assert page.text_content("#job-title") == XSS and page.locator("main img").count() == 0
        assert page.locator("#segments .s-valid").count() == 2
        shot("10-job")
        browser.close()
    assert dialogs == [], dialogs
    # no node's key or API token appears in any log or output of the devnet
    secrets = [x for d in sorted(root.glob("node*")) for x in ((d / "node_key").read_bytes().hex(),
                                                                (d / "api_token").read_text().strip())]
    logs = list(root.parent.rglob("*.log"))  # devnet.log and every node.log and stdout.log
    assert len(logs) >= 9 and not any(sec in f.read_text(errors="replace") for f in logs for sec in secrets)
    assert not [e for e in errors if "Content Security Policy" in e or "Refused" in e], errors
