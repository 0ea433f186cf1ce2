"""The ledger's pure core: code that computes and imports nothing with I/O (no disk, network or clock).

Modules here receive their storage through typed seams (``typing.Protocol``) and return the writes for the
caller to commit, so the edges (``node/ledger/store.py``, the service, the driver) decide when and where bytes
reach disk. Today: :mod:`node.ledger.core.smt`, the sparse Merkle tree behind the state root.

This package re-exports nothing, so importing one core module never loads another.
"""
