"""The API's typed seam to the node: :class:`NodeAPI` names what the routers use of a running
:class:`node.runtime.Node`, and a FastAPI dependency hands it to the module-level routers.

:func:`node.api.app.create_app` puts the node in ``app.state.node`` and its views in ``app.state.queries``; an
endpoint asks for them with ``node: NodeDep`` and ``queries: QueriesDep`` (:mod:`node.api.queries`, which this
module does not import: the views are typed by :class:`NodeAPI`). The routers therefore hold no node of
their own: one router object serves every app built in a process (the tests build several), each request reading
the node of the app it reached. The token check is :func:`node.api.security.require_token` (``AUTH``).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Protocol

from fastapi import Depends, Request

from .security import require_token

if TYPE_CHECKING:  # types only: the API sits above all of these (see the layers contract in pyproject.toml)
    from ..batch.items import ContentStore
    from ..batch.worker import BatchWorker
    from ..blobs import BlobStore
    from ..compute.budget import MemoryBudget
    from ..compute.model import Manifest
    from ..inference.client import Generation, RouteClient
    from ..inference.seams import Head
    from ..inference.server import SpanServer
    from ..inference.swarm import SwarmTable
    from ..keys import Identity
    from ..ledger.core.genesis import Genesis
    from ..ledger.service import LedgerService
    from ..ledger.store import LedgerStore
    from ..market.worker import JobWorker
    from ..net.service import NetworkService
    from ..p2p.budget import ReplyBudget
    from ..p2p.host import P2PHost
    from ..settle.book import EpochBook
    from ..settle.tabs import TabBook
    from ..training.seams import Executor
    from ..verify.member import CommitteeMember


class ModelSettings(Protocol):
    """What the API reads of the node's configuration (``node.cfg``, a :class:`node.runtime.NodeConfig`: above the
    API in the layers, hence this Protocol)."""

    @property
    def model_dir(self) -> Path: ...

    @property
    def model_cache(self) -> Path | None: ...  # other models' dirs (None: the parent of model_dir)

    @property
    def span(self) -> tuple[int, int] | str | None: ...  # the decoder blocks served ("auto" until resolved)

    @property
    def budget(self) -> MemoryBudget | None: ...  # node start --max-memory (None: no budget)


class NodeAPI(Protocol):
    """What the API's routers use of :class:`node.runtime.Node` (read-only properties, so the node's plain
    attributes satisfy them; :func:`node.runtime.api_view` checks that a Node is one). A service the node runs
    without (``server``, ``jobs``, ``batches``, ``member``, ``tab_book``, ``book``; ``net`` in a test's node) is
    None; the routes that need it say so in their replies."""

    @property
    def api_token(self) -> str: ...

    @property
    def cfg(self) -> ModelSettings: ...

    @property
    def ident(self) -> Identity: ...

    @property
    def genesis(self) -> Genesis: ...

    @property
    def manifest(self) -> Manifest: ...

    @property
    def ledger(self) -> LedgerService: ...

    @property
    def store(self) -> LedgerStore: ...

    @property
    def swarm(self) -> SwarmTable: ...

    @property
    def server(self) -> SpanServer | None: ...  # sessions open now and served (status, swarm, /metrics)

    @property
    def jobs(self) -> JobWorker | None: ...  # ``progress`` (a job's local losses), ``release``

    @property
    def batches(self) -> BatchWorker | None: ...  # ``done`` (results computed here)

    @property
    def member(self) -> CommitteeMember | None: ...  # ``memory_view`` (what committee duty holds of the budget)

    @property
    def net(self) -> NetworkService | None: ...  # ``status``, ``path_of(peer)`` (issue 25)

    @property
    def host(self) -> P2PHost: ...  # addresses, peers, gossip counts; handed to the capabilities' clients

    @property
    def reply_budget(self) -> ReplyBudget: ...  # bulk replies in flight and refused (/metrics)

    @property
    def tab_book(self) -> TabBook | None: ...  # what this node signed on its tabs as a requester (issue 37)

    @property
    def book(self) -> EpochBook | None: ...  # the tab receipts this node holds as a worker (issue 37)

    @property
    def blobs(self) -> BlobStore: ...

    @property
    def batch_store(self) -> ContentStore: ...  # a batch's item files and results (node.batch.client)

    @property
    def executor(self) -> Executor: ...  # the torch thread (node.training.client computes θ_0 there)

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


async def get_node(request: Request) -> NodeAPI:
    """The node of the app that ``request`` reached (``app.state.node``). A coroutine, so FastAPI calls it on the
    event loop rather than in its thread pool."""
    node: NodeAPI = request.app.state.node
    return node


NodeDep = Annotated[NodeAPI, Depends(get_node)]
AUTH = [Depends(require_token)]  # ``dependencies=AUTH``: the route needs the API token (401 without it)
