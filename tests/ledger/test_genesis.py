"""Genesis loading and the refusal of parameters that make cheating profitable."""

from __future__ import annotations

import json

import pytest

from node.ledger.genesis import GenesisError, Params, load_genesis, parse_genesis


def test_embedded_devnet_loads():
    g = load_genesis()
    assert g.chain_id == "tally-devnet" and len(g.validators) == 1 and g.supply > 0


def test_profitable_cheating_is_refused():
    # p = 5%, S = 100, G = 10: p·S = 5 <= (1 − p)·G = 9.5
    with pytest.raises(GenesisError, match="cheating is profitable"):
        Params(sample_base_ppm=50_000, sample_floor_ppm=50_000, slash_amount=100, max_receipt_price=10).check()
    Params(sample_base_ppm=50_000, sample_floor_ppm=50_000, slash_amount=1000, max_receipt_price=10).check()


@pytest.mark.parametrize("change", [
    {"chain_id": ""}, {"validators": []}, {"validators": ["nope"]},
    {"params": {"unknown_param": 1}}, {"params": {"committee_size": 0}},
    {"accounts": [{"account": "12D3KooWRcNPtNp97U5hzRFZcN4eP4CsUScKtjSEtqXbAZKJ9p4N", "balance": -5}]},
])
def test_malformed_genesis_refused(change):
    from importlib import resources

    doc = json.loads(resources.files("genesis").joinpath("devnet.json").read_text())
    doc.update(change)
    with pytest.raises(GenesisError):
        parse_genesis(doc)
