"""The node's HTTP surface (FastAPI, served by hypercorn on the node's trio loop): the wallet/credits JSON API under
``/v1``, each capability's endpoints, the block explorer and ``/metrics``.

* :mod:`~node.api.app` -- ``create_app(node)``: the app, its error handlers and its routers;
  :mod:`~node.api.serve` -- serving it inside the node's nursery.
* :mod:`~node.api.deps` -- the typed seam: ``NodeAPI`` (what the app, the wallet routes, the explorer and
  ``/metrics`` use of the node, a Protocol extending the capability routers' ``node.web.deps.CapabilityNode``) and
  ``NodeAPIDep``, the FastAPI dependency that hands it to endpoints (``create_app`` puts the node in ``app.state``);
  ``QueriesDep`` (:mod:`~node.api.queries`) hands them the node's views. The token check (``AUTH``), ``ApiError``
  and the JSON helpers the capabilities' routers share with this package are in :mod:`node.web`, below them.
* Routers, each a module-level ``router``: :mod:`~node.api.wallet` (accounts, transfers, bonds, proofs, generate),
  :mod:`~node.api.modelsapi` (``/v1/models``); and each capability's own, which ``create_app`` includes:
  :mod:`node.market.api` (fine-tune jobs), :mod:`node.training.api` (training runs), :mod:`node.batch.api` (batch
  jobs), :mod:`node.settle.api` (tabs and settlements).
* The explorer: :mod:`~node.api.pages` (server-rendered pages, ``templates/``, ``static/``),
  :mod:`~node.api.charts` (SVG chart geometry).
* The read side: :mod:`~node.api.queries` (everything a page or route shows), :mod:`~node.api.views` (JSON views
  of ledger objects), :mod:`~node.api.cache` (a response cache for the hottest reads).
* :mod:`~node.api.models` (reads, shared types) and :mod:`~node.api.postmodels` (transfers, bonds, generate):
  request and response models, the OpenAPI schema; :mod:`~node.api.receiptview` -- typed views of the receipt kinds.
* :mod:`~node.api.security` -- loopback Host, same-origin, the API token, response headers;
  :mod:`~node.api.metrics` -- Prometheus text.
"""
