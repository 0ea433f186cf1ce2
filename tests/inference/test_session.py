"""The session protocol end to end over in-memory streams: real servers, real client, no libp2p."""

from __future__ import annotations

from typing import ClassVar

import pytest
import trio

from node.compute.reference import local_generate
from node.identity import Identity

from .fakenet import make_swarm

SPANS = [(0, 2), (2, 4), (4, 6)]
PROMPT = [5, 17, 42, 99]


def run(fn, timeout=60):
    async def main():
        with trio.fail_after(timeout):
            return await fn()
    return trio.run(main)


def _member(tiny, client):
    from node.compute.executor import TorchExecutor
    from node.compute.span import SpanModel
    from node.verify.member import CommitteeMember

    return CommitteeMember(Identity.generate(), None, None, client.blobs, TorchExecutor(1),
                           lambda s, e: SpanModel(tiny, s, e), client.manifest.model_id)


async def _swarm(nursery, tiny, tmp_path, per_span=1, **kw):
    return await make_swarm(nursery, tiny, tmp_path, [span for span in SPANS for _ in range(per_span)], **kw)


def test_generation_matches_local_and_receipts_cover_every_position(tiny, tmp_path):
    async def main():
        async with trio.open_nursery() as n:
            _net, servers, client = await _swarm(n, tiny, tmp_path)
            gen = await client.generate(PROMPT, 12)
            await trio.sleep(0.05)
            n.cancel_scope.cancel()
            return gen, servers

    gen, servers = run(main)
    assert gen.tokens == local_generate(tiny, PROMPT, 12)
    assert len(gen.receipts) == 3 and not gen.failovers
    for r, s in zip(gen.receipts, servers, strict=False):
        assert r.tokens == len(PROMPT) + 11 and r.price == r.work * 100
        r.check_signatures()
        (settled,) = s.settled
        assert settled.reason == "closed" and settled.receipt == r  # both ends hold the same receipt
        assert s.active == 0 and s.reserved == 0


def test_failover_replays_and_bills_no_position_twice(tiny, tmp_path):
    """The middle server dies after token 17 of 48: the replacement replays its 4 + 16 positions unbilled."""
    async def main():
        async with trio.open_nursery() as n:
            net, servers, client = await _swarm(n, tiny, tmp_path, per_span=3)
            killed = []

            async def on_token(i, tok, route):
                if i == 17:
                    peer = route[1][0]
                    killed.append(peer)
                    await net.kill(peer)

            gen = await client.generate(PROMPT, 48, on_token=on_token)
            member = _member(tiny, client)
            verdicts = [await member.check(r) for r in gen.receipts]
            await trio.sleep(0.05)
            n.cancel_scope.cancel()
            return gen, killed, {s.ident.account: s for s in servers}, verdicts

    gen, (dead,), by_account, verdicts = run(main)
    assert [v for v, _ in verdicts] == [0] * 4  # the committee re-executes replayed and partial sessions: valid
    assert gen.tokens == local_generate(tiny, PROMPT, 48)
    (fo,) = gen.failovers
    assert fo.dead == dead and fo.token == 18 and fo.replayed == len(PROMPT) + 16 and fo.span == (2, 4)
    middle = [r for r in gen.receipts if (r.span_start, r.span_end) == (2, 4)]
    assert len(middle) == 2
    dead_r, new_r = middle
    assert dead_r.tokens == len(PROMPT) + 16  # the steps that produced tokens 1-17
    assert new_r.tokens == 48 - 17  # the steps that produced tokens 18-48, the replay unbilled
    assert dead_r.tokens + new_r.tokens == len(PROMPT) + 47  # == an uninterrupted session: nothing paid twice
    others = [r for r in gen.receipts if (r.span_start, r.span_end) != (2, 4)]
    assert [r.tokens for r in others] == [len(PROMPT) + 47] * 2
    # the replacement holds the same receipt as the client; its committed inputs include the replay
    repl = by_account[new_r.worker]
    (settled,) = repl.settled
    assert settled.receipt == new_r and settled.steps == 1 + 31


@pytest.mark.parametrize("codec", ["none", "fp16", "zstd", "fp16+zstd"])
def test_compression_is_recorded_and_committees_verify_it(tiny, tmp_path, codec):
    from node.ledger.core.tx import VALID

    async def main():
        async with trio.open_nursery() as n:
            _net, _servers, client = await _swarm(n, tiny, tmp_path)
            gen = await client.generate(PROMPT, 10, compression=codec)
            member = _member(tiny, client)
            verdicts = [await member.check(r) for r in gen.receipts]
            n.cancel_scope.cancel()
            return gen, verdicts

    gen, verdicts = run(main)
    assert all(r.compression == codec for r in gen.receipts)
    assert all(v == VALID for v, _ in verdicts), verdicts
    if "fp16" not in codec:
        assert gen.tokens == local_generate(tiny, PROMPT, 10)
    print(codec, [d for _, d in verdicts])


@pytest.mark.parametrize("how", ["stalls", "disconnects"])
def test_vanished_client_frees_cache_and_is_billed_for_acknowledged_steps(tiny, tmp_path, how):
    """A client that stops after token 17 without closing: each server frees the session (within the step
    timeout when the stream stays open, at once when it breaks) and its receipt covers the 17 steps."""
    timeout = 0.5

    async def main():
        async with trio.open_nursery() as n:
            net, servers, client = await _swarm(n, tiny, tmp_path, step_timeout=timeout)
            stop = trio.Event()

            async def on_token(i, tok, route):
                if i == 17:
                    stop.set()
                    await trio.sleep_forever()

            async def gen():
                with trio.CancelScope() as cs:
                    client_scope.append(cs)
                    await client.generate([7], 40, on_token=on_token)

            client_scope = []
            n.start_soon(gen)
            await stop.wait()
            t0 = trio.current_time()
            if how == "disconnects":
                await net.drop_client()
            with trio.fail_after(timeout * 4):
                while any(s.active for s in servers):
                    await trio.sleep(0.01)
            freed_after = trio.current_time() - t0
            await trio.sleep(0.05)
            client_scope[0].cancel()
            n.cancel_scope.cancel()
            return servers, freed_after

    servers, freed_after = run(main)
    assert freed_after < timeout * 2
    for s in servers:
        (st,) = s.settled
        assert st.reason == "vanished" and st.steps == 17 and st.acked == 17
        assert st.receipt.tokens == 17 and s.ledger.submitted == [st.receipt]
        st.receipt.check_signatures()
        assert s.reserved == 0


def test_no_replacement_raises_no_route_and_pays_what_was_received(tiny, tmp_path):
    from node.compute.shards import NoRouteError

    async def main():
        async with trio.open_nursery() as n:
            net, _servers, client = await _swarm(n, tiny, tmp_path)

            async def on_token(i, tok, route):
                if i == 5:
                    await net.kill(route[1][0])

            with pytest.raises(NoRouteError) as ei:
                await client.generate(PROMPT, 10, on_token=on_token)
            n.cancel_scope.cancel()
            return ei.value, client.ledger.submitted

    err, submitted = run(main)
    assert err.block == 2
    # every hop is paid for the outputs the client received: steps of tokens 1-5 on all three, the 6th step
    # on the first hop (it answered before the middle one failed)
    assert sorted(r.tokens for r in submitted) == [len(PROMPT) + 4, len(PROMPT) + 4, len(PROMPT) + 5]


def test_a_failing_forward_still_settles_the_acknowledged_steps(tiny, tmp_path):
    """The server's own failure (here: its span raises, as on out-of-memory) ends the session with an
    ``internal`` error, no penalty for the client, and a receipt for the steps already acknowledged."""
    async def main():
        async with trio.open_nursery() as n:
            net, _servers, client = await _swarm(n, tiny, tmp_path, per_span=2)
            broken = []

            async def on_token(i, tok, route):
                if i == 3:
                    srv = net.servers[route[2][0]]
                    broken.append(srv)

                    def boom(*a, **k):
                        raise RuntimeError("CUDA out of memory (simulated)")
                    srv.batcher.span = type("S", (), {"forward": boom, "fault": None})()

            gen = await client.generate(PROMPT, 8, on_token=on_token)
            await trio.sleep(0.05)
            n.cancel_scope.cancel()
            return gen, broken[0], net.penalties

    gen, srv, penalties = run(main)
    assert gen.tokens == local_generate(tiny, PROMPT, 8) and len(gen.failovers) == 1
    assert "internal" in gen.failovers[0].error
    (st,) = srv.settled
    assert st.reason == "error" and st.receipt.tokens == len(PROMPT) + 2 and st.acked == 3
    assert not penalties


@pytest.mark.parametrize("inline", [True, False], ids=["inline-acks", "server-without-inline-acks"])
def test_acknowledgements_ride_on_steps_where_the_server_offers_it(tiny, tmp_path, inline):
    """Without ``on_token`` a client sends no ``ack`` message to a server that offers ``inline_acks``: every
    countersignature rides on the next step or on ``close``, and both ends still hold the same receipt for every
    step. A server that does not offer it (as before the field existed) gets one ``ack`` message per step."""
    steps = 10

    async def main():
        async with trio.open_nursery() as n:
            _net, servers, client = await _swarm(n, tiny, tmp_path, inline_acks=inline)
            gen = await client.generate(PROMPT, steps)
            await trio.sleep(0.05)
            n.cancel_scope.cancel()
            return gen, servers

    gen, servers = run(main)
    assert gen.tokens == local_generate(tiny, PROMPT, steps)
    for r, s in zip(gen.receipts, servers, strict=False):
        (settled,) = s.settled
        assert settled.reason == "closed" and settled.acked == steps and settled.receipt == r
        r.check_signatures()
        if inline:  # steps 1..9 acknowledged by steps 2..10, step 10 by close
            assert (s.ack_messages, s.inline_acks_read) == (0, steps)
        else:
            assert (s.ack_messages, s.inline_acks_read) == (steps, 0)


def test_an_inline_ack_with_a_bad_countersignature_is_refused(tiny, tmp_path):
    """The ``ack`` field of a step is checked like an ``ack`` message: a forged countersignature is found by the
    eager check (every VERIFY_EVERY acks), the session ends in error, the sender is penalized for it, and the
    receipt the server keeps covers none of the forged acknowledgements."""
    from node.compute.shards import NoRouteError
    from node.inference.server import VERIFY_EVERY
    from node.p2p.scoring import BAD_SIGNATURE

    async def main():
        async with trio.open_nursery() as n:
            net, servers, client = await _swarm(n, tiny, tmp_path)
            ident = client.ident
            client.ident = type("Forger", (), {"sign": lambda self, m: bytes(64), "account": ident.account,
                                               "peer_id": ident.peer_id})()
            with pytest.raises(NoRouteError):  # every hop refuses it, and no other server holds those blocks
                await client.generate([7], VERIFY_EVERY + 4)
            await trio.sleep(0.05)
            n.cancel_scope.cancel()
            return servers, net.penalties, ident.peer_id

    servers, penalties, client_peer = run(main)
    first = servers[0].settled[0]
    assert first.reason == "error" and first.acked == 0 and first.receipt is None
    assert first.steps == VERIFY_EVERY  # step 33, carrying the ack of step 32, was refused before it ran
    assert (client_peer, BAD_SIGNATURE) in penalties and {p for p, _ in penalties} == {client_peer}


def test_a_changed_address_is_announced_at_once_not_a_period_later(tiny, tmp_path):
    """SpanServer.announce_loop: a relay reservation made mid-period reaches the swarm within ADDR_CHECK
    seconds; unchanged addresses are re-announced once per period (trio's MockClock: no real waiting)."""
    from trio.testing import MockClock

    from node.encoding import unpack
    from node.inference.server import ADDR_CHECK

    from .fakenet import make_server

    server = make_server(tiny, 1, (0, 2), tmp_path)
    sent: list[tuple[float, list[str]]] = []

    class Host:  # the two members announce_loop uses: addrs and publish
        addrs: ClassVar[list[str]] = ["/ip4/10.0.0.3/tcp/4001/p2p/S"]

        def topic(self, name):
            return name

        async def publish(self, topic, data):
            sent.append((trio.current_time(), unpack(data)["addrs"]))

    host = Host()

    async def main():
        async with trio.open_nursery() as n:
            n.start_soon(server.announce_loop, host, 30.0)
            await trio.sleep(65.2)  # announcements at 0, 30, 60 (and checks every ADDR_CHECK, off this instant)
            host.addrs = host.addrs + ["/ip4/10.0.0.9/tcp/4001/p2p/R/p2p-circuit/p2p/S"]
            await trio.sleep(10.0)
            n.cancel_scope.cancel()

    trio.run(main, clock=MockClock(autojump_threshold=0))
    times = [round(t, 3) for t, _ in sent]
    assert times[:3] == [0.0, 30.0, 60.0], times
    assert len(sent) == 4 and sent[3][1] == host.addrs, sent
    assert 65.2 < sent[3][0] <= 65.2 + ADDR_CHECK + 1e-6, sent
