"""Issue 37, in-process nodes (real libp2p on 127.0.0.1, real LevelDB, real torch, the tiny model): a generation on
a chain with tabs is paid through them -- the client opens one tab per server, each session's receipt is a tab
receipt the server keeps in its epoch book, each server sends one epoch batch, reveals what the ledger draws
(every receipt, as on the devnet), committees vote, and each server is paid what its requester signed, once."""

from __future__ import annotations

import httpx
import pytest
import trio

from node.compute.model import make_tiny
from node.compute.reference import local_generate
from node.ledger.core.state import VALID_S
from node.ledger.core.tabs import TabReceipt

from .swarm import swarm, tiny_genesis

SPANS = [(0, 2), (2, 4), (4, 6)]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_tiny(tmp_path_factory.mktemp("models"), seed=0)


def test_a_generation_is_paid_through_tabs_and_epoch_batches(tmp_path, tiny):
    prompt = [5, 17, 42, 99, 3]
    g = tiny_genesis(3, epoch_blocks=8, batch_samples=1000, reveal_window=8, settle_window=2, tab_close_delay=24)

    async def main():
        async with swarm(tmp_path, tiny, SPANS, genesis=g) as nodes:
            client = nodes[0]
            st = client.ledger.state
            before = {nd.ident.account: st.account(nd.ident.account) for nd in nodes}
            supply = st.supply()
            gen = await client.generate(prompt, 6)
            gen2 = await client.generate(prompt, 3)  # a second session on each tab: nonce 2, owed on from the first
            workers = [nd.ident.account for nd in nodes[1:]]
            with trio.fail_after(90):  # every server's batch drawn, revealed, voted on, paid and pruned
                while True:
                    st = client.ledger.state
                    paid = all(st.tables["worker_batches"].get(w, (1, -1))[0] == 0
                               and st.tables["worker_batches"].get(w, (0, -1))[1] >= 0 for w in workers)
                    if paid and not st.tables["settlements"]:
                        break
                    await client.ledger.new_block.wait()
            st = client.ledger.state
            me = client.ident.account
            tabs = {t.worker: t for t in st.tables["tabs"].values() if t.requester == me}
            recs = {r.id: st.receipts.get(r.id) for r in gen.receipts + gen2.receipts}
            async with httpx.AsyncClient(timeout=10) as http:  # the wallet API's view of the same tabs
                api = (await http.get(f"{client.api_url}/v1/accounts/{client.ident.peer_id}/tabs")).json()
                worker_view = (await http.get(f"{client.api_url}/v1/accounts/{nodes[1].ident.peer_id}/tabs")).json()
                listed = (await http.get(f"{client.api_url}/v1/receipts", params={"limit": 20})).json()["receipts"]
                by_worker = (await http.get(f"{client.api_url}/v1/accounts/{nodes[1].ident.peer_id}/receipts")).json()
                tab_id = api["tabs"][0]["tab"]
                pages = [(await http.get(f"{client.api_url}{u}")) for u in
                         (f"/tabs/{tab_id}", f"/accounts/{client.ident.peer_id}", "/tabs/" + "ab" * 32, "/tabs/xyz")]
            return gen, gen2, before, {a: st.account(a) for a in before}, supply, st.supply(), tabs, recs, api, \
                worker_view, pages, listed, by_worker

    gen, gen2, before, after, supply, supply1, tabs, recs, api, worker_view, pages, listed, by_worker = trio.run(main)
    assert gen.tokens == local_generate(tiny, prompt, 6)
    receipts = gen.receipts + gen2.receipts
    assert len(receipts) == 6 and all(isinstance(r, TabReceipt) for r in receipts)
    assert {r.tab_nonce for r in gen2.receipts} == {2}  # each server's second session on the same tab
    owed = {r.worker: r.cumulative for r in gen2.receipts}
    for r in gen.receipts:
        assert owed[r.worker] == r.cumulative + next(x for x in gen2.receipts if x.worker == r.worker).tokens * 2 * \
            g.params.price_per_token_block
    client = next(iter(before))
    assert {w: t.redeemed for w, t in tabs.items()} == owed  # each tab redeemed exactly what was signed on it
    for r in receipts:  # every receipt was drawn, revealed and voted valid
        rec = recs[r.id]
        assert rec.status == VALID_S and rec.votes and {v[2] for v in rec.votes} == {0}
    earned = {w: after[w].balance - before[w].balance for w in owed}
    # the committees are the servers themselves (the only bonded accounts): fees move between them, so together they
    # earned exactly what was signed, each at least half its own
    assert sum(earned.values()) == sum(owed.values()) and all(earned[w] > owed[w] // 2 for w in owed)
    assert all(after[w].escrow == 0 for w in owed)  # nothing left pending
    assert before[client].balance - after[client].balance - (after[client].escrow - before[client].escrow) \
        == sum(owed.values())
    assert supply == supply1
    assert len(api["tabs"]) == 3 and sorted(int(t["redeemed"]["base_units"]) for t in api["tabs"]) == \
        sorted(owed.values())
    assert len(worker_view["tabs"]) == 1 and worker_view["open_batches"] == 0
    # the explorer lists the revealed receipts as inference receipts, and under their worker's account
    assert {x["id"] for x in listed if x["kind"] == "inference"} == {r.id.hex() for r in receipts}
    assert len([x for x in by_worker["receipts"] if x["role"] == "worker"]) == 2
    tab_page, account_page, missing, bad = pages  # the explorer: a tab's page, and the tabs on the account page
    assert tab_page.status_code == 200 and api["tabs"][0]["tab"] in tab_page.text and "Redeemed" in tab_page.text
    assert account_page.status_code == 200 and 'id="tabs"' in account_page.text
    assert account_page.text.count('href="/tabs/') == 3
    assert (missing.status_code, bad.status_code) == (404, 400)


@pytest.mark.slow  # four in-process nodes, ~35 s on 2 cores (falls behind its 90 s deadline at a load of 14)
def test_a_redundant_session_disputes_a_corrupt_servers_tab_receipt_and_its_batch_is_refuted(tmp_path, tiny):
    """Issue 37's "a requester may still dispute any receipt it holds within the window", with real nodes: a
    redundant generation meets a corrupt server on route A; the requester's node queues both hops' tab receipts and
    files a TabDispute for each once the server's epoch batch that redeems it is on the ledger. The corrupt server
    also withholds its reveals (its SettleDuty drops them), so its receipt reaches a committee only through the
    dispute: voted invalid, its batch is refuted (nothing paid, the tab's credits back) and its bond slashed; the
    honest route-B server's disputed receipt is voted valid and its batch paid."""
    from node.inference.redundant import RedundantClient
    from node.ledger.core.status import INVALID_S
    from node.ledger.core.tabs import Reveal
    from node.settle.duty import SettleDuty

    prompt = [5, 17, 42, 99]
    g = tiny_genesis(3, epoch_blocks=8, batch_samples=2, reveal_window=8, settle_window=2, tab_close_delay=24)

    async def main():
        async with swarm(tmp_path, tiny, [(0, 6)] * 3, genesis=g) as nodes:
            client = nodes[0]
            red = RedundantClient(client.client)
            ra, rb = red.routes()
            bad = next(nd for nd in nodes[1:] if nd.ident.peer_id == ra[0].peer)
            good = next(nd for nd in nodes[1:] if nd.ident.peer_id == rb[0].peer)
            bad.server.span.fault = "corrupt"  # an output cheat (`node start --fault corrupt`)
            duty = next(d.duty for d in bad.duties if isinstance(getattr(d, "duty", None), SettleDuty))
            send = duty._submit

            async def withhold(tx):  # the cheat never reveals: only the requester's dispute can expose it
                return False if isinstance(tx, Reveal) else await send(tx)

            duty._submit = withhold
            st = client.ledger.state
            bad_before, good_before = st.account(bad.ident.account), st.account(good.ident.account)
            gen = await red.generate(prompt, 4)
            me = client.ident.account

            def tab_of(worker: bytes):
                return next(t for t in client.ledger.state.tables["tabs"].values()
                            if t.requester == me and t.worker == worker)

            # each tab's lock before any batch redeemed it (locked + redeemed: the same before and after a batch)
            locked0 = {w: tab_of(w).locked + tab_of(w).redeemed for w in (bad.ident.account, good.ident.account)}
            disputed = [r for r in gen.receipts if r.id in set(gen.mismatch.disputed)]
            with trio.fail_after(90):  # both disputes filed and judged, the bad batch gone, the good one paid
                while True:
                    st = client.ledger.state
                    recs = [st.receipts.get(r.id) for r in disputed]
                    if all(rec is not None and rec.status.final for rec in recs) and \
                            not any(s.worker in (bad.ident.account, good.ident.account)
                                    for s in st.tables["settlements"].values()):
                        break
                    await client.ledger.new_block.wait()
            locked1 = {w: tab_of(w).locked for w in locked0}
            return gen, disputed, recs, client.disputes.sent, bad.ident.account, good.ident.account, \
                bad_before, good_before, st.account(bad.ident.account), st.account(good.ident.account), locked0, \
                locked1

    gen, disputed, recs, sent, bad, good, bad0, good0, bad1, good1, locked0, locked1 = trio.run(main)
    assert gen.tokens == local_generate(tiny, prompt, 4) and gen.mismatch is not None
    assert len(disputed) == 2 and {r.id for r in disputed} <= set(sent)  # filed by the requester's dispute duty
    status = {r.worker: rec.status for r, rec in zip(disputed, recs, strict=True)}
    assert status == {bad: INVALID_S, good: VALID_S}, status
    owed = {r.worker: r.cumulative for r in disputed}
    # refuted: what its batch took went back into the requester's tab (its balance grew only by committee fees for
    # other receipts), and its bond was slashed
    assert locked1[bad] == locked0[bad] and bad1.escrow == 0 and bad1.bond < bad0.bond
    assert locked1[good] == locked0[good] - owed[good] and good1.escrow == 0 and good1.bond == good0.bond  # paid
