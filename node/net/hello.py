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
from typing import Any, Callable, Protocol

import trio

from ..p2p.framing import RemoteError

log = logging.getLogger(__name__)

HELLO_PROTOCOL = "/tally/hello/1.0.0"
AGENT = "tally/0.1.0"
WRONG_GENESIS = 1000.0  # penalty points: far past any disconnect threshold, so the peer is banned at once
REFUSE_S = 600.0  # seconds a peer of another genesis stays banned (its connections closed as they open); then
# its hello is checked again, so a peer that fixed its genesis file is back within ten minutes


class HelloHost(Protocol):
    """What :class:`Hello` needs of the host (:class:`node.p2p.host.P2PHost`)."""

    peer_id: str

    async def request(self, peer_id: str, protocol_id: str, msg: dict, timeout: float) -> dict: ...

    def penalize(self, peer_id: str, weight: float, ban_s: float | None = None) -> bool: ...

    def announced(self) -> list[str]: ...


class Hello:
    """Runs the handshake for one node.

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
        self._verified: set[str] = set()
        self._events: dict[str, trio.Event] = {}
        self.refused: dict[str, str] = {}  # peer -> its genesis hash (hex), for peers of another genesis
        self.observed: dict[str, str] = {}  # peer -> how it saw our connection, "/ip4/A/tcp/P"
        self.agents: dict[str, str] = {}

    def message(self) -> dict:
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
        ev = self._events.setdefault(peer, trio.Event())
        with trio.move_on_after(self.timeout if timeout is None else timeout):
            await ev.wait()
        return peer in self._verified

    def forget(self, peer: str) -> None:
        """Drop ``peer``'s verified state (its last connection closed)."""
        self._verified.discard(peer)
        self._events.pop(peer, None)

    def _check(self, peer: str, msg: dict) -> bool:
        chain, genesis = msg.get("chain_id"), msg.get("genesis")
        agent = msg.get("agent")
        if isinstance(agent, str):
            self.agents[peer] = agent[:64]
        if chain == self.chain_id and genesis == self.genesis_hash.hex():
            self._verified.add(peer)
            self._events.setdefault(peer, trio.Event()).set()
            addrs = msg.get("addrs")
            if self.on_verified is not None and isinstance(addrs, list):
                self.on_verified(peer, [a for a in addrs[:8] if isinstance(a, str) and len(a) < 256])
            return True
        theirs = genesis if isinstance(genesis, str) else repr(genesis)
        self.refused[peer] = theirs[:64]
        if len(self.refused) > 4096:
            self.refused.pop(next(iter(self.refused)))
        log.warning("refusing peer %s: it runs chain %r with genesis %s, this node runs chain %r with genesis %s",
                    peer, chain if isinstance(chain, str) else "?", theirs[:64], self.chain_id,
                    self.genesis_hash.hex())
        self.host.penalize(peer, WRONG_GENESIS, REFUSE_S)
        ev = self._events.get(peer)
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
        except Exception as e:  # unreachable, reset, timeout: the connection is gone or not a Tally node
            log.debug("hello to %s failed: %s: %s", peer, type(e).__name__, e)
            return False
        obs = reply.get("observed")
        if isinstance(obs, str) and len(obs) < 128:
            self.observed[peer] = obs
        return self._check(peer, reply)

    async def handle(self, msg: dict, remote: str, remote_addr: tuple[str, int] | None = None) -> dict:
        """Answer a hello. Raises :class:`RemoteError` ``wrong_genesis`` (message ending in our hash)."""
        if not self._check(remote, msg):
            raise RemoteError("wrong_genesis", f"this node runs chain {self.chain_id!r} with genesis "
                                               f"{self.genesis_hash.hex()}")
        reply: dict[str, Any] = self.message()
        if remote_addr:
            ip, port = remote_addr
            reply["observed"] = f"/ip{'6' if ':' in ip else '4'}/{ip}/tcp/{port}"
        return reply
