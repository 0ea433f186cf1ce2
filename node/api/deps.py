"""The API's typed seam to the node: :class:`NodeAPI` names what the app, the wallet routes, the explorer and
``/metrics`` use of a running :class:`node.runtime.Node`; ``NodeAPIDep`` hands it to their module-level routers.

:class:`NodeAPI` extends what the capabilities' routers use (:class:`node.web.deps.CapabilityNode`, and
:class:`node.batch.client.RequesterNode` for the batch routes), so the node :func:`node.api.app.create_app` puts in
``app.state.node`` is the node each of them expects (mypy checks a Node against it: :func:`node.runtime.api_view`).
An endpoint asks for it with ``node: NodeAPIDep`` (:func:`node.web.deps.get_node` reads it) and for the node's views
with ``queries: QueriesDep`` (:mod:`node.api.queries`, which this module does not import: the views are typed by
:class:`NodeAPI`). The routers therefore hold no node of their own: one router object serves every app built in a
process (the tests build several), each request reading the node of the app it reached. The token check is
:func:`node.web.deps.require_token` (``node.web.deps.AUTH``).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Protocol

from fastapi import Depends

from ..batch.client import RequesterNode
from ..duty.parts import Settings
from ..web.deps import get_node

if TYPE_CHECKING:  # types only
    from ..compute.budget import MemoryBudget
    from ..inference.client import Generation, RouteClient
    from ..inference.seams import Head
    from ..inference.server import SpanServer
    from ..inference.swarm import SwarmTable
    from ..ledger.service import LedgerService
    from ..net.service import NetworkService
    from ..p2p.budget import ReplyBudget
    from ..p2p.host import P2PHost
    from ..verify.member import CommitteeMember


class ModelSettings(Settings, Protocol):
    """What the API reads of the node's configuration (``node.cfg``, a :class:`node.config.NodeConfig`: above the
    API in the layers, hence this Protocol): the capabilities' settings (:class:`node.duty.parts.Settings`) and the
    node's models, span and memory budget."""

    @property
    def model_dir(self) -> Path: ...

    @property
    def model_cache(self) -> Path | None: ...  # other models' dirs (None: the parent of model_dir)

    @property
    def span(self) -> tuple[int, int] | str | None: ...  # the decoder blocks served ("auto" until resolved)

    @property
    def budget(self) -> MemoryBudget | None: ...  # node start --max-memory (None: no budget)


class NodeAPI(RequesterNode, Protocol):
    """What the API's routers use of :class:`node.runtime.Node`: the capability routers' node
    (:class:`~node.web.deps.CapabilityNode`: key, settings, genesis, manifest, ledger, store, host, blobs,
    executor, ``service(kind)``; :class:`~node.batch.client.RequesterNode`: ``decode``) and what the
    wallet, the explorer and ``/metrics`` read besides (read-only properties, so the node's plain attributes satisfy
    them; :func:`node.runtime.api_view` checks that a Node is one). A service the node runs without (``server``,
    ``member``; ``net`` in a test's node) is None; the routes that need it say so in their replies."""

    @property
    def api_token(self) -> str: ...

    @property
    def cfg(self) -> ModelSettings: ...

    @property
    def ledger(self) -> LedgerService: ...

    @property
    def swarm(self) -> SwarmTable: ...

    @property
    def server(self) -> SpanServer | None: ...  # sessions open now and served (status, swarm, /metrics)

    @property
    def member(self) -> CommitteeMember | None: ...  # ``memory_view`` (what committee duty holds of the budget)

    @property
    def net(self) -> NetworkService | None: ...  # ``status``, ``path_of(peer)`` (issue 25)

    @property
    def host(self) -> P2PHost: ...  # addresses, peers, gossip counts; handed to the capabilities' clients

    @property
    def reply_budget(self) -> ReplyBudget: ...  # bulk replies in flight and refused (/metrics)

    def client_for(self, model: str | None = None) -> RouteClient[Head]:
        """The route client of ``model`` (name or id; None: this node's model); ``manifest.vocab_size``.

        Raises:
            node.models.lookup.UnknownModel: the node holds no such model.
        """
        ...

    def encode_prompt(self, text: str, model: str | None = None) -> list[int]: ...

    def encode_chat(self, messages: list[dict[str, str]], model: str | None = None) -> list[int]: ...

    def decode(self, ids: list[int], model: str | None = None) -> str | None: ...

    async def generate(self, prompt_ids: list[int], max_new_tokens: int, model: str | None = None,
                       redundancy: int | None = None) -> Generation: ...


NodeAPIDep = Annotated[NodeAPI, Depends(get_node)]  # the node of the app a request reached, as the API uses it
