"""Issue 36: blocks from peers in checked, resumable chunks (node/verify/chunks.py, chunkfetch.py) over real libp2p.

A 64 MiB block (over the 48 MiB a whole-file reply may carry) arrives in ranges of at most 1 MiB; a peer whose
index does not hash to the manifest is refused before any data is asked of it; a peer serving a tampered tensor
behind an honest index is caught when that tensor completes and the tensor is asked of the next peer; a fetch cut
short continues where it stopped without asking again for the tensors it checked."""

from __future__ import annotations

import json
import struct

import pytest
import trio

from node.compute.model import block_file, load_manifest
from node.models.convert import add_model
from node.models.ggufstream import Storage
from node.models.lookup import model_dir_of
from node.p2p.framing import RemoteError
from node.verify.blockcheck import check_block_file
from node.verify.blockfetch import BLOCK_PROTOCOL, MAX_FILE, REQUEST_MAX, BlockFetcher, HeldModels
from node.verify.chunkfetch import ChunkFetchFailed, fetch_file
from node.verify.chunks import CHUNK, BadIndex, file_index, parse_index
from tests.p2p.util import running_hosts

from ..models.synth_gguf import write_llama_gguf


@pytest.fixture(scope="module")
def big_block_model(tmp_path_factory):
    """One block of 16.8 M float32 parameters: a 64 MiB block file."""
    d = tmp_path_factory.mktemp("bigblock")
    src = write_llama_gguf(d / "m.gguf", blocks=2, hidden=1024, ffn=4096, heads=8, kv_heads=8, type_name="Q8_0")
    return model_dir_of(add_model(src, d / "cache", storage=Storage.FLOAT32).name, d / "cache")


def _serve(host, model_dir, tmp, calls, tamper=None, stop_after=None):
    """``host`` serves ``model_dir`` over BLOCK_PROTOCOL, recording ``(type, offset, length)``. ``tamper``: flip a
    byte at that file offset in range replies. ``stop_after``: answer ``not_found`` after that many ranges."""
    held = HeldModels(model_dir, tmp / f"held-{host.peer_id[-6:]}")

    async def handle(msg: dict, peer: str) -> dict:
        calls.append((msg.get("type"), msg.get("offset"), msg.get("length")))
        if msg.get("type") == "range" and stop_after is not None and sum(c[0] == "range" for c in calls) > stop_after:
            raise RemoteError("not_found", "gone")
        reply = await held.handle(msg, peer)
        hit = msg.get("type") == "range" and tamper is not None and 0 <= tamper - msg["offset"] < msg["length"]
        if hit:
            data = bytearray(reply["data"])
            data[tamper - msg["offset"]] ^= 0xFF
            reply = {"data": bytes(data)}
        return reply

    host.set_request_handler(BLOCK_PROTOCOL, handle, max_message=REQUEST_MAX)


def test_an_index_is_checked_before_any_data(big_block_model):
    m = load_manifest(big_block_model)
    path = big_block_model / block_file(0)
    header, commitments = file_index(path)
    idx = parse_index(header, commitments, m.block_hashes[0], 1 << 30)
    assert idx.size == path.stat().st_size > MAX_FILE
    with pytest.raises(BadIndex, match="do not hash"):
        parse_index(header, commitments, m.block_hashes[1], 1 << 30)
    with pytest.raises(BadIndex, match="over the"):
        parse_index(header, commitments, m.block_hashes[0], idx.size - 1)
    bad = dict(commitments)
    bad[next(iter(bad))] = b"\x00" * 32
    with pytest.raises(BadIndex, match="do not hash"):
        parse_index(header, bad, m.block_hashes[0], 1 << 30)
    meta = json.loads(header[8:])
    name = next(k for k in meta if k != "__metadata__")
    meta[name]["data_offsets"][1] += 4  # a range that no longer tiles the data
    body = json.dumps(meta).encode()
    with pytest.raises(BadIndex):
        parse_index(struct.pack("<Q", len(body)) + body, commitments, m.block_hashes[0], 1 << 30)
    with pytest.raises(BadIndex, match="at most 1 MiB"):
        parse_index(b"x" * 4, commitments, m.block_hashes[0], 1 << 30)


def test_a_block_over_one_reply_arrives_in_checked_chunks_and_a_tampered_tensor_goes_to_the_next_peer(
        tmp_path, big_block_model):
    m = load_manifest(big_block_model)
    header, _ = file_index(big_block_model / block_file(0))
    tamper_at = len(header) + 5 * CHUNK + 17  # inside the first (largest) tensors' bytes

    async def main():
        async with running_hosts(3) as (liar, good, me):
            calls_liar: list = []
            calls_good: list = []
            _serve(liar, big_block_model, tmp_path, calls_liar, tamper=tamper_at)
            _serve(good, big_block_model, tmp_path, calls_good)
            assert await me.connect(liar.addrs + good.addrs) == 2
            f = BlockFetcher(me, tmp_path / "fetched", lambda mid, i: [liar.peer_id, good.peer_id], timeout=30)
            d = await f.ensure(m.model_id, 0, 1)
            return d, calls_liar, calls_good, list(f.refused)

    d, calls_liar, calls_good, refused = trio.run(main)
    assert (d / block_file(0)).read_bytes() == (big_block_model / block_file(0)).read_bytes()
    assert not list(d.glob("*.part*"))
    ranges = [c for c in calls_liar + calls_good if c[0] == "range"]
    assert ranges and all(n <= CHUNK for _, _, n in ranges) and not any(c[0] == "block" for c in calls_good)
    assert [why for _, why in refused] and all("do not hash to the commitment" in why for _, why in refused)
    assert any(o <= tamper_at < o + n for _, o, n in [c for c in calls_liar if c[0] == "range"])
    assert calls_good[0][0] == "range"  # the good peer was asked only for what the liar failed, not the index again


def test_a_fetch_cut_short_resumes_without_asking_again_for_checked_tensors(tmp_path, big_block_model):
    m = load_manifest(big_block_model)
    dest = tmp_path / "out" / block_file(0)
    dest.parent.mkdir()

    async def main():
        async with running_hosts(3) as (flaky, good, me):
            first: list = []
            second: list = []
            _serve(flaky, big_block_model, tmp_path, first, stop_after=30)
            _serve(good, big_block_model, tmp_path, second)
            assert await me.connect(flaky.addrs + good.addrs) == 2

            async def request(peer, msg, max_message):
                return await me.request(peer, BLOCK_PROTOCOL, msg, timeout=30, max_message=max_message)

            install = lambda part, path: (check_block_file(part, m.block_hashes[0]), part.replace(path))  # noqa: E731
            with pytest.raises(ChunkFetchFailed, match="no peer left"):
                await fetch_file(request, [flaky.peer_id], m.model_id, 0, m.block_hashes[0], dest, 1 << 30, install)
            progress = json.loads(dest.with_name(dest.name + ".part.json").read_text())
            got = await fetch_file(request, [good.peer_id], m.model_id, 0, m.block_hashes[0], dest, 1 << 30, install)
            return first, second, progress, got

    first, second, progress, got = trio.run(main)
    assert dest.read_bytes() == (big_block_model / block_file(0)).read_bytes()
    assert progress["done"], "some tensors were checked before the peer stopped"
    first_ranges = [o for t, o, _ in first if t == "range"][:30]
    resumed = [o for t, o, _ in second if t == "range"]
    size = dest.stat().st_size
    assert got < size - 8 * CHUNK  # the second fetch did not start over
    assert min(resumed) > min(first_ranges)  # nor asked again for the first, checked tensors
    assert not dest.with_name(dest.name + ".part.json").exists()
