"""Collaborative training runs through the API, the explorer and ``node run``: a live in-process swarm (real
libp2p on 127.0.0.1, real LevelDB, the tiny random Llama) for post / join / leave / cancel / fetch, and the pure
ledger state machine driven through whole rounds for the pages of a run with history."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import torch

from node.api.pages import environment, run_charts
from node.compute.data import dataset_bytes
from node.encoding import commitments_root
from node.ledger.core.runs import RunStatus
from node.ledger.core.runstate import runs_of
from node.ledger.core.tx import INVALID
from node.training.api import run_view
from node.training.cli import _summary
from node.training.inner import InnerTrainer
from node.web.views import acct

from ..ledger.test_runs import WORKERS, Chain, start
from .conftest import LiveSwarm, get, post

ROOT = Path(__file__).resolve().parents[2]
TEXT = (ROOT / "docs" / "DESIGN.md").read_text()[:6000]
# a run on the tiny model that needs 3 workers: with the swarm's 2 bonded servers it stays waiting (cancellable)
RUN = dict(title="<b>shared</b> run", text=TEXT, rank=4, targets="q_proj,v_proj", seed=7, lr=0.01, batch_size=2,
           seq_len=16, inner_steps=2, screen_windows=1, rounds=2, min_workers=3, max_workers=3,
           price_per_step="0.5", aggregator_fee="0.25", round_timeout=20, deadline_blocks=5000)


@pytest.fixture(scope="module")
def live(tmp_path_factory, tiny):
    s = LiveSwarm(tmp_path_factory.mktemp("runs"), tiny, spans=[(0, 3), (3, 6)]).start()
    try:
        yield s
    finally:
        s.stop()


def wait_run(live, run_id: str, pred=lambda r: True, timeout: float = 20.0, node=None) -> dict:
    """Poll ``GET /v1/runs/{id}`` on ``node``'s API (default: the sponsor's; each node has its own replica of the
    ledger) until the run is on its ledger and ``pred`` holds (bounded)."""
    end = time.monotonic() + timeout
    api = node.api_url if node is not None else live.api
    while time.monotonic() < end:
        r = get(f"{api}/v1/runs/{run_id}")
        if r.status_code == 200 and pred(r.json()):
            return r.json()
        time.sleep(0.2)
    raise AssertionError(f"run {run_id} did not reach the expected state in {timeout} s: "
                         f"{r.status_code} {r.text[:300]}")


def call(node, method: str, path: str, **kw) -> httpx.Response:
    """A request to ``node``'s own API with its own token (each node signs with its own key)."""
    return httpx.request(method, node.api_url + path, timeout=60,
                         headers={"Authorization": f"Bearer {node.api_token}"}, **kw)


def ledger_view(live):
    """What a refused post must not change: mempool, the sponsor's account, the runs, the stored blobs."""
    def snap():
        c = live.client
        return (set(c.ledger.mempool), c.ledger.state.account(c.ident.account), dict(runs_of(c.ledger.state)),
                sorted(p.name for p in c.blobs.dir.iterdir()))
    return live.call(snap)


@pytest.fixture(scope="module")
def posted(live):
    """One LoRA run posted through the API, on the ledger."""
    acc0 = live.call(lambda: live.client.ledger.state.account(live.client.ident.account))
    r = post(f"{live.api}/v1/runs", json=RUN, headers=live.auth)
    assert r.status_code == 200, r.text
    out = r.json()
    run = wait_run(live, out["run_id"])
    return out, run, acc0


def test_post_escrows_the_budget_and_serves_theta0(live, tiny, posted):
    out, run, acc0 = posted
    c = live.client
    rid = bytes.fromhex(out["run_id"])
    on_ledger = live.call(lambda: runs_of(c.ledger.state)[rid])
    p = on_ledger.post
    # budget = rounds × (max_workers × inner_steps × price_per_step + aggregator_fee), all in escrow
    budget = 2 * (3 * 2 * 500_000_000 + 250_000_000)
    assert p.budget == budget == int(out["budget"]["base_units"]) == int(run["budget"]["base_units"])
    acc = live.call(lambda: c.ledger.state.account(c.ident.account))
    assert acc.escrow - acc0.escrow == budget and acc0.balance - acc.balance == budget
    assert on_ledger.status == RunStatus.WAITING and on_ledger.escrow_left == budget
    assert (p.sender, p.model_id, p.trainable, p.rank, p.targets, p.seed) == (
        c.ident.account, c.manifest.model_id, "lora", 4, "q_proj,v_proj", 7)
    # the documented defaults for what RUN leaves out
    assert (p.lr_micro, p.outer_lr_ppm, p.outer_momentum_ppm, p.nesterov, p.clip_ppm, p.codec, p.inner_state,
            p.sample_ppm) == (10_000, 1_000_000, 0, 1, 2_000_000, "int8", "reset", 100_000)
    assert p.title == RUN["title"] and run["title"] == RUN["title"]
    # θ_0 is InnerTrainer's seeded init on the node's model, computed here independently, and stored by that id
    theta0 = InnerTrainer(tiny, "lora", 4, ("q_proj", "v_proj"), 0.01, 7).params()
    assert p.params0 == commitments_root(theta0) == bytes.fromhex(out["params0"]) == on_ledger.params
    assert live.call(lambda: c.blobs.has(p.params0))
    from node.blobs import decode_blob

    stored = live.call(lambda: decode_blob(c.blobs.get_wire(p.params0), p.params0))
    assert all(torch.equal(a, b) for a, b in zip(stored, theta0, strict=True)) and len(stored) == len(theta0)
    data = live.call(lambda: decode_blob(c.blobs.get_wire(p.dataset_root), p.dataset_root))
    assert dataset_bytes(data) == TEXT.encode()  # the dataset blob, as job datasets are stored
    # listed, and filtered by status
    listed = get(f"{live.api}/v1/runs").json()
    assert out["run_id"] in [x["run_id"] for x in listed["runs"]]
    assert out["run_id"] in [x["run_id"] for x in get(f"{live.api}/v1/runs?status=waiting").json()["runs"]]
    assert out["run_id"] not in [x["run_id"] for x in get(f"{live.api}/v1/runs?status=training").json()["runs"]]
    assert get(f"{live.api}/v1/runs?status=bogus").status_code == 422
    assert run["ledger"]["params"] == p.params0.hex() and run["rounds_detail"] == [] and run["current"] is None


def test_fetch_writes_a_peft_adapter_checked_against_the_ledger(live, posted, tmp_path):
    out, _, _ = posted
    r = post(f"{live.api}/v1/runs/{out['run_id']}/fetch", json={"out_dir": str(tmp_path / "a")}, headers=live.auth)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["params"] == out["params0"] and body["round"] == 0 and body["trainable"] == "lora"
    from safetensors.torch import load_file

    sd = load_file(str(tmp_path / "a" / "adapter_model.safetensors"))
    cfg = json.loads((tmp_path / "a" / "adapter_config.json").read_text())
    assert cfg["r"] == 4 and sorted(cfg["target_modules"]) == ["q_proj", "v_proj"] and cfg["peft_type"] == "LORA"
    theta0 = InnerTrainer(live.model_dir, "lora", 4, ("q_proj", "v_proj"), 0.01, 7)
    want = {n.replace(".default", ""): t for n, t in zip(theta0.names, theta0.params(), strict=True)}
    assert sd.keys() == want.keys() and all(torch.equal(sd[k], want[k]) for k in want)
    # θ = θ_0 (LoRA B = 0): the held-out loss is the base model's
    assert body["heldout_loss_initial"] == pytest.approx(body["heldout_loss"], abs=1e-6)
    assert post(f"{live.api}/v1/runs/{out['run_id']}/fetch", json={"out_dir": "x"}).status_code == 401
    bad = post(f"{live.api}/v1/runs/{'0' * 32}/fetch", json={"out_dir": str(tmp_path / "b")}, headers=live.auth)
    assert bad.status_code == 404 and not (tmp_path / "b").exists()


def test_all_parameter_run_fetches_as_model_safetensors(live, tmp_path):
    from transformers import LlamaForCausalLM

    body = dict(RUN, title="all", trainable="all", codec="none")
    r = post(f"{live.api}/v1/runs", json=body, headers=live.auth)
    assert r.status_code == 200, r.text
    run_id = r.json()["run_id"]
    run = wait_run(live, run_id)
    assert run["settings"]["trainable"] == "all" and run["settings"]["targets"] == []
    f = post(f"{live.api}/v1/runs/{run_id}/fetch", json={"out_dir": str(tmp_path / "m")}, headers=live.auth)
    assert f.status_code == 200, f.text
    model, info = LlamaForCausalLM.from_pretrained(str(tmp_path / "m"), output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    trainer = InnerTrainer(live.model_dir, "all", 0, (), 0.01, 7)
    assert commitments_root(trainer.params()) == bytes.fromhex(r.json()["params0"])
    sd = model.state_dict()
    assert all(torch.equal(sd[n], t) for n, t in zip(trainer.names, trainer.params(), strict=True))
    assert call(live.client, "POST", f"/v1/runs/{run_id}/cancel").status_code == 200


def test_join_leave_cancel(live, posted):
    out, _, _acc0 = posted
    rid = out["run_id"]
    sponsor, w1, w2 = live.nodes
    assert call(w1, "POST", f"/v1/runs/{rid}/join").status_code == 200
    assert call(w2, "POST", f"/v1/runs/{rid}/join").status_code == 200
    run = wait_run(live, rid, lambda r: len(r["workers"]) == 2)
    wait_run(live, rid, lambda r: len(r["workers"]) == 2, node=w1)
    assert set(run["workers"]) == {w1.ident.peer_id, w2.ident.peer_id} and run["status"] == "waiting"
    again = call(w1, "POST", f"/v1/runs/{rid}/join")
    assert again.status_code == 409 and "already joined" in again.json()["message"]
    own = call(sponsor, "POST", f"/v1/runs/{rid}/join")
    assert own.status_code == 409 and "sponsor" in own.json()["message"]
    assert httpx.post(f"{w1.api_url}/v1/runs/{rid}/leave", timeout=30).status_code == 401  # no token
    assert call(w2, "POST", f"/v1/runs/{rid}/leave").status_code == 200
    wait_run(live, rid, lambda r: r["workers"] == [w1.ident.peer_id])
    wait_run(live, rid, lambda r: r["workers"] == [w1.ident.peer_id], node=w1)
    notyours = call(w1, "POST", f"/v1/runs/{rid}/cancel")
    assert notyours.status_code == 409 and "only the sponsor" in notyours.json()["message"]
    assert call(sponsor, "POST", f"/v1/runs/{rid}/cancel").status_code == 200
    run = wait_run(live, rid, lambda r: r["status"] == "cancelled")
    assert run["refunded"] == run["budget"] and run["escrow_left"]["base_units"] == "0"
    wait_run(live, rid, lambda r: r["status"] == "cancelled", node=w2)
    late = call(w2, "POST", f"/v1/runs/{rid}/join")
    assert late.status_code == 409 and "cancelled" in late.json()["message"]
    assert call(w1, "POST", f"/v1/runs/{'ab' * 16}/join").status_code == 404
    assert call(w1, "POST", "/v1/runs/xyz/join").status_code == 400


BAD = [  # (body changes, status, words in the message)
    ({"play": "hamlet"}, 400, "exactly one of text or play"),
    ({"text": None}, 400, "exactly one of text or play"),
    ({"rank": 0}, 422, "rank"),
    ({"codec": "fp16"}, 422, "codec"),
    ({"inner_state": "sometimes"}, 422, "inner_state"),
    ({"outer_momentum": 1.0}, 422, "outer_momentum"),
    ({"clip": 0.5}, 422, "clip"),
    ({"unknown_field": 1}, 422, "unknown_field"),
    ({"price_per_step": "1e-3"}, 422, "price_per_step"),
    ({"price_per_step": "0"}, 400, "positive"),
    ({"min_workers": 4, "max_workers": 3}, 400, "min_workers"),
    ({"text": "too short"}, 400, "too small"),
    ({"targets": "no_such_module"}, 400, "no_such_module"),
    ({"price_per_step": "30"}, 400, "max_receipt_price"),
    ({"price_per_step": "10", "rounds": 200}, 400, "balance"),
    ({"deadline_blocks": 2_000_000}, 400, "max_job_deadline"),
]


@pytest.mark.parametrize("change,status,words", BAD, ids=[w.split()[0] + str(i) for i, (_, _, w) in enumerate(BAD)])
def test_bad_posts_are_refused_and_change_nothing(live, change, status, words):
    before = ledger_view(live)
    r = post(f"{live.api}/v1/runs", json={**RUN, **change}, headers=live.auth)
    assert r.status_code == status, r.text
    assert words in r.json()["message"], r.json()
    assert ledger_view(live) == before


def test_post_needs_the_token(live):
    before = ledger_view(live)
    assert post(f"{live.api}/v1/runs", json=RUN).status_code == 401
    assert post(f"{live.api}/v1/runs", json=RUN, headers={"Authorization": "Bearer nope"}).status_code == 401
    assert ledger_view(live) == before


def test_explorer_pages_of_a_live_run(live, posted):
    out, _, _ = posted
    home = get(f"{live.api}/", headers={"Accept": "text/html"})
    assert home.status_code == 200 and 'href="/runs"' in home.text
    page = get(f"{live.api}/runs", headers={"Accept": "text/html"})
    assert page.status_code == 200 and f"/runs/{out['run_id']}" in page.text
    assert "&lt;b&gt;shared&lt;/b&gt; run" in page.text and "<b>shared</b>" not in page.text  # text, not markup
    one = get(f"{live.api}/runs/{out['run_id']}", headers={"Accept": "text/html"})
    assert one.status_code == 200 and out["run_id"] in one.text and out["params0"] in one.text
    assert get(f"{live.api}/runs/{'0' * 32}", headers={"Accept": "text/html"}).status_code == 404
    found = get(f"{live.api}/search?q={out['run_id']}", headers={"Accept": "text/html"}, follow_redirects=False)
    assert found.status_code == 303 and found.headers["location"] == f"/runs/{out['run_id']}"
    assert get(f"{live.api}/v1/search?q={out['run_id']}").json()["kind"] == "run"
    assert get(f"{live.api}/runs/nothex", headers={"Accept": "text/html"}).status_code == 400


def test_run_pages_with_history_show_rounds_workers_and_verdicts():
    """A run driven through two whole rounds on the pure ledger (every receipt replayed; round 1: one invalid
    worker; round 2: one screened out), rendered by the explorer's templates."""
    c = Chain()
    post_ = start(c, sample_ppm=1_000_000, title="<i>hist</i>")
    cur0 = c.run(post_).cur
    cheat = WORKERS[2].account
    c.settle_round(post_, verdicts={cheat: INVALID})
    cur = c.run(post_).cur
    dropped = cur.participants[0]
    c.settle_round(post_, accepted=[w for w in cur.participants if w != dropped])
    run = c.run(post_)
    x = run_view(run, c.s)
    assert [r["round"] for r in x["rounds_detail"]] == [0, 1]
    r0, r1 = x["rounds_detail"]
    assert {"reason": "invalid"} in [{"reason": e["reason"]} for e in r0["excluded"]]
    assert [e["reason"] for e in r1["excluded"]] == ["screened out"]
    assert x["loss_per_round"] == [4.0, 4.0] and x["bytes_per_round"] == [3000, 3000]
    assert any(v["verdict"] == "invalid" for w in r0["workers"] for v in w["verdicts"])
    assert r0["aggregate"]["status"] == "valid" and r0["params_next"] == run.history[0].params_next.hex()
    env = environment()
    base = dict(chain_id="test-chain", head=c.s.height, now_ms=0)

    html = env.get_template("run.html").render(**base, **run_charts(x))
    assert post_.run_id.hex() in html and html.count('<tr class="round">') == 2
    # the Δ bytes each worker uploaded, one stacked bar per round with a part per committed worker
    assert x["bytes_per_worker"] == [{acct(w): 1000 for w in r.participants} for r in (cur0, cur)]
    assert html.count(" bytes from ") == 8 and "round 2: 1000 bytes from" in html
    assert "No held-out loss measured yet." in html  # these aggregates claim none (heldout_ppm 0)
    claimed = [0.5 + i for i in range(2)]
    html = env.get_template("run.html").render(**base, **run_charts({**x, "heldout_per_round": claimed}))
    assert 'id="heldout-chart"' in html and "after round 2: 1.5 nats/token held out" in html
    # node run status draws the same two charts as text bars (plain lines: no redraw)
    text = _summary({**x, "heldout_per_round": claimed}).splitlines()
    held = text[text.index("held-out loss of θ after each round (nats/token):") + 1:][:2]
    assert held[0].split()[:3] == ["round", "1", "0.5000"] and held[1].endswith("█" * 40)  # the largest: full
    assert held[0].count("█") == 13  # 0.5 of 1.5: a third of 40 (13 full eighths-blocks and a partial one)
    per = text[text.index("Δ bytes uploaded per worker per round:") + 1:]
    assert len(per) == 8 and all(line.rstrip().endswith("█" * 40) for line in per)  # equal uploads, full bars
    assert "No held" not in "\n".join(text) and "held-out" not in _summary(x)  # no claim: no held-out chart
    assert "screened out" in html and "invalid" in html and "4.0000" in html and "3000" in html
    assert run.history[1].params_next.hex()[:12] in html and "&lt;i&gt;hist&lt;/i&gt;" in html
    assert "<i>hist</i>" not in html
    from node.training.api import list_runs

    lst = env.get_template("runs.html").render(**base, page=list_runs(c.s, None, 50, 0), status_filter=None, offset=0)
    assert f"/runs/{post_.run_id.hex()}" in lst and "2/2" in lst


def run_cli(capsys, data_dir: Path, *args: str) -> tuple[int | str, str, str]:
    """``node run --data-dir DIR ARGS`` in this process (the same ``node.cli.main``); returns (exit code or the
    exit message, stdout, stderr)."""
    from node.cli import main

    capsys.readouterr()
    try:
        code = main(["run", "--data-dir", str(data_dir), *args])
    except SystemExit as e:
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_list_in_a_fresh_process_without_torch(live, posted, capsys):
    out, _, _ = posted
    code, top, _ = run_cli(capsys, live.client.cfg.data_dir, "--help")
    assert code == 0 and "plain averaging" in top
    assert all(c in top for c in ("post", "list", "status", "join", "leave", "cancel", "fetch"))
    script = ("import sys; from node.cli import main; code = main(sys.argv[1:]); "
              "print('torch imported:', 'torch' in sys.modules); sys.exit(code)")
    p = subprocess.run([sys.executable, "-c", script, "run", "--data-dir", str(live.client.cfg.data_dir), "list"],
                       capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert p.returncode == 0, p.stderr
    assert out["run_id"] in p.stdout and "'<b>shared</b> run'" in p.stdout and "torch imported: False" in p.stdout


def test_cli_post_help_status_and_errors(live, posted, capsys):
    out, _, _ = posted
    d0 = live.client.cfg.data_dir
    code, helps, _ = run_cli(capsys, d0, "post", "--help")
    assert code == 0
    flat = " ".join(helps.split())
    for flag, default in (("--inner-steps", "25"), ("--codec", "int8"), ("--inner-state", "reset"),
                          ("--outer-lr", "1.0"), ("--outer-momentum", "0.0"), ("--price-per-step", "0.01"),
                          ("--sample-ppm", "100000")):
        assert flag in flat and f"(default: {default}" in flat, flag
    code, listed, _ = run_cli(capsys, d0, "list", "--status", "finished")
    assert code == 0 and out["run_id"] not in listed
    code, status, _ = run_cli(capsys, d0, "status", out["run_id"])
    assert code == 0 and f"run {out['run_id']}" in status and "H=2" in status and "codec int8" in status
    code, raw, _ = run_cli(capsys, d0, "status", out["run_id"], "--json")
    assert code == 0 and json.loads(raw)["run_id"] == out["run_id"]
    code, _, _ = run_cli(capsys, d0, "status", "0" * 32)
    assert "not_found" in str(code)
    code, _, err = run_cli(capsys, d0, "post", "--text", str(ROOT / "docs" / "DESIGN.md"), "--price-per-step", "1e-3")
    assert code == 2 and "price-per-step" in err  # refused by argparse before anything is sent
    code, _, _ = run_cli(capsys, d0, "post", "--text", str(ROOT / "no-such-file"))
    assert "cannot read --text" in str(code)


def test_cli_join_and_follow_a_cancelled_run(live, capsys):
    """`status --follow` on a run that has ended prints plain lines (not a tty) and returns; joining it is
    refused with the ledger's reason."""
    r = post(f"{live.api}/v1/runs", json=dict(RUN, title="to cancel"), headers=live.auth)
    assert r.status_code == 200, r.text
    rid = r.json()["run_id"]
    wait_run(live, rid)
    d0, d1 = live.client.cfg.data_dir, live.nodes[1].cfg.data_dir
    code, out, _ = run_cli(capsys, d0, "cancel", rid)
    assert code == 0 and "cancel submitted" in out
    code, out, _ = run_cli(capsys, d0, "status", rid, "--follow")  # returns once the cancel is in a block
    assert code == 0
    lines = out.splitlines()
    follow = [i for i, x in enumerate(lines) if x.startswith(f"{rid[:8]} cancelled: round 0/2")]
    assert len(follow) == 1 and "\r" not in out  # one plain line per change, no progress bar off a terminal
    assert lines.index(next(x for x in lines if x.startswith(f"run {rid}"))) > follow[0]  # then the summary
    wait_run(live, rid, lambda r: r["status"] == "cancelled", node=live.nodes[1])
    code, _, _ = run_cli(capsys, d1, "join", rid)
    assert "refused" in str(code) and "cancelled" in str(code)
