"""Issue 24 finding 5, check 3: every signed object binds the genesis hash, not only the chain id.

Two genesis documents that differ only in one allocation name two networks with one chain id (every
``tally-devnet``, a re-created testnet). A transfer, a receipt (built by the inference client's running receipt),
a committee vote, double-sign evidence, a block with its commit, a header given to a light client and a snapshot
manifest made for one are refused by the other: by name, before any signature check, and — relabelled for the
other network by whoever replays them — because their signatures do not verify there. Real LevelDB stores in tmp
dirs; the last test submits a wallet transfer of network A to a validator of network B over real libp2p.
"""

from __future__ import annotations

import os
from dataclasses import replace

import pytest
import trio

from node.encoding import pack, unpack
from node.inference.receipts import RunningReceipt, SessionTerms
from node.keys import verify
from node.ledger import snapshot as snap
from node.ledger.core import domain
from node.ledger.core.block import InvalidBlock, decode_block, precommit_digest, vote_digest
from node.ledger.core.chain import check_and_apply, commit_block, propose
from node.ledger.core.genesis import parse_genesis
from node.ledger.core.staking import evidence_of
from node.ledger.core.state import apply_tx, genesis_state
from node.ledger.core.tx import INVALID, Evidence, InvalidTx, Transfer, Vote, decode_tx
from node.ledger.proofs import LightClient
from node.ledger.service import SUBMIT_PROTOCOL, LedgerService
from node.ledger.store import LedgerStore, StoreCorrupt
from node.p2p.framing import RemoteError
from node.p2p.host import P2PHost

from .helpers import CLIENT, KEYS, VALIDATOR, W1, C, make_genesis, make_receipt

GA = make_genesis()
GB = replace(GA, balances=GA.balances + ((KEYS[7].account, C, 0),))  # network B: one more allocation, nothing else
GC = replace(GA, genesis_time_ms=GA.genesis_time_ms + 1)  # network C: A re-created later; only the genesis hash differs


def refused_by_b(tx, what: str) -> None:
    """``tx`` (signed for A) applies on A; on B it is refused by name, and relabelled for B its signatures fail."""
    apply_tx(genesis_state(GA), tx)  # control: valid where it was signed
    sb = genesis_state(GB)
    before = (dict(sb.accounts), sb.state_root())
    with pytest.raises(InvalidTx, match=r"signed for another network \(chain 'test-chain', genesis "
                                        + GA.hash.hex()[:16]):
        apply_tx(sb, tx)
    relabelled = replace(tx, chain_id=GB.domain)  # what a replayer would send: B's domain, A's signatures
    with pytest.raises(InvalidTx, match=f"bad {what}"):
        apply_tx(sb, relabelled)
    assert (dict(sb.accounts), sb.state_root()) == before  # nothing changed


def test_one_chain_id_two_genesis_docs_are_two_signing_domains():
    assert GA.chain_id == GB.chain_id == "test-chain" and GA.hash != GB.hash and GA.domain != GB.domain
    assert domain.split(GA.domain) == ("test-chain", GA.hash.hex())
    assert parse_genesis(GA.to_doc()).domain == GA.domain  # a genesis file read back names the same network
    assert domain.is_domain(GA.domain) and not domain.is_domain("test-chain")
    with pytest.raises(ValueError):
        domain.make("x" * 65, GA.hash)


def test_a_transfer_signed_for_one_genesis_is_refused_by_another():
    refused_by_b(Transfer(GA.domain, CLIENT.account, W1.account, 5 * C, 0).signed(CLIENT), "transfer signature")


def test_a_receipt_from_the_running_receipt_of_one_genesis_is_refused_by_another():
    """The receipt both ends sign in an inference session (:class:`RunningReceipt`, which hashes the domain into
    its prepared prefix) binds the genesis: the same session's steps give another id under B's domain."""
    def terms(g):
        return SessionTerms(g.domain, b"s" * 16, W1.account, CLIENT.account, b"m" * 32, 0, 4, 0, "none", 0,
                            g.params.price_per_token_block)

    ra, rb = RunningReceipt(terms(GA)), RunningReceipt(terms(GB))
    ida, idb = ra.append(b"i" * 32, b"o" * 32, 10), rb.append(b"i" * 32, b"o" * 32, 10)
    assert ida != idb
    receipt = ra.current()
    assert receipt is not None and receipt.id == ida
    receipt = receipt.sign_worker(W1).countersign(CLIENT)
    refused_by_b(receipt, "worker receipt signature")
    refused_by_b(make_receipt(GA, W1), "worker receipt signature")


def test_a_committee_vote_signed_for_one_genesis_is_refused_by_another():
    vote = Vote(GA.domain, os.urandom(32), W1.account, 0, INVALID, 0).signed(W1)
    sb = genesis_state(GB)
    with pytest.raises(InvalidTx, match="signed for another network"):
        apply_tx(sb, vote)
    with pytest.raises(InvalidTx, match="bad vote signature"):
        apply_tx(sb, replace(vote, chain_id=GB.domain))


def test_consensus_votes_and_double_sign_evidence_of_one_genesis_slash_nobody_on_another():
    k = VALIDATOR
    a, b = b"\x01" * 32, b"\x02" * 32
    sig = lambda v: k.sign(vote_digest("prevote", GA.domain, 1, 0, v))  # noqa: E731
    assert verify(k.account, vote_digest("prevote", GA.domain, 1, 0, a), sig(a))
    assert not verify(k.account, vote_digest("prevote", GB.domain, 1, 0, a), sig(a))  # B's driver refuses it
    ev = Evidence(GA.domain, k.account, "prevote", 1, 0, a, sig(a), b, sig(b))
    sa = genesis_state(GA)
    apply_tx(sa, ev)  # control: on A it is double signing, recorded (and slashed from whatever bond it holds)
    assert ev.key in evidence_of(sa)
    sb = genesis_state(GB)
    before = sb.account(k.account)
    with pytest.raises(InvalidTx, match="signed for another network"):
        apply_tx(sb, ev)
    relabelled = replace(ev, chain_id=GB.domain)
    with pytest.raises(InvalidTx, match="bad evidence vote signature"):
        apply_tx(sb, relabelled)
    assert sb.account(k.account) == before and ev.key not in evidence_of(sb) and relabelled.key not in evidence_of(sb)


def _chain_a(store: LedgerStore | None = None):
    """Blocks 1 and 2 of network A with their commits (appended to ``store`` when given: block 1 only)."""
    s0 = store.replay() if store is not None else genesis_state(GA)
    b1, s1, rejected = propose(s0, [Transfer(GA.domain, CLIENT.account, W1.account, C, 0).signed(CLIENT)], VALIDATOR,
                               1000, ())
    assert not rejected
    c1 = commit_block(VALIDATOR, b1)
    if store is not None:
        store.append(b1, c1, s0, s1)
    b2, _, _ = propose(s1, [], VALIDATOR, 2000, c1)
    return b1, c1, b2, commit_block(VALIDATOR, b2)


def test_a_block_and_commit_of_one_genesis_are_refused_by_another_and_by_its_light_client():
    """Same validator key on both networks: a committed block of A does not extend B, and B's light client
    (state sync trusts headers through it) refuses A's header, by name. Relabelled for network C — A's document
    re-created a millisecond later: same chain id, validator, allocations and parameters, the same genesis state
    root, only the genesis hash differs — A's header at height 2 is everything C's light client checks when it
    skips to it (no link to C's genesis is asked for), except its commit: A's precommits sign A's genesis hash, so
    they are not valid signatures on C."""
    b1, c1, b2, c2 = _chain_a()
    check_and_apply(genesis_state(GA), b1, c1)  # control
    with pytest.raises(InvalidBlock, match="block signed for another network"):
        check_and_apply(genesis_state(GB), b1, c1)
    lc = LightClient(GB)
    with pytest.raises(InvalidBlock, match="header of chain"):
        lc.update(b1.header, list(c1), None)
    assert lc.height == 0

    assert GC.hash != GA.hash and genesis_state(GC).state_root() == genesis_state(GA).state_root()
    ok = LightClient(GA)
    ok.skip(b2.header, list(c2), None)  # control: A's own light client trusts it
    assert ok.height == 2
    relabelled = replace(b2.header, chain_id=GC.domain)  # A's contents, heights and validator; C's domain
    # each layer binds the genesis hash on its own: the header's hash, and the precommit digest over it
    assert relabelled.hash != b2.hash
    assert precommit_digest(GC.domain, 2, 0, b2.hash) != precommit_digest(GA.domain, 2, 0, b2.hash)
    lc = LightClient(GC)
    with pytest.raises(InvalidBlock, match=r"commit for height 2 has 0/1 valid signatures"):
        lc.skip(relabelled, list(c2), None)
    assert lc.height == 0
    # a node of C checks a block's commit before anything else: A's block 1 relabelled for C is refused for it
    with pytest.raises(InvalidBlock, match=r"commit for height 1 has 0/1 valid signatures"):
        check_and_apply(genesis_state(GC), replace(b1, header=replace(b1.header, chain_id=GC.domain)), c1)


def test_a_snapshot_manifest_of_one_genesis_is_refused_by_another(tmp_path):
    """A's snapshot is refused by B by name. Relabelled for C (one chain id, one validator, one genesis state, only
    the genesis hash differs), A's manifest and the header that binds it check out on C in every field; state sync
    refuses them because the header's commit signs A's genesis hash, and C's empty store stays empty."""
    store = LedgerStore(tmp_path / "a", GA)
    try:
        _, _, b2, c2 = _chain_a(store)
        m, chunks = snap.make(store.db, GA.domain, 700)
    finally:
        store.close()
    snap.check_manifest(m, b2.header, GA.domain)  # control
    with pytest.raises(snap.SnapshotError, match="snapshot signed for another network"):
        snap.check_manifest(m, b2.header, GB.domain)
    with pytest.raises(snap.SnapshotError, match="another network"):  # a relabelled manifest, A's header
        snap.check_manifest(replace(m, chain_id=GB.domain), b2.header, GB.domain)
    data = [chunks[i] for i in m.chunks]
    ok = LedgerStore(tmp_path / "a2", GA)
    try:
        assert snap.restore(ok, m, data, b2.header, c2, GA.validators).height == 1  # control: A restores it
    finally:
        ok.close()
    mc, hc = replace(m, chain_id=GC.domain), replace(b2.header, chain_id=GC.domain)
    sc = LedgerStore(tmp_path / "c", GC)
    try:
        snap.check_manifest(mc, hc, GC.domain)  # every binding but the signature holds on C
        with pytest.raises(InvalidBlock, match=r"commit for height 2 has 0/1 valid signatures"):
            snap.restore(sc, mc, data, hc, c2, GC.validators)
        assert (sc.head, sc.base) == (0, 0)
    finally:
        sc.close()


def test_an_older_versions_transaction_or_block_is_refused_at_decode():
    wire = Transfer(GA.domain, CLIENT.account, W1.account, C, 0).signed(CLIENT).to_wire()
    assert decode_tx(unpack(pack(wire))).chain_id == GA.domain
    with pytest.raises(InvalidTx, match="not bound to a genesis"):
        decode_tx({**wire, "c": "test-chain"})
    block, _, _ = propose(genesis_state(GA), [], VALIDATOR, 1000, ())
    old = block.to_wire()
    old["h"][0] = "test-chain"
    with pytest.raises(InvalidBlock, match="not bound to a genesis"):
        decode_block(old)


def test_a_store_written_before_the_genesis_binding_is_refused_with_the_command_to_start_over(tmp_path):
    """A store of the older version (no ``D`` mark) that holds blocks is refused: its blocks are signed over the
    bare chain id. An empty unmarked one is marked and used; a fresh one is marked at once."""
    path = tmp_path / "data" / "ledger"
    store = LedgerStore(path, GA)
    assert store.db.get(b"D") == domain.STORE_VERSION
    s0 = store.replay()
    b1, s1, _ = propose(s0, [], VALIDATOR, 1000, ())
    store.append(b1, commit_block(VALIDATOR, b1), s0, s1)
    store.db.delete(b"D", sync=True)  # as the older version left it
    store.close()
    with pytest.raises(StoreCorrupt, match=r"older version.*genesis hash.*mv ledger ledger\.old; mv snapshots"):
        LedgerStore(path, GA)
    # refused again (nothing was changed by the refusal), and the store is closed (reopenable at once)
    with pytest.raises(StoreCorrupt, match="restarts from its"):
        LedgerStore(path, GA)
    empty = tmp_path / "empty"
    old_empty = LedgerStore(empty, GA)
    old_empty.db.delete(b"D", sync=True)
    old_empty.close()
    again = LedgerStore(empty, GA)
    assert again.db.get(b"D") == domain.STORE_VERSION
    again.close()


def test_a_wallet_transfer_of_network_a_is_refused_by_a_validator_of_network_b(tmp_path):
    """Real libp2p hosts and LevelDB ledgers, one chain id, two genesis docs. A wallet on network A queues a
    transfer; it reaches B's validator through the direct submit protocol (the transport lets it through: both
    name the chain ``test-chain``), which refuses it naming A's genesis; B keeps making blocks and never holds it."""
    sa, sb = LedgerStore(tmp_path / "a", GA), LedgerStore(tmp_path / "b", GB)
    tx = Transfer(GA.domain, CLIENT.account, W1.account, C, 0).signed(CLIENT)  # as node/api/wallet.py builds it

    async def body():
        async with P2PHost(W1, 0, "test-chain").running() as ha, \
                P2PHost(VALIDATOR, 0, "test-chain").running() as hb:
            a, b = LedgerService(sa, GA, W1, ha), LedgerService(sb, GB, VALIDATOR, hb)
            async with trio.open_nursery() as n:
                n.start_soon(a.run)
                n.start_soon(b.run)
                await b.wait_for_height(1, timeout=30)
                assert await a.submit(tx) == tx.id  # A's own mempool takes it
                assert await ha.connect(hb.addrs) == 1
                with pytest.raises(RemoteError, match="signed for another network") as e:
                    await ha.request(hb.peer_id, SUBMIT_PROTOCOL, {"tx": tx.to_wire()}, timeout=10)
                assert e.value.code == "invalid_tx"
                relabelled = replace(tx, chain_id=GB.domain)
                with pytest.raises(RemoteError, match="bad transfer signature"):
                    await ha.request(hb.peer_id, SUBMIT_PROTOCOL, {"tx": relabelled.to_wire()}, timeout=10)
                h = b.state.height
                await b.wait_for_height(h + 3, timeout=60)
                assert tx.id not in b.mempool and relabelled.id not in b.mempool
                assert sb.tx_location(tx.id) is None and sb.tx_location(relabelled.id) is None
                assert b.state.account(W1.account).balance == dict((x, y) for x, y, _ in GB.balances)[W1.account]
                n.cancel_scope.cancel()

    try:
        trio.run(body)
    finally:
        sa.close()
        sb.close()
