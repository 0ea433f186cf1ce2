"""The capability routers' node dependency: :class:`CapabilityNode` names what they use of a running
:class:`node.runtime.Node`, ``NodeDep`` hands it to an endpoint and ``AUTH`` checks the API token.

:func:`node.api.app.create_app` puts the node in ``app.state.node``; an endpoint asks for it with ``node: NodeDep``.
The routers therefore hold no node of their own: one router object serves every app built in a process (the tests
build several), each request reading the node of the app it reached. ``create_app`` takes a
:class:`node.api.deps.NodeAPI`, which extends :class:`CapabilityNode` and each capability router's own narrower
need (``node.batch.client.RequesterNode``), so the node an endpoint receives is one of them.

A capability's running part (its worker or book: ``JobWorker``, ``TabBook``, ``EpochBook``, ...) is reached with
``node.service(kind)``, typed by the kind the router names, without this layer naming any capability.
"""

from __future__ import annotations

import hmac
from typing import TYPE_CHECKING, Annotated, Protocol, TypeVar

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from .errors import ApiError

if TYPE_CHECKING:  # types only
    from ..blobs import BlobStore
    from ..compute.model import Manifest
    from ..duty.parts import Settings
    from ..duty.seams import Executor, Host, Ledger
    from ..keys import Identity
    from ..ledger.core.genesis import Genesis
    from ..ledger.store import LedgerStore

T = TypeVar("T")


class CapabilityNode(Protocol):
    """What the capability routers use of :class:`node.runtime.Node` (read-only properties, so the node's plain
    attributes satisfy them): its key, settings, genesis, model manifest, ledger service and store, libp2p host, blob
    store and torch executor, and its running parts by type. The capabilities' clients take it too
    (``node.market.client.post_job``, ``node.training.client.post_run``, ...; ``node.batch.client.RequesterNode``
    extends it by the model's tokenizer, and reaches the batch content store as ``service(ContentStore)``)."""

    @property
    def cfg(self) -> Settings: ...  # the node's settings (the clients read ``model_dir``)

    @property
    def ident(self) -> Identity: ...

    @property
    def genesis(self) -> Genesis: ...

    @property
    def manifest(self) -> Manifest: ...

    @property
    def ledger(self) -> Ledger: ...  # state, nonces, submit (node.ledger.service.LedgerService)

    @property
    def store(self) -> LedgerStore: ...  # archived receipts, settled batches' blocks

    @property
    def host(self) -> Host: ...  # requests to peers (node.p2p.host.P2PHost), handed to the clients

    @property
    def blobs(self) -> BlobStore: ...

    @property
    def executor(self) -> Executor: ...  # the torch thread (node.training.client computes θ_0 there)

    def service(self, kind: type[T]) -> T | None:
        """This node's running part of type ``kind`` (a capability's worker or book), or None when it runs none
        (:meth:`node.runtime.Node.service`)."""
        ...


async def get_node(request: Request) -> CapabilityNode:
    """The node of the app that ``request`` reached (``app.state.node``, a :class:`node.api.deps.NodeAPI` set by
    :func:`node.api.app.create_app`). A coroutine, so FastAPI calls it on the event loop rather than in its thread
    pool."""
    node: CapabilityNode = request.app.state.node
    return node


NodeDep = Annotated[CapabilityNode, Depends(get_node)]

BEARER = HTTPBearer(auto_error=False, scheme_name="api_token",
                    description="the node's API token: the contents of <data-dir>/api_token")


def require_token(request: Request, creds: HTTPAuthorizationCredentials | None = Depends(BEARER)) -> None:
    """A FastAPI dependency (an HTTP bearer security scheme in the OpenAPI schema) that lets a request through only
    if it carries ``Authorization: Bearer <token>`` with the token of the app's node (``app.state.node.api_token``,
    compared in constant time).

    Raises:
        ApiError: 401 ``unauthorized`` (no token, or another one).
    """
    want: bytes = request.app.state.node.api_token.encode()
    token = creds.credentials.strip() if creds is not None else ""
    if not hmac.compare_digest(token.encode("utf-8", "replace"), want):
        raise ApiError(401, "unauthorized", "missing or wrong API token (Authorization: Bearer "
                                            "$(cat <data-dir>/api_token))")


AUTH = [Depends(require_token)]  # ``dependencies=AUTH``: the route needs the API token (401 without it)

__all__ = ["AUTH", "BEARER", "CapabilityNode", "NodeDep", "get_node", "require_token"]
