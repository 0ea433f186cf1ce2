"""The ledger's pure core: code that computes and imports nothing with I/O (no disk, network or clock).

Modules here receive their storage through typed seams (``typing.Protocol``) and return the writes for the
caller to commit, so the edges (``node/ledger/store.py``, the service, the driver) decide when and where bytes
reach disk.

A map, from the bottom up:

* leaves: :mod:`~node.ledger.core.domain` (signing domains), :mod:`~node.ledger.core.sampling`,
  :mod:`~node.ledger.core.status` (``ReceiptStatus``), :mod:`~node.ledger.core.kv` (tables over a key-value
  seam), the state root: :mod:`~node.ledger.core.smt` (the binary sparse Merkle tree whose hashes and proofs
  define it), :mod:`~node.ledger.core.jmt` and :mod:`~node.ledger.core.jmtnode` (the same tree stored 16-ary,
  Jellyfish-style: updates, proofs, node bytes, the decoded-node cache), :mod:`~node.ledger.core.tree` (the
  ledger's entries as the tree's leaves), :mod:`~node.ledger.core.consensus` (Tendermint as a pure machine).
* transactions: :mod:`~node.ledger.core.txbase` (``Tx``, ``Verdict``, the core modules' kinds: transfers, bonds,
  unbonds, inference receipts, votes, evidence); :mod:`~node.ledger.core.valset` (validator sets) and
  :mod:`~node.ledger.core.genesis` (parameters); :mod:`~node.ledger.core.committee` (drawing a committee,
  tallying its votes into a ``Verdict``).
* the seams a capability is written against: :mod:`~node.ledger.core.rows` (``Account``, ``ReceiptRecord``),
  :mod:`~node.ledger.core.view` (``StateView``, the narrow state), :mod:`~node.ledger.core.module`
  (``LedgerModule``, ``ReceiptKind``, ``Module``).
* the modules: the bank (:mod:`~node.ledger.core.bank`: transfers, bonds, unbonds), the receipts
  (:mod:`~node.ledger.core.receipts`: inference receipts, votes, and every receipt's sampling and settlement),
  then the extensions: fine-tune jobs (:mod:`~node.ledger.core.jobtx`, :mod:`~node.ledger.core.jobstate`,
  :mod:`~node.ledger.core.jobs`),
  training runs (:mod:`~node.ledger.core.runtx`, :mod:`~node.ledger.core.runstate`, :mod:`~node.ledger.core.runs`),
  batch jobs (:mod:`~node.ledger.core.batchtx`, :mod:`~node.ledger.core.batchstate`,
  :mod:`~node.ledger.core.batchaudit`, :mod:`~node.ledger.core.batch`), the receipt history
  (:mod:`~node.ledger.core.history`), the validator set's changes and evidence (:mod:`~node.ledger.core.staking`),
  disputes (:mod:`~node.ledger.core.disputes`, a package). Each owns its tables; its records' module gives
  their typed accessors (``jobstate.jobs_of``/``open_jobs``, ``runstate.runs_of``/``open_runs``,
  ``batchstate.open_batches``, ``staking.evidence_of``): the state names only the core's.
* the registry: :mod:`~node.ledger.core.modules` (``MODULES``: the transaction registry, the dispatch and the
  end-block order), :mod:`~node.ledger.core.tx` (``TX_KINDS``, ``decode_tx``), :mod:`~node.ledger.core.records`
  (every table's codec, in snapshot order).
* the state and blocks: :mod:`~node.ledger.core.state` (``State``, ``apply_tx``: what every transaction shares,
  then its module; ``end_block``: each module's, in order), :mod:`~node.ledger.core.block`,
  :mod:`~node.ledger.core.chain`, :mod:`~node.ledger.core.liveness`, :mod:`~node.ledger.core.capture`,
  :mod:`~node.ledger.core.blockcodec`.

This package re-exports nothing, so importing one core module never loads another.
"""
