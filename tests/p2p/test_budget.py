"""ReplyBudget unit tests (pure trio, no network): caps per peer and node-wide, waits then refuses, bytes come back
on exit, error and cancellation, counters."""

import pytest
import trio

from node.p2p.budget import Busy, Cap, ReplyBudget, busy_reply
from node.p2p.framing import RemoteError

from .util import run

MiB = 1 << 20


def test_caps_and_counters():
    b = ReplyBudget(per_peer=10 * MiB, node_wide=16 * MiB, wait=0.05)

    async def body():
        async with b.reserve("a", 6 * MiB) as r1:
            assert (r1.nbytes, r1.held) == (6 * MiB, 6 * MiB)
            async with b.reserve("a", 4 * MiB):  # exactly the per-peer cap
                assert b.held_by("a") == 10 * MiB
                with pytest.raises(Busy) as e:
                    async with b.reserve("a", 1):
                        pass
                assert e.value.cap is Cap.PEER and e.value.code == "busy"
                async with b.reserve("b", 6 * MiB):  # exactly the node-wide cap
                    with pytest.raises(Busy) as e:
                        async with b.reserve("c", 1):
                            pass
                    assert e.value.cap is Cap.NODE
                    assert b.in_flight == 16 * MiB
        assert b.whole()
        s = b.stats()
        assert s["granted"] == 3 and s["refused_peer"] == 1 and s["refused_node"] == 1
        assert s["in_flight_bytes"] == 0 and s["in_flight_replies"] == 0 and s["peers"] == 0

    run(body)


def test_busy_is_a_remote_error_reply():
    b = ReplyBudget(per_peer=1, node_wide=1, wait=0)
    r = b.try_reserve("a", 1)
    with pytest.raises(RemoteError) as e:  # what set_request_handler turns into an error reply
        b.try_reserve("a", 1)
    reply = busy_reply(e.value)
    assert reply["status"] == "error" and reply["code"] == "busy" and "per-peer cap" in reply["message"]
    b.release(r)
    assert b.whole()
    with pytest.raises(RuntimeError):
        b.release(r)  # twice: refused, nothing goes negative
    assert b.whole()


def test_oversized_reply_reserves_the_cap():
    b = ReplyBudget(per_peer=4 * MiB, node_wide=8 * MiB, wait=0)

    async def body():
        async with b.reserve("a", 48 * MiB) as r:
            assert r.held == 4 * MiB and r.nbytes == 48 * MiB
            with pytest.raises(Busy):
                async with b.reserve("a", 1):
                    pass
            async with b.reserve("b", 100 * MiB):  # another peer: the node still has room for one cap
                with pytest.raises(Busy):
                    async with b.reserve("c", 1):
                        pass
        assert b.whole()

    run(body)


def test_waiter_gets_room_when_it_is_given_back():
    b = ReplyBudget(per_peer=MiB, node_wide=MiB, wait=5.0)
    order = []

    async def holder(task_status=trio.TASK_STATUS_IGNORED):
        async with b.reserve("a", MiB):
            task_status.started()
            await trio.sleep(0.2)
            order.append("released")

    async def body():
        async with trio.open_nursery() as n:
            await n.start(holder)
            t0 = trio.current_time()
            async with b.reserve("b", MiB):  # node-wide full: waits for holder, well under its 5 s wait
                order.append("granted")
                assert 0.1 < trio.current_time() - t0 < 4.0
        assert order == ["released", "granted"] and b.whole()

    run(body)


def test_refused_after_wait_not_before():
    b = ReplyBudget(per_peer=MiB, node_wide=2 * MiB, wait=0.3)

    async def body():
        async with b.reserve("a", MiB):
            t0 = trio.current_time()
            with pytest.raises(Busy):
                async with b.reserve("a", 1):
                    pass
            waited = trio.current_time() - t0
            assert 0.25 <= waited < 3.0
            with pytest.raises(Busy):  # an explicit wait of 0 refuses at once
                async with b.reserve("a", 1, wait=0):
                    pass
        assert b.whole() and b.refused[Cap.PEER] == 2

    run(body)


def test_given_back_on_error_and_cancellation():
    b = ReplyBudget(per_peer=MiB, node_wide=MiB, wait=0.1)

    async def body():
        with pytest.raises(KeyError):
            async with b.reserve("a", MiB):
                raise KeyError("handler failed")
        assert b.whole()
        with trio.move_on_after(0.1) as cs:
            async with b.reserve("a", MiB):
                await trio.sleep_forever()  # a write that never ends, cut by its deadline
        assert cs.cancelled_caught and b.whole()
        # a waiter cancelled while waiting takes nothing either
        async with trio.open_nursery() as n, b.reserve("a", MiB):
            async def waiter():
                async with b.reserve("b", MiB, wait=10):
                    raise AssertionError("must not get room")
            n.start_soon(waiter)
            await trio.sleep(0.05)
            n.cancel_scope.cancel()
        assert b.whole() and b.granted == 3

    run(body)


def test_many_concurrent_reservations_balance():
    b = ReplyBudget(per_peer=3 * MiB, node_wide=5 * MiB, wait=0.5)
    peak = {"total": 0, "peer": 0}

    async def one(peer: str, i: int):
        try:
            async with b.reserve(peer, MiB):
                peak["total"] = max(peak["total"], b.in_flight)
                peak["peer"] = max(peak["peer"], b.held_by(peer))
                await trio.sleep(0.01 * (i % 5))
        except Busy:
            pass

    async def body():
        async with trio.open_nursery() as n:
            for i in range(60):
                n.start_soon(one, f"p{i % 4}", i)
        assert b.whole()
        assert peak["total"] <= 5 * MiB and peak["peer"] <= 3 * MiB
        assert b.granted + b.refused[Cap.PEER] + b.refused[Cap.NODE] == 60

    run(body)


def test_bad_arguments():
    with pytest.raises(ValueError):
        ReplyBudget(per_peer=0)
    with pytest.raises(ValueError):
        ReplyBudget(per_peer=2, node_wide=1)
    with pytest.raises(ValueError):
        ReplyBudget(wait=-1)
    b = ReplyBudget()
    with pytest.raises(ValueError):
        b.try_reserve("a", -1)

    async def body():
        with pytest.raises(ValueError):
            async with b.reserve("a", -5):
                pass

    run(body)
    assert b.whole()
