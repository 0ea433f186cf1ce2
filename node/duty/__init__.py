"""What the capabilities share, below all of them (issues 26 and 38): their record, the roles of the node's
services they receive, the loop that drives them by blocks, and what a committee check returns.

* :mod:`~node.duty.capability` -- :class:`~node.duty.capability.Capability`, one record per capability (its ledger
  modules, ``build(parts)`` -> :class:`~node.duty.capability.Built`: services, stream handlers, reachable parts and
  a close hook; its committee checkers, HTTP router, ``node`` sub-commands, settings and ``node start`` flags),
  listed in :data:`node.capabilities.CAPABILITIES`; :func:`~node.duty.capability.settings_of`.
* :mod:`~node.duty.parts` -- :class:`~node.duty.parts.NodeParts`, the node's services as one frozen, typed bundle
  (key, settings, ledger, host, blobs, executor, model id, reply budget) that a capability is built from;
  ``Settings`` (what the capabilities read of the node's base settings) and ``Service``.
* :mod:`~node.duty.seams` -- one Protocol per role, declared once: ``LedgerReader``, ``Submitter``, ``Ledger``,
  ``Executor``, ``Host``, ``Member``, ``ReceiptChecker``.
* :mod:`~node.duty.runner` -- :class:`~node.duty.runner.Duty` (a block-driven worker: ``name``,
  ``step(nursery)``), :class:`~node.duty.runner.DutyRunner` (the one loop: wake at each block or on request, step,
  log and back off on failure) and :class:`~node.duty.runner.DutyState`.
* :mod:`~node.duty.verdict` -- :class:`~node.duty.verdict.CheckResult`, a committee check's verdict and distance.
* :mod:`~node.duty.argtypes` -- the argparse types the capabilities' flags and ``node``'s commands share.

The package sits below the capabilities and :mod:`node.web`, above the ledger, in the layers contract
(``pyproject.toml``, ``docs/architecture.md``): every capability may use it, and it imports no capability.
"""
