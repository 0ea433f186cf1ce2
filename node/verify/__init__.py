"""Committee re-execution: a node drawn onto a receipt's committee re-executes the work and votes
(DESIGN.md, Verification).

* :mod:`~node.verify.member` -- :class:`~node.verify.member.CommitteeMember`: watches blocks for duty, checks
  inference receipts itself and hands every other receipt type to the checker its capability registered
  (:class:`~node.duty.seams.ReceiptChecker`), then signs the vote.
* Models a member lacks: :mod:`~node.verify.blockfetch` (fetching blocks by content hash, each checked by
  :mod:`~node.verify.blockcheck`),
  :mod:`~node.verify.blockserve` (serving them), :mod:`~node.verify.fetchstore` (the fetched-models dir under byte
  caps), :mod:`~node.verify.tokfetch` (their tokenizer files).

The distance it measures is :mod:`node.compute.compare`; the ledger's half (sampling, committees, the tally) is
:mod:`node.ledger.core.committee` and :mod:`node.ledger.core.state`.
"""
