"""Collaborative training runs, a capability: DiLoCo with receipts (docs/training-runs.md). Workers train H inner
steps from the run's parameters, commit and reveal pseudo-gradients; an aggregator applies the outer step;
committees replay sampled rounds and every aggregate.

* Pure parts: :mod:`~node.training.assign` (beacon-drawn batch assignment), :mod:`~node.training.codec`
  (pseudo-gradient codecs), :mod:`~node.training.outer` (the outer step), :mod:`~node.training.screen` (the loss
  screen).
* In torch: :mod:`~node.training.inner` (a worker's inner loop), :mod:`~node.training.rounds` (train, replay,
  aggregate one round).
* The node's part: :mod:`~node.training.worker` (the run worker, driven by blocks), :mod:`~node.training.replay`
  (:class:`~node.training.replay.RunChecks`, the committee checks); what they need of the node's executor, host
  and ledger are the roles of :mod:`node.duty.seams`.
  :mod:`~node.training.faults` -- the run worker's test switches. The worker and the checks import no torch at
  import: they import the torch modules where they train, replay or aggregate, so that building a node imports no
  torch.
* :mod:`~node.training.client` -- the sponsor's and a worker's side outside the node; :mod:`~node.training.cli` --
  ``node run``; :mod:`~node.training.api` -- its HTTP router (``/v1/runs``).
* :mod:`~node.training.capability` -- its record (:data:`node.capabilities.CAPABILITIES`): the run worker, the
  checks registered with the committee member, the router and the command.

The ledger's half is :mod:`node.ledger.core.runtx` and :mod:`node.ledger.core.runs` (with ``runrounds``,
``runreceipts``, ``runstate``).
"""
