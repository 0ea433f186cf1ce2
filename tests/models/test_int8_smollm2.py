"""Issue 15, check 2 with the real model (slow): the SmolLM2-135M GGUF converted to float32 and its int8 copy
(``node model add smollm2 --quantize int8``) serve side by side in one devnet of ``node start`` processes on
127.0.0.1 — a validator that is also the client (dev key 0), float servers of blocks [0, 15) and [15, 30) (keys 1,
2), int8 servers of the same spans (keys 3, 4). A client of each model gets the tokens of that model generated in
one process; every receipt is sampled and its committee (servers of either model: a member of the other model
fetches the blocks by content hash) votes it valid. Then the float server of [15, 30) unbonds and stops, and a
server that runs the int8 weights under the float model's id (``--fault int8``, key 5) takes its place: its
receipt is voted invalid and its bond slashed. Credits are conserved. Uses the default model cache
(``ensure_smollm2``; the int8 copy is made there once)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from node.compute.model import default_cache_dir, ensure_smollm2, load_manifest
from node.compute.reference import local_generate
from node.ledger.core.status import INVALID_S, VALID_S
from node.models import registry
from node.models.convert import add_model

from ..inference.procs import (
    api_call,
    api_get,
    free_port,
    genesis_supply,
    peer,
    spawn,
    stop_all,
    tail,
    validator_addr,
    wait_final_api,
    wait_info,
    write_genesis,
)

PROMPT = "The three most important inventions in human history are"
NEW = 16
FLOAT = {1: (0, 15), 2: (15, 30)}  # dev key -> span of the float model
INT8 = {3: (0, 15), 4: (15, 30)}  # of the int8 copy
LIAR = 5  # joins later: int8 weights under the float id, blocks [15, 30)


def int8_copy(cache: Path, float_dir: Path) -> Path:
    """The int8 copy of ``float_dir`` in ``cache`` (made with ``add_model`` when the registry has none)."""
    for e in registry.load(cache):
        if e.quantization == "int8" and Path(e.source) == float_dir:
            return cache / e.dir
    return cache / add_model(Path("smollm2"), cache, quantize="int8").dir


def _generate(tmp: Path, model: str, token_ids: list[int]) -> dict:
    return api_call(tmp, 0, "POST", "/v1/generate", json={"prompt_ids": token_ids, "max_new_tokens": NEW,
                                                            "model": model})


def _wait_servers(info: dict, model_id: str, spans: dict[str, list[int]], timeout: float = 300) -> None:
    """Until the node's ``/v1/swarm`` lists exactly ``spans`` (peer -> span) as the live servers of ``model_id``."""
    deadline = time.monotonic() + timeout
    seen = None
    while time.monotonic() < deadline:
        seen = {s["peer"]: s["span"] for s in api_get(info, "/v1/swarm")["servers"] if s["model_id"] == model_id}
        if seen == spans:
            return
        time.sleep(0.5)
    raise AssertionError(f"servers of {model_id[:12]}: {seen}, expected {spans}")


@pytest.mark.slow  # six `node start` processes load the real model (two of them the int8 copy) on shared cores
# quarantined at stop 45: in CI's second run at 18e793b an honest receipt ended `valid` after its committee escalated
# to round 1, but not every vote on it said valid (the log cut the votes short: an abstention under load or an
# invalid vote, not known); it passed in the run before and at stop 44. The assertion now prints every vote, so
# the next failure says which. Runs with -m quarantine.
@pytest.mark.quarantine
def test_smollm2_and_its_int8_copy_side_by_side_and_an_int8_server_claiming_float_is_voted_invalid(tmp_path):
    fdir = ensure_smollm2()
    cache = default_cache_dir()
    assert fdir.parent == cache
    qdir = int8_copy(cache, fdir)
    fid, qid = load_manifest(fdir).model_id.hex(), load_manifest(qdir).model_id.hex()
    assert fid != qid
    qname = next(e.name for e in registry.load(cache) if cache / e.dir == qdir)
    # every receipt sampled (p = 1: the deterrence rule p·S > (1 − p)·G holds for any slash); a round gets 120
    # blocks of 500 ms before it escalates (members of the other model fetch 15 real blocks first); quiet when idle
    gfile = write_genesis(tmp_path, servers=[*FLOAT, *INT8], clients=[LIAR], block_time_ms=500,
                          verdict_timeout=120, heartbeat_ms=5000, sample_base_ppm=1_000_000,
                          sample_floor_ppm=1_000_000)
    supply0 = genesis_supply(gfile)
    procs = {}
    times: dict[str, float] = {}
    try:
        t0 = time.monotonic()
        port = free_port()
        boot = ("--bootstrap", validator_addr(port))
        procs[0] = spawn(tmp_path, 0, gfile, cache, "--port", str(port), model="smollm2")
        v = wait_info(tmp_path, 0, procs[0], timeout=300)
        for k, (s, e) in FLOAT.items():
            procs[k] = spawn(tmp_path, k, gfile, cache, "--span", f"{s}:{e}", *boot, model="smollm2")
        for k, (s, e) in INT8.items():
            procs[k] = spawn(tmp_path, k, gfile, cache, "--span", f"{s}:{e}", *boot, model=qname)
        for k in [*FLOAT, *INT8]:
            wait_info(tmp_path, k, procs[k], timeout=600)
        _wait_servers(v, fid, {peer(k): list(sp) for k, sp in FLOAT.items()})
        _wait_servers(v, qid, {peer(k): list(sp) for k, sp in INT8.items()})
        times["up"] = time.monotonic() - t0

        from transformers import AutoTokenizer

        ids = AutoTokenizer.from_pretrained(fdir, trust_remote_code=False)(PROMPT)["input_ids"]
        t1 = time.monotonic()
        gen_f = _generate(tmp_path, "smollm2", ids)
        gen_q = _generate(tmp_path, qname, ids)
        recs = wait_final_api(v, gen_f["receipts"] + gen_q["receipts"], timeout=600)
        times["both models"] = time.monotonic() - t1

        # the float server of [15, 30) leaves (unbonds once its receipts are final, then stops); the liar bonds
        # and serves that span under the float id
        api_call(tmp_path, 2, "POST", "/v1/unbond", json={"amount": "200"})
        procs[LIAR] = spawn(tmp_path, LIAR, gfile, cache, "--span", "15:30", *boot, "--fault", "int8",
                            model="smollm2")
        liar_info = wait_info(tmp_path, LIAR, procs[LIAR], timeout=600)
        _wait_bond(v, 2, 0)
        stop_all([procs.pop(2)])
        api_call(tmp_path, LIAR, "POST", "/v1/bond", json={"amount": "200"})
        _wait_bond(v, LIAR, 200 * 10**9)
        _wait_servers(v, fid, {peer(1): [0, 15], peer(LIAR): [15, 30]}, timeout=120)
        t2 = time.monotonic()
        gen_l = _generate(tmp_path, "smollm2", ids)
        recs_l = wait_final_api(v, gen_l["receipts"], timeout=600)
        times["liar"] = time.monotonic() - t2
        liar_acc = api_get(v, f"/v1/accounts/{peer(LIAR)}")
        status = api_get(v, "/v1/status")
        assert liar_info["pid"] == procs[LIAR].pid
        print("phase times (s):", {k: round(x, 1) for k, x in times.items()})
    except BaseException:
        for k in procs:
            print(f"--- node {k} ---", tail(tmp_path, k), sep="\n")
        raise
    finally:
        stop_all(procs.values())

    # a client of each model gets the text of that model in one process, through that model's servers only
    assert gen_f["tokens"] == local_generate(fdir, ids, NEW)
    assert gen_q["tokens"] == local_generate(qdir, ids, NEW)
    assert [h["peer"] for h in gen_f["route"]] == [peer(1), peer(2)]
    assert [h["peer"] for h in gen_q["route"]] == [peer(3), peer(4)]
    for rid in gen_f["receipts"] + gen_q["receipts"]:  # sampled, re-executed, valid
        r = recs[rid]
        assert r["model_id"] == (fid if rid in gen_f["receipts"] else qid)
        assert r["status"] == VALID_S and r["votes"] and all(x["verdict"] == "valid" for x in r["votes"]), \
            (rid.hex() if isinstance(rid, bytes) else rid, r["status"], r["votes"])
    # a member of the other model voted on some receipt (it fetched that model's blocks by content hash)
    other = [x["voter"] for rid in gen_f["receipts"] for x in recs[rid]["votes"] if x["voter"] in map(peer, INT8)]
    other += [x["voter"] for rid in gen_q["receipts"] for x in recs[rid]["votes"] if x["voter"] in map(peer, FLOAT)]
    assert other, "every vote came from a node of the receipt's own model"

    # the int8 server under the float id: its receipt voted invalid, its bond slashed; the honest hop valid
    assert [h["peer"] for h in gen_l["route"]] == [peer(1), peer(LIAR)]
    by_worker = {recs_l[rid]["worker"]: recs_l[rid] for rid in gen_l["receipts"]}
    assert by_worker[peer(LIAR)]["status"] == INVALID_S, by_worker[peer(LIAR)]
    assert by_worker[peer(1)]["status"] == VALID_S
    assert int(liar_acc["slashed"]["base_units"]) > 0
    assert int(status["supply"]["base_units"]) == supply0


def _wait_bond(info: dict, key: int, bond: int, timeout: float = 120) -> None:
    """Until dev key ``key``'s bond on the node's ledger is ``bond`` base units."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if int(api_get(info, f"/v1/accounts/{peer(key)}")["bond"]["base_units"]) == bond:
            return
        time.sleep(0.5)
    raise AssertionError(f"bond of dev key {key} is not {bond} within {timeout} s")
