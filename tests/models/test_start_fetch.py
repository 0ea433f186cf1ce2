"""Issue 36: ``node start --model MODEL_ID`` of a model the cache lacks fetches it first (the fetch itself, across
processes, is tests/models/test_large_swarm.py's fifth server); what it refuses, before any byte is fetched, and the
message for a span whose blocks this machine's copy lacks."""

from __future__ import annotations

from argparse import Namespace

import pytest

from node.cliargs import check_span_held, fetch_missing_model
from node.compute.model import block_file, load_manifest, make_tiny
from node.ledger.genesis import load_genesis

ID = "ab" * 32


def _args(tmp_path, model: str, span) -> Namespace:
    return Namespace(model=model, model_cache=tmp_path / "cache", span=span)


def test_a_missing_model_id_needs_peers_and_a_span(tmp_path):
    genesis = load_genesis(None)
    with pytest.raises(SystemExit, match="no --bootstrap peers to fetch it from"):
        fetch_missing_model(_args(tmp_path, ID, (0, 2)), genesis, [])
    with pytest.raises(SystemExit, match="give --span A:B"):
        fetch_missing_model(_args(tmp_path, ID, ("auto", None)), genesis, ["/ip4/127.0.0.1/tcp/1/p2p/x"])
    assert not (tmp_path / "cache").exists()  # nothing written
    fetch_missing_model(_args(tmp_path, "tiny", (0, 2)), genesis, [])  # a name, not an id: nothing to fetch


def test_a_span_whose_blocks_are_missing_says_how_to_fetch_them(tmp_path):
    d = make_tiny(tmp_path / "cache", seed=0)
    check_span_held(_args(tmp_path, "tiny", (0, 2)), d, 2)  # all there: no exit
    (d / block_file(1)).unlink()
    mid = load_manifest(d).model_id.hex()
    with pytest.raises(SystemExit, match=f"lacks blocks 1; fetch them with 'node model fetch {mid} --from PEER "
                                         "--blocks 0:2"):
        check_span_held(_args(tmp_path, "tiny", (0, 2)), d, 2)
