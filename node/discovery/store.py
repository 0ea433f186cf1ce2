"""The records a node holds for the keys close to it (pure; a fake clock in tests).

Bounds (issue 39, "bounded tables"): at most :data:`MAX_PER_KEY` records under one key, :data:`MAX_KEYS_PER_ACCOUNT`
keys per server, :data:`MAX_RECORDS` in all. One record per (key, server): a newer ``seq`` replaces the older.
Eviction: expired records go first (a heap on expiry, popped as the clock passes them: amortized O(log n) per
record). A full key or a full store takes a new server's record only by evicting the record that expires
soonest, and only if the new one outlives it: a flood of fresh identities can displace short-lived records, never
records that outlive the flood's, and each of its records costs a signature and a republish to hold its place.
"""

from __future__ import annotations

import heapq
import random

from .keys import span_key
from .record import SpanRecord

MAX_PER_KEY = 256  # records under one key (servers of one model starting at one block)
MAX_KEYS_PER_ACCOUNT = 4  # keys one server may hold records under (one per model it serves, a few models)
MAX_RECORDS = 16_384  # records in all (~2 KiB each at most: ≤ 32 MiB, usually ~300 B each)
ANSWER_LIMIT = 32  # records in one answer


class RecordStore:
    """Span records by key (the key is derived from the record: :func:`span_key` of its model and start)."""

    def __init__(self, max_per_key: int = MAX_PER_KEY, max_records: int = MAX_RECORDS,
                 max_keys_per_account: int = MAX_KEYS_PER_ACCOUNT, rng: random.Random | None = None):
        self.max_per_key, self.max_records, self.max_keys_per_account = max_per_key, max_records, max_keys_per_account
        self.by_key: dict[bytes, dict[bytes, SpanRecord]] = {}
        self.keys_of: dict[bytes, set[bytes]] = {}  # account -> keys it holds records under
        self._expiry: list[tuple[int, bytes, bytes, int]] = []  # (expires, key, account, seq); stale ones skipped
        self.size = 0
        self.rng = rng or random.Random()

    def __len__(self) -> int:
        return self.size

    def _drop(self, key: bytes, account: bytes) -> None:
        recs = self.by_key[key]
        del recs[account]
        if not recs:
            del self.by_key[key]
        keys = self.keys_of[account]
        keys.discard(key)
        if not keys:
            del self.keys_of[account]
        self.size -= 1

    def prune(self, now: float) -> int:
        """Drop every record with ``expires <= now`` (Unix seconds); returns how many went."""
        n = 0
        while self._expiry and self._expiry[0][0] <= now:
            _, key, account, seq = heapq.heappop(self._expiry)
            rec = self.by_key.get(key, {}).get(account)
            if rec is not None and rec.seq == seq:
                self._drop(key, account)
                n += 1
        if len(self._expiry) > 2 * self.size + 64:  # replaced records' heap entries: compact
            self._expiry = [(r.expires, k, a, r.seq) for k, recs in self.by_key.items() for a, r in recs.items()]
            heapq.heapify(self._expiry)
        return n

    def _soonest(self, records: dict[bytes, SpanRecord]) -> SpanRecord:
        return min(records.values(), key=lambda r: (r.expires, r.account))

    def _global_soonest(self) -> SpanRecord:
        """The held record that expires first: the expiry heap's top, after popping entries of replaced records."""
        while True:
            _, key, account, seq = self._expiry[0]
            rec = self.by_key.get(key, {}).get(account)
            if rec is not None and rec.seq == seq:
                return rec
            heapq.heappop(self._expiry)

    def put(self, rec: SpanRecord, now: float) -> bool:
        """Hold ``rec`` (already checked by :func:`~node.discovery.record.decode_record`); returns whether it is
        held now. Refused: an older or equal ``seq`` than the server's record under that key, a server already
        holding :data:`MAX_KEYS_PER_ACCOUNT` other keys, or a full key/store whose soonest-expiring record
        outlives ``rec``."""
        self.prune(now)
        key = span_key(rec.model_id, rec.start)
        recs = self.by_key.get(key, {})
        prev = recs.get(rec.account)
        if prev is not None:
            if rec.seq <= prev.seq:
                return False
            self._drop(key, rec.account)
        elif key not in self.keys_of.get(rec.account, set()) and \
                len(self.keys_of.get(rec.account, ())) >= self.max_keys_per_account:
            return False
        if prev is None:
            if len(recs) >= self.max_per_key:
                victim = self._soonest(recs)
                if victim.expires >= rec.expires:
                    return False
                self._drop(key, victim.account)
            elif self.size >= self.max_records:
                victim = self._global_soonest()
                if victim.expires >= rec.expires:
                    return False
                self._drop(span_key(victim.model_id, victim.start), victim.account)
        self.by_key.setdefault(key, {})[rec.account] = rec
        self.keys_of.setdefault(rec.account, set()).add(key)
        heapq.heappush(self._expiry, (rec.expires, key, rec.account, rec.seq))
        self.size += 1
        return True

    def get(self, key: bytes, now: float, limit: int = ANSWER_LIMIT) -> list[SpanRecord]:
        """Up to ``limit`` unexpired records under ``key``: all of them when they fit, else a uniform random
        sample (so that no server can push the others out of answers by what it claims), sorted by account."""
        self.prune(now)
        recs = list(self.by_key.get(key, {}).values())
        if len(recs) > limit:
            recs = self.rng.sample(recs, limit)
        return sorted(recs, key=lambda r: r.account)

    def records(self) -> list[SpanRecord]:
        """Every record held (for republishing and inspection), sorted by (key, account)."""
        return [r for k in sorted(self.by_key) for _, r in sorted(self.by_key[k].items())]

