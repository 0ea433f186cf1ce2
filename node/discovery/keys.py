"""Where a span record lives: the Kademlia key of (model, first block) (pure).

A server stores its record under the key of its span's *first* block only: the route planner
(:func:`node.compute.shards.choose_route`) enters spans at their start, so a client that needs blocks
``[a, b)`` asks for the keys of the positions it can reach, starting with ``a``, and never hears about other
models or spans (issue 39: a node's discovery cost does not grow with the swarm). One record per server per
model, however long its span.
"""

from __future__ import annotations

from ..encoding import H

KEY_TAG = b"tally/span-key/v1"


def span_key(model_id: bytes, block: int) -> bytes:
    """The 32-byte Kademlia key of the spans of ``model_id`` (32 bytes) starting at ``block`` (>= 0).

    Raises:
        ValueError: a model id that is not 32 bytes, or a negative block.
    """
    if len(model_id) != 32 or block < 0:
        raise ValueError("span_key needs a 32-byte model id and a block >= 0")
    return H(KEY_TAG, model_id, block.to_bytes(4, "big"))
