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
    {"accounts": "nope"}, {"accounts": [5]},
    {"accounts": [{"account": "12D3KooWRcNPtNp97U5hzRFZcN4eP4CsUScKtjSEtqXbAZKJ9p4N", "balanse": "1"}]},
])
def test_malformed_genesis_refused(change):
    from importlib import resources

    doc = json.loads(resources.files("genesis").joinpath("devnet.json").read_text())
    doc.update(change)
    with pytest.raises(GenesisError):
        parse_genesis(doc)


DEV0 = "12D3KooWRcNPtNp97U5hzRFZcN4eP4CsUScKtjSEtqXbAZKJ9p4N"


@pytest.mark.parametrize("value", [1000, 1000.0, 1e3, True, None, " 1000", "1e3", "+1000", "01000", "1000.",
                                   ".5", "\uff11", "1.0000000001", "-1", "9223372036.854775808"])
def test_genesis_amounts_use_the_one_amount_syntax(value):
    from importlib import resources

    doc = json.loads(resources.files("genesis").joinpath("devnet.json").read_text())
    for key in ("balance", "bond"):
        bad = {**doc, "accounts": [{"account": DEV0, key: value}]}
        with pytest.raises(GenesisError, match=f"{key}") as e:
            parse_genesis(json.loads(json.dumps(bad)))  # as read from a file
        msg = str(e.value)
        assert "plain decimal credits" in msg or "at most" in msg, msg


def test_genesis_amounts_are_decimal_credits_and_params_integers():
    from importlib import resources

    doc = json.loads(resources.files("genesis").joinpath("devnet.json").read_text())
    ok = {**doc, "accounts": [{"account": DEV0, "balance": "1000.5", "bond": "0"}, {"account": DEV0}]}
    g = parse_genesis(ok)
    assert g.balances[0][1:] == (1000 * 10**9 + 5 * 10**8, 0) and g.balances[1][1:] == (0, 0)
    assert parse_genesis(g.to_doc()).hash == g.hash  # the serializer writes the same syntax back
    # the embedded devnet: every balance and bond a string, the same base units as the integers it had before
    assert all(isinstance(a.get(k, ""), str) for a in doc["accounts"] for k in ("balance", "bond"))
    assert load_genesis().supply == 2_300 * 10**9
    for value in (True, 1.5, "10"):  # params stay integers of base units / ppm / blocks
        with pytest.raises(GenesisError, match="non-negative integer"):
            parse_genesis({**doc, "params": {**doc["params"], "min_bond": value}})
