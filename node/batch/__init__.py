"""Batch jobs checked by majority vote (issue 14): the item file format, executing an item, the worker service and
the requester's side. The ledger half is :mod:`node.ledger.core.batch`."""
