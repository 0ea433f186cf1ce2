"""Fine-tune jobs, the marketplace capability: a requester posts a LoRA job with its dataset and escrow, a bonded
worker trains it segment by segment with a training receipt per segment, committees replay sampled segments.

* :mod:`~node.market.worker` -- the worker: fetch and check the dataset, accept, train, deliver;
  :mod:`~node.market.client` -- the requester's side; :mod:`~node.market.cli` -- ``node job``.
* :mod:`~node.market.check` -- :class:`~node.market.check.TrainingCheck`, the committee's replay of a segment.
* :mod:`~node.market.api` -- its HTTP router (``/v1/jobs``); :mod:`~node.market.settings` -- its part of the
  node's settings (``--accept-jobs``, ``--job-capacity``).
* :mod:`~node.market.capability` -- its record (:data:`node.capabilities.CAPABILITIES`): the worker, the check
  registered with the committee member, the router, the command and the flags.

The ledger's half is :mod:`node.ledger.core.jobtx`, :mod:`node.ledger.core.jobstate` (the records and their
accessors) and :mod:`node.ledger.core.jobs`.
"""
