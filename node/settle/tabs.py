"""The two ends of a session paid through a tab (issue 37): the worker's gate at session open (:class:`TabGate`)
and the requester's tabs (:class:`TabBook`).

**Worker.** A session on a tab opens only when the ledger holds that tab for this worker and this requester, open
(not closing), and what is still locked covers the session's most expensive outcome (``max_length`` positions
through the span): ``locked − (before − redeemed) ≥ max price`` -- a worker never serves on a tab that cannot pay.
The worker then names the session's tab nonce and ``before`` (what the requester owes on the tab so far): one more
than, and the cumulative of, the newest receipt it holds for the tab (its epoch book) or the ledger's redeemed
voucher, whichever is newer. One session per tab at a time (its final cumulative is the next one's ``before``).

**Requester.** One tab per worker it uses, opened on first use with ``lock`` base units (topped up when a
session's max price would not fit) and waited for until a block includes it; the highest cumulative it has signed
per tab, kept in ``tabs.json`` in its data dir, so that it never accepts a ``before`` above what it signed (a worker
that overcharges is refused). A tab is held by one session at a time (a lock per tab).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import trio

from ..duty.seams import Ledger
from ..identity import Identity
from ..ledger.core.state import State
from ..ledger.core.tabs import TabOpen, TabTopUp
from ..ledger.core.tabs.state import Tab
from .book import EpochBook

TAB_WAIT = 30.0  # seconds a requester waits for its tab transaction to be included


class TabRefused(ValueError):
    """A session cannot open on this tab; ``code`` says why (``no_tab``, ``tab_closing``, ``tab_low``,
    ``tab_busy``)."""

    def __init__(self, code: str, msg: str):
        super().__init__(msg)
        self.code = code


class TabGate:
    """The worker's check of a tab at session open (module docstring). ``state()`` is the ledger's state now."""

    def __init__(self, state: Callable[[], State], book: EpochBook, me: bytes):
        self.state, self.book, self.me = state, book, me
        self.busy: set[bytes] = set()

    def open(self, requester: bytes, tab_id: bytes, max_price: int) -> tuple[int, int]:
        """``(tab nonce, before)`` of a new session of ``requester`` on ``tab_id`` costing at most ``max_price``;
        the tab is held until :meth:`close`.

        Raises:
            TabRefused: unknown tab or another's, closing, too little locked, or a session already open on it.
        """
        tab: Tab | None = self.state().tables["tabs"].get(tab_id)
        if tab is None or tab.worker != self.me or tab.requester != requester:
            raise TabRefused("no_tab", "the ledger holds no tab of yours for this worker under that id")
        if tab.close_at:
            raise TabRefused("tab_closing", f"the tab closes at height {tab.close_at}")
        if tab_id in self.busy:
            raise TabRefused("tab_busy", "a session is already open on this tab")
        newest = self.book.newest(tab_id)
        nonce = max(tab.nonce, newest.tab_nonce if newest is not None else 0) + 1
        before = max(tab.redeemed, newest.cumulative if newest is not None else 0)
        left = tab.locked - (before - tab.redeemed)
        if left < max_price:
            raise TabRefused("tab_low", f"the tab has {left} base units left of its lock; this session may cost "
                                        f"{max_price}: top it up")
        self.busy.add(tab_id)
        return nonce, before

    def close(self, tab_id: bytes) -> None:
        """The session on ``tab_id`` ended (its receipt, if any, is in the book)."""
        self.busy.discard(tab_id)


class TabBook:
    """The requester's tabs (module docstring), kept in ``path`` (JSON: worker -> tab id, tab id -> the highest
    cumulative signed)."""

    def __init__(self, ledger: Ledger, ident: Identity, path: Path, lock: int):
        self.ledger, self.ident, self.path, self.lock = ledger, ident, path, lock
        self.tab_of: dict[bytes, bytes] = {}
        self.signed: dict[bytes, int] = {}
        self._locks: dict[bytes, trio.Semaphore] = {}  # one session per tab (released by another task)
        if path.exists():
            doc = json.loads(path.read_text())
            self.tab_of = {bytes.fromhex(w): bytes.fromhex(t) for w, t in doc.get("tabs", {}).items()}
            self.signed = {bytes.fromhex(t): int(c) for t, c in doc.get("signed", {}).items()}

    def _save(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"tabs": {w.hex(): t.hex() for w, t in self.tab_of.items()},
                                   "signed": {t.hex(): c for t, c in self.signed.items()}}))
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, self.path)

    async def _included(self, check: Callable[[State], bool], what: str) -> None:
        with trio.move_on_after(TAB_WAIT) as scope:
            while not check(self.ledger.state):
                await self.ledger.new_block.wait()
        if scope.cancelled_caught:
            raise TabRefused("no_tab", f"{what} was not included within {TAB_WAIT:.0f} s")

    async def acquire(self, worker: bytes, max_price: int) -> bytes:
        """The tab to pay ``worker`` through for a session costing at most ``max_price``, held for it (opened or
        topped up first when needed, waiting for inclusion). Release it with :meth:`release`.

        Raises:
            TabRefused: the tab transaction was not included in time.  InvalidTx: it was refused (balance).
        """
        tab_id = self.tab_of.get(worker)
        lock = self._locks.setdefault(worker, trio.Semaphore(1))
        await lock.acquire()
        try:
            tabs = self.ledger.state.tables["tabs"]
            tab: Tab | None = tabs.get(tab_id) if tab_id is not None else None
            if tab is None or tab.close_at:
                tx = TabOpen(self.ledger.state.chain_id, self.ident.account, worker, max(self.lock, max_price),
                             self.ledger.next_nonce(self.ident.account)).signed(self.ident)
                await self.ledger.submit(tx)
                opened: bytes = tx.id
                await self._included(lambda s: opened in s.tables["tabs"], "the tab's opening")
                self.tab_of[worker] = opened
                self._save()
                return opened
            assert tab_id is not None  # a tab was found under it
            owed = max(self.signed.get(tab_id, 0), tab.redeemed) - tab.redeemed
            if tab.locked - owed < max_price:
                need = max(self.lock, max_price) - (tab.locked - owed)
                up = TabTopUp(self.ledger.state.chain_id, self.ident.account, tab_id, need,
                              self.ledger.next_nonce(self.ident.account)).signed(self.ident)
                await self.ledger.submit(up)
                await self._included(lambda s: s.account(self.ident.account).nonce > up.nonce, "the tab's top-up")
            found: bytes = tab_id
            return found
        except BaseException:
            lock.release()
            raise

    def check_before(self, tab_id: bytes, before: int) -> bool:
        """Whether a worker's ``before`` for ``tab_id`` is at most what this requester signed (or the ledger
        redeemed): never more."""
        tab: Tab | None = self.ledger.state.tables["tabs"].get(tab_id)
        return before <= max(self.signed.get(tab_id, 0), tab.redeemed if tab is not None else 0)

    def release(self, worker: bytes, tab_id: bytes, cumulative: int | None) -> None:
        """The session on ``worker``'s tab ended; ``cumulative`` is what its countersigned receipt says is owed."""
        if cumulative is not None and cumulative > self.signed.get(tab_id, 0):
            self.signed[tab_id] = cumulative
            self._save()
        lock = self._locks.get(worker)
        if lock is not None and lock.value == 0:
            lock.release()


__all__ = ["TAB_WAIT", "TabBook", "TabGate", "TabRefused"]
