"""Issue 37: the worker's side of settlement -- its epoch book on disk (LevelDB) and the duty that sends one batch
per epoch and reveals what the ledger draws, against a real chain in memory (blocks proposed and committed,
signatures checked). A worker whose process dies after a batch was prepared, or whose batch never reached the
ledger, is paid after restart for every receipt its requester signed, and nothing twice."""

from __future__ import annotations

import torch
import trio

from node.ledger.core.tx import VALID
from node.settle.book import EpochBook
from node.settle.duty import SettleDuty
from tests.ledger.tabs_helpers import KEYS, C, Chain, tab_genesis

REQ, W1 = KEYS[0], KEYS[1]


class ChainLedger:
    """The duty's view of a :class:`Chain`: its state, its pending transactions, and submit (checked as a node
    would before gossiping: the signatures)."""

    def __init__(self, chain: Chain):
        self.chain = chain

    @property
    def state(self):
        return self.chain.state

    @property
    def mempool(self):
        return {t.id: t for t in self.chain.pending}

    async def submit(self, tx) -> bytes:
        tx.check_signatures()
        self.chain.send(tx)
        return tx.id


def _step(duty: SettleDuty) -> None:
    async def go():
        async with trio.open_nursery() as n:
            await duty.step(n)
    trio.run(go)


def _run(c: Chain, duty: SettleDuty, blocks: int) -> None:
    """``blocks`` blocks, the duty stepping before each and every committee voting valid."""
    for _ in range(blocks):
        _step(duty)
        c.vote_all(VALID)
        c.block()


def _setup(tmp_path, n_receipts: int = 5):
    c = Chain(tab_genesis())
    tab = c.open_tab(REQ, W1, 20 * C)
    c.block()
    book = EpochBook(tmp_path / "book", c.g.domain)
    rs = c.receipts(W1, REQ, tab, [C] * n_receipts)
    for r in rs:
        assert book.add(r)
    return c, tab, book, rs


def test_a_book_keeps_the_newest_receipt_of_a_session_and_refuses_an_older(tmp_path):
    c = Chain(tab_genesis())
    book = EpochBook(tmp_path, c.g.domain)
    tab = b"t" * 32
    r1, r2 = c.receipts(W1, REQ, tab, [C, C])
    longer = c.receipts(W1, REQ, tab, [3 * C], start_nonce=1)[0]  # the same session (nonce 1), more steps
    assert book.add(r1) and book.add(r2) and book.add(longer)
    assert not book.add(r1)  # older than what is held
    assert [r.cumulative for r in book.open_receipts()] == [3 * C, 2 * C]
    assert book.newest(tab).tab_nonce == 2
    book.close()
    book = EpochBook(tmp_path, c.g.domain)  # reopened: all of it was on disk
    assert [r.cumulative for r in book.open_receipts()] == [3 * C, 2 * C]
    book.close()


def test_the_duty_batches_reveals_and_is_paid_once(tmp_path):
    c, tab, book, _rs = _setup(tmp_path)
    duty = SettleDuty(ChainLedger(c), W1, book)
    bal0 = c.state.account(W1.account).balance
    _run(c, duty, 4 + 3 + 6)  # into the next epoch, batch, draw, reveal, votes, settle window
    _run(c, duty, 2)
    assert duty.batches_sent == 1 and duty.reveals_sent == 2
    assert not c.state.tables["settlements"] and not list(book.batches()) and not book.open_receipts()
    earned = c.state.account(W1.account).balance - bal0
    assert 4 * C < earned < 5 * C  # 5 C signed, committee fees out of it
    assert c.state.tables["tabs"][tab].redeemed == 5 * C
    book.close()


def test_a_worker_killed_after_preparing_its_batch_is_paid_after_restart_and_not_twice(tmp_path):
    c, tab, book, _rs = _setup(tmp_path)
    duty = SettleDuty(ChainLedger(c), W1, book)
    c.block(4 - c.state.height % 4)  # the next epoch
    _step(duty)  # the batch is prepared in the book and sent
    assert duty.batches_sent == 1
    book.close()  # the process dies here; what it sent is in the mempool (gossiped)
    c.block()
    book = EpochBook(tmp_path / "book", c.g.domain)
    duty = SettleDuty(ChainLedger(c), W1, book)  # the restarted node
    bal0 = c.state.account(W1.account).balance
    _run(c, duty, 14)
    assert duty.batches_sent == 0  # no second batch over the same receipts
    assert c.state.tables["tabs"][tab].redeemed == 5 * C
    assert 4 * C < c.state.account(W1.account).balance - bal0 < 5 * C
    assert not book.open_receipts() and not list(book.batches())  # the book knew the batch: all of it settled
    book.close()


def test_a_batch_lost_before_the_ledger_saw_it_goes_into_a_later_one(tmp_path):
    c, tab, book, _rs = _setup(tmp_path)
    duty = SettleDuty(ChainLedger(c), W1, book)
    c.block(4 - c.state.height % 4)
    _step(duty)
    c.pending.clear()  # the transaction never left the dead process
    book.close()
    c.block(9)  # two epochs later its epoch can no longer be included
    book = EpochBook(tmp_path / "book", c.g.domain)
    more = c.receipts(W1, REQ, tab, [C, C], start_nonce=6, start_owed=5 * C)
    for r in more:
        book.add(r)
    duty = SettleDuty(ChainLedger(c), W1, book)
    _step(duty)  # released, and its receipts went into a new batch with the two since
    now = (c.state.height + 1) // 4  # the epoch of the next block
    assert [(b.epoch, len(got)) for _, b, got, _ in book.batches()] == [(now - 1, 7)] and duty.batches_sent == 1
    _run(c, duty, 16)
    assert c.state.tables["tabs"][tab].redeemed == 7 * C and not book.open_receipts()
    book.close()


def test_a_final_batch_deletes_its_session_blobs_unless_a_receipt_still_in_the_book_names_them(tmp_path):
    """The bounded retention of the tensors committees re-execute from: kept while a receipt in the book names them
    (here every receipt of the helper names the same inputs and outputs roots), deleted when the last batch that
    covered them is final; a blob no receipt names is never touched."""
    from node.blobs import BlobStore

    c, tab, book, _rs = _setup(tmp_path, n_receipts=3)
    blobs = BlobStore(tmp_path / "node")
    other = blobs.put([torch.ones(2)])
    shared = [blobs.path_of(b"i" * 32), blobs.path_of(b"o" * 32)]  # the roots the helper's receipts commit to
    for p in shared:
        p.write_bytes(b"\x90")
    duty = SettleDuty(ChainLedger(c), W1, book, blobs)
    c.block(4 - c.state.height % 4)
    _step(duty)  # the first batch over the three receipts
    for r in c.receipts(W1, REQ, tab, [C, C], start_nonce=4, start_owed=3 * C):
        book.add(r)  # two more, open: they name the same blobs
    first = {k for k, *_ in book.batches()}
    held_after_first = 0  # blocks in which the first batch was final and receipts naming the blobs were still held
    for _ in range(30):
        _run(c, duty, 1)
        in_book = bool(book.open_receipts()) or bool(list(book.batches()))
        if in_book:
            assert all(p.exists() for p in shared) and duty.blobs_deleted == 0
            held_after_first += not first & {k for k, *_ in book.batches()}
    assert held_after_first > 0, "the first batch was never final while the later receipts were held"
    assert c.state.tables["tabs"][tab].redeemed == 5 * C and not book.open_receipts() and not list(book.batches())
    assert duty.blobs_deleted == 2 and not any(p.exists() for p in shared) and blobs.has(other)
    book.close()
