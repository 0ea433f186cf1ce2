"""Issue 28's check 2: the table scenario run by hand, as an operator would (``python -m tests.net.jepsen_table``).

Four network namespace hosts, four validators of one genesis made with ``node genesis new`` (each bonded 200 and
holding 1,000 credits, ``--params production`` as in the README unless ``--params`` says otherwise), ``node start``
on each, and a 0.001 credit transfer from every validator's ``node wallet transfer --no-wait`` each second, while:
split {1,2} | {3,4} for 20 s; split {1,2,3} | {4} for 20 s; healed for 15 s; validator 2 killed with SIGKILL for
10 s; validator 2 restarted and 20 s more. Then the wallets stop; after at most 60 s of settling it prints what
every accepted transfer's ``/v1/txs/{id}/status`` said (asked of the node that accepted it), each node's mempool
size and height, and the checks of :meth:`tests.net.jepsen.Jepsen.check_final` on the reopened LevelDBs (no fork,
each transfer in one block or reported dropped, supply conserved). Exit 0 when no transaction is left in a mempool
and none is unreported; 1 otherwise; 2 when network namespaces are unavailable (needs root).

Reuses :class:`tests.net.jepsen.Jepsen` (hosts, genesis, nft cuts, agents) without its slow validator.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

from node.compute.model import make_tiny

from .jepsen import ROOT, Accepted, Jepsen, JepsenFailure
from .netns import Netns, NetnsUnavailable

PHASES = (("split {1,2} | {3,4}", 20.0), ("split {1,2,3} | {4}", 20.0), ("healed", 15.0),
          ("validator 2 killed with SIGKILL", 10.0), ("validator 2 restarted", 20.0))
IN_FLIGHT = 4  # wallet calls one validator's loop may have running at once


class Table:
    """One run of the scenario on ``Jepsen`` ``j`` (set up and started)."""

    def __init__(self, j: Jepsen):
        self.j = j
        self.stop = threading.Event()
        self.cli_failures: list[str] = []
        self.rows: list[str] = []
        self.skipped = 0  # seconds in which a wallet had IN_FLIGHT calls still running and started none

    def wallet_loop(self, name: str) -> None:
        """``node wallet --data-dir D --json transfer --no-wait TO 0.001`` once a second, to the next validator in
        turn, each call in its own thread (a call takes seconds on a loaded machine; at most
        :data:`IN_FLIGHT` at once per wallet); each accepted transfer (its id and nonce) goes to the run's record."""
        j, names = self.j, self.j.validators
        others = [j.vals[n].peer_id for n in names if n != name]
        slots, k, calls = threading.Semaphore(IN_FLIGHT), 0, []
        while not self.stop.is_set():
            t0 = time.monotonic()
            if slots.acquire(blocking=False):
                t = threading.Thread(target=self.wallet_call, args=(name, others[k % len(others)], slots),
                                     daemon=True)
                t.start()
                calls.append(t)
                k += 1
            else:
                self.skipped += 1
            self.stop.wait(max(0.0, 1.0 - (time.monotonic() - t0)))
        for t in calls:
            t.join(timeout=60)

    def wallet_call(self, name: str, to: str, slots: threading.Semaphore) -> None:
        j = self.j
        v = j.vals[name]
        argv = [sys.executable, "-m", "node.cli", "wallet", "--data-dir", str(v.data_dir), "--json", "transfer",
                "--no-wait", to, "0.001"]
        try:
            try:
                r = j.net.run(v.host, argv, timeout=30)
                if r.returncode == 0:
                    out = json.loads(r.stdout)
                    with j._rec_lock:
                        j.rec.accepted.append(Accepted(name, out["id"], out.get("nonce", -2), time.time()))
                else:
                    why = (r.stderr or r.stdout).strip()[-160:]
                    with j._rec_lock:
                        self.cli_failures.append(f"{name}: exit {r.returncode}: {why}")
            except Exception as e:  # noqa: BLE001 - a wallet call that hangs or prints garbage is recorded, the loop goes on
                with j._rec_lock:
                    self.cli_failures.append(f"{name}: {type(e).__name__}: {e}"[:200])
        finally:
            slots.release()

    def heights(self) -> str:
        return " ".join(f"{n}={h}" for n, h in self.j.heights().items())

    def run(self) -> None:
        j = self.j
        threads = [threading.Thread(target=self.wallet_loop, args=(n,), daemon=True) for n in j.validators]
        for t in threads:
            t.start()
        v = j.validators
        began = 0.0
        for i, (what, hold) in enumerate(PHASES):
            before = self.heights()
            if i in (0, 3):
                began = time.time()  # a fault: from here until progress resumed (the latency check leaves it out)
            if i == 0:
                j.cut({frozenset((a, b)) for a in v[:2] for b in v[2:]})
            elif i == 1:
                j.cut({frozenset((a, v[3])) for a in v[:3]})
            elif i == 2:
                j.heal()
            elif i == 3:
                j.vals[v[1]].proc.send_signal(signal.SIGKILL)
                j.vals[v[1]].proc.wait(timeout=10)
            else:
                j.start_node(v[1])
                j.wait_up(v[1])
            time.sleep(hold)
            self.rows.append(f"{what}, {hold:g} s: heights {before} -> {self.heights()}")
            print(self.rows[-1], flush=True)
            if i in (2, 4):  # healed / restarted: the fault lasts until every node passes the height seen at its end
                top = max(h for h in j.heights().values() if h is not None)
                j.wait_progress(top + 1, what)
                j.rec.faults.append((began, time.time()))
        self.stop.set()
        for t in threads:
            t.join(timeout=60)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--params", default="production", help="node genesis new --params (default: production)")
    ap.add_argument("--keep", type=Path, help="copy the node logs here")
    args = ap.parse_args()
    try:
        net = Netns(prefix_note="table")
    except NetnsUnavailable as e:
        print(f"network namespaces unavailable: {e}", file=sys.stderr)
        return 2
    tmp = Path(tempfile.mkdtemp(prefix="tally-table-"))
    j = None
    try:
        cache = tmp / "models"
        make_tiny(cache, seed=0)
        j = Jepsen(net, tmp, cache, seed=0, swarm=False, slow=False, params=args.params, min_transfers=0,
                   allow_dropped=True)  # this scenario reports drops (with their reasons) and counts wallet failures
        j.setup()
        j.start()
        table = Table(j)
        t0 = time.monotonic()
        table.run()
        print(f"wallets stopped after {time.monotonic() - t0:.0f} s; {len(j.rec.accepted)} transfers accepted, "
              f"{len(table.cli_failures)} wallet calls failed, {table.skipped} wallet-seconds skipped (calls still "
              f"running)", flush=True)
        final = j.settle()  # (workload already stopped) at most 60 s until every one is included or dropped
        statuses = Counter(f.get("status") for f in final.values())
        reasons = Counter(f.get("reason") for f in final.values() if f.get("status") == "dropped")
        mempools = {}
        for name, val in j.vals.items():
            s, body = val.agent.call("GET", "/v1/status")
            mempools[name] = (body["mempool"], body["height"]) if s == 200 else ("no answer", None)
        print(f"every /v1/txs/{{id}}/status at the end: {dict(statuses)}; dropped reasons {dict(reasons)}")
        for a in j.rec.accepted:
            f = final.get(a.id, {})
            if f.get("status") != "included":
                print(f"  {a.node} nonce {a.nonce} {a.id[:16]}: {json.dumps(f)[:300]}")
        print("mempool and height of each node: " + ", ".join(f"{n} {m} (height {h})" for n, (m, h) in
                                                            mempools.items()))
        if table.cli_failures:
            by_node = Counter(f.split(":", 1)[0] for f in table.cli_failures)
            print(f"wallet calls that failed, by node {dict(by_node)} (first 10):\n  "
                  + "\n  ".join(table.cli_failures[:10]))
        left = sum(m for m, _ in mempools.values() if isinstance(m, int))
        unreported = [a for a in j.rec.accepted if final.get(a.id, {}).get("status") not in ("included", "dropped")]
        try:
            print(j.check_final(final))
            ok = True
        except JepsenFailure as e:
            print(f"check_final: {e}")
            ok = False
        if args.keep:
            args.keep.mkdir(parents=True, exist_ok=True)
            for log in tmp.glob("*.log"):
                (args.keep / log.name).write_bytes(log.read_bytes())
        print(f"left in a mempool: {left}; unreported: {len(unreported)}")
        return 0 if ok and left == 0 and not unreported else 1
    finally:
        if j is not None:
            j.close()
        net.close()


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
