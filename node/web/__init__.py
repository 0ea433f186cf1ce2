"""What a capability's HTTP router builds on (issue 38, "one record per capability"): a layer below the
capabilities, beside :mod:`node.duty`, so that each capability package owns its router (``node.market.api``,
``node.training.api``, ``node.batch.api``, ``node.settle.api``) without importing :mod:`node.api`, which sits above
them and includes their routers in the app.

* :mod:`~node.web.deps` -- the router's node dependency: :class:`~node.web.deps.CapabilityNode` (what the
  capability routers use of a running :class:`node.runtime.Node`, a Protocol), ``NodeDep`` (hands an endpoint the
  node of the app it reached) and ``AUTH`` (the API token check, ``require_token``);
* :mod:`~node.web.errors` -- :class:`~node.web.errors.ApiError`, an error answered as JSON ``{"code", "message"}``;
* :mod:`~node.web.views` -- the pure JSON helpers: amounts, accounts, hex ids, and their parsing;
* :mod:`~node.web.models` -- the pydantic types the routers share with the wallet API (``AmountText``,
  ``ErrorOut``).
"""
