"""The ledger's module tuple (issue 26): one registration per module is the registry, the dispatch, the tables and
the end-block order; the receipts module settles other modules' receipts through their ReceiptKind and forces
committees through their forces_check (``node/ledger/core/modules.py``, ``module.py``, ``receipts.py``)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, replace
from typing import ClassVar

import pytest

from node.ledger import mempool_policy, snapshot, statedb
from node.ledger.core import genesis, liveness, modules, records, tree, tx as txmod
from node.ledger.core.genesis import GenesisError
from node.ledger.core.kv import Codec
from node.ledger.core.module import Module, ident
from node.ledger.core.params import ParamPart
from node.ledger.core.receipts import Receipts
from node.ledger.core.state import PENDING, SAMPLED, apply_block_body, genesis_state
from node.ledger.core.txbase import SingleSigned
from node.ledger.core.view import StateView
from tests.ledger.helpers import CLIENT, W1, make_genesis, make_receipt

# The store keys of the state tables (a consensus format: hashed into every entry's tree key, LevelDB's prefix,
# a snapshot's table order), as they were when each was kept in a list by hand (tree.TAG, statedb.PREFIX)
STORE_KEYS = {"accounts": b"a", "receipts": b"r", "evidence": b"e", "sessions": b"s", "jobs": b"j", "runs": b"n",
              "open_receipts": b"o", "open_jobs": b"p", "open_runs": b"q", "history": b"h", "retire": b"t",
              "validators": b"v", "batches": b"b", "batch_items": b"i", "batch_due": b"d", "batch_workers": b"w",
              "open_batches": b"y", "disputes": b"z", "tabs": b"T", "settlements": b"E", "tab_reveals": b"R",
              "tab_due": b"D", "worker_batches": b"W", "tab_disputes": b"Q"}
# the mempool's work kinds when they were a list of names (mempool.WORK_KINDS), and the tabs' two a worker must
# land to be paid and not slashed (issue 38: that list had missed them)
WORK_KINDS = {"receipt", "train_receipt", "vote", "evidence", "job_accept", "job_deliver", "job_release",
              "round_receipt", "round_reveal", "round_aggregate", "dispute", "batch_commit", "batch_reveal",
              "batch_audit_vote", "epoch_batch", "reveal"}


def test_the_registry_is_the_tuple():
    kinds = [c for m in modules.MODULES for c in m.txs]
    assert list(txmod.TX_KINDS.values()) == kinds  # every kind, in the tuple's order, and nothing else
    assert list(txmod.TX_KINDS) == [c.KIND for c in kinds]
    for m in modules.MODULES:
        for c in m.txs:
            assert modules.MODULE_OF[c] is m and modules.module_of(c) is m
    assert [m.name for m in modules.MODULES] == ["bank", "receipts", "jobs", "runs", "batches", "history",
                                                 "staking", "disputes", "tabs"]  # the end-block order


def test_store_keys_work_kinds_and_params_are_the_modules_declarations():
    assert modules.STORE_KEYS == STORE_KEYS and tree.TAG == STORE_KEYS
    assert {t: b"S/" + k + b"/" for t, k in STORE_KEYS.items()} == statedb.PREFIX
    declared = {t for m in modules.MODULES for t in (*m.maps, *m.sets)}
    assert declared == set(records.MAPS + records.SETS) == set(records.CODECS) == set(STORE_KEYS)
    assert tuple(sorted(STORE_KEYS, key=STORE_KEYS.__getitem__)) == snapshot.TABLES  # the snapshot's table index
    assert mempool_policy.WORK_KINDS == WORK_KINDS == modules.WORK_KINDS
    owners = {m.params: m.name for m in modules.MODULES if m.params is not None}
    assert {p.fields.__name__: owners.get(p, "core") for p in genesis.PARTS} == {
        "CoreParams": "core", "JobParams": "jobs", "IdleParams": "core", "HistoryParams": "history",
        "StakingParams": "staking", "BatchParams": "batches", "FetchParams": "core", "TabParams": "tabs"}
    assert set(genesis.OPTIONAL_PARAMS) == {n for p in genesis.PARTS for n in p.optional}
    # a part's own bound is checked through Params.check: the batch module's, then the tabs'
    with pytest.raises(GenesisError, match="min_replication"):
        genesis.Params(min_replication=17).check()
    with pytest.raises(GenesisError, match="epoch_blocks"):
        genesis.Params(epoch_blocks=10).check()


def test_the_genesis_hash_keeps_the_order_of_the_parameters():
    """The parts' fields, in PARTS order, are the order the parameters had in one class before (the genesis hash
    is over their values in that order), but for min_model_servers (see genesis.PARTS)."""
    before = ["block_time_ms", "price_per_token_block", "max_receipt_price", "sample_base_ppm", "sample_floor_ppm",
              "adapt_step", "committee_size", "max_rounds", "committee_fee_bps", "slash_amount", "min_bond",
              "challenge_window", "verdict_timeout", "receipt_max_age", "job_start_window", "job_start_penalty",
              "job_release_penalty", "max_job_deadline", "heartbeat_ms", "retention_blocks", "min_validator_bond",
              "batch_slash", "batch_absent_penalty", "min_replication", "batch_max_held", "batch_audit_ppm",
              "min_model_servers", "batch_min_token_price", "batch_max_open_items", "batch_audit_pay_bps",
              "epoch_blocks", "batch_samples", "reveal_window", "settle_window", "tab_close_delay"]
    now = [f.name for f in dataclasses.fields(genesis.Params)]
    before.remove("min_model_servers")
    before.insert(before.index("batch_audit_pay_bps") + 1, "min_model_servers")
    assert now == before


def test_a_registry_refuses_forgotten_or_clashing_declarations():
    """The module manager's checks at import (Cosmos' assertNoForgottenModules): a table without a store key, a
    key twice, a work kind of another module, parameters that are no part of Params, a part no module owns."""
    bare = Module("bare", maps={"bare": Codec(ident, ident)})
    with pytest.raises(ValueError, match="one key per table"):
        modules._registry((*modules.MODULES, bare))
    with pytest.raises(ValueError, match="store keys must be"):
        modules._registry((*modules.MODULES, replace(bare, store_keys={"bare": b"a"})))  # the accounts' key
    with pytest.raises(ValueError, match="work kind"):
        modules._registry((*modules.MODULES, Module("w", work_txs=(_Ping,))))
    with pytest.raises(ValueError, match="not a part of Params"):
        modules._registry((*modules.MODULES, Module("p", params=ParamPart(_Ping))))
    without_tabs = tuple(m for m in modules.MODULES if m.name != "tabs")
    with pytest.raises(ValueError, match="TabParams"):
        modules._registry(without_tabs)


def test_liveness_asks_every_module():
    """A module's own reason for a height reaches the driver (liveness imports no capability: it asks the tuple)."""
    s = genesis_state(make_genesis())
    assert liveness.height_need(s) is None
    s.tables["tab_due"][(5).to_bytes(8, "big")] = (b"t" + bytes(32),)  # a tab closing at height 5
    assert liveness.height_need(s) == "tab"


@dataclass(frozen=True)
class _Ping(SingleSigned):
    chain_id: str
    sender: bytes
    sig: bytes = b""

    TAG: ClassVar[bytes] = b"tally/test-ping/v1"
    KIND: ClassVar[str] = "transfer"  # the bank's kind name: refused
    SIGS: ClassVar[tuple[str, ...]] = ("sig",)
    SCHEMA: ClassVar[dict[str, str]] = {"sender": "account"}


def test_a_registry_refuses_a_kind_or_table_or_name_twice():
    ping = Module("ping", txs=(_Ping,))
    with pytest.raises(ValueError, match="share a name"):
        modules._registry((*modules.MODULES, ping))
    with pytest.raises(ValueError, match="registered twice"):
        modules._registry((*modules.MODULES, Module("again", txs=modules.MODULES[0].txs[:1])))
    with pytest.raises(ValueError, match="declared twice"):
        modules._registry((*modules.MODULES, Module("tables", maps={"accounts": Codec(ident, ident)})))
    with pytest.raises(ValueError, match="two modules named"):
        modules._registry((*modules.MODULES, Module("bank")))


def test_a_module_forcing_a_committee_gets_one_and_the_others_are_not_asked():
    """The receipts module, built over one extension that forces a committee on every pending receipt and one
    that never does (the way the disputes module is wired), samples a receipt the beacon did not pick."""
    asked: list[bytes] = []

    def always(s: StateView, receipt_id: bytes, height: int) -> bool:
        asked.append(receipt_id)
        return True

    g = make_genesis(sample_base_ppm=1000, sample_floor_ppm=1000, slash_amount=10**12, challenge_window=4)
    s = apply_block_body(genesis_state(g), 1, b"\x01" * 32, [make_receipt(g, W1, CLIENT, rid=b"s" * 16)])
    rid = next(iter(s.open_receipts))
    never = Module("never")
    plain = s.copy()
    Receipts((never,)).end_block(plain, 2, b"\x02" * 32)
    assert plain.receipts[rid].status == PENDING and plain.receipts[rid].p_ppm == 1000  # the beacon skips it
    forced = s.copy()
    Receipts((never, Module("always", on_force=always))).end_block(forced, 2, b"\x02" * 32)
    rec = forced.receipts[rid]
    assert rec.status == SAMPLED and rec.p_ppm == 10**6 and rec.committee and W1.account not in rec.committee
    assert asked == [rid]
    assert not never.may_force and Module("always", on_force=always).may_force
