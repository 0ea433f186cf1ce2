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


def chat_token_ids(tok: Any, messages: list[dict[str, str]]) -> list[int]:
    """Token ids of a chat (``[{"role", "content"}, ...]``) through the tokenizer ``tok``'s own chat template
    (rendered by transformers in Jinja2's sandbox), ending with the assistant's turn to speak.

    Raises:
        ValueError: ``tok`` is None or has no chat template (the caller passes ``prompt``), or the template
            refuses the chat (e.g. roles out of order).
    """
    if tok is None:
        raise ValueError("this model has no tokenizer; pass prompt_ids")
    if not getattr(tok, "chat_template", None):
        raise ValueError("this model has no chat template; pass prompt instead of messages")
    try:
        ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    except Exception as e:  # noqa: BLE001 - a template raises jinja2's and its own errors for a bad chat
        raise ValueError(f"the model's chat template refused this chat: {e}") from None
    if isinstance(ids, dict) or hasattr(ids, "keys"):  # BatchEncoding in newer transformers
        ids = ids["input_ids"]
    return [int(i) for i in ids]
