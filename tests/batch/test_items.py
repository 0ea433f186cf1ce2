"""The batch item file: parsing, limits and clear errors, its items_root exactly as BatchPost expects, the content
store; and the canonical result bytes of real torch work on the tiny model (score bytes equal on 1 and 2 threads,
a bf16 or corrupt worker's differ)."""

from __future__ import annotations

import json

import pytest
import torch

from node.batch.content import items_check
from node.batch.items import ContentStore, ItemsError, parse_items, result_hash
from node.batch.tasks import SCORE_GRID, ItemRunner, quantize
from node.batch.worker import SaltBook
from node.compute.model import make_tiny
from node.compute.reference import local_generate
from node.encoding import H, merkle_root, unpack
from node.ledger.core.batchtx import items_root


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_tiny(tmp_path_factory.mktemp("models"), seed=0)


def test_parse_and_root_match_the_ledger():
    data = b'{"prompt": "a"}\n{"prompt_ids": [1, 2, 3]}\n{"prompt": "\xc3\xa9t\xc3\xa9"}\n'
    f = parse_items(data, "generate")
    assert f.items == ({"prompt": "a"}, {"prompt_ids": [1, 2, 3]}, {"prompt": "été"})
    lines = [b'{"prompt": "a"}', b'{"prompt_ids": [1, 2, 3]}', b'{"prompt": "\xc3\xa9t\xc3\xa9"}']
    assert f.root == items_root(lines) == merkle_root([H(b"tally/batch-item/v1", x) for x in lines])
    assert f.data() == data
    assert parse_items(data.rstrip(b"\n"), "generate").root == f.root  # the final newline is optional
    assert items_check(f.root)(data) and not items_check(f.root)(data.replace(b"a", b"b", 1))
    assert parse_items(b'{"text": "hi"}', "score").items == ({"text": "hi"},)


@pytest.mark.parametrize("data,kind,msg", [
    (b"", "generate", "empty"),
    (b"\n\n", "score", "empty"),
    (b'{"prompt": "a"}\n{"prompt": \n', "generate", "line 2: bad JSON"),
    (b'{"prompt": "a"}\n\n{"prompt": "b"}\n', "generate", "line 2: blank"),
    (b'{"prompt": "a"}\r\n', "generate", "line 1: ends in \\r"),
    (b'[1, 2]\n', "generate", "line 1: an item is a JSON object"),
    (b'{"text": "a"}\n', "generate", 'line 1: a generate item has exactly one of'),
    (b'{"prompt": "a", "prompt_ids": [1]}\n', "generate", "exactly one of"),
    (b'{"prompt_ids": [1, -2]}\n', "generate", "non-negative ints"),
    (b'{"prompt_ids": [true]}\n', "generate", "non-negative ints"),
    (b'{"prompt": ""}\n', "generate", "non-empty string"),
    (b'{"prompt": "a"}\n', "score", 'line 1: a score item is {"text"'),
    (b'{"text": "\xff"}\n', "score", "line 1: not UTF-8"),
    (b'{"text": "a"}\n', "rank", "kind must be one of"),
])
def test_bad_files_have_clear_errors(data, kind, msg):
    with pytest.raises(ItemsError, match=None) as e:
        parse_items(data, kind)
    assert msg in str(e.value), str(e.value)


def test_limits():
    with pytest.raises(ItemsError, match="3 items; at most 2"):
        parse_items(b'{"text": "a"}\n' * 3, "score", max_items=2)
    with pytest.raises(ItemsError, match=r"line 2: .* bytes, at most"):
        parse_items(b'{"text": "a"}\n' + json.dumps({"text": "x" * 70_000}).encode(), "score")


def test_content_store_and_salt_book_survive_reopening(tmp_path):
    s = ContentStore(tmp_path)
    key = s.put_result(b"result bytes")
    assert key == result_hash(b"result bytes") and ContentStore(tmp_path).get(key) == b"result bytes"
    assert s.get(b"\0" * 32) is None and s.get(b"short") is None
    book = SaltBook(tmp_path / "commits")
    slot = (b"b" * 16, 3, 1)
    book.add(slot, key, b"s" * 32)
    assert SaltBook(tmp_path / "commits").entries == {slot: (key, b"s" * 32)}  # a restarted worker can reveal
    (tmp_path / "commits" / "junk-1-2.json").write_text("{")
    assert SaltBook(tmp_path / "commits").entries == {slot: (key, b"s" * 32)}  # junk is skipped, not fatal
    book.drop(slot)
    assert slot not in SaltBook(tmp_path / "commits").entries


TEXTS = ["To be, or not to be, that is the question:", "Whether 'tis nobler in the mind to suffer",
         "The slings and arrows of outrageous fortune,", "Or to take arms against a sea of troubles"]


def test_score_bytes_equal_across_thread_counts(tiny):
    """Honest workers on 1 and 2 torch threads produce the same bytes; a bf16 worker's differ on every text."""
    before = torch.get_num_threads()
    runner = ItemRunner(tiny)
    out = {}
    raw = {}
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            out[n] = [runner.run("score", {"text": t}, 0) for t in TEXTS]
            raw[n] = [runner.log_likelihoods(runner.tokenize(t)) for t in TEXTS]
    finally:
        torch.set_num_threads(before)
    assert out[1] == out[2]
    margin = max(abs(a - b) for x, y in zip(raw[1], raw[2], strict=False) for a, b in zip(x, y, strict=False))
    assert margin < SCORE_GRID / 100  # measured 0.0 here: far inside the grid's half step
    r0 = unpack(out[1][0])
    assert len(r0["ll_q"]) == len(r0["ids"]) - 1 and all(isinstance(v, int) and v <= 0 for v in r0["ll_q"])
    assert r0["ll_q"] == quantize(raw[1][0])
    bf16 = ItemRunner(tiny, fault="bf16")
    assert all(bf16.run("score", {"text": t}, 0) != o for t, o in zip(TEXTS, out[1], strict=False))
    corrupt = ItemRunner(tiny, fault="corrupt")
    assert all(corrupt.run("score", {"text": t}, 0) != o for t, o in zip(TEXTS, out[1], strict=False))


def test_generate_is_one_process_greedy_and_errors_are_canonical(tiny):
    runner = ItemRunner(tiny)
    ids = runner.tokenize("Shall I compare thee")
    got = unpack(runner.run("generate", {"prompt": "Shall I compare thee"}, 5))
    assert got == {"ids": local_generate(tiny, ids, 5)}
    assert unpack(runner.run("generate", {"prompt_ids": ids}, 5)) == got
    bad = unpack(ItemRunner(tiny, fault="corrupt").run("generate", {"prompt_ids": ids}, 5))
    assert bad["ids"][:-1] == got["ids"][:-1] and bad["ids"][-1] != got["ids"][-1]
    vocab, max_len = runner.manifest.vocab_size, runner.manifest.max_length
    assert unpack(runner.run("generate", {"prompt_ids": [vocab]}, 5)) == {"error": "token_out_of_vocab"}
    assert unpack(runner.run("generate", {"prompt_ids": [1] * max_len}, 5)) == {"error": "too_long"}
    assert unpack(runner.run("score", {"text": "a"}, 0)) == {"error": "too_short"}
