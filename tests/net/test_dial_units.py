"""Address selection, happy-eyeballs racing, path memory and log routing (issue 25; pure units, real trio)."""

from __future__ import annotations

import ipaddress
import logging

import pytest
import trio
from trio.testing import MockClock

from node.net.dial import Kind, LocalView, classify, race, select
from node.net.paths import PathBook, PathKind, relay_of
from node.p2p import logs

R = "12D3KooWRelayRelayRelayRelayRelayRelayRelayRelayRel"
CIRCUIT = f"/ip4/203.0.113.9/tcp/4001/p2p/{R}/p2p-circuit"
HOME = LocalView(nets=(ipaddress.ip_network("192.168.1.0/24"), ipaddress.ip_network("127.0.0.0/8")))


def test_unreachable_addresses_are_never_candidates():
    assert classify("/ip4/0.0.0.0/tcp/4001", HOME, False) is None
    assert classify("/ip4/169.254.3.4/tcp/4001", HOME, False) is None
    assert classify("/ip6/fe80::1/tcp/4001", HOME, False) is None
    assert classify("/ip4/127.0.0.1/tcp/4001", HOME, False) is None  # we do not listen on loopback
    assert classify("/ip4/127.0.0.1/tcp/4001", LocalView(loopback=True), False) is Kind.SUBNET
    # a peer that announces a circuit says it is not reachable directly: its private addresses of another network
    # are dropped, those of a subnet we share are kept and tried first
    assert classify("/ip4/10.1.2.3/tcp/4001", HOME, True) is None
    assert classify("/ip4/192.168.1.7/tcp/4001", HOME, True) is Kind.SUBNET
    # a peer without a circuit may sit on a routed private network (a VPN, a test bridge)
    assert classify("/ip4/10.1.2.3/tcp/4001", HOME, False) is Kind.ROUTED
    # an address the kernel has no route to ("Network is unreachable") is dropped, even a public one
    noroute = LocalView(nets=HOME.nets, routable=lambda ip: not ip.startswith("198."))
    assert classify("/ip4/198.51.100.1/tcp/4001", noroute, False) is None
    assert classify("/ip4/8.8.8.8/tcp/4001", noroute, False) is Kind.PUBLIC
    assert classify("/dns4/example.org/tcp/4001", HOME, False) is Kind.PUBLIC


def test_select_orders_remembered_subnet_public_then_relay_and_keeps_a_relay_within_the_limit():
    addrs = ["/ip4/10.9.0.2/tcp/4001", CIRCUIT, "/ip4/8.8.8.8/tcp/4001", "/ip4/192.168.1.7/tcp/4001",
             "/ip4/0.0.0.0/tcp/4001"]
    assert select(addrs, HOME) == ["/ip4/192.168.1.7/tcp/4001", "/ip4/8.8.8.8/tcp/4001", CIRCUIT]
    assert select(addrs, HOME, remembered=CIRCUIT) == [CIRCUIT, "/ip4/192.168.1.7/tcp/4001",
                                                        "/ip4/8.8.8.8/tcp/4001"]
    assert select(addrs, HOME, limit=2) == ["/ip4/192.168.1.7/tcp/4001", CIRCUIT]
    # the case: a NAT'd server's interface addresses of another network are not dialled at all
    assert select(["/ip4/10.247.2.2/tcp/4001", CIRCUIT], HOME) == [CIRCUIT]
    assert select([], HOME) == []


async def _attempt_log(log: list, outcomes: dict[str, tuple[float, bool]], c: str) -> bool:
    log.append((c, trio.current_time()))
    delay, ok = outcomes[c]
    await trio.sleep(delay)
    return ok


def _run(fn) -> None:
    trio.run(fn, clock=MockClock(autojump_threshold=0))


def test_race_staggers_attempts_and_the_first_success_cancels_the_rest():
    _run(_staggers)


async def _staggers() -> None:
    started: list = []
    outcomes = {"slow-ok": (5.0, True), "fast-ok": (0.1, True), "never": (100.0, False)}
    t0 = trio.current_time()
    won = await race(["slow-ok", "fast-ok", "never"], lambda c: _attempt_log(started, outcomes, c), delay=0.25)
    assert won == "fast-ok"
    assert [c for c, _ in started] == ["slow-ok", "fast-ok"]  # "never" did not start: fast-ok won at 0.35 s
    assert started[1][1] - t0 == pytest.approx(0.25)  # RFC 8305 §5: the next attempt after the delay
    assert trio.current_time() - t0 == pytest.approx(0.35)  # the slow attempt was cancelled, not waited for


def test_race_starts_the_next_attempt_at_once_when_one_fails():
    _run(_next_at_once)


async def _next_at_once() -> None:
    started: list = []
    outcomes = {"refused": (0.01, False), "boom": (0.0, False), "ok": (0.05, True)}

    async def attempt(c: str) -> bool:
        if c == "boom":
            started.append((c, trio.current_time()))
            raise OSError("Network is unreachable")
        return await _attempt_log(started, outcomes, c)

    t0 = trio.current_time()
    assert await race(["refused", "boom", "ok"], attempt, delay=0.25) == "ok"
    assert [round(t - t0, 3) for _, t in started] == [0.0, 0.01, 0.01]
    assert await race(["refused"], attempt) is None
    assert await race([], attempt) is None


def test_path_book_remembers_what_worked_bounded_and_logs_changes_once(caplog):
    book = PathBook(max_peers=2)
    book.worked("a", "/ip4/1.1.1.1/tcp/1")
    book.worked("b", CIRCUIT)
    book.worked("c", "/ip4/3.3.3.3/tcp/1")
    assert book.remembered("a") is None and book.remembered("b") == CIRCUIT  # LRU: a evicted
    book.forget("b", "/ip4/9.9.9.9/tcp/1")
    assert book.remembered("b") == CIRCUIT
    book.forget("b", CIRCUIT)
    assert book.remembered("b") is None
    assert book.sample("p", 100.0) == 100.0 and book.sample("p", 0.0) == pytest.approx(70.0)
    with caplog.at_level(logging.INFO, logger="node.net.paths"):
        assert book.observe("p", PathKind.RELAYED, CIRCUIT)
        assert not book.observe("p", PathKind.RELAYED, CIRCUIT)
        assert book.observe("p", PathKind.DIRECT, "/ip4/3.3.3.3/tcp/4001")
    lines = [r.getMessage() for r in caplog.records if r.name == "node.net.paths"]
    assert lines == [f"peer p: relayed at {CIRCUIT}", "peer p: direct at /ip4/3.3.3.3/tcp/4001 (was relayed)"]
    assert relay_of(f"/p2p/{R}/p2p-circuit/p2p/12D3KooWx") == R
    assert relay_of("/ip4/1.2.3.4/tcp/1") is None


class _Keep(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.seen: list[tuple[str, str, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.seen.append((record.name, record.levelname, record.getMessage()))


def test_libp2p_records_of_normal_nat_behaviour_are_debug_and_other_errors_warnings():
    lg, root = logging.getLogger("libp2p"), logging.getLogger()
    saved = (list(lg.handlers), lg.propagate, lg.level, root.level)
    keep = _Keep()  # on the root logger, as a user's terminal handler is
    try:
        logs.install()
        for h in lg.handlers:  # handlers other tests' fixtures may have left on "libp2p" itself
            if not isinstance(h, logs._Route):
                lg.removeHandler(h)
        root.addHandler(keep)
        root.setLevel(logging.DEBUG)
        logging.getLogger("libp2p.transport.tcp.tcp").error("Failed to open TCP stream: %s",
                                                             OSError(101, "Network is unreachable"))
        logging.getLogger("libp2p.relay.circuit_v2.dcutr").warning(
            "Failed to establish direct connection with %s", "12D3KooWx")
        logging.getLogger("libp2p.relay.circuit_v2.protocol").error("Unexpected error reading from stream: %s", "")
        logging.getLogger("libp2p.something").error("the peerstore is on fire")
        logging.getLogger("libp2p.something").warning("lost the key: %s", "")
        logging.getLogger("libp2p.network.auto_connector").info("chatter")
    finally:
        root.removeHandler(keep)
        for h in saved[0]:
            if h not in lg.handlers:
                lg.addHandler(h)
        lg.propagate = saved[1]
        lg.setLevel(saved[2])
        root.setLevel(saved[3])
    shown = [(lvl, msg) for name, lvl, msg in keep.seen if name.startswith("libp2p")]
    assert shown == [("WARNING", "the peerstore is on fire"),
                     ("WARNING", "lost the key: (py-libp2p gave no reason)")], shown


def test_reason_never_leaves_the_reason_empty():
    assert logs.reason(trio.TooSlowError()) == "TooSlowError: no answer within the deadline"
    assert logs.reason(OSError(101, "Network is unreachable")) == "OSError: [Errno 101] Network is unreachable"
    assert logs.reason(KeyError()).startswith("KeyError: ")
    assert logs.reason(KeyError()) != "KeyError: "
