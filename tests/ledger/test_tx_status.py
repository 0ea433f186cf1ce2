"""Issue 28: a transaction a node accepts reaches a block or is dropped with a reason its submitter can see.
Real LevelDB ledgers in tmp dirs, blocks produced as a validator produces them, a real libp2p host for the
submissions kept in the outbox over a restart, and the real API app for ``/v1/txs/{id}`` and its ``/status``."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest
import trio

from node.identity import Identity
from node.ledger.core.chain import commit_block
from node.ledger.core.tx import Transfer
from node.ledger.mempool_policy import Limits
from node.ledger.outbox import outbox_path
from node.ledger.service import LedgerService
from node.ledger.store import LedgerStore
from node.ledger.txstatus import TxState
from node.p2p.host import P2PHost

from .helpers import KEYS, VALIDATOR, W1, C, make_genesis

A = KEYS[5]


def genesis():
    g = make_genesis()
    return replace(g, balances=g.balances + ((A.account, 100 * C, 0),))


def pay(who: Identity, nonce: int, amount: int = C, g=None) -> Transfer:
    """A signed transfer for the network of ``g`` (default :func:`genesis`): its signing domain binds the genesis."""
    return Transfer((g or genesis()).domain, who.account, W1.account, amount, nonce).signed(who)


async def produce(svc: LedgerService):
    value = svc.driver._get_value(svc.state.height + 1)
    block, new_state = svc.driver.blocks[value]
    assert await svc.commit_decided(block, commit_block(VALIDATOR, block), new_state)
    return block


@pytest.fixture
def svc(tmp_path):
    g = genesis()
    store = LedgerStore(tmp_path / "db", g)
    s = LedgerService(store, g, VALIDATOR, host=None, mempool_limits=Limits(future_ttl_blocks=3))
    yield s
    store.close()


def test_pending_gapped_included_dropped_and_unknown_each_say_so(svc):
    t0, t1, t2 = pay(A, 0), pay(A, 1), pay(A, 2)
    svc.add_tx(t0)
    st = svc.tx_status(t0.id)
    assert st.state is TxState.PENDING and st.missing_nonce is None and "waiting for a block" in st.reason
    assert st.pending_s >= 0 and st.describe().startswith("pending for ")
    svc.add_tx(t2)  # nonce 1 has not arrived: a gap, reported with the missing nonce and the blocks left
    st = svc.tx_status(t2.id)
    assert st.state is TxState.PENDING and st.missing_nonce == 1 and st.expires_in_blocks == 3
    assert "nonce 1 has not reached this node" in st.reason
    assert svc.tx_status(t1.id).state is TxState.UNKNOWN

    trio.run(produce, svc)  # t0 lands; t2 still waits for nonce 1, one block less
    assert svc.tx_status(t0.id).state is TxState.INCLUDED and svc.tx_status(t0.id).height == 1
    st = svc.tx_status(t2.id)
    assert st.state is TxState.PENDING and st.missing_nonce == 1 and st.expires_in_blocks == 2

    async def more():
        for _ in range(3):
            await produce(svc)

    trio.run(more)  # nonce 1 never came: t2 is dropped, and says why
    st = svc.tx_status(t2.id)
    assert st.state is TxState.DROPPED and "waited 3 blocks for nonce 1" in st.reason
    assert st.describe().startswith("dropped: ")


def test_the_api_answers_pending_with_the_missing_nonce_and_dropped_with_the_reason(svc):
    from starlette.testclient import TestClient

    from node.api.app import create_app

    node = SimpleNamespace(store=svc.store, ledger=svc, genesis=svc.genesis, ident=VALIDATOR, api_token="t")
    c = TestClient(create_app(node), base_url="http://127.0.0.1")
    js = {"accept": "application/json"}
    t0, t2 = pay(A, 0), pay(A, 2)
    svc.add_tx(t0)
    svc.add_tx(t2)
    got = c.get(f"/v1/txs/{t2.id.hex()}", headers=js)
    assert got.status_code == 404 and got.json()["code"] == "pending" and "nonce 1" in got.json()["message"]
    st = c.get(f"/v1/txs/{t2.id.hex()}/status", headers=js).json()
    assert st["status"] == "pending" and st["missing_nonce"] == 1 and st["expires_in_blocks"] == 3
    page = c.get(f"/tx/{t2.id.hex()}", headers={"accept": "text/html"})  # the explorer says the same
    assert page.status_code == 404 and "pending for" in page.text and "nonce 1 has not reached" in page.text
    assert st["pending_s"] >= 0 and st["height"] is None and st["summary"].startswith("pending for ")
    trio.run(produce, svc)
    st = c.get(f"/v1/txs/{t0.id.hex()}/status", headers=js).json()
    assert st["status"] == "included" and st["height"] == 1 and st["pending_s"] is None
    assert c.get(f"/v1/txs/{t0.id.hex()}", headers=js).json()["height"] == 1
    assert c.get(f"/v1/txs/{t2.id.hex()}/status", headers=js).json()["status"] == "pending"  # t1 still missing
    too_much = pay(A, 1, 10**6 * C)
    with pytest.raises(Exception, match="insufficient balance"):
        svc.add_tx(too_much)
    got = c.get(f"/v1/txs/{too_much.id.hex()}", headers=js)
    assert got.status_code == 404 and got.json()["code"] == "dropped" and "insufficient" in got.json()["message"]
    unknown = "ab" * 32
    assert c.get(f"/v1/txs/{unknown}", headers=js).json()["code"] == "not_found"
    assert c.get(f"/v1/txs/{unknown}/status", headers=js).json()["status"] == "unknown"
    assert c.get("/v1/txs/zz/status", headers=js).status_code == 422


def test_accepted_transfers_survive_a_crash_in_the_outbox_and_stale_ones_are_reported(tmp_path):
    """A wallet transfer accepted by a node is on disk before the API answers; a restarted node queues it again
    (and re-sends it), or says why it cannot (its nonce was used meanwhile)."""
    g = genesis()
    path = tmp_path / "db"
    t0, t1 = pay(A, 0), pay(A, 1)
    other = pay(A, 1, 2 * C)  # another transaction with t1's nonce, included while the node was down

    async def first_life():
        store = LedgerStore(path, g)
        async with P2PHost(VALIDATOR, 0, "test-chain").running() as host:
            s = LedgerService(store, g, VALIDATOR, host)
            assert await s.submit(t0) == t0.id and await s.submit(t1) == t1.id  # no peer: gossip reaches no one
        store.close()  # no block was made: a crash loses nothing but the mempool

    trio.run(first_life)
    x = LedgerStore(tmp_path / "x", g)
    assert outbox_path(x) == tmp_path / "x.outbox"
    x.close()
    assert (tmp_path / "db.outbox").stat().st_size > 0

    store = LedgerStore(path, g)
    s = LedgerService(store, g, VALIDATOR, None)
    assert s.load_outbox() == 2 and s.tx_status(t1.id).state is TxState.PENDING
    s.mempool.reset(s.state)
    store.close()

    async def meanwhile():  # the rest of the network includes t0 and `other` (nonce 1) while we are down
        st = LedgerStore(path, g)
        v = LedgerService(st, g, VALIDATOR, None)
        v.add_tx(t0)
        v.add_tx(other)
        await produce(v)
        st.close()

    trio.run(meanwhile)
    store = LedgerStore(path, g)
    s = LedgerService(store, g, VALIDATOR, None)
    assert s.load_outbox() == 0
    assert s.tx_status(t0.id).state is TxState.INCLUDED
    st = s.tx_status(t1.id)
    assert st.state is TxState.DROPPED and "nonce 1" in st.reason and "already used" in st.reason
    store.close()


def test_a_transfer_submitted_before_any_peer_is_re_sent_when_a_validator_connects(tmp_path):
    """Two real libp2p hosts, two LedgerDBs: a follower's wallet transfer published while it has no peer reaches
    no one; once the validator connects, the follower's re-send (direct submit, no gossip mesh needed) gets it
    into a block, and the follower reports it included after syncing."""
    g = make_genesis()
    sv, sf = LedgerStore(tmp_path / "v", g), LedgerStore(tmp_path / "f", g)
    tx = pay(W1, 0, g=g)

    async def body():
        async with P2PHost(VALIDATOR, 0, "test-chain").running() as hv, \
                P2PHost(W1, 0, "test-chain").running() as hf:
            v, f = LedgerService(sv, g, VALIDATOR, hv), LedgerService(sf, g, W1, hf)
            async with trio.open_nursery() as n:
                n.start_soon(v.run)
                n.start_soon(f.run)
                await v.wait_for_height(1, timeout=20)
                assert await f.submit(tx) == tx.id  # nobody to hear it
                await trio.sleep(3)
                assert tx.id not in v.mempool and sv.tx_location(tx.id) is None
                assert await hf.connect(hv.addrs) == 1
                with trio.fail_after(30):
                    while f.tx_status(tx.id).state is not TxState.INCLUDED:
                        await trio.sleep(0.1)
                assert sv.tx_location(tx.id) is not None
                n.cancel_scope.cancel()

    try:
        trio.run(body)
    finally:
        sv.close()
        sf.close()


def test_a_restarted_service_queues_its_outbox_again_and_the_transfer_lands_in_one_block(tmp_path):
    """``LedgerService.run`` at start queues the outbox again (two real libp2p hosts, two LevelDBs): a follower's
    transfer accepted while it has no peer exists only in its mempool and outbox; the service is cancelled and its
    store closed with nothing written on the way out (the mempool dies, as in a crash); a new service on the same
    LevelDB, now connected to the validator, runs, and the transfer lands in exactly one block. The process-level
    version with SIGKILL is tests/e2e/test_processes.py (slow)."""
    g = make_genesis()
    tx = pay(W1, 0, g=g)

    async def first_life():
        sf = LedgerStore(tmp_path / "f", g)
        try:
            async with P2PHost(W1, 0, "test-chain").running() as hf:
                f = LedgerService(sf, g, W1, hf)
                async with trio.open_nursery() as n:
                    n.start_soon(f.run)
                    assert await f.submit(tx) == tx.id  # no peer: nobody hears it
                    assert f.tx_status(tx.id).state is TxState.PENDING
                    n.cancel_scope.cancel()
        finally:
            sf.close()

    async def second_life():
        sv, sf = LedgerStore(tmp_path / "v", g), LedgerStore(tmp_path / "f", g)
        try:
            async with P2PHost(VALIDATOR, 0, "test-chain").running() as hv, \
                    P2PHost(W1, 0, "test-chain").running() as hf:
                v, f = LedgerService(sv, g, VALIDATOR, hv), LedgerService(sf, g, W1, hf)
                assert tx.id not in f.mempool  # a fresh mempool: only the outbox remembers the transfer
                assert await hf.connect(hv.addrs) == 1
                async with trio.open_nursery() as n:
                    n.start_soon(v.run)
                    n.start_soon(f.run)
                    with trio.move_on_after(20):
                        while f.tx_status(tx.id).state is not TxState.INCLUDED:
                            await trio.sleep(0.1)
                    st = f.tx_status(tx.id)
                    assert st.state is TxState.INCLUDED, f"20 s after the restart the transfer is {st.describe()}"
                    await v.wait_for_height(sv.head + 2, timeout=10)  # two more blocks: it is not included again
                    n.cancel_scope.cancel()
            return [h for h in range(1, sv.head + 1) for t in sv.get_block(h)[0].txs if t.id == tx.id]
        finally:
            sv.close()
            sf.close()

    trio.run(first_life)
    assert (tmp_path / "f.outbox").stat().st_size > 0
    assert len(trio.run(second_life)) == 1


def test_an_unreadable_outbox_is_ignored_and_a_bad_entry_skipped(tmp_path):
    from node.encoding import pack
    from node.ledger.outbox import Outbox

    box = Outbox(tmp_path / "o")
    assert box.load() == []  # no file yet
    (tmp_path / "o").write_bytes(b"\xc1 not msgpack")
    assert box.load() == []
    (tmp_path / "o").write_bytes(pack({"not": "a list"}))
    assert box.load() == []
    good = pay(A, 0)
    (tmp_path / "o").write_bytes(pack([{"kind": "nonsense"}, good.to_wire()]))
    assert [t.id for t in box.load()] == [good.id]
    box.save([good])
    assert box.ids == {good.id} and [t.id for t in box.load()] == [good.id]
    assert Outbox(None).load() == [] and Outbox(None).save([good]) is None
