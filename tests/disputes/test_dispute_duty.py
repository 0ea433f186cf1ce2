"""Issue 37: the requester's side of a tab dispute (:class:`node.disputes.duty.DisputeDuty`) against a real chain
in memory: a receipt queued before the worker's batch exists is filed once the batch that redeems it is included,
judged by its committee, and an invalid verdict refutes the batch; a receipt no batch ever redeems is given up;
another requester's receipt is refused at once."""

from __future__ import annotations

import pytest
import trio

from node.disputes.duty import GIVE_UP_EPOCHS, DisputeDuty, redeeming_batch
from node.ledger.core.tx import INVALID
from tests.ledger.tabs_helpers import KEYS, C, Chain, tab_genesis
from tests.settle.test_duty import ChainLedger

REQ, W1 = KEYS[0], KEYS[1]


def _step(duty: DisputeDuty) -> None:
    async def go():
        async with trio.open_nursery() as n:
            await duty.step(n)

    trio.run(go)


def test_a_queued_dispute_is_filed_when_the_batch_that_redeems_it_is_included_and_refutes_it():
    c = Chain(tab_genesis())
    duty = DisputeDuty(ChainLedger(c), REQ)
    tab = c.open_tab(REQ, W1, 10 * C)
    c.block()
    rs = c.receipts(W1, REQ, tab, [C] * 6)
    bad = rs[4]
    duty.add(bad)
    _step(duty)  # no batch yet: it waits
    assert not c.pending and list(duty.queued) == [bad.id]
    b = c.batch(W1, rs)
    c.block()
    assert redeeming_batch(c.state, bad) == b.key
    _step(duty)
    assert not duty.queued and duty.sent == [bad.id] and len(c.pending) == 1
    c.block()
    assert not c.rejected and c.settlement(b).disputes == 1
    c.block()  # the disputed receipt's committee is drawn
    escrow = c.state.account(W1.account).escrow
    assert escrow == 6 * C
    c.vote_all(INVALID)
    c.block()
    assert c.state.receipts[bad.id].status == "invalid" and c.settlement(b) is None
    assert c.state.account(W1.account).escrow == 0 and c.state.tables["tabs"][tab].locked == 10 * C


def test_a_receipt_no_batch_redeems_is_given_up_and_another_requesters_is_refused():
    c = Chain(tab_genesis())
    duty = DisputeDuty(ChainLedger(c), REQ)
    tab = c.open_tab(REQ, W1, 10 * C)
    c.block()
    (r,) = c.receipts(W1, REQ, tab, [C])
    duty.add(r)
    c.block(c.g.params.epoch_blocks * GIVE_UP_EPOCHS - 2)
    _step(duty)
    assert r.id in duty.queued  # within its last epoch still
    c.block(c.g.params.epoch_blocks)
    _step(duty)
    assert not duty.queued and not duty.sent and not c.pending
    with pytest.raises(ValueError, match="requester"):
        DisputeDuty(ChainLedger(c), W1).add(r)


def test_a_dispute_the_network_failed_to_send_stays_queued_for_the_next_step():
    c = Chain(tab_genesis())

    class Flaky(ChainLedger):
        fails = 1

        async def submit(self, tx) -> bytes:
            if self.fails:
                self.fails -= 1
                raise ConnectionError("no peer took it")
            return await super().submit(tx)

    duty = DisputeDuty(Flaky(c), REQ)
    tab = c.open_tab(REQ, W1, 10 * C)
    c.block()
    rs = c.receipts(W1, REQ, tab, [C, C])
    duty.add(rs[0])
    c.batch(W1, rs)
    c.block()
    with pytest.raises(BaseExceptionGroup) as e:  # (raised through the step's task group)
        _step(duty)  # the duty runner backs off and steps again
    assert e.group_contains(ConnectionError)
    assert list(duty.queued) == [rs[0].id] and not c.pending
    _step(duty)
    assert not duty.queued and duty.sent == [rs[0].id] and len(c.pending) == 1
