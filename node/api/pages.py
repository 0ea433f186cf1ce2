"""The block explorer: server-rendered HTML pages (Jinja2 with autoescape on; every user-supplied string such as
a job title is text, never markup) with a small local script for live refresh (``static/explorer.js``).

Pages: ``/`` (head, finality, validators, peers, swarm coverage, latest blocks and receipts), ``/blocks``,
``/blocks/{height}``, ``/tx/{id}``, ``/receipts``, ``/receipts/{id}``, ``/accounts/{peer}``, ``/validators``,
``/swarm``, ``/peers`` (each connected peer's path, address and round trip), ``/models``, ``/verification``, ``/jobs``,
``/jobs/{id}``, ``/runs``, ``/runs/{id}``, ``/batches``, ``/batches/{id}`` and ``/search?q=`` (303 to
the match). A missing object answers a 404 page; a malformed id a 400 page.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from pathlib import Path as FsPath

import jinja2
from fastapi import APIRouter, Path, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse

from . import charts, views as v
from .runs import RUN_STATUSES, list_runs, run_view
from .security import ApiError

TEMPLATES = FsPath(__file__).parent / "templates"
VERIF_KEYS = ["valid", "invalid", "abstain", "slashes"]


def environment() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES)), autoescape=True,
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    env.filters["short"] = lambda s, n=10: s if not s or len(s) <= n + 2 else f"{s[:n]}…"
    env.filters["credits"] = lambda a: "—" if a is None else a["credits"]
    env.filters["utc"] = lambda ms: "—" if ms is None else datetime.fromtimestamp(
        ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    env.filters["pct"] = lambda x, total: f"{100 * x / total:.0f}%" if total else "—"
    return env


def pages_router(node, q) -> APIRouter:
    """Explorer routes for ``node`` (views from ``q``, a :class:`~node.api.queries.Queries`)."""
    env = environment()
    r = APIRouter(include_in_schema=False, default_response_class=HTMLResponse)

    def page(name: str, status: int = 200, **ctx) -> HTMLResponse:
        st = node.ledger.state
        html = env.get_template(name).render(chain_id=st.chain_id, head=st.height, now_ms=int(time.time() * 1000),
                                             **ctx)
        return HTMLResponse(html, status_code=status, headers={"Cache-Control": "no-store"})

    @r.get("/")
    async def home():
        status = q.status()
        head = q.blocks(10, None)["blocks"]
        last = node.store.get_block_raw(status["height"]) if status["height"] else None
        sw = q.swarm()
        mine = [s for s in sw["servers"] if s["model_id"] == sw["model_id"]]
        return page("home.html", ns=status, blocks=head, receipts=q.receipts(10, None)["receipts"],
                    verif=q.verification(24), vals=q.validators(100), swarm=sw,
                    cov=charts.coverage(sw["num_blocks"], mine, sw["coverage"]), mine=mine,
                    commit_signers=len(last["c"]) if last else 0)

    @r.get("/blocks")
    async def blocks(before: int | None = Query(None, ge=1, le=2**62)):
        return page("blocks.html", page=q.blocks(50, before))

    @r.get("/blocks/{height}")
    async def block(height: int = Path(..., ge=1, le=2**62)):
        return page("block.html", b=q.block(height))

    @r.get("/tx/{tx_id}")
    async def tx(tx_id: str = Path(..., max_length=64)):
        tid = v.parse_id(tx_id, "transaction id")
        if tid in node.ledger.state.receipts:
            return RedirectResponse(f"/receipts/{tid.hex()}", status_code=303)
        try:
            t = q.tx(tid)
        except ApiError as e:  # in no stored block: say what this node knows (pending and why, dropped and why)
            st = node.ledger.tx_status(tid) if e.status == 404 else None
            if st is None or st.state.value not in ("pending", "dropped"):
                raise
            raise ApiError(404, st.state.value,
                           f"transaction {tid.hex()} is in no block yet: {st.describe()}") from None
        return page("tx.html", t=t)

    @r.get("/receipts")
    async def receipts(cursor: str | None = Query(None, max_length=64),
                       status: str | None = Query(
                           None, pattern="^(pending|sampled|valid|invalid|settled|unverified)$")):
        return page("receipts.html", page=q.receipts(50, cursor, status), status_filter=status)

    @r.get("/receipts/{receipt_id}")
    async def receipt(receipt_id: str = Path(..., max_length=64)):
        rec = q.receipt(v.parse_id(receipt_id, "receipt id"))
        loc = node.store.tx_location(bytes.fromhex(rec["id"]))
        return page("receipt.html", r=rec, job=_job_of(rec), in_block=loc[0] if loc else rec["height"])

    def _job_of(rec):
        if rec.get("job_id"):
            try:
                return q.job(bytes.fromhex(rec["job_id"]))
            except ApiError:
                return None
        return None

    @r.get("/accounts/{account}")
    async def account(account: str = Path(..., max_length=128), cursor: str | None = Query(None, max_length=64),
                      rcursor: str | None = Query(None, max_length=96)):
        a = v.parse_account(account)
        return page("account.html", acc=q.account(a), hist=q.history(a, 25, cursor),
                    recs=q.account_receipts(a, 10, rcursor), is_validator=a in node.ledger.state.validators,
                    is_self=a == node.ident.account)

    @r.get("/validators")
    async def validators():
        return page("validators.html", vals=q.validators(100), bonds=q.bonds())

    @r.get("/swarm")
    async def swarm():
        sw = q.swarm()
        mine = [s for s in sw["servers"] if s["model_id"] == sw["model_id"]]
        return page("swarm.html", swarm=sw, mine=mine, cov=charts.coverage(sw["num_blocks"], mine, sw["coverage"]))

    @r.get("/peers")
    async def peers():
        status = q.status()
        return page("peers.html", ns=status, net=status.get("network"))

    @r.get("/models")
    async def models():
        from .modelsapi import models_view

        return page("models.html", models=models_view(node)["models"])

    @r.get("/verification")
    async def verification():
        ver = q.verification(24)
        return page("verification.html", verif=ver,
                    outcome=charts.stacked_bars(ver["series"], VERIF_KEYS),
                    sampling=charts.stacked_bars(ver["series"], ["sampled"]))

    @r.get("/jobs")
    async def jobs(cursor: str | None = Query(None, max_length=64), status: str | None = Query(None, max_length=32)):
        return page("jobs.html", page=q.jobs(50, cursor, status), status_filter=status,
                    market=hasattr(node.ledger.state, "jobs"))

    @r.get("/jobs/{job_id}")
    async def job(job_id: str = Path(..., max_length=32)):
        j = q.job(v.parse_id(job_id, "job id", 16))
        recs = [q.receipt(bytes.fromhex(s)) for s in j["segments"] if bytes.fromhex(s) in node.ledger.state.receipts]
        return page("job.html", j=j, loss=charts.line(j["losses"]), segs=recs)

    @r.get("/runs")
    async def runs(status: str | None = Query(None, pattern=f"^({RUN_STATUSES})$"),
                   offset: int = Query(0, ge=0, le=10**9)):
        return page("runs.html", page=list_runs(node.ledger.state, status, 50, offset), status_filter=status,
                    offset=offset)

    @r.get("/runs/{run_id}")
    async def run(run_id: str = Path(..., max_length=32)):
        rid = v.parse_id(run_id, "run id", 16)
        st = node.ledger.state
        if rid not in st.runs:
            raise ApiError(404, "not_found", "no such run on the ledger")
        x = run_view(st.runs[rid], st, node.store.archived_summary)
        return page("run.html", run=x, loss=charts.line(x["loss_per_round"]))

    @r.get("/batches")
    async def batches(offset: int = Query(0, ge=0, le=10**9)):
        from ..batch.client import batch_json

        st = node.ledger.state
        bs = sorted(st.tables["batches"].values(), key=lambda b: (-b.height, b.post.id))
        return page("batches.html", page={"batches": [batch_json(b, st) for b in bs[offset:offset + 50]],
                                          "total": len(bs)})

    @r.get("/batches/{batch_id}")
    async def batch(batch_id: str = Path(..., max_length=32)):
        from ..batch.client import batch_json

        bid = v.parse_id(batch_id, "batch id", 16)
        st = node.ledger.state
        b = st.tables["batches"].get(bid)
        if b is None:
            raise ApiError(404, "not_found", "no such batch on the ledger")
        return page("batch.html", b=batch_json(b, st, with_items=True))

    @r.get("/search")
    async def search(q_: str = Query("", alias="q", max_length=256)):
        try:
            hit = q.search(q_)
        except ApiError as e:
            return page("search.html", status=e.status, query=q_, message=e.message)
        return RedirectResponse(hit["url"], status_code=303)

    return r


def error_page(request: Request, status: int, code: str, message: str) -> HTMLResponse:
    """The HTML error page for explorer routes."""
    html = environment().get_template("error.html").render(
        chain_id="", head=None, now_ms=int(time.time() * 1000), status=status, code=code, message=message)
    return HTMLResponse(html, status_code=status)
