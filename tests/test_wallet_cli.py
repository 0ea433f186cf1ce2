"""`node wallet` against a real node process (tiny model, a genesis made by `node genesis new`), as a user runs it;
and `node start` dialling the genesis file's bootstrap list."""

from __future__ import annotations

import contextlib
import io
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from node.cli import main as cli_main
from node.encoding import BASE_UNITS
from node.identity import Identity, dev_seed
from node.ledger.genesis import load_genesis
from node.wallet.cli import InputError, check_account, check_amount

ROOT = Path(__file__).resolve().parents[1]
C = BASE_UNITS
DEV = [Identity.from_seed(dev_seed(i)).peer_id for i in range(5)]
ME, FRIEND = DEV[0], DEV[3]


def cli(*args: str, timeout: float = 90, process: bool = False) -> subprocess.CompletedProcess:
    """``node ARGS``: in this process through :func:`node.cli.main` (the entry point ``python -m node.cli``
    runs: the same parser, code and exit status, without ~1 s of interpreter start per call), or, with
    ``process``, as its own ``python -m node.cli`` process."""
    if process:
        return subprocess.run([sys.executable, "-m", "node.cli", *args], capture_output=True, text=True,
                              timeout=timeout, cwd=ROOT)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = cli_main(list(args))
        except SystemExit as e:  # argparse's usage errors (status 2), as the process would exit
            code = e.code if isinstance(e.code, int) else 1
    return subprocess.CompletedProcess(["node", *args], code, out.getvalue(), err.getvalue())


def start_node(data_dir: Path, genesis: Path, models: Path, dev_account: int) -> subprocess.Popen:
    data_dir.mkdir(parents=True)
    log = open(data_dir / "stdout.log", "w")  # noqa: SIM115  (the node process writes to it until it ends)
    return subprocess.Popen([sys.executable, "-m", "node.cli", "start", "--genesis", str(genesis), "--data-dir",
                             str(data_dir), "--dev-account", str(dev_account), "--model", "tiny", "--model-cache",
                             str(models), "--api-port", "0", "--log-level", "WARNING"],
                            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)


def wait_up(proc: subprocess.Popen, data_dir: Path, timeout: float = 120) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"node exited {proc.returncode}: {(data_dir / 'stdout.log').read_text()[-2000:]}")
        if (data_dir / "node.json").exists():
            return json.loads((data_dir / "node.json").read_text())
        time.sleep(0.2)
    raise AssertionError(f"node in {data_dir} not up after {timeout} s")


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


@pytest.fixture(scope="module")
def net(tmp_path_factory):
    """One validator node on a chain of its own: dev key 0 holds 1000 credits; dev key 1 holds 100 bonded."""
    tmp = tmp_path_factory.mktemp("wallet")
    genesis = tmp / "genesis.json"
    r = cli("genesis", "new", "--chain-id", "tally-test-wallet", "--out", str(genesis), "--validator",
            f"{ME}=100", "--account", f"{ME}=1000", "--account", f"{DEV[1]}=5:100", "--params", "devnet",
            "--param", "block_time_ms=200")
    assert r.returncode == 0, r.stderr
    d0 = tmp / "n0"
    proc = start_node(d0, genesis, tmp / "models", 0)
    try:
        info = wait_up(proc, d0)
        yield {"tmp": tmp, "genesis": genesis, "dir": d0, "info": info, "proc": proc}
    finally:
        stop(proc)


def wallet(net, *args: str) -> subprocess.CompletedProcess:
    return cli("wallet", "--data-dir", str(net["dir"]), *args)


def account(net, peer: str) -> dict:
    """The account as the API shows it (checked against `node wallet balance` in the first test)."""
    return httpx.get(f"{net['info']['api']}/v1/accounts/{peer}").json()


def units(acc: dict, field: str) -> int:
    return int(acc[field]["base_units"])


def test_balance_is_human_readable_and_json(net):
    r = wallet(net, "balance")
    assert r.returncode == 0, r.stderr
    assert f"account  {ME}" in r.stdout and "bond     100 credits" in r.stdout and "escrow   0 credits" in r.stdout
    assert "balance  " in r.stdout and "eligible yes" in r.stdout
    other = json.loads(wallet(net, "balance", DEV[1], "--json").stdout)  # --json after the subcommand too
    assert steady(other) == steady(account(net, DEV[1]))  # the API's JSON as it is
    assert other["account"] == DEV[1] and other["balance"]["credits"] == "5" and other["bond"]["credits"] == "100"


def test_transfer_moves_exactly_the_amount_and_shows_in_history(net):
    me0, friend0 = account(net, ME), account(net, FRIEND)
    r = wallet(net, "transfer", FRIEND, "1.000000001")
    assert r.returncode == 0, r.stderr
    lines = dict(line.split(None, 1) for line in r.stdout.splitlines())
    txid, height = lines["txid"], int(lines["height"])
    assert len(txid) == 64 and height >= 1 and lines["amount"] == "1.000000001 credits"
    me1, friend1 = account(net, ME), account(net, FRIEND)
    assert units(me0, "balance") - units(me1, "balance") == C + 1
    assert units(friend1, "balance") - units(friend0, "balance") == C + 1
    assert me1["nonce"] == me0["nonce"] + 1
    tx = httpx.get(f"{net['info']['api']}/v1/txs/{txid}").json()
    assert tx["height"] == height and tx["kind"] == "transfer"
    hist = json.loads(wallet(net, "history", "--json", "--all").stdout)
    assert [e["kind"] for e in hist["events"] if e["tx"] == txid] == ["transfer"]
    text = wallet(net, "history", FRIEND).stdout
    assert txid in text and "transfer" in text and "1.000000001" in text


def test_bond_and_unbond_move_between_balance_and_bond(net):
    a0 = account(net, ME)
    r = wallet(net, "--json", "bond", "10")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["kind"] == "bond" and out["amount"]["credits"] == "10" and out["height"] >= 1
    a1 = account(net, ME)
    assert units(a0, "balance") - units(a1, "balance") == 10 * C and units(a1, "bond") - units(a0, "bond") == 10 * C
    r = wallet(net, "unbond", "4.5")
    assert r.returncode == 0 and "kind    unbond" in r.stdout, r.stderr
    a2 = account(net, ME)
    assert units(a2, "balance") - units(a1, "balance") == 4_500_000_000
    assert units(a1, "bond") - units(a2, "bond") == 4_500_000_000


def test_no_wait_returns_the_id_at_once_and_the_transfer_lands(net):
    friend0 = account(net, FRIEND)
    r = wallet(net, "--json", "transfer", "--no-wait", FRIEND, "2")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert "height" not in out and len(out["id"]) == 64
    deadline = time.monotonic() + 30
    while httpx.get(f"{net['info']['api']}/v1/txs/{out['id']}").status_code == 404:
        assert time.monotonic() < deadline, "the --no-wait transfer never reached a block"
        time.sleep(0.2)
    assert units(account(net, FRIEND), "balance") - units(friend0, "balance") == 2 * C


def test_bad_amounts_are_refused_by_the_canonical_parser():
    for bad in ("1e3", "-1", "0", "1.0000000001", "1,5", " 1", "NaN", "\u0663", "1.", ".5", "01", ""):
        with pytest.raises(InputError, match="bad amount"):
            check_amount(bad)
    assert check_amount("1.50") == "1.5" and check_amount("0.000000001") == "0.000000001"
    with pytest.raises(InputError, match="bad account"):
        check_account("12D3KooWnobody")


def steady(acc: dict) -> dict:
    return {k: v for k, v in acc.items() if k != "height"}


def test_bad_amounts_are_refused_client_side_and_nothing_changes(net):
    before = account(net, ME)
    for args in (["transfer", FRIEND, "1e3"], ["transfer", FRIEND, "1.0000000001"], ["bond", "0"],
                 ["unbond", "-1"]):
        r = wallet(net, *args)
        assert r.returncode == 1 and "bad amount" in r.stderr and "Traceback" not in r.stderr, (args, r.stderr)
    # refused before the node is looked for: the same answer where no node runs
    r = cli("wallet", "--data-dir", str(net["tmp"] / "no-node-here"), "transfer", FRIEND, "1,5")
    assert r.returncode == 1 and "bad amount" in r.stderr, r.stderr
    r = wallet(net, "transfer", "12D3KooWnobody", "1")
    assert r.returncode == 1 and "bad account" in r.stderr
    assert steady(account(net, ME)) == steady(before)  # same balance, bond, escrow and nonce


def test_api_refusals_are_printed_plainly(net):
    before = account(net, ME)
    r = wallet(net, "transfer", FRIEND, "1000000")
    assert r.returncode == 1 and r.stderr.strip() == "node wallet: invalid_tx: insufficient balance", r.stderr
    r = wallet(net, "unbond", "1000000")
    assert r.returncode == 1 and "invalid_tx: unbond exceeds the bond" in r.stderr
    assert "Traceback" not in r.stderr
    (net["dir"] / "api_token").rename(net["dir"] / "api_token.moved")
    try:
        r = wallet(net, "bond", "1")
        assert r.returncode == 1 and "cannot read the API token" in r.stderr
    finally:
        (net["dir"] / "api_token.moved").rename(net["dir"] / "api_token")
    assert steady(account(net, ME)) == steady(before)


def test_history_pages(net):
    for amount in ("0.5", "0.25"):
        assert wallet(net, "transfer", FRIEND, amount).returncode == 0
    full = json.loads(wallet(net, "history", "--all", "--json").stdout)["events"]
    assert len(full) >= 2
    one = wallet(net, "history", "--limit", "1")
    assert one.returncode == 0 and len(one.stdout.splitlines()) == 1 and "more: " in one.stderr
    cursor = one.stderr.split("--cursor ")[1].split()[0]
    page2 = json.loads(wallet(net, "history", "--json", "--limit", "1", "--cursor", cursor).stdout)
    assert page2["events"] == full[1:2]
    assert wallet(net, "history", "--limit", "0").returncode == 2


def test_a_data_dir_without_a_running_node_is_named(net, tmp_path):
    r = cli("wallet", "--data-dir", str(tmp_path), "balance", process=True)  # `python -m node.cli` itself
    assert r.returncode == 1 and f"no node is running in {tmp_path}" in r.stderr
    stale = tmp_path / "stale"
    stale.mkdir()
    (stale / "node.json").write_text(json.dumps({"api": "http://127.0.0.1:9", "peer_id": ME}))
    r = cli("wallet", "--data-dir", str(stale), "balance")
    assert r.returncode == 1 and f"no node is running in {stale}" in r.stderr and "127.0.0.1:9" in r.stderr


def test_node_start_dials_the_genesis_files_bootstrap_list(net):
    """A genesis file that differs only in its bootstrap list names the same chain (same hash); a node started
    with it and no --bootstrap dials those addresses."""
    doc = json.loads(net["genesis"].read_text())
    doc["bootstrap"] = [a for a in net["info"]["addrs"] if a.startswith("/ip4/127.0.0.1/")][:1]
    assert doc["bootstrap"]
    with_boot = net["tmp"] / "genesis-boot.json"
    with_boot.write_text(json.dumps(doc))
    assert load_genesis(with_boot).hash == load_genesis(net["genesis"]).hash
    d4 = net["tmp"] / "n4"
    proc = start_node(d4, with_boot, net["tmp"] / "models", 4)
    try:
        info = wait_up(proc, d4)
        assert info["peer_id"] == DEV[4]
        deadline = time.monotonic() + 30
        while DEV[4] not in httpx.get(f"{net['info']['api']}/v1/status").json()["peers"]:
            assert time.monotonic() < deadline, "the node never dialled the genesis bootstrap address"
            time.sleep(0.2)
        r = cli("wallet", "--data-dir", str(d4), "balance")  # and it follows the chain it joined
        assert r.returncode == 0 and f"account  {DEV[4]}" in r.stdout
    finally:
        stop(proc)


def test_the_wallet_gives_up_saying_why_a_transaction_is_pending_or_dropped(tmp_path):
    """``wait_included`` against the real API app over a real LevelDB ledger (no network: blocks are produced
    between the wallet's looks, as a validator produces them): a transfer queued behind a nonce gap is reported
    pending with the missing nonce when the wallet's deadline passes, then dropped with the node's reason once the
    gap outlives ``future_ttl_blocks``; the CLI's exit statuses say which."""
    from types import SimpleNamespace

    import trio
    from starlette.testclient import TestClient

    from node.api.app import create_app
    from node.ledger.core.chain import commit_block
    from node.ledger.core.tx import Transfer
    from node.ledger.mempool_policy import Limits
    from node.ledger.service import LedgerService
    from node.ledger.store import LedgerStore
    from node.wallet.cli import EXIT_DROPPED, EXIT_PENDING
    from node.wallet.client import NodeApi, NotIncluded
    from tests.ledger.helpers import KEYS, VALIDATOR, make_genesis

    assert (EXIT_PENDING, EXIT_DROPPED) == (2, 3)
    g = make_genesis()
    store = LedgerStore(tmp_path / "db", g)
    svc = LedgerService(store, g, VALIDATOR, host=None, mempool_limits=Limits(future_ttl_blocks=4))
    node = SimpleNamespace(store=store, ledger=svc, genesis=g, ident=VALIDATOR, api_token="t")
    me = KEYS[1]
    (tmp_path / "node.json").write_text(json.dumps({"api": "http://127.0.0.1", "peer_id": me.peer_id}))
    api = NodeApi(tmp_path)
    api.http = TestClient(create_app(node), base_url="http://127.0.0.1")
    gapped = Transfer(g.domain, me.account, KEYS[2].account, C, 1).signed(me)  # nonce 0 never sent
    svc.add_tx(gapped)
    sub = {"id": gapped.id.hex(), "nonce": 1}

    async def produce():
        value = svc.driver._get_value(svc.state.height + 1)
        block, new_state = svc.driver.blocks[value]
        assert await svc.commit_decided(block, commit_block(VALIDATOR, block), new_state)

    clock = [0.0]

    def sleep(s):  # the wallet's pause between looks: a block goes by
        clock[0] += s
        trio.run(produce)

    with pytest.raises(NotIncluded) as e:
        api.wait_included(sub, 0.5, clock=lambda: clock[0], sleep=sleep)
    assert not e.value.dropped and "not in a block after 0.5 s: pending for" in str(e.value)
    assert "nonce 0 has not reached this node" in str(e.value)
    assert e.value.status["status"] == "pending" and e.value.status["missing_nonce"] == 0
    with pytest.raises(NotIncluded) as e:
        api.wait_included(sub, 60, clock=lambda: clock[0], sleep=sleep)
    assert e.value.dropped and "was dropped by the node" in str(e.value) and "waited 4 blocks for nonce 0" in str(
        e.value)
    assert e.value.status["status"] == "dropped" and svc.state.height <= 6
    store.close()
