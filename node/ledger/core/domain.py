"""The signing domain: which network a signed object belongs to, its chain id bound to its genesis hash.

Every signed object (transactions of every kind, consensus proposals and votes, double-sign evidence, block
headers and their commits, receipts, snapshot manifests) hashes its network into its id or digest
(:func:`node.encoding.object_id`: ``H(msgpack [tag, domain, *fields])``). Until issue 24 that was the chain id
alone, so two networks reusing one (every ``tally-devnet``, a re-created testnet) accepted each other's transfers,
receipts and votes, evidence from one slashed on the other, and state sync trusted any header signed by the same
validator keys. The domain is now the string ``"<chain id>/<genesis hash, 64 hex digits>"``
(:attr:`node.ledger.core.genesis.Genesis.domain`): an object signed for one genesis has another id under any other
genesis, so its signatures do not verify there, and since the domain travels in the object (its ``chain_id``
field, the wire's ``"c"``) a node refuses it before any signature check with a message naming both genesis hashes
(:func:`mismatch`).

It is a plain string on purpose: every decoder (gossip, blocks, the stored records, the wallet's outbox, the
explorer) keeps reading objects without being told which network it serves, and the hot path hashes it exactly as
it hashed the chain id (one string field in the canonical array; no second pass over the fields). It costs 65 more
bytes per object on the wire.

Stores written before this change hold blocks signed for the bare chain id; they are refused at open
(:data:`STORE_VERSION`, :class:`node.ledger.store.LedgerStore`): a devnet restarts from its genesis.
"""

from __future__ import annotations

HASH_HEX = 64  # a genesis hash (32 bytes) in hex
MAX_CHAIN_ID = 64  # characters (node.ledger.core.genesis.parse_genesis)
MAX_DOMAIN = MAX_CHAIN_ID + 1 + HASH_HEX
STORE_VERSION = b"tally/domain/v2"  # written under the store key ``D``: blocks signed over the genesis-bound domain
_HEX = frozenset("0123456789abcdef")


def make(chain_id: str, genesis_hash: bytes) -> str:
    """The signing domain of the network with ``chain_id`` (1..64 characters) and the 32-byte ``genesis_hash``.

    Raises:
        ValueError: a chain id or hash of the wrong size.
    """
    if not 0 < len(chain_id) <= MAX_CHAIN_ID or len(genesis_hash) != HASH_HEX // 2:
        raise ValueError("a signing domain is a chain id of 1..64 characters and a 32-byte genesis hash")
    return f"{chain_id}/{genesis_hash.hex()}"


def is_domain(value: object) -> bool:
    """Whether ``value`` has the shape :func:`make` gives (a wire check: says nothing of which network)."""
    if not isinstance(value, str) or not HASH_HEX + 2 <= len(value) <= MAX_DOMAIN:
        return False
    return value[-HASH_HEX - 1] == "/" and _HEX.issuperset(value[-HASH_HEX:])


def split(domain: str) -> tuple[str, str]:
    """``(chain id, genesis hash hex)`` of a domain; ``(domain, "")`` for a value of another shape (an older
    version's bare chain id)."""
    if not is_domain(domain):
        return domain, ""
    return domain[:-HASH_HEX - 1], domain[-HASH_HEX:]


def mismatch(theirs: str, ours: str, what: str = "transaction") -> str:
    """The refusal message for a ``what`` signed for domain ``theirs`` reaching the network of domain ``ours``
    (they differ): names the other genesis when only the genesis differs."""
    chain, genesis = split(theirs)
    our_chain, our_genesis = split(ours)
    if not genesis:
        return (f"{what} for chain {chain[:80]!r} not bound to a genesis (signed by an older version); this is "
                f"chain {our_chain!r}, genesis {our_genesis[:16]}…")
    if chain == our_chain:
        return (f"{what} signed for another network (chain {chain!r}, genesis {genesis[:16]}…); this network's "
                f"genesis is {our_genesis[:16]}…")
    return f"{what} for chain {chain!r} (genesis {genesis[:16]}…), this is chain {our_chain!r}"
