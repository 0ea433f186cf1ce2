"""Span records and the bounded record store (pure: fake clocks, real Ed25519 signatures)."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings, strategies as st

from node.discovery.keys import span_key
from node.discovery.record import (
    CLOCK_SKEW,
    MAX_RECORD_BYTES,
    MAX_TTL,
    RecordError,
    SpanRecord,
    decode_record,
    sign_record,
)
from node.discovery.store import RecordStore
from node.encoding import pack
from node.keys import Identity

MODEL = bytes(range(32))
NOW = 1_800_000_000


def ident(i: int) -> Identity:
    return Identity.from_seed(i.to_bytes(32, "big"))


def rec(i: int, start: int = 0, end: int = 4, seq: int = 1, expires: int = NOW + 300, model: bytes = MODEL,
        **kw) -> SpanRecord:
    return sign_record(ident(i), model, start, end, seq=seq, expires=expires, **kw)


def test_a_record_round_trips_and_every_changed_byte_is_refused():
    r = rec(1, 2, 7, throughput=12.5, latency=0.02, free_cache=4096, addrs=("/ip4/127.0.0.1/tcp/4001",))
    data = r.encode()
    assert decode_record(data, NOW) == r
    for i in range(len(data)):
        bad = bytearray(data)
        bad[i] ^= 0x01
        with pytest.raises(RecordError):
            decode_record(bytes(bad), NOW)


def test_expiry_is_checked_against_the_readers_clock():
    r = rec(1, expires=NOW + 300)
    with pytest.raises(RecordError, match="expired"):
        decode_record(r.encode(), NOW + 300)
    with pytest.raises(RecordError, match="from now"):  # a storer cannot serve a record with a far expiry
        decode_record(r.encode(), NOW + 300 - MAX_TTL - CLOCK_SKEW - 1)
    assert decode_record(r.encode(), NOW + 299).seq == 1


def test_another_servers_signature_and_oversized_or_malformed_records_are_refused():
    r = rec(1)
    forged = SpanRecord(**{**r.__dict__, "account": ident(2).account})
    with pytest.raises(RecordError, match="signature"):
        decode_record(forged.encode(), NOW)
    with pytest.raises(RecordError, match="at most"):
        decode_record(b"\x90" * (MAX_RECORD_BYTES + 1), NOW)
    for junk in (pack([1, 2, 3]), pack({"a": 1}), b"\xc1", pack([b"x"] * 11)):
        with pytest.raises(RecordError):
            decode_record(junk, NOW)
    with pytest.raises(RecordError, match="span"):
        rec(1, 5, 5)
    with pytest.raises(RecordError, match="addresses"):
        rec(1, addrs=("x" * 300,))


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=600))
def test_random_bytes_never_decode_to_a_record(data):
    with pytest.raises(RecordError):
        decode_record(data, NOW)


def test_a_newer_seq_replaces_and_an_older_one_is_refused():
    s = RecordStore()
    assert s.put(rec(1, seq=5), NOW)
    assert not s.put(rec(1, seq=5), NOW) and not s.put(rec(1, seq=4), NOW)
    assert s.put(rec(1, seq=6, throughput=3.0), NOW)
    assert len(s) == 1 and s.get(span_key(MODEL, 0), NOW)[0].throughput == 3.0


def test_records_expire_and_leave_nothing_behind():
    s = RecordStore()
    for i in range(50):
        assert s.put(rec(i, expires=NOW + 10 + i), NOW)
    assert len(s.get(span_key(MODEL, 0), NOW, limit=100)) == 50
    assert s.prune(NOW + 34) == 25  # expiries NOW+10 .. NOW+34
    assert len(s) == 25 and len(s.get(span_key(MODEL, 0), NOW + 34, limit=100)) == 25
    s.prune(NOW + 100)
    assert len(s) == 0 and not s.by_key and not s.keys_of


def test_a_full_key_keeps_the_records_that_outlive_a_flood_of_new_identities():
    s = RecordStore(max_per_key=16)
    for i in range(16):
        assert s.put(rec(i, expires=NOW + 600), NOW)
    flood = [rec(1000 + i, expires=NOW + 300) for i in range(64)]  # shorter-lived: refused
    assert not any(s.put(r, NOW) for r in flood)
    assert {r.account for r in s.get(span_key(MODEL, 0), NOW, limit=64)} == {ident(i).account for i in range(16)}
    assert s.put(rec(2000, expires=NOW + 700), NOW)  # a longer-lived record displaces the soonest-expiring one
    assert len(s.by_key[span_key(MODEL, 0)]) == 16


def test_the_whole_store_and_each_server_are_bounded():
    s = RecordStore(max_per_key=1000, max_records=100, max_keys_per_account=2)
    for i in range(400):
        s.put(rec(i, start=i % 20, end=20, expires=NOW + 100 + i), NOW)
        assert len(s) <= 100
    assert len(s) == 100 and sum(len(v) for v in s.by_key.values()) == 100
    assert min(r.expires for r in s.records()) == NOW + 400  # the latest-expiring hundred were kept
    one = RecordStore(max_keys_per_account=2)
    assert one.put(rec(7, start=0), NOW) and one.put(rec(7, start=1), NOW)
    assert not one.put(rec(7, start=2), NOW)  # a third key for one server
    assert one.put(rec(7, start=1, seq=2), NOW)  # a refresh of a key it holds


def test_answers_are_bounded_and_sampled_from_everyone():
    s = RecordStore(rng=random.Random(0))
    for i in range(200):
        s.put(rec(i), NOW)
    seen: set[bytes] = set()
    for _ in range(40):
        got = s.get(span_key(MODEL, 0), NOW, limit=32)
        assert len(got) == 32
        seen |= {r.account for r in got}
    assert len(seen) > 150  # not the same 32 every time
    assert s.get(span_key(bytes(32), 0), NOW) == []  # another model: nothing
