"""What a session needs of settlement by tabs (issue 37), declared here so that the inference package imports no
other capability: the requester's tabs (:class:`RequesterTabs`, implemented by :class:`node.settle.tabs.TabBook`)
and the worker's gate at session open (:class:`WorkerTabs`, :class:`node.settle.tabs.TabGate`). The runtime hands
them in when the chain's genesis turns tabs on (``epoch_blocks``); otherwise a session is paid by its own receipt.

On the wire: a requester's ``open`` carries ``"tab": tab id`` (32 bytes) and ``"tab_height"``, the height at which
it saw the tab (a worker that lacks the tab waits until it holds that block, ten seconds at most, before it
refuses); the worker's reply carries
``"tab": [tab nonce, before]``, the nonce and the amount owed on the tab before this session
(:class:`node.inference.receipts.TabTerms`); both ends then build the session's tab receipt from them.
"""

from __future__ import annotations

from typing import Any, Protocol


class RequesterTabs(Protocol):
    """The requester's side (:class:`node.settle.tabs.TabBook`)."""

    async def acquire(self, worker: bytes, max_price: int) -> bytes:
        """The tab id to pay ``worker`` through for a session of at most ``max_price`` base units (held for it)."""
        ...

    def check_before(self, tab_id: bytes, before: int) -> bool:
        """Whether the worker's ``before`` is at most what this requester signed on the tab."""
        ...

    def release(self, worker: bytes, tab_id: bytes, cumulative: int | None) -> None:
        """The session ended; ``cumulative``: what its countersigned receipt says is owed (None: no receipt)."""
        ...


class WorkerTabs(Protocol):
    """The worker's side (:class:`node.settle.tabs.TabGate`)."""

    def open(self, requester: bytes, tab_id: bytes, max_price: int) -> tuple[int, int]:
        """``(tab nonce, before)`` of a session on ``tab_id``; raises ``ValueError`` with a ``code`` when refused."""
        ...

    def close(self, tab_id: bytes) -> None:
        """The session on ``tab_id`` ended and its receipt (if any) is kept."""
        ...


def tab_reply(value: Any) -> tuple[int, int] | None:
    """The worker's ``[tab nonce, before]`` from an ``opened`` reply, checked (None when malformed)."""
    if (isinstance(value, list) and len(value) == 2
            and all(isinstance(x, int) and not isinstance(x, bool) and 0 <= x < 2**63 for x in value)
            and value[0] >= 1):
        return int(value[0]), int(value[1])
    return None


__all__ = ["RequesterTabs", "WorkerTabs", "tab_reply"]
