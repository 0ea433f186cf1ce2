"""Validators that change (issue 13, node.ledger.core.valset): joining by a transaction, effective two heights
later, removal by leaving, unbonding or slashing below min_validator_bond, voting power = bond, quorum with
unequal power in commits and in the consensus machine, validator hashes in headers, the light client's
sequential verification, stored validator sets, and refusals that change nothing."""

from __future__ import annotations

import json
from dataclasses import replace
from importlib import resources

import pytest

from node.encoding import pack, unpack
from node.identity import Identity, dev_seed
from node.ledger.core import blockcodec
from node.ledger.core.block import Header, InvalidBlock, check_commit, decode_block, sign_commit, vote_digest
from node.ledger.core.chain import check_and_apply, propose
from node.ledger.core.consensus import Tendermint, Timeouts
from node.ledger.core.genesis import Genesis, GenesisError, Params, parse_genesis
from node.ledger.core.state import State, apply_txs, genesis_state
from node.ledger.core.tx import Bond, Evidence, Transfer, Unbond
from node.ledger.core.valset import ValidatorJoin, ValidatorLeave, ValidatorSet, ValidatorSetError
from node.ledger.genesis import load_genesis
from node.ledger.proofs import LightClient, light_block, parse_light_block, verify_header
from node.ledger.store import LedgerStore

from .test_consensus import VALS, Sim

C = 10**9
KEYS = [Identity.from_seed(dev_seed(i)) for i in range(6)]
MIN = 150 * C  # min_validator_bond of these chains


def valset_genesis(min_validator_bond: int = MIN, n: int = 4) -> Genesis:
    """n validators bonded 200 credits (power 200e9 each); KEYS[4] bonded 300, KEYS[5] bonded 100 (not enough)."""
    p = Params(block_time_ms=100, price_per_token_block=1000, max_receipt_price=C, slash_amount=100 * C,
               min_validator_bond=min_validator_bond)
    p.check()
    bal = [(k.account, 1000 * C, 200 * C) for k in KEYS[:4]] + [(KEYS[4].account, 1000 * C, 300 * C),
                                                                (KEYS[5].account, 1000 * C, 100 * C)]
    return Genesis("vals-chain", 0, tuple(k.account for k in KEYS[:n]), tuple(bal), p)


BY_ACCOUNT = {k.account: k for k in KEYS}


def step(state: State, txs=(), signers=None, t: int = 1000):
    """Build, sign and check block state.height + 1 (the real path: propose, commit, check_and_apply); returns
    (block, state after it, rejected). ``signers``: who precommits (default: the whole current set)."""
    vs = state.valset()
    proposer = BY_ACCOUNT[vs.proposer(state.height + 1, 0)]
    last = step.last_commit.get(state.last_hash, ())
    block, built, rejected = propose(state, list(txs), proposer, t + state.height, last)
    signers = vs.accounts if signers is None else signers
    commit = [sign_commit(BY_ACCOUNT[a], state.chain_id, block.height, block.hash) for a in signers]
    new = check_and_apply(state, block, commit)
    assert new.state_root() == built.state_root()
    step.last_commit[block.hash] = tuple(commit)
    return block, new, rejected


step.last_commit = {}


def nonce(s: State, k: Identity) -> int:
    return s.account(k.account).nonce


def join(s: State, k: Identity) -> ValidatorJoin:
    return ValidatorJoin(s.chain_id, k.account, nonce(s, k)).signed(k)


# ------------------------------------------------------------------ genesis


def test_devnet_hash_and_document_unchanged_without_the_param():
    g = load_genesis()
    assert g.params.min_validator_bond == 0
    assert "min_validator_bond" not in g.to_doc()["params"]
    doc = json.loads(resources.files("genesis").joinpath("devnet.json").read_text())
    assert parse_genesis(doc).hash == g.hash
    with_param = parse_genesis({**doc, "params": {**doc.get("params", {}), "min_validator_bond": 0}})
    assert with_param.hash == g.hash  # 0 is the default and left out of the hash


def test_genesis_validators_need_the_minimum_bond():
    g = valset_genesis()
    doc = g.to_doc()
    assert doc["params"]["min_validator_bond"] == MIN
    assert parse_genesis(doc).hash == g.hash
    doc["params"]["min_validator_bond"] = 250 * C  # the genesis validators hold 200
    with pytest.raises(GenesisError, match="less bond than min_validator_bond"):
        parse_genesis(doc)


def test_genesis_set_has_power_by_bond():
    s = genesis_state(valset_genesis())
    vs = s.valset()
    assert vs.accounts == tuple(sorted(k.account for k in KEYS[:4]))
    assert vs.total == 4 * 200 * C and s.next_valset() == vs == s.prev_valset()
    fixed = genesis_state(replace(valset_genesis(), params=replace(valset_genesis().params, min_validator_bond=0)))
    assert fixed.valset().total == 4 and len(fixed.tables["validators"]) == 0  # one vote each, nothing stored


# ------------------------------------------------------------------ the state machine


def test_join_is_effective_two_heights_after_its_block():
    s = genesis_state(valset_genesis())
    _, s, _ = step(s)
    newcomer = KEYS[4]
    b_join, s_join, rejected = step(s, [join(s, newcomer)])
    assert not rejected
    h = b_join.height
    assert newcomer.account not in s_join.valset()  # height h + 1: not yet
    assert s_join.next_valset().power(newcomer.account) == 300 * C  # height h + 2: power = its bond
    b1, s1, _ = step(s_join)  # block h + 1, still signed by the old four
    assert b1.header.validators_hash == s.valset().hash
    assert b1.header.next_validators_hash == s_join.next_valset().hash != b1.header.validators_hash
    assert newcomer.account in s1.valset() and s1.valset().total == 4 * 200 * C + 300 * C
    b2, s2, _ = step(s1)  # block h + 2: signed by the five
    assert b2.header.validators_hash == s_join.next_valset().hash
    assert b2.height == h + 2
    # without the newcomer's 300 of 1100, the four old validators still hold 800 > 2/3 · 1100: enough
    step(s2, signers=[k.account for k in KEYS[:4]])
    # three of the old four (600 of 1100) are not
    with pytest.raises(InvalidBlock, match="more than 2/3"):
        step(s2, signers=[k.account for k in KEYS[:3]])
    # the newcomer and two old ones (700 of 1100) are not either, but with a third (900) they are
    with pytest.raises(InvalidBlock):
        step(s2, signers=[KEYS[4].account, KEYS[0].account, KEYS[1].account])
    step(s2, signers=[KEYS[4].account, KEYS[0].account, KEYS[1].account, KEYS[2].account])


def test_power_follows_the_bond():
    s = genesis_state(valset_genesis())
    k = KEYS[0]
    _, s, _ = step(s, [Bond(s.chain_id, k.account, 50 * C, nonce(s, k)).signed(k)])
    assert s.valset().power(k.account) == 200 * C and s.next_valset().power(k.account) == 250 * C
    _, s, _ = step(s, [Unbond(s.chain_id, k.account, 20 * C, nonce(s, k)).signed(k)])
    assert s.valset().power(k.account) == 250 * C and s.next_valset().power(k.account) == 230 * C
    _, s, _ = step(s)
    assert s.valset().power(k.account) == 230 * C


def test_unbonding_below_the_minimum_removes_the_validator():
    s = genesis_state(valset_genesis())
    k = KEYS[1]
    _, s, _ = step(s, [Unbond(s.chain_id, k.account, 60 * C, nonce(s, k)).signed(k)])  # 140 < 150
    assert k.account in s.valset() and k.account not in s.next_valset()
    assert s.tables["validators"][k.account][3] == 0  # no longer a member: bonding back does not re-add it
    _, s, _ = step(s, [Bond(s.chain_id, k.account, 60 * C, nonce(s, k)).signed(k)])
    _, s, _ = step(s)
    assert k.account not in s.valset() and k.account not in s.next_valset()
    _, s, _ = step(s, [join(s, k)])  # a new join is needed
    _, s, _ = step(s)
    assert s.valset().power(k.account) == 200 * C


def test_slashing_below_the_minimum_removes_the_validator():
    s = genesis_state(valset_genesis())
    k = KEYS[2]
    a, b = b"\x01" * 32, b"\x02" * 32
    sig = lambda v: k.sign(vote_digest("prevote", s.chain_id, 1, 0, v))  # noqa: E731
    ev = Evidence(s.chain_id, k.account, "prevote", 1, 0, a, sig(a), b, sig(b))
    _, s, rejected = step(s, [ev])
    assert not rejected
    assert s.account(k.account).bond == 100 * C  # slashed by slash_amount: below the 150 minimum
    assert k.account in s.valset() and k.account not in s.next_valset()
    _, s, _ = step(s)
    assert k.account not in s.valset() and len(s.valset()) == 3


def test_leave_is_effective_two_heights_later_and_keeps_the_bond():
    s = genesis_state(valset_genesis())
    k = KEYS[3]
    _, s, rejected = step(s, [ValidatorLeave(s.chain_id, k.account, nonce(s, k)).signed(k)])
    assert not rejected
    assert k.account in s.valset() and k.account not in s.next_valset()
    _, s, _ = step(s)
    assert k.account not in s.valset() and s.account(k.account).bond == 200 * C
    _, s, _ = step(s)
    assert k.account not in s.tables["validators"]  # nothing left of it: the row is gone


@pytest.mark.parametrize("case", ["bond too small", "twice", "leave non-member", "last leaves",
                                  "unbond last", "fixed chain", "bad signature", "bad nonce"])
def test_invalid_validator_txs_are_refused_and_change_nothing(case):
    g = valset_genesis(n=1) if case in ("last leaves", "unbond last") else valset_genesis()
    if case == "fixed chain":
        g = replace(g, params=replace(g.params, min_validator_bond=0))
    s = genesis_state(g)
    k0 = KEYS[0]
    tx = {
        "bond too small": lambda: join(s, KEYS[5]),
        "twice": lambda: join(s, k0),
        "leave non-member": lambda: ValidatorLeave(s.chain_id, KEYS[4].account, 0).signed(KEYS[4]),
        "last leaves": lambda: ValidatorLeave(s.chain_id, k0.account, 0).signed(k0),
        "unbond last": lambda: Unbond(s.chain_id, k0.account, 100 * C, 0).signed(k0),
        "fixed chain": lambda: join(s, KEYS[4]),
        "bad signature": lambda: ValidatorJoin(s.chain_id, KEYS[4].account, 0).signed(KEYS[3]),
        "bad nonce": lambda: ValidatorJoin(s.chain_id, KEYS[4].account, 7).signed(KEYS[4]),
    }[case]()
    reason = {"bond too small": "at least", "twice": "already a validator", "leave non-member": "not a validator",
              "last leaves": "last validator", "unbond last": "without validators", "fixed chain": "fixed in genesis",
              "bad signature": "bad validator_join signature", "bad nonce": "bad nonce"}[case]
    root, rows = s.state_root(), dict(s.tables["validators"].items())
    w, ok, bad = apply_txs(s, [tx])
    assert not ok and len(bad) == 1 and reason in bad[0][1], bad
    assert w.state_root() == root and s.state_root() == root
    assert dict(w.tables["validators"].items()) == rows


def test_a_block_whose_header_names_another_set_is_refused():
    s = genesis_state(valset_genesis())
    vs = s.valset()
    block, _, _ = propose(s, [], BY_ACCOUNT[vs.proposer(1, 0)], 1000, ())
    forged = replace(block, header=replace(block.header, next_validators_hash=b"\x00" * 32))
    commit = [sign_commit(BY_ACCOUNT[a], s.chain_id, 1, forged.hash) for a in vs.accounts]
    with pytest.raises(InvalidBlock, match="validators_hash"):
        check_and_apply(s, forged, commit)


# ------------------------------------------------------------------ quorum by power


def test_commit_quorum_is_more_than_two_thirds_of_the_power():
    a, b, c = sorted(k.account for k in KEYS[:3])
    vs = ValidatorSet.of({a: 7, b: 2, c: 1})  # total 10
    h = b"\x05" * 32

    def commit(*who):
        return [sign_commit(BY_ACCOUNT[x], "vals-chain", 3, h) for x in who]

    check_commit("vals-chain", 3, h, commit(a), vs)  # 7 of 10 > 2/3
    with pytest.raises(InvalidBlock):
        check_commit("vals-chain", 3, h, commit(b, c), vs)  # 3 of 10
    with pytest.raises(InvalidBlock):
        check_commit("vals-chain", 3, h, commit(a), ValidatorSet.of({a: 6, b: 2, c: 1}))  # 6 of 9: not more
    # a tuple of accounts is one vote each, as before: 2 of 3 is not more than 2/3, 3 of 3 is
    with pytest.raises(InvalidBlock):
        check_commit("vals-chain", 3, h, commit(b, c), (a, b, c))
    check_commit("vals-chain", 3, h, commit(a, b, c), (a, b, c))


def test_consensus_decides_with_unequal_power():
    big = ValidatorSet.of({VALS[0]: 5, VALS[1]: 1, VALS[2]: 1, VALS[3]: 1})  # total 8: a quorum is 6

    def sim(crashed):
        s = Sim(n=4, seed=1, crashed=crashed, heights=2)
        for v, m in s.m.items():
            s.m[v] = Tendermint(v, big, 1, get_value=m.get_value, valid=m.valid, timeouts=Timeouts(0.2, 0.1, 0.1, 0.1))
        return s.run(until=40)

    two_small_down = sim(crashed=(VALS[1], VALS[2]))  # 5 + 1 = 6 of 8
    assert all(len(two_small_down.decisions[v]) == 2 for v in (VALS[0], VALS[3]))
    two_small_down.agreed()
    big_down = sim(crashed=(VALS[0],))  # 3 of 8: nothing (with one vote each, 3 of 4 would decide)
    assert not any(big_down.decisions.values())


def test_machine_takes_the_set_of_the_next_height():
    m = Tendermint(VALS[0], VALS[:4], 1, get_value=lambda h: b"v" * 32, valid=lambda x: True)
    assert m.quorum == 3
    m.next_height(2, start=False, validators=ValidatorSet.of({VALS[0]: 10, VALS[4 % 4]: 10, VALS[1]: 5}))
    assert m.total == 15 and m.quorum == 15 - 14 // 3 and m.validators == tuple(sorted((VALS[0], VALS[1])))


def test_validator_set_rules():
    with pytest.raises(ValidatorSetError):
        ValidatorSet(())
    with pytest.raises(ValidatorSetError):
        ValidatorSet(((b"\x02" * 32, 1), (b"\x01" * 32, 1)))  # unsorted
    vs = ValidatorSet.of({b"\x01" * 32: 3, b"\x02" * 32: 0})
    assert len(vs) == 1 and ValidatorSet.from_bytes(vs.to_bytes()) == vs
    assert vs.hash != ValidatorSet.of({b"\x01" * 32: 4}).hash


# ------------------------------------------------------------------ headers and their storage


def test_fixed_chain_headers_keep_their_form_and_hash():
    h = Header("c", 1, b"\x00" * 32, 5, b"\x01" * 32, b"\x02" * 32, b"\x03" * 32)
    assert len(h.fields()) == 6
    with_vals = replace(h, validators_hash=b"\x04" * 32, next_validators_hash=b"\x05" * 32)
    assert len(with_vals.fields()) == 8 and with_vals.hash != h.hash


def test_block_record_with_validator_hashes_round_trips_and_stays_small():
    s = genesis_state(valset_genesis())
    block, _, _ = step(s)
    commit = step.last_commit[block.hash]
    wire = block.to_wire()
    raw = blockcodec.encode_record(wire, commit, [], s.chain_id, s.validators)
    back = blockcodec.decode_record(raw, s.chain_id, s.validators, lambda: [])
    assert decode_block(back["b"]).hash == block.hash
    assert unpack(raw)[1][7] is None  # next_validators_hash = validators_hash is stored once
    one = genesis_state(valset_genesis(n=1))
    b1, _, _ = step(one)
    raw1 = blockcodec.encode_record(b1.to_wire(), step.last_commit[b1.hash], [], one.chain_id, one.validators)
    assert len(raw1) <= 250 - 25, len(raw1)  # an empty one-validator block with its commit (issue 13's 250 B)


def test_store_records_the_sets_and_serves_light_blocks(tmp_path):
    g = valset_genesis()
    store = LedgerStore(tmp_path / "ledger", g)
    try:
        s = store.replay()
        for i in range(5):
            block, new, _ = step(s, [join(s, KEYS[4])] if i == 1 else [])
            store.append(block, list(step.last_commit[block.hash]), s, new)
            s = new
        assert len(store.valset_at(1)) == 4 and len(store.valset_at(3)) == 4 and len(store.valset_at(4)) == 5
        assert store.valset_at(5) == s.valset() == s.prev_valset()
    finally:
        store.close()
    store = LedgerStore(tmp_path / "ledger", g)  # reopened: the sets were stored with the blocks
    try:
        assert len(store.valset_at(4)) == 5 and store.replay().state_root() == s.state_root()
        lc = LightClient(g)
        lc.follow(parse_light_block(unpack(pack(light_block(store, h)))) for h in range(1, store.head + 1))
        assert lc.height == store.head and len(lc.valset) == 5
    finally:
        store.close()


# ------------------------------------------------------------------ the light client


def _chain(g: Genesis, blocks: int = 6, txs_of=None):
    """Light blocks (header, commit, signing set) of a chain where KEYS[4] joins in block 2; ``txs_of(i, state)``
    gives block i + 1's transactions instead."""
    s = genesis_state(g)
    out = []
    for i in range(blocks):
        vs = s.valset()
        txs = txs_of(i, s) if txs_of else [join(s, KEYS[4])] if i == 1 else []
        block, s, rejected = step(s, txs)
        assert not rejected
        out.append((block.header, list(step.last_commit[block.hash]), vs))
    return out


def test_light_client_follows_the_change_and_verifies_a_header_after_it():
    g = valset_genesis()
    items = _chain(g)
    lc = LightClient(g)
    lc.follow(items)
    assert lc.height == len(items) and KEYS[4].account in lc.valset
    assert items[-1][0].validators_hash == lc.valset.hash != items[0][0].validators_hash


def test_light_client_refuses_a_forged_set_and_a_short_commit():
    g = valset_genesis()
    items = _chain(g)
    lc = LightClient(g)
    lc.follow(items[:3])
    header, commit, vs = items[3]
    # a set the trusted header did not name: the attacker's own validators with all the power
    forged = ValidatorSet.of({KEYS[5].account: 10**15})
    with pytest.raises(InvalidBlock, match="not the one the trusted header"):
        lc.update(header, [sign_commit(KEYS[5], g.domain, header.height, header.hash)], forged)
    with pytest.raises(InvalidBlock, match="more than 2/3"):
        lc.update(header, commit[:2], vs)
    with pytest.raises(InvalidBlock, match="does not follow"):
        lc.update(items[4][0], items[4][1], items[4][2])
    assert lc.height == 3  # nothing changed by the refusals
    lc.update(header, commit, vs)
    assert lc.height == 4


def test_verify_header_checks_the_named_set():
    g = valset_genesis()
    header, commit, vs = _chain(g, 1)[0]
    verify_header(header, commit, vs)
    with pytest.raises(InvalidBlock, match="not the one it names"):
        verify_header(header, commit, ValidatorSet.of({**vs.powers, KEYS[4].account: 1}))


def test_transfer_does_not_touch_the_set():
    s = genesis_state(valset_genesis())
    k = KEYS[0]
    _, s2, _ = step(s, [Transfer(s.chain_id, k.account, KEYS[5].account, C, 0).signed(k)])
    assert s2.valset() == s.valset() and s2.next_valset() == s.next_valset()


# ------------------------------------------------------------------ state sync follows the change


def test_state_sync_follows_validator_changes_from_genesis(tmp_path):
    from node.ledger import statesync as ss
    from tests.p2p.util import run, running_hosts

    g = valset_genesis()
    src = LedgerStore(tmp_path / "src", g)
    s = src.replay()
    for i in range(8):
        block, new, _ = step(s, [join(s, KEYS[4])] if i == 2 else [])
        src.append(block, list(step.last_commit[block.hash]), s, new)
        s = new
    server = ss.SnapshotServer(src, every=8)

    async def main():
        await server.on_block(8)
        block, new, _ = step(s)  # block 9 certifies state 8, signed by the five
        src.append(block, list(step.last_commit[block.hash]), s, new)
        assert KEYS[4].account in {bytes(v) for v, _r, _s in step.last_commit[block.hash]}
        dst = LedgerStore(tmp_path / "dst", g)
        async with running_hosts(2) as (h_src, h_dst):
            server.install(h_src)
            assert await h_dst.connect(h_src.addrs) == 1
            synced = await ss.state_sync(dst, h_dst, [h_src.peer_id], timeout=10)
        assert synced is not None and synced.height == 8 and synced.state_root() == block.header.state_root
        assert len(synced.valset()) == 5 and dst.valset_at(9) == synced.valset()
        nxt = check_and_apply(synced, block, list(step.last_commit[block.hash]))  # and it follows the chain
        dst.append(block, list(step.last_commit[block.hash]), synced, nxt)
        dst.close()

    run(main, timeout=60)
    src.close()


def test_state_sync_refuses_a_peer_whose_headers_name_forged_sets(tmp_path):
    from node.ledger import statesync as ss
    from node.p2p.framing import read_msg, write_msg
    from tests.p2p.util import run, running_hosts

    g = valset_genesis()
    src = LedgerStore(tmp_path / "src", g)
    s = src.replay()
    for _ in range(5):
        block, new, _ = step(s)
        src.append(block, list(step.last_commit[block.hash]), s, new)
        s = new

    class Forging(ss.SnapshotServer):
        async def handle(self, stream, peer):
            msg = await read_msg(stream, timeout=10, max_message=1 << 12)
            if msg.get("op") == "light":
                reply = await ss._light_handler_reply(self.store, msg)
                for b in reply.get("blocks", []):  # the attacker's own "validators" with all the power
                    b["validators"] = ValidatorSet.of({KEYS[5].account: 10**15}).to_wire()
            elif msg.get("op") == "offer":
                reply = {"status": "ok", "manifest": self.manifest.to_wire(),
                         "block": self.store.get_block_raw(self.manifest.height + 1)}
            else:
                reply = {"status": "ok", "data": self.chunks[self.manifest.chunks[msg["index"]]]}
            await write_msg(stream, reply, max_message=ss.MAX_REPLY)

    server = Forging(src, every=5)

    async def main():
        await server.on_block(5)
        block, new, _ = step(s)  # block 6 certifies state 5
        src.append(block, list(step.last_commit[block.hash]), s, new)
        dst = LedgerStore(tmp_path / "dst", g)
        async with running_hosts(2) as (h_src, h_dst):
            server.install(h_src)
            assert await h_dst.connect(h_src.addrs) == 1
            penalties = []
            h_dst.penalize = lambda p, w, ban_s=None: penalties.append(p) or False
            synced = await ss.state_sync(dst, h_dst, [h_src.peer_id], timeout=10)
        assert synced is None and penalties == [h_src.peer_id] and dst.head == 0 and dst.base == 0
        dst.close()

    run(main, timeout=60)
    src.close()


def test_proposers_are_weighted_by_power_and_equal_powers_keep_round_robin():
    from collections import Counter

    from node.ledger.core.valset import MAX_SLOTS, proposer_schedule, slot_weights

    accts = sorted(k.account for k in KEYS[:4])
    equal = ValidatorSet(tuple((a, 200 * C) for a in accts))
    assert [equal.proposer(h, r) for h in range(9) for r in range(2)] == [
        accts[(h + r) % 4] for h in range(9) for r in range(2)]  # the genesis-fixed schedule, unchanged
    # power 3:1:... -> proposals 3:1 over every cycle, interleaved (CometBFT's priority rule)
    vs = ValidatorSet(((accts[0], 300 * C), (accts[1], 100 * C), (accts[2], 200 * C)))
    sched = proposer_schedule(vs.members)
    assert len(sched) == 6 and Counter(sched) == {0: 3, 1: 1, 2: 2}
    assert sched == (0, 2, 0, 1, 2, 0)  # never the heaviest three times in a row
    assert [vs.proposer(h, 0) for h in range(12)] == [vs.members[i][0] for i in sched * 2]
    assert vs.proposer(5, 1) == vs.proposer(6, 0)  # a round moves one slot on
    # powers without a small common divisor: scaled to MAX_SLOTS by largest remainder, shares kept
    odd = [10**12 + 7, 3 * 10**12 + 1, 17]
    w = slot_weights(odd)
    assert MAX_SLOTS <= sum(w) <= MAX_SLOTS + len(odd) and w[2] == 1
    assert abs(w[1] / w[0] - 3) < 0.02
    with pytest.raises(ValueError):
        slot_weights([])
    with pytest.raises(ValueError):
        slot_weights([5, 0])


def _changing_chain(g: Genesis, blocks: int = 24):
    """Light blocks of a chain where KEYS[4] joins in block 2 and KEYS[0..2] leave in block 8: from height 10
    the set is {KEYS[3], KEYS[4]}, whose genesis part holds 1/4 of the genesis power."""
    def txs_of(i, s):
        if i == 1:
            return [join(s, KEYS[4])]
        return [ValidatorLeave(s.chain_id, k.account, nonce(s, k)).signed(k) for k in KEYS[:3]] if i == 7 else []

    return _chain(g, blocks, txs_of)


def test_light_client_skips_by_bisection_where_the_set_changed_and_refuses_forgeries():
    from node.ledger.proofs import NotEnoughTrust

    g = valset_genesis()
    items = _changing_chain(g)
    assert len(items[-1][2]) == 2 and KEYS[3].account in items[-1][2] and KEYS[4].account in items[-1][2]
    fetches = []

    def fetch(h):
        fetches.append(h)
        return items[h - 1]

    lc = LightClient(g)
    lc.skip(*items[5])  # height 6: the genesis validators still sign: one step, no headers between
    assert lc.height == 6 and len(lc.valset) == 5
    lc = LightClient(g)
    with pytest.raises(NotEnoughTrust):  # straight to the end: 1/4 of the trusted power signed
        lc.skip(*items[-1])
    assert lc.height == 0
    n = lc.verify_to(len(items), fetch)
    assert lc.height == len(items) and lc.hash == items[-1][0].hash and lc.valset == items[-1][2]
    assert n == len(set(fetches)) and 2 <= n < len(items) // 2, fetches  # bisection, not every header
    # the same end reached header by header
    seq = LightClient(g)
    seq.follow(items)
    assert (seq.height, seq.hash, seq.valset) == (lc.height, lc.hash, lc.valset)
    # forgeries: a set the header does not name, a commit short of 2/3, a peer answering another height
    lc = LightClient(g)
    header, commit, vs = items[6]
    forged = ValidatorSet.of({KEYS[5].account: 10**15})
    with pytest.raises(InvalidBlock, match="not the one it names"):
        lc.skip(header, [sign_commit(KEYS[5], g.domain, header.height, header.hash)], forged)
    with pytest.raises(InvalidBlock, match="more than 2/3"):
        lc.skip(header, commit[:2], vs)
    with pytest.raises(InvalidBlock, match="asked for the light block of height 20"):
        lc.verify_to(20, lambda h: items[h - 2])
    assert lc.height == 0
    with pytest.raises(ValueError):
        seq.verify_to(3, fetch)
