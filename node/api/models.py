"""Response models of the wallet/credits API's reads, and the shared conventions and types (amounts, accounts,
errors): with :mod:`node.api.postmodels` (the state-changing routes' requests and replies) they are the OpenAPI
schema (``/openapi.json``).

Conventions: an amount is ``{"base_units": "<integer string>", "credits": "<decimal string>"}`` (1 credit =
10^9 base units; strings so no JSON parser rounds them); accounts are libp2p peer IDs (``12D3KooW...``); hashes and
ids are lower-case hex; heights are block numbers (genesis is 0); times are Unix milliseconds. Handlers build
plain dicts (:mod:`node.api.views`, :mod:`node.web.views`) and return them as JSON directly; tests check every
response against these models (Schemathesis).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

# The shape of an account; whether its bytes are a valid Ed25519 public key is checked by
# node.web.views.parse_account (node.identity.account_from_str), which answers 400 bad_account.
ACCOUNT_RE = r"^(12D3KooW[1-9A-HJ-NP-Za-km-z]{44}|[0-9a-fA-F]{64})$"
# Amounts as users write them (AmountText) and the error reply (ErrorOut) are shared with the capabilities'
# routers: node.web.models.


class Amount(BaseModel):
    base_units: str = Field(..., description="integer number of base units (10^-9 credit)")
    credits: str = Field(..., description="the same amount in credits, as a decimal string")


class SpanOut(BaseModel):
    peer: str
    span: list[int] = Field(..., description="[start, end) decoder blocks")
    path: str | None = Field(None, description="in a route: direct or relayed, how this node reaches the server")
    rtt_ms: float | None = Field(None, description="in a route: measured ping round trip to the server, ms")


class PeerPathOut(BaseModel):
    """One connected peer as ``ipfs swarm peers`` shows it, plus how it is reached (issue 25)."""

    peer: str
    path: str = Field(..., description="direct, or relayed (through `relay`: a circuit relay v2 connection)")
    addr: str | None = Field(None, description="the connection's remote address (a /p2p-circuit one when relayed)")
    relay: str | None = Field(None, description="the relay's peer ID when relayed")
    rtt_ms: float | None = Field(None, description="smoothed libp2p ping round trip in ms (null until measured)")
    conns: int = Field(..., description="open connections to the peer (a relayed one lingers 60 s after a "
                                        "hole punch)")


class NetworkOut(BaseModel):
    reachability: str = Field(..., description="unknown, public (a peer dialled an address back) or private")
    announced: list[str] = Field(..., description="addresses this node tells others, best first")
    relay_reservation: str | None = Field(None, description="relay peer holding our slot (when private)")
    relaying: bool = Field(..., description="this node relays for peers behind NATs")
    peers_known: int
    peers_connected: int
    refused_streams: int = Field(..., description="inbound streams refused by the per-peer limits")
    refused_connections: int = Field(..., description="connections closed by the per-peer limits")
    circuits: dict[str, int] = Field({}, description="circuits this node relayed since start, by kind: member "
                                     "(both ends of this genesis) or open (any other)")
    peers: list[PeerPathOut] = Field([], description="connected peers: path, address and round trip")


class ConsensusOut(BaseModel):
    """A validator's Tendermint state (arXiv:1807.04938, Algorithm 1), for telling who is stuck where."""

    height: int = Field(..., description="the height being decided")
    round: int
    step: str = Field(..., description="propose, prevote, precommit, or idle (a quiet height not started)")
    round_age_s: float = Field(..., description="seconds since the machine entered this height and round")
    last_commit_age_s: float | None = Field(None, description="seconds since this node stored a block")
    proposer: str = Field(..., description="the account that proposes in this round")
    proposal: bool = Field(..., description="this round's proposal was received")
    prevotes: int = Field(..., description="voting power of this round's prevotes seen (any value)")
    precommits: int = Field(..., description="voting power of this round's precommits seen (any value)")
    quorum: int = Field(..., description="voting power of a quorum (more than 2/3 of power)")
    power: int = Field(..., description="total voting power of this height's validators")
    locked_round: int = Field(..., description="round of the locked value, -1 when none")
    valid_round: int = Field(..., description="round of the valid value, -1 when none")
    higher_rounds: list[list[int]] = Field(..., description="[round, power of its senders] for higher rounds seen")
    timeouts: dict[str, int] = Field(..., description="timeouts that moved the machine since start, by kind")
    timeout_lag: int = Field(0, description="rounds of timeout this height starts with, carried from the last "
                                            "heights (0: round 0's timeouts)")
    resends: int = Field(0, description="re-broadcasts of a stuck round's messages since start")
    queued: int = Field(0, description="events (messages, timeouts) waiting for the consensus task")
    mesh: int = Field(0, description="peers in this node's gossip mesh of the consensus topic")


class MemoryOut(BaseModel):
    total: int = Field(description="bytes of --max-memory")
    span: int = Field(description="bytes of this node's span (float32 at run time)")
    head: int = Field(description="bytes of the client head when built at start (0: --lazy-head)")
    reserve: int = Field(description="bytes kept for the interpreter, activations and KV caches")
    committee: int = Field(description="bytes left for committee duty")
    block: int = Field(description="bytes of one block of this node's model")
    committee_held: int = Field(0, description="bytes of other servers' spans committee duty keeps loaded now")
    streamed: int = Field(0, description="re-executions run block by block from disk (a span over the budget)")
    over_budget: int = Field(0, description="abstentions because not even one block fit the budget")


class StatusOut(BaseModel):
    chain_id: str
    height: int
    head_hash: str
    head_time_ms: int | None
    peer_id: str
    addrs: list[str]
    validator: bool
    validators: int
    peers: list[str]
    mempool: int
    model_id: str
    num_blocks: int
    span: list[int] | None
    swarm: list[SpanOut]
    supply: Amount
    genesis_hash: str = Field("", description="hex; peers of another genesis are refused at connection time")
    network: NetworkOut | None = None
    pruned_below: int = Field(0, description="block bodies below this height are not held here (node start "
                              "--prune-bodies, or a state-synced start); 0: every body from genesis")
    history_size: int = Field(0, description="receipts that left the hot state into the history log")
    history_root: str | None = Field(None, description="hex RFC 9162 root of the history log (null: empty)")
    consensus: ConsensusOut | None = Field(None, description="this node's consensus state (null: no consensus "
                                                             "driver, a node that can never validate)")
    committee_warning: str | None = Field(None, description="why 2 colluding accounts can fill every receipt "
                                                            "committee of this network and what to do (too few "
                                                            "bonded accounts); null: they cannot")
    memory: MemoryOut | None = Field(None, description="node start --max-memory: the budget and what uses it "
                                                       "(null: no budget)")


class AccountOut(BaseModel):
    account: str
    balance: Amount
    bond: Amount
    escrow: Amount
    slashed: Amount
    nonce: int
    valid_run: int = Field(..., description="consecutive valid verdicts (lowers the sampling probability)")
    eligible: bool = Field(..., description="bonded with at least min_bond: may work and sit on committees")
    height: int
    batch_offer: Amount | None = Field(None, description="the floor per token of this account's live batch offer "
                                                         "(node start --accept-batches); null: not drawn for batches")


class EventOut(BaseModel):
    height: int
    seq: int
    kind: str = Field(..., description="a transaction kind (transfer, bond, receipt, vote, ...) or a settlement: "
                                       "payout, refund, paid (escrow spent on a receipt), slash")
    role: str | None = Field(None, description="the account's field in the transaction (sender, recipient, ...)")
    effect: str | None = Field(None, description="what the event did to the account, in words (a receipt's "
                                                 "price shows twice for its requester: moved into escrow when "
                                                 "the receipt is included, released as `paid` when it is final)")
    tx: str | None = None
    receipt: str | None = None
    amount: Amount | None = None


class HistoryOut(BaseModel):
    account: str
    events: list[EventOut]
    next: str | None = Field(None, description="cursor for the next (older) page")


class VoteOut(BaseModel):
    voter: str
    round: int
    verdict: str
    distance_ppm: int


class PayoutOut(BaseModel):
    account: str
    amount: Amount


class ReceiptOut(BaseModel):
    id: str
    kind: str = Field(..., description="inference or training")
    status: str = Field(..., description="pending, sampled, valid, invalid, settled or unverified")
    height: int
    session_id: str | None = None
    job_id: str | None = None
    worker: str
    requester: str
    model_id: str | None = None
    span: list[int] | None = None
    tokens: int | None = None
    work: int | None = None
    price: Amount
    opened_height: int | None = None
    sampling_probability_ppm: int
    round: int
    committee: list[str]
    votes: list[VoteOut]
    final_height: int | None
    payouts: list[PayoutOut]
    slashed: Amount
    fields: dict[str, Any] = Field(default_factory=dict, description="every other field of the receipt")
    archived_height: int | None = Field(None, description="the height at whose end the receipt left the hot state "
                                        "into the history log (its committee and votes are not kept then; "
                                        "proof: /v1/proofs/history/{id})")
    history_index: int | None = Field(None, description="its leaf index in the history log, when archived")


class ReceiptsOut(BaseModel):
    receipts: list[ReceiptOut]
    next: str | None = None


class AccountReceiptOut(BaseModel):
    role: str = Field(..., description="worker, requester or committee")
    receipt: ReceiptOut


class AccountReceiptsOut(BaseModel):
    account: str
    receipts: list[AccountReceiptOut]
    next: str | None = None


class BondOut(BaseModel):
    account: str
    bond: Amount
    balance: Amount
    slashed: Amount
    valid_run: int
    eligible: bool
    validator: bool


class BondsOut(BaseModel):
    min_bond: Amount
    slash_amount: Amount
    bonds: list[BondOut]


class TxSummary(BaseModel):
    id: str
    kind: str


class CommitSig(BaseModel):
    validator: str
    round: int
    signature: str


class BlockOut(BaseModel):
    height: int
    hash: str
    prev_hash: str
    time_ms: int
    proposer: str
    tx_root: str
    state_root: str
    size_bytes: int
    txs: list[TxSummary]
    commit: list[CommitSig] = Field(..., description="precommits that finalized this block")
    last_commit: list[CommitSig] = Field(..., description="precommits for the parent, carried in this block")
    validators_hash: str = Field("", description="hash of the validator set that signs this block (empty on a "
                                                 "chain whose set is fixed in genesis)")
    next_validators_hash: str = Field("", description="hash of the set that signs the next block")


class BlockSummary(BaseModel):
    height: int
    hash: str
    time_ms: int
    proposer: str
    txs: int
    kinds: dict[str, int]


class BlocksOut(BaseModel):
    blocks: list[BlockSummary]
    next: int | None = Field(None, description="pass as before= for the next (older) page")


class TxOut(BaseModel):
    id: str
    kind: str
    height: int
    index: int
    block_hash: str
    fields: dict[str, Any] = Field(..., description="the transaction's fields: accounts as peer IDs, bytes as "
                                                    "hex, amounts as Amount")
    signatures: list[str]


class TxStatusOut(BaseModel):
    id: str
    status: str = Field(..., description="included (in a stored block), pending (queued in this node's mempool), "
                                         "dropped (refused or dropped by this node: see reason) or unknown")
    reason: str = Field("", description="pending: why not in a block yet (waiting for a block, or for a missing "
                                        "nonce); dropped: why")
    summary: str = Field(..., description="one line for a person, e.g. 'pending for 12 s: ...'")
    height: int | None = Field(None, description="included: the block's height")
    pending_s: float | None = Field(None, description="pending: seconds since this node queued it")
    missing_nonce: int | None = Field(None, description="pending behind a nonce gap: the sender's nonce that has "
                                                        "not reached this node")
    expires_in_blocks: int | None = Field(None, description="pending behind a nonce gap: blocks it may still "
                                                            "wait before it is dropped")
    resent: int = Field(0, description="times this node re-sent it to its peers (its own transactions)")


class ValidatorOut(BaseModel):
    account: str
    balance: Amount
    bond: Amount
    slashed: Amount = Field(..., description="bond slashed so far (double signing, invalid work)")
    proposed: int = Field(..., description="blocks it proposed among the last `window` blocks")
    signed: int = Field(..., description="blocks among the last `window` whose commit it signed")
    power: str = Field("1", description="voting power (base units of bond; 1 each on a genesis-fixed set)")


class ValidatorChangeOut(BaseModel):
    account: str
    power: str = Field(..., description="voting power from effective_height (0: leaves the set)")
    from_power: str = Field(..., description="voting power until then")
    effective_height: int


class ValidatorsOut(BaseModel):
    window: int
    height: int
    validators: list[ValidatorOut] = Field(..., description="the set that signs the next block")
    total_power: str = "0"
    quorum_power: str = Field("0", description="power a commit needs: more than 2/3 of total_power")
    validators_hash: str = ""
    next_validators_hash: str = ""
    changes: bool = Field(False, description="false: the set is fixed in genesis (min_validator_bond 0)")
    min_validator_bond: Amount | None = None
    pending: list[ValidatorChangeOut] = Field(default_factory=list,
                                              description="decided changes and the heights they take effect")


class SwarmServerOut(BaseModel):
    peer: str
    model_id: str
    span: list[int]
    active: int = Field(..., description="sessions open at its last announcement")
    seen_s: float = Field(..., description="seconds since its last announcement")
    addrs: list[str]


class SwarmOut(BaseModel):
    model_id: str = Field(..., description="the model this node runs (coverage is of this model)")
    num_blocks: int
    servers: list[SwarmServerOut] = Field(..., description="live servers of every model announced, this one's first")
    coverage: list[int] = Field(..., description="number of live servers holding each decoder block")
    covered: int = Field(..., description="decoder blocks held by at least one live server")


class VerificationBucket(BaseModel):
    from_height: int
    to_height: int
    receipts: int
    sampled: int
    valid: int
    invalid: int
    abstain: int
    slashes: int


class VerificationOut(BaseModel):
    height: int
    receipts: int
    pending: int
    sampled: int
    valid: int
    invalid: int
    settled: int
    unverified: int
    votes: dict[str, int]
    slashes: int
    slashed: Amount
    series: list[VerificationBucket]


class SearchOut(BaseModel):
    kind: str = Field(..., description="block, tx, receipt, account, job or run")
    id: str
    url: str = Field(..., description="explorer page")
    api: str = Field(..., description="API resource")


class ProofOut(BaseModel):
    header: list[Any]
    leaf: str = Field(description="rfc9162: the transaction's wire bytes; smt: the state entry's stored bytes")
    index: int
    size: int
    path: list[str] = Field(description="rfc9162: the audit path; smt: the siblings from the root down "
                                        "(\"\" for an empty subtree)")
    commit: list[list[Any]]
    tree: str = Field("rfc9162", description="rfc9162 (a transaction in a block) or smt (a state entry)")
    table: str | None = Field(None, description="smt: the state table of the entry (accounts, receipts)")


class HistoryProofOut(BaseModel):
    receipt_id: str
    archived_height: int = Field(..., description="the height at whose end the receipt left the hot state")
    header: list[Any]
    commit: list[list[Any]]
    leaf: str = Field(description="hex summary of the receipt (msgpack, node.ledger.core.history.summary)")
    index: int = Field(description="its leaf index in the history log")
    size: int = Field(description="the log's size in the state the header commits to")
    path: list[str] = Field(description="RFC 9162 audit path from the leaf to the log root, bottom-up")
    head: ProofOut = Field(description="smt proof of the log head entry (size, root) under the header's state root")
    summary: dict[str, Any] = Field(default_factory=dict, description="the summary, decoded")
