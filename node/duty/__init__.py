"""Block-driven duties (issue 26): what the capabilities share about being driven by the ledger's blocks.

* :mod:`~node.duty.runner` -- :class:`~node.duty.runner.Duty` (the Protocol a capability's block-driven worker
  implements: ``name``, ``step(nursery)``), :class:`~node.duty.runner.DutyRunner` (the one loop: wake at each
  block or on request, step, log and back off on failure) and :class:`~node.duty.runner.DutyState`.
* :mod:`~node.duty.parts` -- :class:`~node.duty.parts.NodeParts`, the node's services as one typed bundle (key,
  settings, ledger, host, blobs, executor, model id) that each capability is built from (``from_parts``), its
  fields typed with narrow Protocols (``Ledger``, ``Host``, ``Executor``, ``Settings``), and ``Service``.

The package sits between the capabilities (``batch``, ``market``, ``training``, ...) and the ledger in the layers
contract (``pyproject.toml``): every capability may use it, and it imports no capability.
"""
