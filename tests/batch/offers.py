"""Test helpers for batch opt-in (issue 24 finding 2): nodes drawn for batch items must have offered on the ledger."""

from __future__ import annotations

import trio

from node.ledger.core.batch import reputation


async def wait_offers(node, accounts, timeout: float = 120.0) -> None:
    """Until ``node``'s ledger holds a live batch offer of every account in ``accounts`` (each a
    ``node start --accept-batches`` node's ``ident.account``): a post is refused while fewer than k accounts offer."""
    with trio.fail_after(timeout):
        while not all(reputation(node.ledger.state, a).offer >= 0 for a in accounts):
            await node.ledger.new_block.wait()
