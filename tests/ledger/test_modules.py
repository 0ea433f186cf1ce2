"""The ledger's module tuple (issue 26): one registration per module is the registry, the dispatch, the tables and
the end-block order; the receipts module settles other modules' receipts through their ReceiptKind and forces
committees through their forces_check (``node/ledger/core/modules.py``, ``module.py``, ``receipts.py``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import pytest

from node.ledger.core import modules, records, tx as txmod
from node.ledger.core.kv import Codec
from node.ledger.core.module import Module, ident
from node.ledger.core.receipts import Receipts
from node.ledger.core.state import PENDING, SAMPLED, apply_block_body, genesis_state
from node.ledger.core.txbase import SingleSigned
from node.ledger.core.view import StateView
from tests.ledger.helpers import CLIENT, W1, make_genesis, make_receipt

# The state tables' order before modules declared them: a snapshot chunk names a table by its index in MAPS + SETS;
# the tables of a module added later (tabs, issue 37) come after them
SNAPSHOT_ORDER = ("accounts", "receipts", "evidence", "sessions", "jobs", "runs", "history", "retire", "validators",
                  "batches", "batch_items", "batch_due", "batch_workers", "disputes",
                  "tabs", "settlements", "tab_reveals", "tab_due", "worker_batches", "tab_disputes")
SNAPSHOT_SETS = ("open_receipts", "open_jobs", "open_runs", "open_batches")


def test_the_registry_is_the_tuple():
    kinds = [c for m in modules.MODULES for c in m.txs]
    assert list(txmod.TX_KINDS.values()) == kinds  # every kind, in the tuple's order, and nothing else
    assert list(txmod.TX_KINDS) == [c.KIND for c in kinds]
    for m in modules.MODULES:
        for c in m.txs:
            assert modules.MODULE_OF[c] is m and modules.module_of(c) is m
    assert [m.name for m in modules.MODULES] == ["bank", "receipts", "jobs", "runs", "batches", "history",
                                                 "staking", "disputes", "tabs"]  # the end-block order


def test_the_tables_are_the_modules_in_the_snapshot_order():
    assert records.MAPS == SNAPSHOT_ORDER and records.SETS == SNAPSHOT_SETS
    declared = {t for m in modules.MODULES for t in (*m.maps, *m.sets)}
    assert declared == set(records.MAPS + records.SETS) == set(records.CODECS)
    # a table of a module added later comes after today's, whatever its name
    assert records._ordered(["zz_new", "accounts", "aa_new", "receipts"]) == ("accounts", "receipts", "zz_new",
                                                                            "aa_new")


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
