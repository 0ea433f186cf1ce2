"""The genesis handshake: peers of another chain or genesis are refused at connection time.

On every new connection each side sends ``/tally/hello/1.0.0`` with its chain id and genesis hash
(:attr:`node.ledger.genesis.Genesis.hash`); the other answers with its own and with the address it sees the
connection coming from (how others see this node: :mod:`node.net.reachability` uses it). A mismatch on either
side logs one WARNING naming both chains and both hashes, bans the peer (:mod:`node.p2p.scoring`) and closes
the connection. Tally's own protocols wait for the handshake (:meth:`Hello.wait_verified`) before serving a
peer, and gossip topics carry the genesis hash, so blocks of another genesis never reach this node's ledger.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Protocol

import trio

from ..p2p.framing import RemoteError

log = logging.getLogger(__name__)

HELLO_PROTOCOL = "/tally/hello/1.0.0"
AGENT = "tally/0.1.0"
WRONG_GENESIS = 1000.0  # penalty points: far past any disconnect threshold, so the peer is banned at once
MAX_TRACKED = 4096  # peers whose agent, observed address, refusal or pending handshake is kept (LRU beyond)
MAX_OBSERVED = 256  # observed addresses kept (the most recent): reachability needs a handful
REFUSE_S = 600.0  # seconds a peer of another genesis stays banned (its connections closed as they open); then
# its hello is checked again, so a peer that fixed its genesis file is back within ten minutes


class HelloHost(Protocol):
    """What :class:`Hello` needs of the host (:class:`node.p2p.host.P2PHost`)."""

    @property
    def peer_id(self) -> str: ...

    async def request(self, peer_id: str, protocol_id: str, msg: dict[str, Any], timeout: float) -> dict[str, Any]: ...

    def penalize(self, peer_id: str, weight: float, ban_s: float | None = None) -> bool: ...

    def announced(self) -> list[str]: ...


def _put(table: OrderedDict[str, Any], key: str, value: Any, limit: int) -> None:
    """``table[key] = value`` as the most recent entry; the oldest are dropped beyond ``limit``."""
    table.pop(key, None)
    table[key] = value
    while len(table) > limit:
        table.popitem(last=False)


class Hello:
    """Runs the handshake for one node.

    Per-peer state is bounded whatever the number of identities seen: verified peers are forgotten when their
    last connection closes (:meth:`forget`), and the agent, observed-address, refusal and pending-handshake tables
    keep the :data:`MAX_TRACKED` (observed: :data:`MAX_OBSERVED`) most recent peers.

    Args:
        chain_id: this node's chain id.
        genesis_hash: this node's genesis hash (32 bytes).
        host: the :class:`HelloHost`.
        timeout: seconds allowed for one handshake.
        on_verified: ``fn(peer, addrs)`` once per verified hello, with the addresses the peer announces.
    """

    def __init__(self, chain_id: str, genesis_hash: bytes, host: HelloHost, timeout: float = 10.0,
                 on_verified: Callable[[str, list[str]], None] | None = None):
        self.chain_id, self.genesis_hash, self.host, self.timeout = chain_id, genesis_hash, host, timeout
        self.on_verified = on_verified  # fn(peer, the addresses it announced)
        self._verified: OrderedDict[str, None] = OrderedDict()  # bounded like the rest: a peer verified as it
        # disconnected is never forgotten by forget()
        self._events: OrderedDict[str, trio.Event] = OrderedDict()
        self.refused: OrderedDict[str, str] = OrderedDict()  # peer -> its genesis hash (hex), another genesis
        self.observed: OrderedDict[str, str] = OrderedDict()  # peer -> how it saw our connection, "/ip4/A/tcp/P"
        self.agents: OrderedDict[str, str] = OrderedDict()

    def message(self) -> dict[str, Any]:
        """This node's hello (also its reply, plus ``observed``)."""
        return {"chain_id": self.chain_id, "genesis": self.genesis_hash.hex(), "agent": AGENT,
                "addrs": self.host.announced()}

    def verified(self, peer: str) -> bool:
        """Whether ``peer`` has shown this node's chain id and genesis hash."""
        return peer in self._verified

    async def wait_verified(self, peer: str, timeout: float | None = None) -> bool:
        """Wait until ``peer``'s handshake is done (either direction). False on mismatch or timeout."""
        if peer in self._verified:
            return True
        if peer in self.refused:
            return False
        ev = self._event(peer)
        with trio.move_on_after(self.timeout if timeout is None else timeout):
            await ev.wait()
        return peer in self._verified

    def _event(self, peer: str) -> trio.Event:
        ev = self._events.get(peer)
        if ev is None:
            ev = trio.Event()
            _put(self._events, peer, ev, MAX_TRACKED)  # a dropped event's waiters time out as if unanswered
        return ev

    def forget(self, peer: str) -> None:
        """Drop ``peer``'s verified state (its last connection closed)."""
        self._verified.pop(peer, None)
        self._events.pop(peer, None)

    def _check(self, peer: str, msg: dict[str, Any]) -> bool:
        chain, genesis = msg.get("chain_id"), msg.get("genesis")
        agent = msg.get("agent")
        if isinstance(agent, str):
            _put(self.agents, peer, agent[:64], MAX_TRACKED)
        if chain == self.chain_id and genesis == self.genesis_hash.hex():
            _put(self._verified, peer, None, MAX_TRACKED)
            self._events.pop(peer, trio.Event()).set()  # wakes the waiters; verified peers need no event
            addrs = msg.get("addrs")
            if self.on_verified is not None and isinstance(addrs, list):
                self.on_verified(peer, [a for a in addrs[:8] if isinstance(a, str) and len(a) < 256])
            return True
        theirs = genesis if isinstance(genesis, str) else repr(genesis)
        _put(self.refused, peer, theirs[:64], MAX_TRACKED)
        log.warning("refusing peer %s: it runs chain %r with genesis %s, this node runs chain %r with genesis %s",
                    peer, chain if isinstance(chain, str) else "?", theirs[:64], self.chain_id,
                    self.genesis_hash.hex())
        self.host.penalize(peer, WRONG_GENESIS, REFUSE_S)
        ev = self._events.pop(peer, None)
        if ev is not None:
            ev.set()
        return False

    async def greet(self, peer: str) -> bool:
        """Send our hello to ``peer`` and check its reply. Returns whether the peer is of our genesis; a peer
        that does not answer stays unverified (its streams wait, then are refused)."""
        if peer in self._verified:
            return True
        try:
            reply = await self.host.request(peer, HELLO_PROTOCOL, self.message(), timeout=self.timeout)
        except RemoteError as e:
            if e.code == "wrong_genesis":
                return self._check(peer, {"chain_id": None, "genesis": e.message.rsplit(" ", 1)[-1]})
            log.debug("hello to %s: %s", peer, e)
            return False
        except Exception as e:  # noqa: BLE001 - unreachable, reset, timeout: the connection is gone or not a Tally node
            log.debug("hello to %s failed: %s: %s", peer, type(e).__name__, e)
            return False
        obs = reply.get("observed")
        if isinstance(obs, str) and len(obs) < 128:
            _put(self.observed, peer, obs, MAX_OBSERVED)
        return self._check(peer, reply)

    async def handle(self, msg: dict[str, Any], remote: str,
                     remote_addr: tuple[str, int] | None = None) -> dict[str, Any]:
        """Answer a hello. Raises :class:`RemoteError` ``wrong_genesis`` (message ending in our hash)."""
        if not self._check(remote, msg):
            raise RemoteError("wrong_genesis", f"this node runs chain {self.chain_id!r} with genesis "
                                               f"{self.genesis_hash.hex()}")
        reply: dict[str, Any] = self.message()
        if remote_addr:
            ip, port = remote_addr
            reply["observed"] = f"/ip{'6' if ':' in ip else '4'}/{ip}/tcp/{port}"
        return reply
