"""The ledger: Tendermint consensus, the state and its LevelDB store, block gossip, sync and proofs.

* :mod:`node.ledger.core` -- the pure core: transactions, blocks, the state transition, Tendermint as a state
  machine, the state tree, each capability's state machine. It imports only :mod:`node.encoding` and
  :mod:`node.keys` (an import contract in CI).
* :mod:`~node.ledger.service` -- the ledger at the edge: mempool, block production, gossip, sync;
  :mod:`~node.ledger.driver` -- runs the consensus machine over gossipsub; :mod:`~node.ledger.mempool`;
  :mod:`~node.ledger.outbox` -- the node's own pending transactions over a crash; :mod:`~node.ledger.txstatus`.
* Storage: :mod:`~node.ledger.store` (blocks and indexes), :mod:`~node.ledger.statedb` (the state in LevelDB),
  :mod:`~node.ledger.explorer_index`, :mod:`~node.ledger.leveldb_reads`.
* Snapshots and state sync: :mod:`~node.ledger.snapshot`, :mod:`~node.ledger.snapstore`,
  :mod:`~node.ledger.statesync`, :mod:`~node.ledger.syncfetch`.
* :mod:`~node.ledger.proofs` -- inclusion proofs and a light client; :mod:`~node.ledger.genesis` -- loading a
  genesis file; :mod:`~node.ledger.cli` -- ``node ledger``.
"""
