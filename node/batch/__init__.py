"""Batch jobs checked by majority vote (issue 14; docs/batch.md), a capability: a requester posts an item file with
escrow, the ledger draws workers per item, their committed results decide it.

* :mod:`~node.batch.items` -- the JSONL item file, its ``items_root``, the content store;
  :mod:`~node.batch.tasks` -- executing one item and the canonical bytes of its result.
* :mod:`~node.batch.worker` -- the worker service every bonded node runs; :mod:`~node.batch.content` -- item
  files and results served and fetched by hash, and who may read them; :mod:`~node.batch.offer` -- keeping this
  node's offer on the ledger.
* :mod:`~node.batch.client` -- the requester's side; :mod:`~node.batch.cli` -- ``node batch``.
* :mod:`~node.batch.api` -- its HTTP router (``/v1/batches``); :mod:`~node.batch.settings` -- its part of the
  node's settings (``--accept-batches``, ``--batch-floor``).
* :mod:`~node.batch.capability` -- its record (:data:`node.capabilities.CAPABILITIES`): the worker, the offer
  keeper, the content protocol's handler and store, the router, the command and the flags.

The ledger's half is :mod:`node.ledger.core.batch` (with ``batchtx``, ``batchstate``, ``batchrules``,
``batchapply``, ``batchaudit`` and ``batchparams``).
"""
