"""Inference, the capability every node runs: serving a span of a model to clients, generating through a route of
servers, and the running receipts both ends sign after every step (DESIGN.md, Receipts).

* :mod:`~node.inference.server` -- the span server: the session protocol, receipts, announcements;
  :mod:`~node.inference.batching` -- concurrent sessions' decoding steps as one forward.
* :mod:`~node.inference.swarm` -- the swarm table (span announcements heard, round trips measured);
  :mod:`~node.inference.client` -- routing, failover and greedy generation, over
  :mod:`~node.inference.hops` -- the client's session with each server of a route;
  :mod:`~node.inference.redundant` -- each step on two disjoint routes, compared.
* :mod:`~node.inference.receipts` -- running receipts; :mod:`~node.inference.wire` -- hidden states on the wire.
* :mod:`~node.inference.seams` -- what the package needs of the node's other parts (executor, host, ledger, head);
  :mod:`~node.inference.tabseam` -- what a session needs of settlement by tabs.

Committees check these receipts in :mod:`node.verify.member`; the ledger's half is :mod:`node.ledger.core.state`.
"""
