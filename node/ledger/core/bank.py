"""The bank, the core's ledger module for balances and bonds (pure): transfers, bonds and unbonds.

Kinds :class:`~node.ledger.core.txbase.Transfer`, :class:`~node.ledger.core.txbase.Bond` and
:class:`~node.ledger.core.txbase.Unbond` (each ordered by its sender's account nonce, which the state checks and
advances around :meth:`~node.ledger.core.module.LedgerModule.apply`); table ``accounts`` (account ->
:class:`~node.ledger.core.rows.Account`). All amounts in base units.

An unbond is refused while any module holds open work of the worker: each module's ``unbond_blocker`` is asked in
the module tuple's order (:mod:`node.ledger.core.modules` hands them in), and the first reason is the error.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from .genesis import TREASURY
from .kv import Codec
from .module import LedgerModule, Module, credit
from .rows import Account
from .txbase import Bond, InvalidTx, Transfer, Tx, Unbond, _check
from .view import StateView


def apply_transfer(s: StateView, tx: Transfer) -> None:
    """Move ``tx.amount`` from the sender's balance to the recipient's.

    Raises:
        InvalidTx: the balance does not cover it, or the recipient is the treasury.
    """
    sender = s.account(tx.sender)
    _check(sender.balance >= tx.amount, "insufficient balance")
    _check(tx.recipient != TREASURY, "the treasury cannot receive transfers")
    s.accounts[tx.sender] = replace(sender, balance=sender.balance - tx.amount)
    credit(s, tx.recipient, tx.amount)


def apply_bond(s: StateView, tx: Bond) -> None:
    """Lock ``tx.amount`` of the sender's balance as bond.

    Raises:
        InvalidTx: the balance does not cover it.
    """
    acc = s.account(tx.sender)
    _check(acc.balance >= tx.amount, "insufficient balance")
    s.accounts[tx.sender] = replace(acc, balance=acc.balance - tx.amount, bond=acc.bond + tx.amount)


def apply_unbond(s: StateView, tx: Unbond, blockers: tuple[LedgerModule, ...]) -> None:
    """Release ``tx.amount`` of the sender's bond to its balance, unless one of ``blockers`` holds work of it.

    Raises:
        InvalidTx: more than the bond, or the first blocker's reason (pending receipts, jobs held unstarted,
            undecided batch items, the last validators' bond).
    """
    acc = s.account(tx.sender)
    _check(acc.bond >= tx.amount, "unbond exceeds the bond")
    for m in blockers:
        why = m.unbond_blocker(s, tx.sender, acc.bond - tx.amount)
        _check(why is None, why or "")
    s.accounts[tx.sender] = replace(acc, balance=acc.balance + tx.amount, bond=acc.bond - tx.amount)


def _account(x: Any) -> Account:
    return Account(*x)


def _account_list(a: Account) -> list[int]:
    return a.to_list()


def module(blockers: tuple[LedgerModule, ...]) -> Module:
    """The bank module, asking ``blockers`` (in order) whether an unbond may go ahead."""

    def apply(s: StateView, tx: Tx) -> None:
        if isinstance(tx, Transfer):
            apply_transfer(s, tx)
        elif isinstance(tx, Bond):
            apply_bond(s, tx)
        elif isinstance(tx, Unbond):
            apply_unbond(s, tx, blockers)
        else:  # pragma: no cover - the dispatch sends this module its own kinds only
            raise InvalidTx(f"not a bank transaction: {tx.KIND}")

    return Module("bank", txs=(Transfer, Bond, Unbond), maps={"accounts": Codec(_account_list, _account)},
                  store_keys={"accounts": b"a"}, on_apply=apply)


__all__ = ["apply_bond", "apply_transfer", "apply_unbond", "module"]
