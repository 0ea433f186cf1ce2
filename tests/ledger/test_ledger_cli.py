"""``node ledger info|verify`` on a real LevelDB: a clean chain verifies, a damaged state is found and repaired,
a tampered block is reported, a running node's data dir is refused."""

from __future__ import annotations

import io
import json
from types import SimpleNamespace

import pytest

from node.encoding import pack
from node.ledger import statedb
from node.ledger.cli import run_ledger_command
from node.ledger.store import LedgerStore
from node.lockfile import hold

from .helpers import W1, make_genesis
from .test_store import grow


def _chain(tmp_path, n=8):
    g = make_genesis()
    gfile = tmp_path / "genesis.json"
    gfile.write_text(json.dumps(g.to_doc()))
    store = LedgerStore(tmp_path / "data" / "ledger", g)
    grow(store, store.replay(), g, n)
    store.close()
    return g, gfile


def _run(tmp_path, gfile, cmd, **kw):
    out = io.StringIO()
    args = SimpleNamespace(ledger_cmd=cmd, data_dir=tmp_path / "data", genesis=gfile, repair=False, **kw)
    return run_ledger_command(args, out), out.getvalue()


def test_verify_info_and_repair(tmp_path):
    g, gfile = _chain(tmp_path)
    rc, text = _run(tmp_path, gfile, "verify")
    assert rc == 0 and "ok: 8 blocks verified from genesis" in text
    assert "verified 8/8 blocks" in text  # plain progress lines, not a bar, when not a terminal
    rc, text = _run(tmp_path, gfile, "info")
    assert rc == 0 and "head: 8" in text and "stored state: 8" in text and "blocks: 8 keys" in text

    store = LedgerStore(tmp_path / "data" / "ledger", g)
    store.db.put(statedb.PREFIX["accounts"] + W1.account, pack([7, 0, 0, 0, 0, 0]))
    store.close()
    rc, text = _run(tmp_path, gfile, "verify")
    assert rc == 1 and "differs" in text and "--repair" in text
    out = io.StringIO()
    rc = run_ledger_command(SimpleNamespace(ledger_cmd="verify", data_dir=tmp_path / "data", genesis=gfile,
                                            repair=True), out)
    assert rc == 0 and "repaired" in out.getvalue()
    rc, text = _run(tmp_path, gfile, "verify")
    assert rc == 0 and "the stored state matches" in text


def test_a_tampered_block_is_reported(tmp_path):
    g, gfile = _chain(tmp_path, 4)
    store = LedgerStore(tmp_path / "data" / "ledger", g)
    key = b"B" + (3).to_bytes(8, "big")
    raw = bytearray(store.db.get(key))
    raw[-5] ^= 0xFF
    store.db.put(key, bytes(raw))
    store.close()
    rc, text = _run(tmp_path, gfile, "verify")
    assert rc == 2 and "block 3 does not verify" in text


def test_a_running_node_and_a_missing_ledger_are_refused(tmp_path):
    _g, gfile = _chain(tmp_path, 1)
    lock = hold(tmp_path / "data" / "node.lock")
    try:
        with pytest.raises(SystemExit, match="is running in"):
            _run(tmp_path, gfile, "verify")
    finally:
        lock.close()
    with pytest.raises(SystemExit, match="no ledger in"):
        run_ledger_command(SimpleNamespace(ledger_cmd="info", data_dir=tmp_path / "nowhere", genesis=gfile,
                                           repair=False), io.StringIO())
