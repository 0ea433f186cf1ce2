"""Tabs and epoch batches, a ledger module (:mod:`node.ledger.core.modules`): settlement whose ledger cost follows
settlements, not units of work (issue 37; DESIGN.md "Settlement").

* :mod:`~node.ledger.core.tabs.tabtx` -- the kinds: tab open, top-up and close, the tab receipt (the voucher),
  the epoch batch, the reveal and the dispute;
* :mod:`~node.ledger.core.tabs.state` -- the records: :class:`~node.ledger.core.tabs.state.Tab` and
  :class:`~node.ledger.core.tabs.state.Settlement`;
* :mod:`~node.ledger.core.tabs.rules` -- the state transition of tabs and batches and the draw after commitment;
* :mod:`~node.ledger.core.tabs.checks` -- a revealed or disputed receipt before its committee, and the dispatch.

``MODULE`` registers them: the kinds, the tables ``tabs``, ``settlements``, ``tab_reveals``, ``tab_due``,
``worker_batches`` and ``tab_disputes``, the end-block timers, the receipt kind of a revealed or disputed
receipt, and the unbond it refuses.
"""

from __future__ import annotations

from typing import Any

from ..kv import Codec
from ..module import Module, ident
from ..tabparams import TAB_PART
from .checks import TabReceiptKind, apply_tab_tx
from .rules import end_block, height_need, unbond_blocker
from .state import DisputeHold, Settlement, SettlementStatus, Tab
from .tabtx import TAB_TXS, EpochBatch, Reveal, TabClose, TabDispute, TabOpen, TabReceipt, TabTopUp


def _pair(x: Any) -> tuple[int, int]:
    return (int(x[0]), int(x[1]))


def _keys(x: Any) -> tuple[bytes, ...]:
    return tuple(bytes(i) for i in x)


MODULE = Module("tabs", txs=TAB_TXS,
                maps={"tabs": Tab,  # tab id -> Tab
                      "settlements": Settlement,  # batch key -> Settlement (until final)
                      "tab_reveals": Codec(ident, bytes),  # revealed receipt id -> batch key (until its verdict)
                      "tab_due": Codec(list, _keys),  # height (8 bytes) -> keys due at its end
                      "worker_batches": Codec(list, _pair),  # worker -> (batches not final, last epoch)
                      "tab_disputes": DisputeHold},  # disputed receipt id -> DisputeHold (until its verdict)
                store_keys={"tabs": b"T", "settlements": b"E", "tab_reveals": b"R", "tab_due": b"D",
                            "worker_batches": b"W", "tab_disputes": b"Q"},
                work_txs=(EpochBatch, Reveal), params=TAB_PART, on_need=height_need,
                receipt_kinds={TabReceipt: TabReceiptKind()},
                on_apply=apply_tab_tx, on_end_block=end_block, on_unbond=unbond_blocker)

__all__ = ["MODULE", "DisputeHold", "EpochBatch", "Reveal", "Settlement", "SettlementStatus", "Tab", "TabClose",
           "TabDispute", "TabOpen", "TabReceipt", "TabTopUp"]
