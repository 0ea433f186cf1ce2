"""Every supported architecture served through real ``node start`` processes over libp2p (issue 26's test audit).

Per architecture (one devnet each, module-scoped): the tiny random checkpoint added with ``node model add`` into one
model cache (``tests/models/conftest.py``) is served by three processes started with ``--model tiny-<arch>
--model-cache <cache>``: dev key 0 validates and is the client (no span), dev key 1 serves blocks [0, 2) and takes
fine-tune jobs, dev key 2 serves blocks [2, 4). Every process has its own LevelDB ledger in a tmp dir and reaches the
others over TCP on 127.0.0.1.

* Generation: 8 greedy tokens through the validator's ``POST /v1/generate`` route through both span servers and
  equal ``local_generate`` of the same model dir and the untouched transformers checkpoint, in this process; both
  servers' receipts are sampled and voted valid by the other server (its committee) on the ledger.
* Fine-tune: a 4-step LoRA job posted through ``POST /v1/jobs`` is accepted and trained by key 1 in two segments,
  each replayed by a committee (key 2, the only bonded account that is neither worker nor requester) from the
  state the worker committed and voted valid; the adapter is delivered, the job settles, as the validator's API
  reports it, and the requester fetches the adapter from the worker (``POST /v1/jobs/<id>/fetch``).
"""

from __future__ import annotations

import math
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import torch

from node.compute.reference import local_generate
from node.ledger.core.jobstate import SETTLED, TERMINAL
from node.ledger.core.status import VALID_S

from ..inference.procs import (
    api_call,
    api_get,
    free_port,
    peer,
    spawn,
    stop_all,
    tail,
    validator_addr,
    wait_final_api,
    wait_info,
    write_genesis,
)
from .conftest import ARCHS, DESIGN

pytestmark = pytest.mark.slow  # per architecture three processes that each import torch, transformers and libp2p

PROMPT = "The committee re-executes a sampled receipt"
TOKENS = 8  # greedy tokens: with the prompt, more positions than the sliding window of 4
SERVERS = {1: (0, 2), 2: (2, 4)}  # dev key -> span served
WORKER, MEMBER = 1, 2  # key 1 takes jobs; key 2 is then the only eligible committee member
JOB = dict(steps=4, segment_steps=2, batch_size=2, seq_len=16, rank=4, targets="q_proj,v_proj", lr=1e-2, seed=3,
           price_per_step="0.01")


def model_name(model_type: str) -> str:
    """The name ``tests/models/conftest.py``'s ``added`` fixture gave the architecture in the model cache."""
    return f"tiny-{model_type.replace('_', '-')}"


@dataclass
class Devnet:
    model_type: str
    model_dir: Path  # the converted Tally model dir the processes serve (from the same cache)
    tmp: Path
    infos: dict[int, dict]  # dev key -> its node.json (api URL, addrs, pid)


@pytest.fixture(scope="module", params=list(ARCHS))
def devnet(request, added, tmp_path_factory):
    """A validator-client and two span servers of one architecture, each its own ``node start`` process."""
    model_type = request.param
    cache, dirs = added
    tmp = tmp_path_factory.mktemp(f"arch-{model_type}")
    # committee members fetch blobs and re-execute on shared cores (seen: 26 s under load in tests/inference): a
    # round gets 300 blocks (>= 60 s) before it escalates; with only two accounts bonded an escalated round has no
    # member left and the receipt would settle unverified
    gfile = write_genesis(tmp, servers=list(SERVERS), clients=[0], verdict_timeout=300)
    port = free_port()
    name = model_name(model_type)
    procs = {0: spawn(tmp, 0, gfile, cache, "--port", str(port), model=name)}
    try:
        for k, (a, b) in SERVERS.items():
            procs[k] = spawn(tmp, k, gfile, cache, "--span", f"{a}:{b}", "--bootstrap", validator_addr(port),
                             "--step-timeout", "30", *(["--accept-jobs"] if k == WORKER else []), model=name)
        # up to 300 s each: on two shared cores the imports alone were seen to take 150 s
        infos = {k: wait_info(tmp, k, p, 300) for k, p in procs.items()}
        yield Devnet(model_type, dirs[model_type], tmp, infos)
    except BaseException:
        _print_tails(tmp, procs)
        raise
    finally:
        stop_all(procs.values())


def _print_tails(tmp: Path, keys) -> None:
    for k in keys:
        print(f"--- node {k} ---", tail(tmp, k), sep="\n")


@contextmanager
def logs_on_failure(net: Devnet):
    """Print the end of every process's log when the body fails (pytest shows it with the failure)."""
    try:
        yield
    except BaseException:
        _print_tails(net.tmp, net.infos)
        raise


def generate(net: Devnet, body: dict, timeout: float = 180.0) -> dict:
    """``POST /v1/generate`` on the validator; retried while it answers 503 ``no_route`` (the servers'
    announcements not heard yet), for at most ``timeout`` seconds."""
    info = net.infos[0]
    token = (net.tmp / "p0" / "api_token").read_text().strip()
    deadline = time.monotonic() + timeout
    while True:
        r = httpx.post(info["api"] + "/v1/generate", json=body, headers={"Authorization": f"Bearer {token}"},
                       timeout=120.0)
        if r.status_code != 503 or time.monotonic() > deadline:
            assert r.status_code == 200, f"{r.status_code} {r.text[:500]}"
            return r.json()
        time.sleep(1.0)


def test_generation_through_span_server_processes(devnet, checkpoints):
    """8 greedy tokens through two span-server processes equal the model run whole in this process, and each
    server's receipt is voted valid by the other server."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    net = devnet
    with logs_on_failure(net):
        out = generate(net, {"prompt": PROMPT, "max_new_tokens": TOKENS})
        ids = AutoTokenizer.from_pretrained(str(net.model_dir)).encode(PROMPT)
        assert out["prompt_ids"] == ids  # the node tokenized with the model's own tokenizer
        hf = AutoModelForCausalLM.from_pretrained(str(checkpoints[net.model_type]), dtype=torch.float32).eval()
        want = local_generate(net.model_dir, ids, TOKENS)
        assert out["tokens"] == want == local_generate(net.model_dir, ids, TOKENS, model=hf)
        assert len(set(want)) > 2, want  # not a degenerate model: positions and inputs matter
        assert [(h["peer"], h["span"]) for h in out["route"]] == [(peer(k), list(s)) for k, s in SERVERS.items()]
        assert len(out["receipts"]) == len(SERVERS)
        recs = wait_final_api(net.infos[0], out["receipts"], timeout=240)
    for rec in recs.values():
        worker = next(k for k in SERVERS if peer(k) == rec["worker"])
        other = peer(MEMBER if worker == WORKER else WORKER)
        assert rec["kind"] == "inference" and rec["requester"] == peer(0)
        assert rec["span"] == list(SERVERS[worker]) and rec["tokens"] == len(ids) + TOKENS - 1
        assert rec["status"] == VALID_S, (rec["status"], rec["round"], rec["votes"])
        assert rec["committee"] == [other] and [v["voter"] for v in rec["votes"]] == [other], rec["votes"]
        assert all(v["verdict"] == "valid" for v in rec["votes"]), rec["votes"]


def test_lora_job_trained_and_voted_valid(devnet):
    """A LoRA fine-tune job posted through the API is trained by a server process, each of its segments replayed
    by the committee (the other server) and voted valid, the job settles on the ledger and its adapter is fetched."""
    net = devnet
    validator = net.infos[0]
    with logs_on_failure(net):
        posted = api_call(net.tmp, 0, "POST", "/v1/jobs",
                          json={"title": net.model_type, "text": DESIGN.read_text(), **JOB})
        jid = posted["job_id"]
        job = wait_job(validator, jid, timeout=300)
        assert job["status"] == SETTLED, (job["status"], job["status_text"], job["segments"])
        seg_recs = {s["receipt"]: api_get(validator, f"/v1/receipts/{s['receipt']}") for s in job["segments"]}
        out = net.tmp / "adapter"
        fetched = api_call(net.tmp, 0, "POST", f"/v1/jobs/{jid}/fetch", json={"out_dir": str(out)})
    assert job["worker"] == peer(WORKER) and job["requester"] == peer(0)
    assert job["steps_done"] == JOB["steps"] and job["adapter"]
    assert len(job["losses"]) == 2 and all(x is not None and x > 0 for x in job["losses"]), job["losses"]
    assert [s["steps"] for s in job["segments"]] == [[0, 2], [2, 4]]
    assert len(seg_recs) == 2
    for rec in seg_recs.values():
        assert rec["kind"] == "training" and rec["worker"] == peer(WORKER)
        assert rec["status"] == VALID_S, (rec["status"], rec["round"], rec["votes"])
        assert rec["committee"] == [peer(MEMBER)], rec["committee"]
        assert [(v["voter"], v["verdict"]) for v in rec["votes"]] == [(peer(MEMBER), "valid")], rec["votes"]
    # the requester paid exactly the price: the job's escrow is spent on the valid segment, nothing refunded
    assert job["paid"]["base_units"] == job["price"]["base_units"] != "0" and job["refunded"]["base_units"] == "0"
    # the delivered adapter came over libp2p from the worker process and loads on the base model
    assert fetched["adapter"] == job["adapter"] and (out / "adapter_model.safetensors").exists(), fetched
    losses = [fetched["heldout_loss_base"], fetched["heldout_loss_adapter"]]
    assert all(math.isfinite(x) and x > 0 for x in losses), fetched


def wait_job(info: dict, jid: str, timeout: float) -> dict:
    """Until the job ``jid`` (hex) is terminal on the node's ledger (settled, failed, ...); returns its JSON."""
    deadline = time.monotonic() + timeout
    job = None
    while time.monotonic() < deadline:
        job = api_get(info, f"/v1/jobs/{jid}", missing_ok=True)
        if job is not None and job["status"] in TERMINAL:
            return job
        time.sleep(1.0)
    raise AssertionError(f"job {jid[:12]} not terminal within {timeout} s: "
                         f"{job and (job['status'], job['steps_done'], job['segments'])}")
