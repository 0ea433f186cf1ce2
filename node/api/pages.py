"""The block explorer: server-rendered HTML pages (Jinja2 with autoescape on; every user-supplied string such as
a job title is text, never markup) with a small local script for live refresh (``static/explorer.js``).

Pages: ``/`` (head, finality, validators, peers, swarm coverage, latest blocks and receipts), ``/blocks``,
``/blocks/{height}``, ``/tx/{id}``, ``/receipts``, ``/receipts/{id}``, ``/accounts/{peer}``, ``/validators``,
``/swarm``, ``/peers`` (each connected peer's path, address and round trip), ``/models``, ``/verification``, ``/jobs``,
``/jobs/{id}``, ``/runs``, ``/runs/{id}``, ``/batches``, ``/batches/{id}``, ``/tabs/{id}``, ``/settlements/{key}``
(an epoch batch not yet final) and ``/search?q=`` (303 to the match). A missing object answers a 404 page; a
malformed id a 400 page.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from pathlib import Path as FsPath
from typing import Any

import jinja2
from fastapi import APIRouter, Path, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from ..batch.client import batch_json
from ..ledger.core.runstate import runs_of
from ..ledger.txstatus import TxState
from ..settle.api import MAX_TABS, final_settlement_json, settlement_json, tab_json, tabs_of
from ..training.api import RUN_STATUSES, list_runs, run_view
from ..web.errors import ApiError
from ..web.views import Json, parse_account, parse_id
from . import charts
from .deps import NodeAPI, NodeAPIDep
from .modelsapi import models_view
from .queries import Queries, QueriesDep

TEMPLATES = FsPath(__file__).parent / "templates"
VERIF_KEYS = ["valid", "invalid", "abstain", "slashes"]
WORKER_COLOURS = 8  # the run page's bytes chart colours workers k-w0..k-w7 (explorer.css), then repeats


def environment() -> jinja2.Environment:
    """The explorer's Jinja2 environment: ``templates/``, autoescape, strict undefined, and the filters ``short``,
    ``credits``, ``utc`` and ``pct``."""
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES)), autoescape=True,
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    env.filters["short"] = lambda s, n=10: s if not s or len(s) <= n + 2 else f"{s[:n]}…"
    env.filters["credits"] = lambda a: "—" if a is None else a["credits"]
    env.filters["utc"] = lambda ms: "—" if ms is None else datetime.fromtimestamp(
        ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    env.filters["pct"] = lambda x, total: f"{100 * x / total:.0f}%" if total else "—"
    return env


ENV = environment()
router = APIRouter(include_in_schema=False, default_response_class=HTMLResponse)
"""The explorer's pages; each reads the node of the app it reached (:data:`NodeAPIDep`) through its views
(:data:`QueriesDep`)."""


def page(node: NodeAPI, name: str, status: int = 200, **ctx: Any) -> HTMLResponse:
    """Render template ``name`` with ``ctx`` and the chain's id and height (never cached: the head moves)."""
    st = node.ledger.state
    html = ENV.get_template(name).render(chain_id=st.chain_id, head=st.height, now_ms=int(time.time() * 1000),
                                         **ctx)
    return HTMLResponse(html, status_code=status, headers={"Cache-Control": "no-store"})


@router.get("/")
async def home(queries: QueriesDep, node: NodeAPIDep) -> HTMLResponse:
    status = queries.status()
    head = queries.blocks(10, None)["blocks"]
    last = node.store.get_block_raw(status["height"]) if status["height"] else None
    sw = queries.swarm()
    mine = [s for s in sw["servers"] if s["model_id"] == sw["model_id"]]
    return page(node, "home.html", ns=status, blocks=head, receipts=queries.receipts(10, None)["receipts"],
                verif=queries.verification(24), vals=queries.validators(100), swarm=sw,
                cov=charts.coverage(sw["num_blocks"], mine, sw["coverage"]), mine=mine,
                commit_signers=len(last["c"]) if last else 0)


@router.get("/blocks")
async def blocks(queries: QueriesDep, node: NodeAPIDep,
                 before: int | None = Query(None, ge=1, le=2**62)) -> HTMLResponse:
    return page(node, "blocks.html", page=queries.blocks(50, before))


@router.get("/blocks/{height}")
async def block(queries: QueriesDep, node: NodeAPIDep, height: int = Path(..., ge=1, le=2**62)) -> HTMLResponse:
    return page(node, "block.html", b=queries.block(height))


@router.get("/tx/{tx_id}")
async def tx(queries: QueriesDep, node: NodeAPIDep, tx_id: str = Path(..., max_length=64)) -> Response:
    tid = parse_id(tx_id, "transaction id")
    if tid in node.ledger.state.receipts:
        return RedirectResponse(f"/receipts/{tid.hex()}", status_code=303)
    try:
        t = queries.tx(tid)
    except ApiError as e:  # in no stored block: say what this node knows (pending and why, dropped and why)
        st = node.ledger.tx_status(tid) if e.status == 404 else None
        if st is None or st.state not in (TxState.PENDING, TxState.DROPPED):
            raise
        raise ApiError(404, st.state.value,
                       f"transaction {tid.hex()} is in no block yet: {st.describe()}") from None
    return page(node, "tx.html", t=t)


@router.get("/receipts")
async def receipts(queries: QueriesDep, node: NodeAPIDep, cursor: str | None = Query(None, max_length=64),
                   status: str | None = Query(
                       None, pattern="^(pending|sampled|valid|invalid|settled|unverified)$")) -> HTMLResponse:
    return page(node, "receipts.html", page=queries.receipts(50, cursor, status), status_filter=status)


@router.get("/receipts/{receipt_id}")
async def receipt(queries: QueriesDep, node: NodeAPIDep, receipt_id: str = Path(..., max_length=64)) -> HTMLResponse:
    rec = queries.receipt(parse_id(receipt_id, "receipt id"))
    loc = node.store.tx_location(bytes.fromhex(rec["id"]))
    return page(node, "receipt.html", r=rec, job=_job_of(queries, rec), in_block=loc[0] if loc else rec["height"])


def _job_of(queries: Queries, rec: Json) -> Json | None:
    """The job a receipt belongs to, or None (not a job's segment, or no such job)."""
    if rec.get("job_id"):
        try:
            return queries.job(bytes.fromhex(rec["job_id"]))
        except ApiError:
            return None
    return None


@router.get("/accounts/{account}")
async def account(queries: QueriesDep, node: NodeAPIDep, account: str = Path(..., max_length=128),
                  cursor: str | None = Query(None, max_length=64),
                  rcursor: str | None = Query(None, max_length=96)) -> HTMLResponse:
    a = parse_account(account)
    st = node.ledger.state
    tabs, _ = tabs_of(st, a)  # a scan of the tab table: at most MAX_TABS shown
    return page(node, "account.html", acc=queries.account(a), hist=queries.history(a, 25, cursor),
                recs=queries.account_receipts(a, 10, rcursor), is_validator=a in st.validators,
                is_self=a == node.ident.account, tabs=tabs)


@router.get("/validators")
async def validators(queries: QueriesDep, node: NodeAPIDep) -> HTMLResponse:
    return page(node, "validators.html", vals=queries.validators(100), bonds=queries.bonds())


@router.get("/swarm")
async def swarm(queries: QueriesDep, node: NodeAPIDep) -> HTMLResponse:
    sw = queries.swarm()
    mine = [s for s in sw["servers"] if s["model_id"] == sw["model_id"]]
    return page(node, "swarm.html", swarm=sw, mine=mine, cov=charts.coverage(sw["num_blocks"], mine, sw["coverage"]))


@router.get("/peers")
async def peers(queries: QueriesDep, node: NodeAPIDep) -> HTMLResponse:
    status = queries.status()
    return page(node, "peers.html", ns=status, net=status.get("network"))


@router.get("/models")
async def models(node: NodeAPIDep) -> HTMLResponse:
    return page(node, "models.html", models=models_view(node)["models"])


@router.get("/verification")
async def verification(queries: QueriesDep, node: NodeAPIDep) -> HTMLResponse:
    ver = queries.verification(24)
    return page(node, "verification.html", verif=ver,
                outcome=charts.stacked_bars(ver["series"], VERIF_KEYS),
                sampling=charts.stacked_bars(ver["series"], ["sampled"]))


@router.get("/jobs")
async def jobs(queries: QueriesDep, node: NodeAPIDep, cursor: str | None = Query(None, max_length=64),
               status: str | None = Query(None, max_length=32)) -> HTMLResponse:
    return page(node, "jobs.html", page=queries.jobs(50, cursor, status), status_filter=status,
                market="jobs" in node.ledger.state.tables)


@router.get("/jobs/{job_id}")
async def job(queries: QueriesDep, node: NodeAPIDep, job_id: str = Path(..., max_length=32)) -> HTMLResponse:
    j = queries.job(parse_id(job_id, "job id", 16))
    recs = [queries.receipt(bytes.fromhex(s)) for s in j["segments"] if bytes.fromhex(s) in node.ledger.state.receipts]
    return page(node, "job.html", j=j, loss=charts.line(j["losses"]), segs=recs)


@router.get("/runs")
async def runs(node: NodeAPIDep, status: str | None = Query(None, pattern=f"^({RUN_STATUSES})$"),
               offset: int = Query(0, ge=0, le=10**9)) -> HTMLResponse:
    return page(node, "runs.html", page=list_runs(node.ledger.state, status, 50, offset), status_filter=status,
                offset=offset)


@router.get("/runs/{run_id}")
async def run(node: NodeAPIDep, run_id: str = Path(..., max_length=32)) -> HTMLResponse:
    rid = parse_id(run_id, "run id", 16)
    st = node.ledger.state
    if rid not in runs_of(st):
        raise ApiError(404, "not_found", "no such run on the ledger")
    x = run_view(runs_of(st)[rid], st, node.store.archived_summary)
    return page(node, "run.html", **run_charts(x))


def run_charts(x: Json) -> dict[str, Any]:
    """The run page's context for the run view ``x`` (:func:`node.training.api.run_view`): the run, its mean
    training loss and its held-out loss per round (:func:`charts.line`), and the Δ bytes each worker uploaded per
    round as stacked bars (keys ``w0, w1, ...``: ``colour`` maps each to its CSS colour class, ``peer`` to its
    account, in the legend's order)."""
    workers = sorted({w for r in x["bytes_per_worker"] for w in r})
    key = {w: f"w{i}" for i, w in enumerate(workers)}
    series = [{"label": f"round {i + 1}", "xlabel": i + 1, **{key[w]: n for w, n in r.items()}}
              for i, r in enumerate(x["bytes_per_worker"])]
    return {"run": x, "loss": charts.line(x["loss_per_round"]), "heldout": charts.line(x["heldout_per_round"]),
            "wbytes": charts.stacked_bars(series, [key[w] for w in workers]),
            "colour": {key[w]: f"w{i % WORKER_COLOURS}" for i, w in enumerate(workers)},
            "peer": {key[w]: w for w in workers}}


@router.get("/batches")
async def batches(node: NodeAPIDep, offset: int = Query(0, ge=0, le=10**9)) -> HTMLResponse:
    st = node.ledger.state
    bs = sorted(st.tables["batches"].values(), key=lambda b: (-b.height, b.post.id))
    return page(node, "batches.html", page={"batches": [batch_json(b, st) for b in bs[offset:offset + 50]],
                                      "total": len(bs)})


@router.get("/batches/{batch_id}")
async def batch(node: NodeAPIDep, batch_id: str = Path(..., max_length=32)) -> HTMLResponse:
    bid = parse_id(batch_id, "batch id", 16)
    st = node.ledger.state
    b = st.tables["batches"].get(bid)
    if b is None:
        raise ApiError(404, "not_found", "no such batch on the ledger")
    return page(node, "batch.html", b=batch_json(b, st, with_items=True))


@router.get("/tabs/{tab_id}")
async def tab(node: NodeAPIDep, tab_id: str = Path(..., max_length=64)) -> HTMLResponse:
    tid = parse_id(tab_id, "tab id", 32)
    st = node.ledger.state
    t = st.tables["tabs"].get(tid)
    if t is None:
        raise ApiError(404, "not_found", "no such tab on the ledger (unknown, or closed)")
    mine = [settlement_json(k, x) for k, x in st.tables["settlements"].items() if x.worker == t.worker]
    return page(node, "tab.html", t=tab_json(tid, t), batches=mine[:MAX_TABS])


@router.get("/settlements/{key}")
async def settlement(node: NodeAPIDep, key: str = Path(..., max_length=64)) -> HTMLResponse:
    k = parse_id(key, "batch key", 32)
    x = node.ledger.state.tables["settlements"].get(k)
    s = settlement_json(k, x) if x is not None else final_settlement_json(node.store, k)
    if s is None:
        raise ApiError(404, "not_found", "no epoch batch under that key")
    return page(node, "settlement.html", s=s)


@router.get("/search")
async def search(queries: QueriesDep, node: NodeAPIDep, q_: str = Query("", alias="q", max_length=256)) -> Response:
    try:
        hit = queries.search(q_)
    except ApiError as e:
        return page(node, "search.html", status=e.status, query=q_, message=e.message)
    return RedirectResponse(hit["url"], status_code=303)


def error_page(request: Request, status: int, code: str, message: str) -> HTMLResponse:
    """The HTML error page for explorer routes."""
    html = environment().get_template("error.html").render(
        chain_id="", head=None, now_ms=int(time.time() * 1000), status=status, code=code, message=message)
    return HTMLResponse(html, status_code=status)
