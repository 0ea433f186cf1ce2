"""``node devnet``: the demo swarm as separate processes on 127.0.0.1.

Node 0 is the devnet validator and the client (well-known dev key 0, funded in the devnet genesis); servers
1..N use dev keys 1..N (bonded in genesis) and each serves one span of the model's blocks. The driver talks to
the nodes only through their HTTP APIs, like any user would.
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import subprocess
import sys
import time
from importlib import resources
from pathlib import Path
from typing import IO, Any

import httpx

from .cliargs import resolve_device, resolve_model
from .compute.data import shakespeare_play
from .compute.model import Manifest, load_manifest
from .compute.shards import assign_spans
from .encoding import format_amount
from .identity import Identity, dev_seed
from .ledger.core.jobstate import JobStatus
from .ledger.core.status import FINAL, ReceiptStatus
from .lockfile import LockHeld, hold, holder
from .market.cli import FINAL as JOB_FINAL
from .progress import Progress


class DevnetError(RuntimeError):
    """The devnet could not start or its demo could not finish (the message says why)."""


EMBEDDED_SERVERS = 3  # the embedded devnet genesis (genesis/devnet.json) bonds dev keys 1-3
MAX_SERVERS = 64
WIDE_CHAIN = "tally-test-devnet"  # a tally-test* chain: --dev-account and the test switches are allowed on it


def devnet_genesis(servers: int) -> dict[str, Any]:
    """The devnet's genesis document for more servers than the embedded one bonds: the embedded devnet's params,
    time and validator (dev key 0, funded as there), dev keys ``1..servers`` each funded and bonded as the
    embedded dev keys 1-3 are, and four spare funded keys after them; chain :data:`WIDE_CHAIN`."""
    doc: dict[str, Any] = json.loads(resources.files("genesis").joinpath("devnet.json").read_text())  # an object
    rows = {a["note"].split(":")[0]: a for a in doc["accounts"]}
    server, spare = rows["dev1"], rows["dev4"]
    accounts = [rows["dev0"]]
    for i in range(1, servers + 5):
        tmpl = server if i <= servers else spare
        row = {"account": Identity.from_seed(dev_seed(i)).peer_id, "balance": tmpl["balance"],
               "note": f"dev{i}: {'bonded server' if i <= servers else 'spare'}"}
        if i <= servers:
            row["bond"] = tmpl["bond"]
        accounts.append(row)
    doc.update(chain_id=WIDE_CHAIN, accounts=accounts)
    return doc


# the devnet's tab parameters (node devnet --tabs): epochs of 10 blocks (5 s), every receipt of a batch drawn (as
# p = 1 on the devnet), 10 blocks to reveal, spendable 4 blocks after the last verdict
TAB_PARAMS = {"epoch_blocks": 10, "batch_samples": 1_000_000, "reveal_window": 10, "settle_window": 4,
              "tab_close_delay": 40}


def _wait_info(data_dir: Path, proc: subprocess.Popen[bytes], timeout: float) -> dict[str, Any]:
    path = data_dir / "node.json"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:  # the cause is usually the last lines of stdout.log (a traceback or exit message)
            logs = []
            for name in ("node.log", "stdout.log"):
                f = data_dir / name
                if f.exists() and (text := f.read_text(errors="replace").strip()):
                    logs.append(f"--- {f} (end)\n" + "\n".join(text.splitlines()[-15:]))
            raise DevnetError(f"node in {data_dir} exited with code {proc.returncode}:\n" + "\n".join(logs))
        if path.exists():
            info: dict[str, Any] = json.loads(path.read_text())  # node.runtime writes a JSON object
            return info
        time.sleep(0.2)
    raise DevnetError(f"node in {data_dir} did not start within {timeout:.0f} s")


def _spawn(args: argparse.Namespace, i: int, data_dir: Path, extra: list[str]) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "node.cli", "start", "--data-dir", str(data_dir), "--dev-account", str(i),
           "--model", args.model, "--log-level", "INFO", *extra]
    if args.model_cache:
        cmd += ["--model-cache", str(args.model_cache)]
    data_dir.mkdir(parents=True, exist_ok=True)
    out = open(data_dir / "stdout.log", "wb")  # noqa: SIM115 - the child's log, open for its life
    return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 10
    for p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


MARKER = ".tally-devnet"


def _lock_root(root: Path) -> IO[str]:
    """Hold ``<root>.lock`` for this process's lifetime, so that a second ``node devnet`` on the same data dir
    refuses to start instead of wiping the data of the one that runs. Returns the open file.

    Raises:
        DevnetError: another process holds the lock, or ``root`` has no name (``/``).
    """
    root = root.resolve()
    if not root.name:
        raise DevnetError(f"{root} cannot be a devnet data dir; choose another --data-dir")
    try:
        return hold(root.with_name(root.name + ".lock"))
    except LockHeld as e:
        raise DevnetError(f"another `node devnet` (pid {e.pid}) is running on {root}; stop it first or choose "
                          "another --data-dir") from None


def _prepare_root(root: Path) -> None:
    """Wipe a previous devnet's data dir — only one that devnet created (it holds the marker file) and in which
    no node runs (each node holds ``node.lock`` in its data dir from start to exit, see :mod:`node.lockfile`)."""
    if root.exists():
        dirs = [root] + [d for d in root.iterdir() if d.is_dir()]
        live = [f"{d} (pid {pid})" for d in dirs if (pid := holder(d / "node.lock")) is not None]
        if live:
            raise DevnetError(f"nodes are still running in {', '.join(live)}; stop them first or choose another "
                              "--data-dir")
        if not (root / MARKER).exists() and any(root.iterdir()):
            raise DevnetError(f"{root} exists and was not made by `node devnet`; refusing to wipe it "
                              "(choose another --data-dir)")
        shutil.rmtree(root)
    root.mkdir(parents=True)
    (root / MARKER).write_text("made by `node devnet`; wiped at its next start\n")


def _get(client: httpx.Client, url: str) -> dict[str, Any]:
    r = client.get(url)
    r.raise_for_status()
    body: dict[str, Any] = r.json()  # the node's API answers a JSON object
    return body


def run_devnet(args: argparse.Namespace) -> int:
    """Run the demo; returns 0 when the tokens are identical, every receipt got the expected verdict and the
    balances add up."""
    if not 1 <= args.servers <= MAX_SERVERS:
        print(f"devnet: --servers must be in 1..{MAX_SERVERS}", file=sys.stderr)
        return 2
    if args.servers < 3:
        print("note: fewer than 3 servers; committees need 2 other bonded servers", file=sys.stderr)
    if args.fault_server is not None and not 1 <= args.fault_server <= args.servers:
        print(f"devnet: --fault-server must be in 1..{args.servers}", file=sys.stderr)
        return 2
    if args.tokens < 1 and not args.no_inference:
        print("devnet: --tokens must be at least 1", file=sys.stderr)
        return 2
    if args.job is not None:
        if args.job_steps < 1:
            print("devnet: --job-steps must be at least 1", file=sys.stderr)
            return 2

        try:
            shakespeare_play(args.job)  # checked before anything starts (downloads the sdist once)
        except KeyError as e:
            print(f"devnet: --job: {e.args[0]}", file=sys.stderr)
            return 2
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so the node processes are stopped too
    resolve_device(args.gpu)
    print("== preparing the model (converted once into the model cache)", flush=True)
    model_dir = resolve_model(args)
    manifest = load_manifest(model_dir)
    if args.servers > manifest.num_blocks:
        print(f"devnet: --servers {args.servers}: the model has only {manifest.num_blocks} blocks (one server "
              "serves at least one)", file=sys.stderr)
        return 2
    spans = assign_spans(manifest.num_blocks, args.servers)
    root = args.data_dir
    procs: list[subprocess.Popen[bytes]] = []
    try:
        lock = _lock_root(root)  # noqa: F841 (held until this process exits)
        _prepare_root(root)
        chain: list[str] = []
        if args.servers > EMBEDDED_SERVERS or getattr(args, "tabs", True):
            gfile = root / "genesis.json"
            doc = devnet_genesis(args.servers)
            if getattr(args, "tabs", True):
                doc["params"].update(TAB_PARAMS)
            gfile.write_text(json.dumps(doc, indent=1) + "\n")
            chain = ["--genesis", str(gfile)]
            print(f"   genesis {gfile}: chain {WIDE_CHAIN}, dev keys 1-{args.servers} bonded"
                  + (f"; tabs and epochs of {TAB_PARAMS['epoch_blocks']} blocks" if getattr(args, "tabs", True)
                     else f" (the embedded devnet bonds {EMBEDDED_SERVERS})"), flush=True)
        print(f"== starting {1 + args.servers} node processes on 127.0.0.1 ({root})", flush=True)
        client_dir = root / "node0"
        procs.append(_spawn(args, 0, client_dir, ["--api-port", str(args.api_port), *chain]))
        info0 = _wait_info(client_dir, procs[0], 120)
        for i, (start, end) in enumerate(spans, start=1):
            extra = ["--span", f"{start}:{end}", "--api-port", "0", "--bootstrap", info0["addrs"][0], "--accept-jobs",
                     "--accept-batches", *chain]
            if args.gpu is not None:
                extra += ["--gpu", str(args.gpu)]
            if args.fault_server == i:
                extra += ["--fault", "corrupt"]
            procs.append(_spawn(args, i, root / f"node{i}", extra))
        infos = [info0] + [_wait_info(root / f"node{i}", procs[i], 180) for i in range(1, len(procs))]
        for i, info in enumerate(infos):
            role = "validator + client" if i == 0 else f"serves blocks [{spans[i - 1][0]}, {spans[i - 1][1]})"
            fault = "  (TEST SWITCH: corrupts outputs)" if args.fault_server == i else ""
            print(f"   node{i} {info['peer_id']}  pid {info['pid']}  {role}{fault}")
        api = info0["api"]
        token = (client_dir / "api_token").read_text().strip()
        print(f"   API {api} (token: {client_dir / 'api_token'}); servers' APIs: "
              f"{', '.join(info['api'] for info in infos[1:])}")
        with httpx.Client(timeout=600, headers={"Authorization": f"Bearer {token}"}) as http:
            deadline = time.monotonic() + 60
            while len(_get(http, f"{api}/v1/status")["swarm"]) < len(spans):
                if time.monotonic() > deadline:
                    raise DevnetError("servers did not announce their spans within 60 s")
                time.sleep(0.3)
            accounts = [info["peer_id"] for info in infos]
            ok = True
            if not args.no_inference:
                ok = _inference_demo(http, api, accounts, manifest, model_dir, args)
            if args.job:
                ok = _job_demo(http, api, accounts, root, args) and ok
        if not args.once:
            print(f"\nThe swarm stays up. API: {api}/docs   (Ctrl-C to stop)", flush=True)
            try:
                while all(p.poll() is None for p in procs):
                    time.sleep(1)
            except KeyboardInterrupt:
                pass
        return 0 if ok else 1
    except DevnetError as e:
        print(f"devnet: {e}", file=sys.stderr)
        return 2
    finally:
        _stop(procs)


def _inference_demo(http: httpx.Client, api: str, accounts: list[str], manifest: Manifest, model_dir: Path,
                    args: argparse.Namespace) -> bool:
    """Generate through the route, wait for every receipt's verdict, print receipts and balances."""
    before = {a: _get(http, f"{api}/v1/accounts/{a}") for a in accounts}
    print(f"== generating {args.tokens} tokens greedily through the route", flush=True)
    print(f"   prompt: {args.prompt!r}")
    body: dict[str, Any] = {"prompt": args.prompt, "max_new_tokens": args.tokens}
    if args.model == "tiny":  # the tiny test model has no tokenizer: prompt bytes are the token ids
        body = {"prompt_ids": [b % manifest.vocab_size for b in args.prompt.encode()],
                "max_new_tokens": args.tokens}
    r = http.post(f"{api}/v1/generate", json=body)
    if r.status_code != 200:
        raise DevnetError(f"generate failed: {r.status_code} {r.text}")
    gen = r.json()
    print("   route: " + " -> ".join(f"{h['peer'][:12]}…[{h['span'][0]},{h['span'][1]})" for h in gen["route"]))
    print(f"   text: {gen['text']!r}")
    print(f"   {len(gen['tokens'])} tokens in {gen['seconds']:.2f} s "
          f"({len(gen['tokens']) / gen['seconds']:.1f} tokens/s)")
    print("== waiting for committee verdicts" + (" (each server's epoch batch, its reveals and their votes; "
                                                 "then the batch's payment)" if getattr(args, "tabs", True)
                                                 else ""), flush=True)
    final = FINAL  # receipt statuses no block changes
    deadline = time.monotonic() + 300
    while True:
        got = [http.get(f"{api}/v1/receipts/{rid}") for rid in gen["receipts"]]
        recs = [g.json() for g in got if g.status_code == 200]  # 404: not in a block yet
        if len(recs) == len(got) and all(x["status"] in final for x in recs) and (
                not getattr(args, "tabs", True) or _batches_paid(http, api, accounts[1:])):
            break
        if time.monotonic() > deadline:
            raise DevnetError("receipts did not reach a verdict within 300 s")
        time.sleep(0.5)
    after = {a: _get(http, f"{api}/v1/accounts/{a}") for a in accounts}
    if getattr(args, "tabs", True):
        ok = _report_tabs(http, api, recs, before, after, accounts, args.fault_server)
    else:
        ok = _report(recs, before, after, accounts, args)
    print("== reference: the same model generating greedily in one process", flush=True)
    # local: imports torch (~1.6 s): only the demo's local generation needs it
    from .compute.reference import local_generate

    ref = local_generate(model_dir, gen["prompt_ids"], args.tokens)
    identical = ref == gen["tokens"]
    expected = " (expected: a server corrupted its outputs)" if args.fault_server is not None else ""
    print(f"identical: {'true' if identical else 'false'}{expected}")
    if args.fault_server is None:
        ok = ok and identical
    return ok


def _job_demo(http: httpx.Client, api: str, accounts: list[str], root: Path, args: argparse.Namespace) -> bool:
    """Post a LoRA job on a Shakespeare play, follow it to settlement, fetch the adapter, compare losses."""
    print(f"== fine-tune job: LoRA on {args.job!r}, {args.job_steps} steps, paid per step", flush=True)
    before = {a: _get(http, f"{api}/v1/accounts/{a}") for a in accounts}
    body: dict[str, Any] = {"play": args.job, "title": f"LoRA on {args.job}", "steps": args.job_steps,
            "segment_steps": min(10, args.job_steps),
            "batch_size": 4, "seq_len": 64, "lr": 2e-3, "price_per_step": "0.01"}
    if args.model == "tiny":
        body.update(batch_size=2, seq_len=16, lr=1e-2)
    r = http.post(f"{api}/v1/jobs", json=body)
    if r.status_code != 200:
        raise DevnetError(f"posting the job failed: {r.status_code} {r.text}")
    jid = r.json()["job_id"]
    deadline = time.monotonic() + 60
    while (r := http.get(f"{api}/v1/jobs/{jid}")).status_code == 404:  # submitted, not in a block yet
        if time.monotonic() > deadline:
            raise DevnetError(f"job {jid} did not appear on the ledger within 60 s")
        time.sleep(0.3)
    r.raise_for_status()
    deadline = time.monotonic() + 1800
    # on stderr, as before: a bar on a terminal, plain lines (no redraws) when it is a file or a pipe
    with Progress(args.job_steps, "step", f"job {jid[:8]}", sys.stderr) as bar:
        while True:
            job = _get(http, f"{api}/v1/jobs/{jid}")
            bar.show(job["steps_done"], f"status={job['status']}")
            if job["status"] in JOB_FINAL:
                break
            if time.monotonic() > deadline:
                raise DevnetError("the job did not settle within 30 minutes")
            time.sleep(1)
    name = {a: f"node{i}" for i, a in enumerate(accounts)}
    print(f"   job {jid}: {job['status']} ({job['status_text']}), worker {name.get(job['worker'])}")
    for seg in job["segments"]:
        loss = "NaN" if seg["loss"] is None else f"{seg['loss']:.3f}"
        print(f"   steps {seg['steps'][0]:>3}-{seg['steps'][1]:<3} loss {loss}  verdict {seg['status']}  "
              f"committee {', '.join(name.get(m, m[:12]) for m in seg['committee'])}")
    ok = job["status"] == JobStatus.SETTLED
    if ok:
        out = http.post(f"{api}/v1/jobs/{jid}/fetch", json={"out_dir": str((root / "adapter").resolve())}).json()
        print(f"   adapter {out['adapter'][:16]}… fetched by content hash into {root / 'adapter'}")
        print(f"   held-out loss on the play's last 10%: base model {out['heldout_loss_base']:.4f}, "
              f"with adapter {out['heldout_loss_adapter']:.4f} nats/token")
        improved = out["heldout_loss_adapter"] < out["heldout_loss_base"]
        print(f"   adapter improves held-out loss: {'true' if improved else 'false'}")
        ok = improved or args.model == "tiny"
    after = {a: _get(http, f"{api}/v1/accounts/{a}") for a in accounts}
    paid = int(before[accounts[0]]["balance"]["base_units"]) - int(after[accounts[0]]["balance"]["base_units"])
    price = int(job["price"]["base_units"])
    worker = job["worker"]
    earned = int(after[worker]["balance"]["base_units"]) - int(before[worker]["balance"]["base_units"])
    fees = sum(int(after[a]["balance"]["base_units"]) - int(before[a]["balance"]["base_units"])
               for a in accounts[1:] if a != worker)
    print(f"   requester paid {format_amount(paid)} (price {format_amount(price)}): "
          f"{'true' if paid == price else 'false'}; worker earned {format_amount(earned)} = price - committee fees "
          f"{format_amount(fees)}: {'true' if earned + fees == price else 'false'}")
    return ok and paid == price and earned + fees == price


def _batches_paid(http: httpx.Client, api: str, workers: list[str]) -> bool:
    """Whether every server sent an epoch batch and none of its batches waits any more."""
    for w in workers:
        t = _get(http, f"{api}/v1/accounts/{w}/tabs")
        if t["open_batches"] or not t["tabs"] or not any(int(x["redeemed"]["base_units"]) for x in t["tabs"]):
            return False
    return True


def _report_tabs(http: httpx.Client, api: str, recs: list[dict[str, Any]], before: dict[str, dict[str, Any]],
                 after: dict[str, dict[str, Any]], accounts: list[str], fault: int | None = None) -> bool:
    """The receipts (revealed from the servers' epoch batches), the tabs and the balances, checked to add up: each
    tab redeemed what its last receipt says is owed; the servers together earned what the client owes on the tabs
    of honest servers (committee fees move between servers; a server whose batch was refuted earned nothing from
    it and was slashed, its tab's credits back in the client's lock); the client's balance and escrow fell by that
    much."""
    print("== receipts (each revealed from its server's epoch batch)")
    name = {a: f"node{i}" for i, a in enumerate(accounts)}
    ok = True
    bad = accounts[fault] if fault is not None else None
    for x in recs:
        votes = ", ".join(f"{name.get(v['voter'], v['voter'][:12])}={v['verdict']}" for v in x["votes"])
        f = x["fields"]
        print(f"   {x['id'][:16]}…  worker {name.get(x['worker'])}  blocks [{x['span'][0]},{x['span'][1]})  "
              f"{x['tokens']} token positions  tab {f['tab_id'][:12]}… nonce {f['tab_nonce']}  owed on the tab "
              f"{format_amount(int(f['cumulative']))}")
        print(f"      committee: {', '.join(name.get(m, m[:12]) for m in x['committee'])}; votes: {votes}; "
              f"verdict: {x['status']}" + (f"; slashed {x['slashed']['credits']} credits"
                                           if int(x['slashed']['base_units']) else ""))
        want = ReceiptStatus.INVALID if x["worker"] == bad else ReceiptStatus.VALID
        ok = ok and x["status"] == want
    tabs = _get(http, f"{api}/v1/accounts/{accounts[0]}/tabs")["tabs"]
    owed: dict[str, int] = {}
    for x in recs:  # a tab's newest receipt says what is owed on it
        owed[x["worker"]] = max(owed.get(x["worker"], 0), int(x["fields"]["cumulative"]))
    print("== tabs of the client")
    for t in tabs:
        print(f"   {t['tab'][:16]}…  pays {name.get(t['worker'])}  locked {t['locked']['credits']}  redeemed "
              f"{t['redeemed']['credits']}" + ("  (its batch refuted: refunded into the lock)"
                                               if t["worker"] == bad else ""))
    redeemed = {t["worker"]: int(t["redeemed"]["base_units"]) for t in tabs}
    print("== balances (credits)")
    print(f"   {'node':6} {'balance before':>18} {'balance after':>18} {'change':>14} {'escrow after':>14} "
          f"{'bond after':>12}")
    delta = {}
    for a in accounts:
        b0, b1 = int(before[a]["balance"]["base_units"]), int(after[a]["balance"]["base_units"])
        delta[a] = b1 - b0 + int(after[a]["escrow"]["base_units"]) - int(before[a]["escrow"]["base_units"])
        print(f"   {name[a]:6} {format_amount(b0):>18} {format_amount(b1):>18} {format_amount(b1 - b0):>14} "
              f"{after[a]['escrow']['credits']:>14} {after[a]['bond']['credits']:>12}")
    total = sum(v for w, v in owed.items() if w != bad)
    slash_rewards = sum(int(p["amount"]["base_units"]) for x in recs if x["worker"] == bad for p in x["payouts"]
                        if p["account"] != "treasury")
    balanced = (redeemed == owed and -delta[accounts[0]] == total
                and sum(delta[a] for a in accounts[1:]) == total + slash_rewards)
    print(f"   client owes {format_amount(total)} on its tabs{' with honest servers' if bad else ''} = redeemed by "
          f"the servers' batches = what the servers earned together (committee fees between them"
          f"{', and their reward from the slash' if bad else ''}): {'true' if balanced else 'false'}")
    return ok and balanced


def _report(recs: list[dict[str, Any]], before: dict[str, dict[str, Any]], after: dict[str, dict[str, Any]],
            accounts: list[str], args: argparse.Namespace) -> bool:
    """The receipts with their verdicts and the balances, checked to add up (settlement receipt by receipt)."""
    print("== receipts")
    name = {a: f"node{i}" for i, a in enumerate(accounts)}
    ok = True
    for x in recs:
        votes = ", ".join(f"{name.get(v['voter'], v['voter'][:12])}={v['verdict']} "
                          f"(max per-token rel. L2 distance {v['distance_ppm'] / 1e6:.2g})" for v in x["votes"])
        print(f"   {x['id'][:16]}…  worker {name.get(x['worker'])}  blocks [{x['span'][0]},{x['span'][1]})  "
              f"{x['tokens']} token positions  work {x['work']} token-blocks  price {x['price']['credits']}  "
              f"sampled with p={x['sampling_probability_ppm'] / 1e6:g}")
        print(f"      committee: {', '.join(name.get(m, m[:12]) for m in x['committee'])}; votes: {votes}")
        print(f"      verdict: {x['status']}" + (f"; slashed {x['slashed']['credits']} credits"
                                                 if int(x['slashed']['base_units']) else ""))
        expected = ReceiptStatus.INVALID if args.fault_server is not None \
            and x["worker"] == accounts[args.fault_server] else ReceiptStatus.VALID
        ok = ok and x["status"] == expected
    print("== balances (credits)")
    print(f"   {'node':6} {'balance before':>18} {'balance after':>18} {'change':>14} {'bond after':>12}")
    delta = {}
    for a in accounts:
        b0, b1 = int(before[a]["balance"]["base_units"]), int(after[a]["balance"]["base_units"])
        delta[a] = b1 - b0
        print(f"   {name[a]:6} {format_amount(b0):>18} {format_amount(b1):>18} {format_amount(b1 - b0):>14} "
              f"{after[a]['bond']['credits']:>12}")
    paid = -delta[accounts[0]]
    valid = [x for x in recs if x["status"] == ReceiptStatus.VALID]
    invalid = [x for x in recs if x["status"] == ReceiptStatus.INVALID]
    earned = sum(int(p["amount"]["base_units"]) for x in valid for p in x["payouts"] if p["account"] == x["worker"])
    fees = sum(int(p["amount"]["base_units"]) for x in valid for p in x["payouts"] if p["account"] != x["worker"])
    rewards = sum(int(p["amount"]["base_units"]) for x in invalid for p in x["payouts"]
                  if p["account"] not in (x["requester"], "treasury"))
    balanced = paid == earned + fees and sum(delta[a] for a in accounts[1:]) == earned + fees + rewards
    print(f"   client paid {format_amount(paid)} = servers earned {format_amount(earned)} + committee fees "
          f"{format_amount(fees)}: {'true' if balanced else 'false'}")
    for x in invalid:
        slashed = int(x["slashed"]["base_units"])
        reward = sum(int(p["amount"]["base_units"]) for p in x["payouts"]
                     if p["account"] not in (x["requester"], "treasury"))
        print(f"   {name.get(x['worker'])} slashed {format_amount(slashed)}: committee reward "
              f"{format_amount(reward)}, treasury {format_amount(slashed - reward)}; client refunded "
              f"{x['price']['credits']}")
    return ok and balanced
