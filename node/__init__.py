"""Tally: a peer-to-peer network of nodes that serve transformer spans, with receipts, committees, Tendermint
consensus and a LevelDB ledger (DESIGN.md).

The packages and the layers they form (top to bottom; a layer imports only the layers below it; checked by
``lint-imports``, see docs/architecture.md):

* :mod:`node.cli` -- the ``node`` command.
* :mod:`node.runtime` (one node, composed and run), :mod:`node.devnet` (the demo swarm),
  :mod:`node.genesis_cli` (``node genesis``, ``node key``), :mod:`node.peers_cli` (``node peers``, ``node status``).
* :mod:`node.api` (the HTTP API and the explorer), :mod:`node.cliargs` (``--model``/``--gpu`` resolution).
* Capabilities, which never import each other: :mod:`node.inference` (serving and using spans),
  :mod:`node.verify` (committee re-execution), :mod:`node.market` (fine-tune jobs), :mod:`node.training`
  (collaborative training runs), :mod:`node.batch` (batch jobs by majority vote).
* :mod:`node.duty` (what the capabilities share: the one runner of block-driven duties, and the node's parts as one
  typed bundle of Protocols).
* :mod:`node.ledger` (consensus, state and its store; its pure core is :mod:`node.ledger.core`), :mod:`node.blobs`
  (content-addressed session tensors), :mod:`node.models` (the model cache: ``node model``).
* :mod:`node.net` and :mod:`node.p2p` (networking: the libp2p host, framing, gossip, limits, handshake, discovery,
  reachability, relays).
* :mod:`node.compute` (the model format and running it in torch), :mod:`node.localapi` and :mod:`node.wallet`
  (clients of a local node's HTTP API).
* :mod:`node.identity` (the key file), :mod:`node.lockfile` (data-dir locks).
* :mod:`node.encoding` (canonical encoding, hashes, commitments), :mod:`node.keys` (Ed25519 without I/O).
"""
