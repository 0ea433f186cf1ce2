"""Transactions: the signed objects that change ledger state (the base classes and the core modules' kinds).

Every capability's kinds subclass :class:`SingleSigned` or :class:`Tx` here, in its own ``*tx`` module; the
registry of every kind (``TX_KINDS``) and :func:`~node.ledger.core.tx.decode_tx` are :mod:`node.ledger.core.tx`,
built from the module tuple (:mod:`node.ledger.core.modules`). This module imports no kind of a capability.

Every transaction is a frozen dataclass with a fixed field order. Its canonical bytes are the msgpack array
``[domain_tag, chain_id, *unsigned_fields]`` (see :mod:`node.encoding`); its id is the BLAKE2b-256 digest of
those bytes, and every signature is an Ed25519 signature over that 32-byte id. Two signatures over one
object are therefore one object: a receipt's id does not depend on who signed it.

The ``chain_id`` field holds the network's signing domain, ``"<chain id>/<genesis hash hex>"``
(:attr:`node.ledger.core.genesis.Genesis.domain`, :mod:`node.ledger.core.domain`), so every id and signature binds
the genesis hash and not only the chain id: a transaction signed for one genesis is refused by a network of another
genesis with the same chain id (by name before any signature check, and its signatures would not verify there).

Kinds:
  * :class:`Transfer` — move ``amount`` base units; per-account ``nonce``.
  * :class:`Bond` — lock ``amount`` base units of the sender's balance as a worker bond; per-account ``nonce``.
  * :class:`Unbond` — release bond back to balance once no receipt of the sender is pending; ``nonce``.
  * :class:`Receipt` — "I did this unit of work", signed by the worker and countersigned by the requester.
  * :class:`Vote` — a committee member's verdict on a sampled receipt.
  * :class:`Evidence` — two conflicting consensus votes signed by one validator (double signing).

Transfers, bonds and unbonds carry a per-account nonce. Receipts, votes and evidence are replay-protected by
their ids instead — a receipt id, a (receipt, round, voter) vote and an evidence key each count once on the
ledger — so that independent work items never wait on each other's ordering (a receipt refused for one worker
must not strand the next receipt of the same requester behind a nonce gap).

Wire form (gossip, blocks): ``{"t": kind, "f": [fields...], "s": [signatures...]}``; :func:`decode_tx`
checks every field's type and size and raises :class:`InvalidTx` on anything else. Every account field
(schema kind ``"account"``: senders, recipients, workers, requesters, voters, validators) must be a valid Ed25519
public key (:func:`node.identity.is_valid_account`), so no transaction that names an account no key can spend from
enters a mempool or a valid block, from gossip, a block or the API alike. The ledger's own hash-derived accounts
(the treasury) are never a transaction's field; the state transition credits them directly.
"""

from __future__ import annotations

import enum
import itertools
from collections.abc import Callable
from dataclasses import dataclass, fields as dc_fields, replace
from functools import cached_property
from operator import attrgetter
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, Self, TypeVar, cast

from ...encoding import MAX_AMOUNT, object_id
from ...keys import Identity, is_valid_account, verify

PRECOMMIT_TAG = b"tally/precommit/v1"
PREVOTE_TAG = b"tally/prevote/v1"


def vote_digest(kind: str, chain_id: str, height: int, round_: int, value: bytes | None) -> bytes:
    """32-byte digest a validator signs for a prevote or precommit (``value`` None is nil) on the network of
    signing domain ``chain_id`` (:attr:`node.ledger.core.genesis.Genesis.domain`). Here, beside :class:`Evidence`
    which verifies two of them; :mod:`node.ledger.core.block` signs and checks commits with it."""
    tag = PRECOMMIT_TAG if kind == "precommit" else PREVOTE_TAG
    return object_id(tag, chain_id, [height, round_, value or b""])


class Verdict(enum.IntEnum):
    """A committee member's vote on a receipt, and a committee's final verdict. An ``IntEnum``: signed, stored and
    sent as the int (0, 1, 2), equal to it, so votes decoded from the wire or the store compare the same."""

    VALID = 0
    INVALID = 1
    ABSTAIN = 2  # the member could not re-execute; never penalises the worker

    @property
    def label(self) -> str:
        """``valid``, ``invalid`` or ``abstain``: the word the API, the explorer and the CLI show."""
        return self.name.lower()


VALID, INVALID, ABSTAIN = Verdict.VALID, Verdict.INVALID, Verdict.ABSTAIN
VERDICT_NAMES: dict[int, str] = {v.value: v.label for v in Verdict}


class InvalidTx(ValueError):
    """A transaction that is malformed, badly signed, or not applicable to the current state."""


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise InvalidTx(msg)


def _is_int(v: Any, lo: int = 0, hi: int = MAX_AMOUNT) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi


def _is_bytes(v: Any, n: int | None = None) -> bool:
    return isinstance(v, bytes) and (n is None or len(v) == n)


T = TypeVar("T")
_UNSIGNED: dict[type, Callable[[Any], list[Any]]] = {}  # per kind: tx -> its unsigned field values


def _unsigned_getter(cls: type) -> Callable[[Any], list[Any]]:
    """``tx -> [its unsigned field values]`` for transactions of kind ``cls`` (built once per kind; one C call,
    :func:`operator.attrgetter`, for the lookups)."""
    got = _UNSIGNED.get(cls)
    if got is None:
        sigs = getattr(cls, "SIGS", ())
        tail = getattr(cls, "TAIL", ())
        names = tuple(f.name for f in dc_fields(cls) if f.name not in sigs and f.name != "chain_id"
                      and f.name not in tail) + tuple(tail)
        if len(names) == 1:
            one = attrgetter(names[0])
            got = _UNSIGNED[cls] = lambda tx: [one(tx)]
        elif tail:
            many, required = attrgetter(*names), len(names) - len(tail)

            def trimmed(tx: Any) -> list[Any]:
                vals = list(many(tx))
                while len(vals) > required and vals[-1] == 0:  # trailing optional fields at 0 are left out
                    vals.pop()
                return vals

            got = _UNSIGNED[cls] = trimmed
        else:
            many = attrgetter(*names)
            got = _UNSIGNED[cls] = lambda tx: list(many(tx))
    return got


def arity_fits(cls: type, n: int) -> bool:
    """Whether ``n`` wire fields fit kind ``cls``: all of its ``SCHEMA``, or only the optional tail (``TAIL``) left
    out from the end."""
    schema: dict[str, str] = getattr(cls, "SCHEMA", {})
    return len(schema) - len(getattr(cls, "TAIL", ())) <= n <= len(schema)


def build_tx(cls: type[T], chain_id: Any, fields: list[Any], sigs: list[Any]) -> T:
    """A transaction of kind ``cls`` from its wire parts (fields already checked, or trusted): the required fields
    and the signatures by position, the optional tail (:attr:`Tx.TAIL`) by name, absent ones at 0.

    Raises:
        InvalidTx: the number of fields is not the kind's (between its required fields and all of them), or an
            optional field is present at 0 (its canonical form leaves it out, so that one transaction has one
            encoding and one id).
    """
    tail: tuple[str, ...] = getattr(cls, "TAIL", ())
    required = len(cls.SCHEMA) - len(tail)  # type: ignore[attr-defined]
    _check(arity_fits(cls, len(fields)), "wrong number of fields")
    _check(len(fields) == required or fields[-1] != 0,
           "an optional trailing field at 0 is left out of a transaction's canonical encoding")
    make: Any = cls  # a dataclass kind: chain id, its required fields, its signatures, then its tail by name
    tx: T = make(chain_id, *fields[:required], *sigs, **dict(zip(tail, fields[required:], strict=False)))
    return tx


class FeeParams(Protocol):
    """The genesis parameters a transaction's :meth:`Tx.cost` may read (:class:`node.ledger.core.genesis.Params`)."""

    @property
    def committee_size(self) -> int: ...

    @property
    def batch_audit_pay_bps(self) -> int: ...


class _Nonced(Protocol):
    sender: bytes
    nonce: int


@dataclass(frozen=True)
class Tx:
    """Base class. Subclasses list their unsigned fields first and signature fields (``SIGS``) last."""

    TAG: ClassVar[bytes] = b""
    KIND: ClassVar[str] = ""
    SIGS: ClassVar[tuple[str, ...]] = ()
    # name -> ("int" | "account" | "bytes32" | "bytes16" | "str", ...) used by decode_tx
    SCHEMA: ClassVar[dict[str, str]] = {}
    # the optional trailing fields (int, default 0; the last entries of SCHEMA, declared after the signatures): a
    # field added to a kind after transactions of it were signed. Left out of the id and the wire while 0 (and
    # from the end only), so every transaction signed before keeps its encoding and its id (:func:`build_tx`).
    TAIL: ClassVar[tuple[str, ...]] = ()
    # the field naming the account whose per-sender mempool cap the transaction counts against (:attr:`payer`)
    PAYER: ClassVar[str] = "sender"
    # the field holding the base units the transaction takes from its payer when it applies (:meth:`cost`), or ""
    COST: ClassVar[str] = ""
    if TYPE_CHECKING:  # every kind's first field, declared there so that each kind keeps its own field order
        chain_id: str

    def unsigned(self) -> list[Any]:
        """The signed fields' values in declaration order, the chain id and signatures left out (the field
        names are looked up once per kind, :func:`_unsigned_getter`, not reflected on every call)."""
        return _unsigned_getter(type(self))(self)

    @cached_property
    def id(self) -> bytes:
        """32-byte id: hash of the domain tag, chain id and unsigned fields (computed once per object)."""
        return object_id(self.TAG, self.chain_id, self.unsigned())

    @property
    def sender_nonce(self) -> tuple[bytes, int] | None:
        """``(sender, nonce)`` of a transaction ordered by its sender's account nonce (its kind's ``SCHEMA`` has a
        ``nonce`` field: transfers, bonds, unbonds, job, run and batch messages), else None (receipts, votes,
        consensus messages...). The one test of that, instead of probing attributes."""
        if "nonce" not in self.SCHEMA:
            return None
        nonced = cast("_Nonced", self)
        return nonced.sender, nonced.nonce

    @property
    def payer(self) -> bytes:
        """The account that pays for this transaction: whose per-sender mempool cap it counts against (the field
        :attr:`PAYER` names: the sender, a receipt's requester, a training receipt's worker, a vote's voter, an
        evidence's validator)."""
        payer: bytes = getattr(self, self.PAYER)
        return payer

    def cost(self, params: FeeParams | None = None) -> int:
        """Base units this transaction takes from its :attr:`payer`'s balance when it applies, escrows included
        (the field :attr:`COST` names: a transfer's or bond's amount, a receipt's or job post's price, a run
        post's budget; 0 for every kind that moves none). ``params``: the chain's genesis parameters, for kinds
        whose escrow depends on them (a batch post's audit fee); without them, what the transaction alone says."""
        if not self.COST:
            return 0
        amount: int = getattr(self, self.COST)
        return amount

    def to_wire(self) -> dict[Any, Any]:
        return {"t": self.KIND, "c": self.chain_id, "f": self.unsigned(),
                "s": [getattr(self, s) for s in self.SIGS]}

    def signature_checks(self) -> list[tuple[bytes, bytes, bytes, str]]:
        """Every signature this transaction needs: ``(account, 32-byte digest, signature, what)``."""
        raise NotImplementedError

    def check_signatures(self) -> None:
        """Raise :class:`InvalidTx` unless every required signature verifies."""
        for account, digest, sig, what in self.signature_checks():
            _check(verify(account, digest, sig), f"bad {what} signature")


@dataclass(frozen=True)
class SingleSigned(Tx):
    """A transaction signed by one account, named by the field ``SIGNER``, into the field ``sig``."""

    SIGNER: ClassVar[str] = "sender"

    def signed(self, ident: Identity) -> Self:
        """A copy signed by ``ident`` (which must be the ``SIGNER`` account for the result to verify)."""
        changes: dict[str, Any] = {"sig": ident.sign(self.id)}  # each kind declares ``sig`` (its last field)
        return replace(self, **changes)

    def signature_checks(self) -> list[tuple[bytes, bytes, bytes, str]]:
        return [(getattr(self, self.SIGNER), self.id, self.sig, self.KIND)]  # type: ignore[attr-defined]


@dataclass(frozen=True)
class Transfer(SingleSigned):
    chain_id: str
    sender: bytes
    recipient: bytes
    amount: int
    nonce: int
    sig: bytes = b""

    TAG: ClassVar[bytes] = b"tally/transfer/v1"
    COST: ClassVar[str] = "amount"
    KIND: ClassVar[str] = "transfer"
    SIGS: ClassVar[tuple[str, ...]] = ("sig",)
    SCHEMA: ClassVar[dict[str, str]] = {"sender": "account", "recipient": "account", "amount": "amount",
                                        "nonce": "int"}


@dataclass(frozen=True)
class Bond(SingleSigned):
    chain_id: str
    sender: bytes
    amount: int
    nonce: int
    sig: bytes = b""

    TAG: ClassVar[bytes] = b"tally/bond/v1"
    COST: ClassVar[str] = "amount"
    KIND: ClassVar[str] = "bond"
    SIGS: ClassVar[tuple[str, ...]] = ("sig",)
    SCHEMA: ClassVar[dict[str, str]] = {"sender": "account", "amount": "amount", "nonce": "int"}


@dataclass(frozen=True)
class Unbond(SingleSigned):
    """Release ``amount`` base units of the sender's bond back to its balance; refused while the sender has
    receipts (as worker) that are not final, so a bond cannot run away from a pending slash."""

    chain_id: str
    sender: bytes
    amount: int
    nonce: int
    sig: bytes = b""

    TAG: ClassVar[bytes] = b"tally/unbond/v1"
    KIND: ClassVar[str] = "unbond"
    SIGS: ClassVar[tuple[str, ...]] = ("sig",)
    SCHEMA: ClassVar[dict[str, str]] = {"sender": "account", "amount": "amount", "nonce": "int"}


@dataclass(frozen=True)
class Receipt(Tx):
    """Signed claim of one inference session on one span (DESIGN.md, Receipts).

    Fields: ``session_id`` (16 random bytes), ``worker`` and ``requester`` (32-byte accounts),
    ``model_id`` (32 bytes), span ``[span_start, span_end)`` in blocks, ``tokens`` processed,
    ``inputs_root``/``outputs_root`` (RFC 9162 Merkle roots over the ordered step tensors' commitments),
    ``price`` in base units, ``opened_height`` (ledger height when the session opened), ``compression``
    (wire codec of hidden states, "none" for raw). Work measure = tokens × blocks (:attr:`work`).
    """

    chain_id: str
    session_id: bytes
    worker: bytes
    requester: bytes
    model_id: bytes
    span_start: int
    span_end: int
    tokens: int
    inputs_root: bytes
    outputs_root: bytes
    price: int
    opened_height: int
    compression: str = "none"
    worker_sig: bytes = b""
    requester_sig: bytes = b""

    TAG: ClassVar[bytes] = b"tally/receipt/v1"
    PAYER: ClassVar[str] = "requester"
    COST: ClassVar[str] = "price"  # escrowed at inclusion
    KIND: ClassVar[str] = "receipt"
    SIGS: ClassVar[tuple[str, ...]] = ("worker_sig", "requester_sig")
    SCHEMA: ClassVar[dict[str, str]] = {
        "session_id": "bytes16", "worker": "account", "requester": "account", "model_id": "bytes32",
        "span_start": "int", "span_end": "int", "tokens": "int", "inputs_root": "bytes32",
        "outputs_root": "bytes32", "price": "int", "opened_height": "int", "compression": "str",
    }

    def history_tail(self) -> list[Any]:
        """The last six fields of its summary in the receipt history (:func:`node.ledger.core.history.summary`):
        ``[session id, opened height, model id, span start, span end, tokens]``."""
        return [self.session_id, self.opened_height, self.model_id, self.span_start, self.span_end, self.tokens]

    @property
    def work(self) -> int:
        """Committed work measure in token-blocks: ``tokens × (span_end − span_start)``."""
        return self.tokens * (self.span_end - self.span_start)

    def sign_worker(self, ident: Identity) -> Receipt:
        _check(ident.account == self.worker, "only the worker signs as worker")
        return replace(self, worker_sig=ident.sign(self.id))

    def countersign(self, ident: Identity) -> Receipt:
        _check(ident.account == self.requester, "only the requester countersigns")
        return replace(self, requester_sig=ident.sign(self.id))

    def signature_checks(self) -> list[tuple[bytes, bytes, bytes, str]]:
        return [(self.worker, self.id, self.worker_sig, "worker receipt"),
                (self.requester, self.id, self.requester_sig, "requester counter-")]

    def check_shape(self) -> None:
        _check(self.worker != self.requester, "worker and requester must differ")
        _check(0 <= self.span_start < self.span_end <= 4096, "bad span")
        _check(self.tokens > 0, "a receipt covers at least one token")


@dataclass(frozen=True)
class Vote(SingleSigned):
    """A committee member's signed verdict on a sampled receipt in escalation ``round``.

    ``verdict`` is VALID (0), INVALID (1) or ABSTAIN (2); ``distance_ppm`` is the measured distance between the
    committed outputs and the re-execution in parts per million (see :mod:`node.compute.compare`).
    """

    chain_id: str
    receipt_id: bytes
    voter: bytes
    round: int
    verdict: int
    distance_ppm: int
    sig: bytes = b""

    TAG: ClassVar[bytes] = b"tally/vote/v1"
    PAYER: ClassVar[str] = "voter"
    KIND: ClassVar[str] = "vote"
    SIGS: ClassVar[tuple[str, ...]] = ("sig",)
    SIGNER: ClassVar[str] = "voter"
    SCHEMA: ClassVar[dict[str, str]] = {"receipt_id": "bytes32", "voter": "account", "round": "int",
                                        "verdict": "verdict", "distance_ppm": "int"}


@dataclass(frozen=True)
class Evidence(Tx):
    """Proof that ``validator`` signed two different consensus votes of one ``kind`` at one height and round
    (double signing). Self-authenticating: it carries both signed votes and needs no other signature. Applied
    once per (validator, kind, height, round); the validator's bond is slashed (:mod:`node.ledger.core.state`)."""

    chain_id: str
    validator: bytes
    kind: str
    height: int
    round: int
    value_a: bytes
    sig_a: bytes
    value_b: bytes
    sig_b: bytes

    TAG: ClassVar[bytes] = b"tally/evidence/v1"
    PAYER: ClassVar[str] = "validator"
    KIND: ClassVar[str] = "evidence"
    SIGS: ClassVar[tuple[str, ...]] = ()
    SCHEMA: ClassVar[dict[str, str]] = {"validator": "account", "kind": "votekind", "height": "int", "round": "int",
                                        "value_a": "value", "sig_a": "sig", "value_b": "value", "sig_b": "sig"}

    def signature_checks(self) -> list[tuple[bytes, bytes, bytes, str]]:
        return [(self.validator, vote_digest(self.kind, self.chain_id, self.height, self.round, value or None), sig,
                 "evidence vote") for value, sig in ((self.value_a, self.sig_a), (self.value_b, self.sig_b))]

    @property
    def key(self) -> bytes:
        """What evidence is counted once by: validator, kind, height and round."""
        return object_id(self.TAG, self.chain_id, [self.validator, self.kind, self.height, self.round])


MAX_RECORDS = 1024  # records in one "records" field (a batch's vouchers)


def _is_record(v: Any) -> bool:
    """A list of at most 24 scalars: bytes of at most 64, ints in 0..MAX_AMOUNT, strings of at most 32 characters."""
    return isinstance(v, list) and len(v) <= 24 and all(
        (_is_bytes(x) and len(x) <= 64) or _is_int(x) or (isinstance(x, str) and len(x) <= 32) for x in v)


def _check_field(name: str, kind: str, v: Any) -> None:
    ok = {
        "int": lambda: _is_int(v),
        "amount": lambda: _is_int(v, 1),
        "account": lambda: is_valid_account(v),
        "bytes32": lambda: _is_bytes(v, 32),
        "bytes16": lambda: _is_bytes(v, 16),
        "str": lambda: isinstance(v, str) and len(v) <= 32,
        "verdict": lambda: v in (VALID, INVALID, ABSTAIN) and _is_int(v),
        "votekind": lambda: v in ("prevote", "precommit"),
        "value": lambda: _is_bytes(v) and len(v) in (0, 32),
        "sig": lambda: _is_bytes(v, 64),
        "text": lambda: isinstance(v, str) and len(v) <= 200,
        "sint": lambda: _is_int(v, -1),
        # a flat record of scalars (a receipt's fields and signatures inside a batch or a reveal)
        "record": lambda: _is_record(v),
        "records": lambda: isinstance(v, list) and len(v) <= MAX_RECORDS and all(_is_record(x) for x in v),
        "hashes": lambda: isinstance(v, list) and len(v) <= 64 and all(_is_bytes(x, 32) for x in v),
        # a set of accounts in canonical order: at most 256, strictly ascending (so each at most once)
        "accounts": lambda: (isinstance(v, (list, tuple)) and len(v) <= 256 and all(is_valid_account(a) for a in v)
                             and all(a < b for a, b in itertools.pairwise(v))),
    }[kind]()
    if not ok and kind == "account":
        raise InvalidTx(f"field {name!r} is not a valid Ed25519 public key (no key could spend from it)")
    _check(ok, f"field {name!r} has a bad value")
