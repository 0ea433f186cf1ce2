"""A client head built at its first use (:class:`LazyHead`), so that building a node imports no torch.

Every node's route client holds one. A node that never generates (``node start --lazy-head``, a validator) never
builds it, and so never imports torch or transformers (issue 35: ``node start`` to the first block in seconds).
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .head import ClientHead


class LazyHead:
    """The :class:`~node.compute.head.ClientHead` of ``model_dir``, built on first use of any attribute.

    Building a head imports torch and transformers (its config and norm classes: about 4 CPU-seconds, measured with
    ``python -X importtime``), so the node builds its own model's head on its executor while it starts
    (``NodeConfig.warm_head``, :meth:`Node._warm_head`); heads of other models it generates for are built at
    their first generation. The first use builds it once (thread-safe; it is first used on the executor thread
    or an API thread, never the event loop) and raises what ``ClientHead`` raises (``FileNotFoundError``,
    ``ValueError``) at that use."""

    def __init__(self, model_dir: Path, device: str = "cpu") -> None:
        self._args = (model_dir, device)
        self._head: ClientHead | None = None
        self._lock = threading.Lock()

    def built(self) -> ClientHead:
        """The ClientHead (built now if it is not yet)."""
        # local: node.compute.head imports torch (~2 s); a node that never generates never builds a head
        from .head import ClientHead

        with self._lock:
            if self._head is None:
                self._head = ClientHead(*self._args)
            return self._head

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):  # never build for private lookups (copy, pickle probes, repr internals)
            raise AttributeError(name)
        return getattr(self.built(), name)
