"""The ledger store's reads of what each block writes beside itself (:mod:`node.ledger.store`'s key layout): the
explorer indexes (``i/``: a transaction's place, an epoch batch's story, a block hash's height, an account's
history events and receipts, a page at a time), the history log of receipts that left the state (``X/``: its
leaves and subtree hashes, which its proofs read), and the stored records of an account or a receipt (``S/``).

:class:`StoreReads` is the part of :class:`node.ledger.store.LedgerStore` that only reads: a base class over the
store's open LevelDB handle (:class:`LevelDB`, which a ``plyvel.DB`` fits).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol

from ..encoding import unpack
from . import statedb
from .core.history import SUMMARY_FIELDS
from .core.records import CODECS
from .explorer_index import BATCH_PREFIX, INDEX_VERSION, _h


class LevelIterator(Protocol):
    """A LevelDB iterator (``plyvel``'s): ``(key, value)`` pairs, or keys with ``include_value=False``; closed
    when its ``with`` block ends."""

    def __enter__(self) -> LevelIterator: ...

    def __exit__(self, *exc: object) -> None: ...

    def __iter__(self) -> Iterator[Any]: ...


class WriteBatch(Protocol):
    """A LevelDB write batch (``plyvel``'s): applied at once by :meth:`write`, or when its ``with`` block ends."""

    def __enter__(self) -> WriteBatch: ...

    def __exit__(self, *exc: object) -> None: ...

    def put(self, key: bytes, value: bytes) -> None: ...

    def delete(self, key: bytes) -> None: ...

    def write(self) -> None: ...


class LevelDB(Protocol):
    """What the store uses of its LevelDB handle (a ``plyvel.DB`` fits; plyvel has no type annotations)."""

    @property
    def closed(self) -> bool: ...

    def get(self, key: bytes) -> bytes | None: ...

    def put(self, key: bytes, value: bytes, *, sync: bool = ...) -> None: ...

    def iterator(self, *, prefix: bytes | None = ..., start: bytes | None = ..., stop: bytes | None = ...,
                 reverse: bool = ..., include_value: bool = ...) -> LevelIterator: ...

    def write_batch(self, *, sync: bool = ...) -> WriteBatch: ...

    def close(self) -> None: ...


class StoreReads:
    """Reads of the explorer indexes, the history log and stored records, over the open LevelDB handle ``db``."""

    db: LevelDB

    # ---------------------------------------------------------------- explorer index reads

    def index_meta(self) -> list[int]:
        """``[indexed height, index version, stored block bytes, transactions]`` (zeros before any block)."""
        raw = self.db.get(b"i/h")
        if raw is None:
            return [0, INDEX_VERSION, 0, 0]
        meta: list[int] = unpack(raw)  # written by LedgerStore._write_index
        return meta

    def tx_location(self, tx_id: bytes) -> tuple[int, int, str] | None:
        """``(height, position, kind)`` of a stored transaction, or None."""
        raw = self.db.get(b"i/t" + tx_id)
        return None if raw is None else tuple(unpack(raw))

    def batch_story(self, key: bytes) -> tuple[bytes, tuple[str, int] | None, list[tuple[int, bytes]]] | None:
        """An epoch batch's index entries (:func:`node.ledger.explorer_index.settlement_entries`): ``(transaction
        id, (fate, height) or None while not final, [(leaf index, revealed receipt id)])``, or None for a key no
        block included."""
        p = BATCH_PREFIX + key
        tx_id = self.db.get(p)
        if tx_id is None:
            return None
        fate = self.db.get(p + b"f")
        with self.db.iterator(prefix=p + b"d") as it:
            reveals = [(int.from_bytes(k[len(p) + 1:], "big"), v) for k, v in it]
        return tx_id, (None if fate is None else tuple(unpack(fate))), reveals

    def height_of_hash(self, block_hash: bytes) -> int | None:
        """The height of the stored block whose hash is ``block_hash``, or None."""
        raw = self.db.get(b"i/k" + block_hash)
        return None if raw is None else int.from_bytes(raw, "big")

    def _page(self, prefix: bytes, limit: int, cursor: bytes | None) -> tuple[list[tuple[bytes, bytes]], bytes | None]:
        """Newest-first entries under ``prefix`` strictly before the key suffix ``cursor``; returns
        ``([(suffix, value)], next cursor or None)``."""
        it = (self.db.iterator(start=prefix, stop=prefix + cursor, reverse=True) if cursor
              else self.db.iterator(prefix=prefix, reverse=True))
        items: list[tuple[bytes, bytes]] = []
        with it:
            for k, v in it:
                if len(items) == limit:
                    return items, items[-1][0]
                items.append((k[len(prefix):], v))
        return items, None

    def history(self, account: bytes, limit: int,
                cursor: bytes | None = None) -> tuple[list[tuple[int, int, dict[str, Any]]], bytes | None]:
        """An account's history events, newest first: ``([(height, seq, event)], next cursor)`` (events:
        :func:`node.ledger.explorer_index.index_block`)."""
        items, nxt = self._page(b"i/a" + account, limit, cursor)
        return [(int.from_bytes(s[:8], "big"), int.from_bytes(s[8:12], "big"), unpack(v)) for s, v in items], nxt

    def account_receipts(self, account: bytes, limit: int,
                         cursor: bytes | None = None) -> tuple[list[tuple[int, bytes, str]], bytes | None]:
        """Receipts naming an account (worker, requester, committee member), newest inclusion first:
        ``([(inclusion height, receipt id, role)], next cursor)``."""
        items, nxt = self._page(b"i/r" + account, limit, cursor)
        return [(int.from_bytes(s[:8], "big"), s[8:], unpack(v)) for s, v in items], nxt

    # ---------------------------------------------------------------- history log reads

    def history_node(self, level: int, index: int) -> bytes | None:
        """A stored subtree hash of the history log (a :class:`node.ledger.core.history.NodeReader`)."""
        return self.db.get(b"X/n" + bytes([level]) + _h(index))

    def history_entry(self, rid: bytes) -> tuple[int, int, bytes] | None:
        """``(log index, height it left at, summary bytes)`` of a receipt that left the state, or None (still in
        the state, never on the ledger, or left before this node's snapshot base)."""
        raw = self.db.get(b"X/r" + rid)
        if raw is None:
            return None
        index, height = unpack(raw)
        data = self.db.get(b"X/l" + _h(index))
        return None if data is None else (int(index), int(height), data)

    def archived_summary(self, rid: bytes) -> dict[str, Any] | None:
        """The :data:`node.ledger.core.history.SUMMARY_FIELDS` of a receipt that left the state, as a dict, or
        None (see :meth:`history_entry`)."""
        entry = self.history_entry(rid)
        return None if entry is None else dict(zip(SUMMARY_FIELDS, unpack(entry[2]), strict=True))

    # ---------------------------------------------------------------- stored records

    def get_receipt(self, rid: bytes) -> dict[str, Any] | None:
        """The stored record of receipt ``rid`` (:meth:`ReceiptRecord.to_dict`), or None."""
        raw = self.db.get(statedb.PREFIX["receipts"] + rid)
        if raw is None:
            return None
        record: dict[str, Any] = CODECS["receipts"].loads(raw).to_dict()
        return record

    def get_account(self, account: bytes) -> list[int] | None:
        """The stored ``Account.to_list()`` of ``account``, or None."""
        raw = self.db.get(statedb.PREFIX["accounts"] + account)
        if raw is None:
            return None
        fields: list[int] = CODECS["accounts"].loads(raw).to_list()
        return fields


__all__ = ["LevelDB", "LevelIterator", "StoreReads", "WriteBatch"]
