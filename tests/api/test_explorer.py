"""Explorer pages over HTTP (the browser tests are in test_browser.py): every page renders, search redirects,
user-supplied strings are escaped, and the chart geometry is sound."""

from __future__ import annotations

import re
from types import SimpleNamespace

import httpx

from node.api import charts
from node.api.pages import environment

from .conftest import get

XSS = "<img src=x onerror=alert(1)>"
HTML = {"Accept": "text/html"}


def test_every_page_renders_and_search_redirects(live):
    api, c = live.api, live.client
    gen = live.generate([2, 7, 1], 2)
    rid = gen.receipts[0].id.hex()
    me = c.ident.peer_id
    rec = get(f"{api}/v1/receipts/{rid}").json()
    for path, needle in [("/", "Latest blocks"), ("/blocks", "Proposer"), (f"/blocks/{rec['height']}", rid[:12]),
                         (f"/receipts/{rid}", "Committee"), (f"/accounts/{me}", "History"),
                         ("/validators", me[:14]), ("/swarm", "6</strong> of them"),
                         ("/verification", "Verdicts, abstentions"), ("/jobs", "Fine-tune jobs"),
                         ("/models", "6 / 6"),
                         (f"/tx/{rid}", "Committee")]:
        r = get(api + path, headers=HTML, follow_redirects=True)
        assert r.status_code == 200 and needle in r.text, (path, r.status_code)
        assert r.headers["content-type"].startswith("text/html")
        assert not re.search(r"(src|href)=\"https?://", r.text), path  # nothing from a CDN
        assert "<script>" not in r.text  # no inline script (the CSP forbids it anyway)
    receipt_page = get(f"{api}/receipts/{rid}", headers=HTML).text
    assert receipt_page.count('class="badge s-valid"') >= 3 and "worker's pay" in receipt_page
    for q, where in [(str(rec["height"]), f"/blocks/{rec['height']}"), (rid, f"/receipts/{rid}"),
                     (me, f"/accounts/{me}"), (f"  {rec['height']} ", f"/blocks/{rec['height']}")]:
        r = httpx.get(f"{api}/search", params={"q": q}, headers=HTML, timeout=30)
        assert r.status_code == 303 and r.headers["location"] == where, q
    r = get(f"{api}/search", params={"q": XSS}, headers=HTML)
    assert r.status_code == 404 and "&lt;img src=x onerror=alert(1)&gt;" in r.text and XSS not in r.text
    for path, status in [("/blocks/999999", 404), ("/receipts/zz", 400), ("/accounts/nobody", 400),
                         ("/no/such/page", 404), ("/jobs/" + "00" * 16, 404)]:
        r = get(api + path, headers=HTML)
        assert r.status_code == status and "<h1>" in r.text, path


def test_v1_models_lists_the_model_and_its_servers(live):
    body = get(f"{live.api}/v1/models").json()
    mine = body["models"][0]
    assert mine["this_node"] and mine["name"] == "tiny-0" and mine["quantization"] is None
    assert mine["coverage"] == [1] * 6 and mine["num_blocks"] == 6 and len(mine["servers"]) == 3


def test_gossiped_strings_are_text_on_the_swarm_page(live):
    """Span announcements come from any peer: their addresses are shown escaped."""
    c = live.client
    evil = "12D3KooWEvil"

    def inject():
        c.swarm.entries[evil] = {"model_id": b"\x01" * 32, "start": 0, "end": 1, "addrs": [XSS],
                                 "seen": c.swarm.clock(), "ttl": 60.0, "active": 0, "seq": 1, "refreshes": 0}

    def remove():
        c.swarm.entries.pop(evil, None)

    live.call(inject)
    try:
        r = get(f"{live.api}/swarm", headers=HTML)
        sw = get(f"{live.api}/v1/swarm").json()
    finally:
        live.call(remove)
    assert "&lt;img src=x onerror=alert(1)&gt;" in r.text and XSS not in r.text
    other = [s for s in sw["servers"] if s["peer"] == evil]  # another model: listed, not counted as coverage
    assert other and other[0]["model_id"] == "01" * 32 and sw["coverage"] == [1] * 6 and len(sw["servers"]) == 4


def _job(title: str) -> dict:
    return {"id": "ab" * 16, "title": title, "status": "accepted", "status_text": "training",
            "requester": "12D3KooWA", "worker": "12D3KooWB", "height": 3, "deadline": 99, "steps": 30, "next_step": 20,
            "price": {"base_units": "1", "credits": "0.000000001"}, "escrow_left": {"base_units": "0", "credits": "0"},
            "refunded": {"base_units": "0", "credits": "0"}, "losses": [4.1, 3.2, None], "segments": [],
            "adapter": None, "fields": {"targets": XSS}}


def test_templates_escape_job_titles_and_fields():
    env = environment()
    base = {"chain_id": "<b>chain</b>", "head": 5, "now_ms": 0}
    job = _job(XSS)
    html = env.get_template("job.html").render(**base, j=job, loss=charts.line(job["losses"]), segs=[])
    assert XSS not in html and html.count("&lt;img src=x onerror=alert(1)&gt;") >= 2
    assert "<b>chain</b>" not in html and "&lt;b&gt;chain&lt;/b&gt;" in html
    assert "<polyline" in html and 'class="nan"' in html  # the loss curve, with its NaN segment marked
    page = SimpleNamespace(jobs=[job], next=None)
    html = env.get_template("jobs.html").render(**base, page={"jobs": [job], "next": None}, status_filter=None,
                                                market=True)
    assert XSS not in html and "&lt;img src=x onerror=alert(1)&gt;" in html
    del page


def test_chart_geometry():
    series = [{"from_height": 1 + 10 * i, "to_height": 10 * (i + 1), "valid": i, "invalid": 1, "abstain": 0,
               "slashes": 0} for i in range(5)]
    c = charts.stacked_bars(series, ["valid", "invalid"])
    assert len(c["bars"]) == 5 and all(p["h"] > 0 for b in c["bars"] for p in b["parts"])
    tallest = max(sum(p["h"] for p in b["parts"]) for b in c["bars"])
    assert tallest <= c["base"] - 8 + 1e-6  # within the plot area
    cov = charts.coverage(6, [{"peer": "p1", "span": [0, 2]}, {"peer": "p2", "span": [2, 6]}], [1, 1, 1, 1, 0, 0])
    assert [x["cls"] for x in cov["cells"]][-2:] == ["gap", "gap"] and len(cov["rows"]) == 2
    assert abs(cov["rows"][1]["x"] - (cov["rows"][0]["x"] + cov["rows"][0]["w"])) < 0.02
    ln = charts.line([3.0, 2.0, None, 1.0])
    assert len(ln["paths"]) == 2 and len(ln["gaps"]) == 1 and len(ln["points"]) == 3
