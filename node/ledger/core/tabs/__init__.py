"""Tabs and epoch batches, a ledger module (:mod:`node.ledger.core.modules`): settlement whose ledger cost follows
settlements, not units of work (issue 37; DESIGN.md "Settlement").

* :mod:`~node.ledger.core.tabs.tabtx` -- the kinds: tab open, top-up and close, the tab receipt (the voucher),
  the epoch batch and the reveal;
* :mod:`~node.ledger.core.tabs.state` -- the records: :class:`~node.ledger.core.tabs.state.Tab` and
  :class:`~node.ledger.core.tabs.state.Settlement`;
* :mod:`~node.ledger.core.tabs.rules` -- the state transition, the draw after commitment, and the rules of a
  revealed receipt before its committee.

``MODULE`` registers them: the kinds, the tables ``tabs``, ``settlements``, ``tab_reveals``, ``tab_due`` and
``worker_batches``, the end-block timers, the receipt kind of a revealed receipt, and the unbond it refuses.
"""

from __future__ import annotations

from typing import Any

from ..kv import Codec
from ..module import Module, ident
from .rules import TabReceiptKind, apply_tab_tx, end_block, unbond_blocker
from .state import Settlement, SettlementStatus, Tab
from .tabtx import TAB_TXS, EpochBatch, Reveal, TabClose, TabOpen, TabReceipt, TabTopUp


def _pair(x: Any) -> tuple[int, int]:
    return (int(x[0]), int(x[1]))


def _keys(x: Any) -> tuple[bytes, ...]:
    return tuple(bytes(i) for i in x)


MODULE = Module("tabs", txs=TAB_TXS,
                maps={"tabs": Tab,  # tab id -> Tab
                      "settlements": Settlement,  # batch key -> Settlement (until final)
                      "tab_reveals": Codec(ident, bytes),  # revealed receipt id -> batch key (until its verdict)
                      "tab_due": Codec(list, _keys),  # height (8 bytes) -> keys due at its end
                      "worker_batches": Codec(list, _pair)},  # worker -> (batches not final, last epoch)
                receipt_kinds={TabReceipt: TabReceiptKind()},
                on_apply=apply_tab_tx, on_end_block=end_block, on_unbond=unbond_blocker)

__all__ = ["MODULE", "EpochBatch", "Reveal", "Settlement", "SettlementStatus", "Tab", "TabClose", "TabOpen",
           "TabReceipt", "TabTopUp"]
