"""Read side of the API and explorer: everything a page or a JSON route shows, from the node's state and store.

All methods are synchronous and cheap; they run on the node's event loop. Blocks are immutable once stored, so
their views are cached by height; views derived from the whole state (verification statistics, validator
activity) are cached until the next block. Errors are :class:`~node.web.errors.ApiError` (404 ``not_found``,
400 ``bad_id`` / ``bad_account`` / ``bad_cursor``).
"""

from __future__ import annotations

import time
from collections import Counter, OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, TypeVar

from fastapi import Depends, Request

from ..identity import account_from_str
from ..ledger.core.batch import reputation
from ..ledger.core.block import Header, decode_block
from ..ledger.core.capture import capture_risk
from ..ledger.core.history import read_head
from ..ledger.core.jobstate import jobs_of
from ..ledger.core.runstate import runs_of
from ..ledger.core.staking import evidence_of
from ..ledger.core.state import FINAL
from ..ledger.core.status import INVALID_S, PENDING, SETTLED, UNVERIFIED, VALID_S
from ..ledger.core.tabs import Reveal
from ..ledger.core.tx import ABSTAIN, VERDICT_NAMES
from ..ledger.genesis import TREASURY
from ..web.errors import ApiError
from ..web.views import Json, acct, amount
from . import views as v

if TYPE_CHECKING:
    from ..ledger.core.jobstate import Job
    from ..ledger.core.kv import Table
    from ..ledger.core.state import State
    from ..ledger.store import LedgerStore
    from .deps import NodeAPI

MAX_PAGE = 200
SCAN_BLOCKS = 2000  # blocks one page of a status-filtered receipt listing reads at most


K = TypeVar("K")
V = TypeVar("V")


class _LRU(OrderedDict[K, V]):
    """An ordered dict that keeps its ``size`` most recently put entries."""

    def __init__(self, size: int) -> None:
        super().__init__()
        self.size = size

    def put(self, k: K, val: V) -> V:
        self[k] = val
        if len(self) > self.size:
            self.popitem(last=False)
        return val


def _cursor(text: str | None, n: int | None = None) -> bytes | None:
    if not text:
        return None
    try:
        b = bytes.fromhex(text)
    except ValueError:
        b = b""
    if not b or (n is not None and len(b) != n) or len(b) > 64:
        raise ApiError(400, "bad_cursor", "cursor must be the `next` value of a previous page")
    return b


def _pruned(store: LedgerStore, height: int) -> None:
    """Raise a clear 404 for a block whose body this node no longer holds (``node start --prune-bodies``)."""
    low = store.pruned_below
    if height < low:
        raise ApiError(404, "not_found", f"the body of block {height} is pruned on this node (it keeps block "
                                         f"bodies from height {low}; headers and commits are kept)")


class Queries:
    """Views of one node (:class:`node.runtime.Node`)."""

    def __init__(self, node: NodeAPI) -> None:
        self.node = node
        self._blocks: _LRU[int, Json] = _LRU(512)  # height -> block view
        self._summaries: _LRU[int, tuple[Json, set[bytes]]] = _LRU(8192)  # height -> (summary, commit signers)
        self._state_cache: dict[str, tuple[object, Json]] = {}
        # account -> (state, view): balances change only with a new state
        self._accounts: _LRU[bytes, tuple[State, Json]] = _LRU(1024)
        self._capture: tuple[tuple[int, bytes], str | None] | None = None  # ((height, hash), committee warning)

    @property
    def state(self) -> State:
        """The node's ledger state now (a new object after each block)."""
        return self.node.ledger.state

    def _per_state(self, key: str, fn: Callable[[], Json]) -> Json:
        st = self.state
        hit = self._state_cache.get(key)
        if hit is not None and hit[0] is st:
            return hit[1]
        val = fn()
        self._state_cache[key] = (st, val)
        return val

    # ------------------------------------------------------------------ node and accounts

    def status(self) -> Json:
        """``GET /v1/status`` (:class:`~node.api.models.StatusOut`)."""
        n, st = self.node, self.state
        head = self.block_summary(st.height) if st.height else None
        return {
            "chain_id": st.chain_id, "height": st.height, "head_hash": st.last_hash.hex(),
            "head_time_ms": head["time_ms"] if head else None, "peer_id": n.ident.peer_id, "addrs": n.host.addrs,
            "validator": n.ledger.is_validator, "validators": len(st.validators), "peers": n.host.connected_peers(),
            "mempool": len(n.ledger.mempool), "model_id": n.manifest.model_id.hex(),
            "num_blocks": n.manifest.num_blocks, "span": list(n.cfg.span) if isinstance(n.cfg.span, tuple) else None,
            "swarm": [{"peer": p, "span": [s, e]} for p, s, e in n.swarm.live(n.manifest.model_id)],
            "supply": amount(st.supply()), "genesis_hash": n.genesis.hash.hex(),
            "network": n.net.status() if n.net is not None else None,
            "pruned_below": n.store.pruned_below, **self._history_status(st),
            "consensus": self._consensus(),
            "committee_warning": self._committee_warning(st),
            "memory": self._memory(),
        }

    def _memory(self) -> Json | None:
        """``node start --max-memory``'s budget and what committee duty holds of it; None without a budget."""
        budget = self.node.cfg.budget
        if budget is None:
            return None
        member = self.node.member
        return {**budget.view(), **(member.memory_view() if member is not None else {})}

    def _committee_warning(self, st: State) -> str | None:
        """:func:`node.ledger.core.capture.capture_risk` for the bonded accounts of ``st``, computed once per height
        (it counts every account)."""
        cached = self._capture
        if cached is None or cached[0] != (st.height, st.last_hash):
            cached = self._capture = ((st.height, st.last_hash), capture_risk(len(st.eligible()), st.params))
        return cached[1]

    def _consensus(self) -> Json | None:
        """The consensus driver's state (:meth:`node.ledger.driver.ConsensusDriver.status`); None without one."""
        driver = self.node.ledger.driver
        if driver is None:
            return None
        out = driver.status()
        return {**out, "proposer": acct(out["proposer"])}

    @staticmethod
    def _history_status(st: State) -> Json:
        head = read_head(st)
        return {"history_size": head.size, "history_root": head.root.hex() if head.size else None}

    def account(self, a: bytes) -> Json:
        """Account ``a`` (:class:`~node.api.models.AccountOut`), cached until the state changes."""
        st = self.state
        hit = self._accounts.get(a)
        if hit is not None and hit[0] is st:
            return hit[1]
        offer = reputation(st, a).offer  # its batch offer's floor per token (node.ledger.core.batch), -1: none
        view = {**v.account_json(st.account(a), a, st.height, st.params.min_bond),
                "batch_offer": amount(offer) if offer >= 0 else None}
        self._accounts.put(a, (st, view))
        return view

    def history(self, a: bytes, limit: int, cursor: str | None) -> Json:
        """A page of ``a``'s history, newest first. Raises ApiError 400 ``bad_cursor``."""
        items, nxt = self.node.store.history(a, min(limit, MAX_PAGE), _cursor(cursor, 12))
        return {"account": acct(a), "events": [v.event_json(h, s, ev) for h, s, ev in items],
                "next": nxt.hex() if nxt else None}

    def account_receipts(self, a: bytes, limit: int, cursor: str | None) -> Json:
        """A page of the receipts naming ``a`` (still in the state), newest first. Raises ApiError 400
        ``bad_cursor``."""
        items, nxt = self.node.store.account_receipts(a, min(limit, MAX_PAGE), _cursor(cursor, 40))
        recs = self.state.receipts
        out = [{"role": role, "receipt": v.receipt_json(recs[rid])} for _, rid, role in items if rid in recs]
        return {"account": acct(a), "receipts": out, "next": nxt.hex() if nxt else None}

    def bonds(self) -> Json:
        """Bonded (or slashed) accounts, largest bond first, the treasury left out."""
        st = self.state
        p = st.params
        rows = [{"account": acct(a), "bond": amount(x.bond), "balance": amount(x.balance),
                 "slashed": amount(x.slashed), "valid_run": x.valid_run, "eligible": x.bond >= p.min_bond,
                 "validator": a in st.validators}
                for a, x in st.accounts.items() if (x.bond or x.slashed) and a != TREASURY]
        rows.sort(key=lambda r: -int(r["bond"]["base_units"]))
        return {"min_bond": amount(p.min_bond), "slash_amount": amount(p.slash_amount), "bonds": rows}

    # ------------------------------------------------------------------ blocks and transactions

    def block(self, height: int) -> Json:
        """The block at ``height`` with its commit. Raises ApiError 404 (no such block, or its body pruned)."""
        hit = self._blocks.get(height)
        if hit is not None:
            return hit
        raw = self.node.store.db.get(b"B" + height.to_bytes(8, "big")) if 1 <= height < 2**63 else None
        if raw is None:
            raise ApiError(404, "not_found", f"no block at height {height}")
        _pruned(self.node.store, height)
        d = self.node.store.expand_record(height, raw)  # either stored format (node.ledger.core.blockcodec)
        return self._blocks.put(height, v.block_json(decode_block(d["b"]), d["c"], len(raw)))

    def block_summary(self, height: int) -> Json:
        """One line of the block list (also for a pruned body). Raises ApiError 404 ``not_found``."""
        return self._summary(height)[0]

    def _summary(self, height: int) -> tuple[Json, set[bytes]]:
        hit = self._summaries.get(height)
        if hit is not None:
            return hit
        raw = self.node.store.get_header_raw(height)  # a pruned block's header still has a summary (no txs)
        if raw is None:
            raise ApiError(404, "not_found", f"no block at height {height}")
        _chain, h, _prev, t, proposer = raw["b"]["h"][:5]  # then the roots and the validator hashes, if any
        kinds = Counter(tx.get("t", "?") for tx in raw["b"]["txs"])
        s = {"height": h, "hash": Header(*raw["b"]["h"]).hash.hex(), "time_ms": t,
             "proposer": acct(proposer), "txs": sum(kinds.values()), "kinds": dict(kinds)}
        return self._summaries.put(height, (s, {bytes(x[0]) for x in raw["c"]}))

    def blocks(self, limit: int, before: int | None) -> Json:
        """A page of block summaries, newest first, below height ``before`` (None: from the head)."""
        top = self.state.height if before is None else min(before - 1, self.state.height)
        lo = max(1, top - min(limit, MAX_PAGE) + 1)
        rows = [self.block_summary(h) for h in range(top, lo - 1, -1)] if top >= 1 else []
        return {"blocks": rows, "next": lo if lo > 1 else None}

    def tx(self, tx_id: bytes) -> Json:
        """A transaction in a stored block. Raises ApiError 404 (in no stored block, or its body pruned)."""
        loc = self.node.store.tx_location(tx_id)
        if loc is None:
            raise ApiError(404, "not_found", "no such transaction in a stored block")
        height, index, _ = loc
        _pruned(self.node.store, height)
        got = self.node.store.get_block(height)
        assert got is not None  # located and not pruned: the store holds its body
        block, _ = got
        return v.tx_json(block.txs[index], height, index, block.hash)

    # ------------------------------------------------------------------ receipts and verification

    def receipt(self, rid: bytes) -> Json:
        """A receipt in the state, or archived in the history log. Raises ApiError 404 ``not_found``."""
        rec = self.state.receipts.get(rid)
        if rec is None:
            archived = self.node.store.history_entry(rid)  # left the hot state (node.ledger.core.history)
            if archived is not None:
                return v.archived_receipt_json(*archived)
            raise ApiError(404, "not_found", "no such receipt on the ledger")
        return v.receipt_json(rec)

    def receipts(self, limit: int, cursor: str | None, status: str | None = None) -> Json:
        """Newest first, read from the blocks backwards (O(page), not O(receipts ever made)); the cursor is the
        height and position to continue before (12 bytes as hex). A status filter scans at most
        :data:`SCAN_BLOCKS` blocks per page and then returns what it found with a cursor to go on."""
        c = _cursor(cursor, 12)
        st, store = self.state, self.node.store
        height, pos = (int.from_bytes(c[:8], "big"), int.from_bytes(c[8:], "big")) if c else (st.height, 2**31)
        out: list[Json] = []
        want = min(limit, MAX_PAGE)
        for h in range(min(height, st.height), max(0, height - SCAN_BLOCKS), -1):
            got = store.get_block(h)
            if got is None:
                continue
            txs = got[0].txs
            for i in range(min(len(txs), pos if h == height else len(txs)) - 1, -1, -1):
                tx = txs[i]
                rid = tx.tab_receipt.id if isinstance(tx, Reveal) else tx.id  # a reveal: the receipt it brought in
                rec = st.receipts.get(rid)
                archived = store.history_entry(rid) if rec is None and tx.KIND in ("receipt", "reveal") else None
                if rec is not None:
                    row = v.receipt_json(rec)
                elif archived is not None:
                    row = v.archived_receipt_json(*archived)
                else:
                    continue
                if status and row["status"] != status:
                    continue
                if len(out) == want:
                    return {"receipts": out, "next": (h.to_bytes(8, "big") + (i + 1).to_bytes(4, "big")).hex()}
                out.append(row)
        low = max(0, height - SCAN_BLOCKS)
        return {"receipts": out, "next": (low.to_bytes(8, "big") + (2**31).to_bytes(4, "big")).hex() if low else None}

    def verification(self, buckets: int = 24) -> Json:
        """Verification statistics over ``buckets`` height ranges (:class:`~node.api.models.VerificationOut`),
        cached until the state changes."""
        return self._per_state(f"verif{buckets}", lambda: self._verification(buckets))

    def _verification(self, nb: int) -> Json:
        st = self.state
        head = max(1, st.height)
        width = max(1, -(-head // nb))
        series = [{"from_height": i * width + 1, "to_height": min(head, (i + 1) * width), "receipts": 0,
                   "sampled": 0, "valid": 0, "invalid": 0, "abstain": 0, "slashes": 0}
                  for i in range(-(-head // width))]

        def at(h: int) -> Json:
            return series[min(len(series) - 1, max(0, (h - 1) // width))]

        status: Counter[str] = Counter()
        votes: Counter[int] = Counter()
        slashes, slashed = 0, 0
        for rec in st.receipts.values():
            status[rec.status] += 1
            at(rec.height)["receipts"] += 1
            if rec.committee:
                at(rec.height)["sampled"] += 1
            for _, _, verdict, _ in rec.votes:
                votes[verdict] += 1
                if verdict == ABSTAIN:
                    at(rec.height)["abstain"] += 1
            if rec.status in (VALID_S, INVALID_S):
                at(rec.final_height)[rec.status] += 1
            if rec.slashed:
                slashes += 1
                slashed += rec.slashed
                at(rec.final_height)["slashes"] += 1
        for h, amt in evidence_of(st).values():
            slashes += 1
            slashed += amt
            at(h)["slashes"] += 1
        sampled = sum(1 for rec in st.receipts.values() if rec.committee)
        return {"height": st.height, "receipts": len(st.receipts), "pending": status[PENDING],
                "sampled": sampled, "valid": status[VALID_S], "invalid": status[INVALID_S],
                "settled": status[SETTLED], "unverified": status[UNVERIFIED],
                "votes": {name: votes[k] for k, name in VERDICT_NAMES.items()},
                "slashes": slashes, "slashed": amount(slashed), "series": series}

    # ------------------------------------------------------------------ validators and swarm

    def validators(self, window: int = 100) -> Json:
        """The validator set, each member's activity over the last ``window`` blocks and the pending changes,
        cached until the state changes."""
        return self._per_state(f"vals{window}", lambda: self._validators(window))

    def _validators(self, window: int) -> Json:
        st = self.state
        lo = max(1, st.height - window + 1)
        proposed: Counter[str] = Counter()
        signed: Counter[bytes] = Counter()
        for h in range(lo, st.height + 1):
            s, signers = self._summary(h)
            proposed[s["proposer"]] += 1
            for a in signers:
                signed[a] += 1
        rows = []
        now, nxt = st.valset(), st.next_valset()
        for a in now.accounts:
            x = st.account(a)
            name = acct(a)
            rows.append({"account": name, "balance": amount(x.balance), "bond": amount(x.bond),
                         "slashed": amount(x.slashed), "proposed": proposed[name], "signed": signed[a],
                         "power": str(now.power(a))})
        # changes already decided (node.ledger.core.valset: a block's joins, leaves, bonds and slashes take effect
        # two heights later, so the state holds the set of height + 2): from the next block's set to that one
        pending = [{"account": acct(a), "power": str(nxt.power(a)), "from_power": str(now.power(a)),
                    "effective_height": st.height + 2} for a in sorted(set(now.accounts) | set(nxt.accounts))
                   if now.power(a) != nxt.power(a)]
        return {"window": st.height - lo + 1 if st.height else 0, "height": st.height, "validators": rows,
                "total_power": str(now.total), "quorum_power": str(now.total - (now.total - 1) // 3),
                "validators_hash": now.hash.hex(), "next_validators_hash": nxt.hash.hex(),
                "changes": bool(st.params.min_validator_bond),
                "min_validator_bond": amount(st.params.min_validator_bond), "pending": pending}

    def swarm(self) -> Json:
        """Live servers of every model and this node's model's block coverage (:class:`~node.api.models.SwarmOut`)."""
        n = self.node
        mid = n.manifest.model_id
        now = n.swarm.clock()
        servers: list[Json] = []
        cov = [0] * n.manifest.num_blocks
        for peer, e in sorted(n.swarm.entries.items()):
            if now - e["seen"] >= e["ttl"]:
                continue
            servers.append({"peer": peer, "model_id": bytes(e["model_id"]).hex(), "span": [e["start"], e["end"]],
                            "active": e.get("active", 0), "seen_s": round(now - e["seen"], 3),
                            "addrs": [str(x) for x in e.get("addrs", [])]})
            if e["model_id"] == mid:  # coverage of this node's model; other models are listed as they come
                for b in range(max(0, e["start"]), min(len(cov), e["end"])):
                    cov[b] += 1
        # this node's own span (it hears no own gossip)
        span = n.cfg.span  # a (start, end) once resolved, which it is when the server runs
        if isinstance(span, tuple) and n.server is not None and all(s["peer"] != n.ident.peer_id for s in servers):
            s0, e0 = span
            servers.append({"peer": n.ident.peer_id, "model_id": mid.hex(), "span": [s0, e0],
                            "active": n.server.active, "seen_s": 0.0, "addrs": n.host.addrs})
            for b in range(s0, min(len(cov), e0)):
                cov[b] += 1
        servers.sort(key=lambda x: (x["model_id"] != mid.hex(), x["span"][0], x["peer"]))
        return {"model_id": mid.hex(), "num_blocks": len(cov), "servers": servers, "coverage": cov,
                "covered": sum(1 for c in cov if c)}

    # ------------------------------------------------------------------ jobs

    def _jobs(self) -> Table[bytes, Job]:
        return jobs_of(self.state)

    def jobs(self, limit: int, cursor: str | None, status: str | None = None) -> Json:
        """A page of jobs, newest first, optionally of one status. Raises ApiError 400 ``bad_cursor``."""
        skip = int.from_bytes(_cursor(cursor) or b"", "big")
        jobs = self._jobs()
        out: list[Json] = []
        seen = 0
        for job in sorted(jobs.values(), key=lambda j: (-j.height, j.post.id)):  # newest first
            if status and job.status != status:
                continue
            seen += 1
            if seen <= skip:
                continue
            if len(out) == min(limit, MAX_PAGE):
                return {"jobs": out, "next": (skip + len(out)).to_bytes(8, "big").hex()}
            out.append(v.job_json(job))
        return {"jobs": out, "next": None}

    def job(self, jid: bytes) -> Json:
        """Job ``jid``. Raises ApiError 404 ``not_found``."""
        job = self._jobs().get(jid)
        if job is None:
            raise ApiError(404, "not_found", "no such job on the ledger")
        return v.job_json(job)

    # ------------------------------------------------------------------ search

    def search(self, q: str) -> Json:
        """Resolve a height, block hash, transaction or receipt id, job id or account.

        Raises:
            ApiError: 404 ``not_found`` when nothing matches, 400 ``bad_query`` for an empty or huge query.
        """
        q = q.strip()
        if not q or len(q) > 128:
            raise ApiError(400, "bad_query", "search for a height, a block hash, a tx/receipt/job id or an account")
        st, store = self.state, self.node.store
        if q.isascii() and q.isdigit():
            h = int(q)
            if 1 <= h <= st.height:
                return _hit("block", str(h), f"/blocks/{h}", f"/v1/blocks/{h}")
            raise ApiError(404, "not_found", f"no block at height {h} (head is {st.height})")
        try:
            b = bytes.fromhex(q.lower()) if len(q) in (32, 64) else b""
        except ValueError:
            b = b""
        if len(b) == 32:
            at = store.height_of_hash(b)
            if at is not None:
                return _hit("block", str(at), f"/blocks/{at}", f"/v1/blocks/{at}")
            if b in st.receipts:
                return _hit("receipt", b.hex(), f"/receipts/{b.hex()}", f"/v1/receipts/{b.hex()}")
            if store.tx_location(b) is not None:
                return _hit("tx", b.hex(), f"/tx/{b.hex()}", f"/v1/txs/{b.hex()}")
        if len(b) == 16 and b in self._jobs():
            return _hit("job", b.hex(), f"/jobs/{b.hex()}", f"/v1/jobs/{b.hex()}")
        if len(b) == 16 and b in runs_of(st):  # a collaborative training run (node.training.api)
            return _hit("run", b.hex(), f"/runs/{b.hex()}", f"/v1/runs/{b.hex()}")
        if len(b) == 32 and b in st.accounts:  # a public key in hex: only an account the ledger knows
            name = acct(b)
            return _hit("account", name, f"/accounts/{name}", f"/v1/accounts/{name}")
        if not b:
            try:
                a = account_from_str(q)
            except ValueError:
                a = None
            if a is not None:
                name = acct(a)
                return _hit("account", name, f"/accounts/{name}", f"/v1/accounts/{name}")
        raise ApiError(404, "not_found", "no block, transaction, receipt, job, run or account matches")


def _hit(kind: str, id_: str, url: str, api: str) -> Json:
    return {"kind": kind, "id": id_, "url": url, "api": api}


def age_s(time_ms: int | None) -> float | None:
    """Seconds since a block timestamp (for display)."""
    return None if time_ms is None else max(0.0, time.time() - time_ms / 1000)


FINAL_STATUSES = FINAL


async def get_queries(request: Request) -> Queries:
    """The :class:`Queries` views of the node of the app that ``request`` reached (``app.state.queries``, set by
    :func:`node.api.app.create_app`). A coroutine, so FastAPI calls it on the event loop."""
    queries: Queries = request.app.state.queries
    return queries


QueriesDep = Annotated[Queries, Depends(get_queries)]  # ``queries: QueriesDep``: the views of the app's node
