"""Compact stored block records (pure): an empty block stores little more than its header and commit.

A block is stored (``B`` + height in :class:`node.ledger.store.LedgerStore`) together with the commit that
finalised it. The wire form, ``{"b": {"h": [chain, height, prev, time, proposer, tx_root, state_root], "txs":
[...], "lc": [[validator, round, sig], ...]}, "c": [[validator, round, sig], ...]}``, repeats what the store
already knows; measured with one validator and chain id ``test-chain``, an empty block's record is 374 B of
value. Format 2 (a msgpack array, where the legacy record is a map, so both read back) leaves out, losslessly:

* the chain id (a store belongs to one genesis);
* ``tx_root`` when the block has no transaction (it is then the constant ``merkle_root([])``);
* ``last_commit`` when it equals the commit stored with the parent (always so for the block a validator built on
  its own head; the block hash does not cover it, :class:`node.ledger.core.block.Header`), read back from the parent;
* in commits and for the proposer, a validator's 32-byte account when it is in the genesis validator set: its
  index there instead; and the round, shared by every precommit of a commit, once per commit
  (:func:`node.ledger.core.block.check_commit` refuses commits that mix rounds; one that does is kept in full).

A header with validator hashes (a chain with changing validators, :mod:`node.ledger.core.valset`) stores them
after ``state_root``, ``next_validators_hash`` as nil when it equals ``validators_hash`` (the set does not change).

Record: ``[2, [height, prev, time, proposer, tx_root | nil, state_root(, vals_hash, next_vals_hash | nil)], txs,
last_commit | nil, commit]``, a
commit being ``[round, ref, sig, ref, sig, ...]`` (``ref``: validator index or account bytes) or, when it cannot be
written so, the wire list. An empty one-validator block becomes 157 B of value (chain id ``test-chain``).
:func:`decode_record` gives back exactly the wire dict, so readers (sync, the explorer, replay) see no change.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import msgpack

from ...encoding import DecodeError, merkle_root, pack, unpack_local

FORMAT = 2
EMPTY_TX_ROOT = merkle_root([])


class RecordError(ValueError):
    """A stored block record that is not a legacy map nor a well-formed format-2 array."""


def _ref(v: Any, validators: Sequence[bytes]) -> Any:
    return validators.index(v) if isinstance(v, bytes) and v in validators else v


def _unref(ref: Any, validators: Sequence[bytes]) -> bytes:
    if isinstance(ref, int) and not isinstance(ref, bool):
        if not 0 <= ref < len(validators):
            raise RecordError(f"validator index {ref} outside the validator set")
        return validators[ref]
    if isinstance(ref, bytes):
        return ref
    raise RecordError("malformed validator reference")


def encode_commit(commit: Sequence[Sequence[Any]], validators: Sequence[bytes]) -> list[Any]:
    """``[(validator, round, sig), ...]`` as ``[round, ref, sig, ...]``; the wire list unchanged when its entries
    are not all ``(bytes, int, bytes)`` of one round (or it is empty)."""
    entries = [list(x) for x in commit]
    ok = entries and all(len(e) == 3 and isinstance(e[0], bytes) and isinstance(e[2], bytes)
                         and isinstance(e[1], int) and not isinstance(e[1], bool) for e in entries)
    if not ok or len({e[1] for e in entries}) != 1:
        return entries
    out: list[Any] = [entries[0][1]]
    for v, _, sig in entries:
        out += [_ref(v, validators), sig]
    return out


def decode_commit(obj: Any, validators: Sequence[bytes]) -> list[list[Any]]:
    """The wire list ``[[validator, round, sig], ...]`` of a commit :func:`encode_commit` wrote.

    Raises:
        RecordError: malformed.
    """
    if not isinstance(obj, list):
        raise RecordError("a commit is a list")
    if not obj or isinstance(obj[0], list):
        return obj  # the wire list, kept as it was
    round_, rest = obj[0], obj[1:]
    if not isinstance(round_, int) or len(rest) % 2:
        raise RecordError("malformed compact commit")
    return [[_unref(rest[i], validators), round_, rest[i + 1]] for i in range(0, len(rest), 2)]


def encode_record(wire: dict[Any, Any], commit: Sequence[Sequence[Any]], parent_commit: Sequence[Sequence[Any]],
                  chain_id: str, validators: Sequence[bytes]) -> bytes:
    """The stored bytes of a block (``wire``: :meth:`Block.to_wire`) and its ``commit``. ``parent_commit``: the
    commit stored with the parent block (empty for block 1), as :func:`record_commit` reads it. A block of
    another chain is written in the legacy form (never expected: the store checks blocks first)."""
    c = [list(x) for x in commit]
    chain, height, prev, time_ms, proposer, troot, sroot = wire["h"][:7]
    vals = list(wire["h"][7:])  # validators_hash, next_validators_hash (node.ledger.core.valset), if any
    if vals and vals[1] == vals[0]:
        vals[1] = None  # the set does not change at the next height: stored once
    if chain != chain_id:
        return pack({"b": wire, "c": c})
    txs, lc = wire["txs"], wire["lc"]
    header = [height, prev, time_ms, _ref(proposer, validators),
              None if not txs and troot == EMPTY_TX_ROOT else troot, sroot, *vals]
    same = pack([list(x) for x in lc]) == pack([list(x) for x in parent_commit])
    return pack([FORMAT, header, txs, None if same else encode_commit(lc, validators),
                 encode_commit(c, validators)])


def record_commit(raw: bytes, validators: Sequence[bytes]) -> list[list[Any]]:
    """The commit ``[[validator, round, sig], ...]`` stored in record ``raw`` (either format), without reading
    the rest of the block.

    Raises:
        RecordError: malformed.
    """
    if raw[:1] == _ARRAY5:  # format 2: the commit is the last item; the block's transactions are skipped, unbuilt
        return decode_commit(_last_of_record(raw), validators)
    obj = unpack_local(raw)
    if isinstance(obj, dict):
        legacy: list[list[Any]] = obj["c"]
        return legacy
    _check(obj)
    return decode_commit(obj[4], validators)


_ARRAY5 = b"\x95"  # msgpack's fixarray header of 5 items: a format-2 record


def _last_of_record(raw: bytes) -> Any:
    """The commit item of the format-2 record ``raw`` (a local, trusted record), checked as :func:`_check` checks
    the whole record: the header and the other items are read, the transactions skipped without building them
    (a 500-receipt block: ~0.1 ms instead of ~3 ms).

    Raises:
        RecordError: not a record of a known format. DecodeError: not well-formed msgpack.
    """
    u = msgpack.Unpacker(raw=False, strict_map_key=False)
    u.feed(raw)
    try:
        u.read_array_header()
        fmt, header = u.unpack(), u.unpack()
        try:
            ntx = u.read_array_header()
        except ValueError:
            raise RecordError("not a block record of a known format") from None
        for _ in range(ntx):
            u.skip()
        u.skip()  # last_commit
        commit = u.unpack()
        if u.tell() != len(raw):
            raise DecodeError("malformed msgpack in the local store: extra data after the record")
    except (msgpack.OutOfData, msgpack.FormatError, msgpack.StackError, ValueError, TypeError) as e:
        if isinstance(e, RecordError | DecodeError):
            raise
        raise DecodeError(f"malformed msgpack in the local store: {e}") from None
    _check([fmt, header, [], None, commit])
    return commit


def _check(obj: Any) -> None:
    if not (isinstance(obj, list) and len(obj) == 5 and obj[0] == FORMAT and isinstance(obj[1], list)
            and len(obj[1]) in (6, 8) and isinstance(obj[2], list)):
        raise RecordError("not a block record of a known format")


def decode_record(raw: bytes, chain_id: str, validators: Sequence[bytes],
                  parent_commit: Callable[[], list[Any]]) -> dict[Any, Any]:
    """The wire dict ``{"b": block wire, "c": commit}`` of a stored record (legacy or format 2).
    ``parent_commit()``: the commit stored with the parent block (called only when the record omits its
    ``last_commit``).

    Raises:
        RecordError: malformed.
    """
    obj = unpack_local(raw)
    if isinstance(obj, dict):
        return obj
    _check(obj)
    _, h, txs, lc, c = obj
    height, prev, time_ms, proposer, troot, sroot = h[:6]
    header = [chain_id, height, prev, time_ms, _unref(proposer, validators),
              EMPTY_TX_ROOT if troot is None else troot, sroot]
    if len(h) == 8:  # validators_hash, next_validators_hash (None: the same)
        header += [h[6], h[6] if h[7] is None else h[7]]
    last = parent_commit() if lc is None else decode_commit(lc, validators)
    return {"b": {"h": header, "txs": txs, "lc": last}, "c": decode_commit(c, validators)}


__all__ = [
    "EMPTY_TX_ROOT",
    "FORMAT",
    "RecordError",
    "decode_commit",
    "decode_record",
    "encode_commit",
    "encode_record",
    "record_commit",
]
