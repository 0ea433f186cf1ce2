"""``bench/ledger.py``'s receipt rate at scale (issue 27, check 1): receipts applied per second through a validator
that holds 10^4 and 10^6 live receipts, against the raw Ed25519 verify rate of one thread, in one run.

For each size, a copy of a store built by ``bench/ledger.py --scale --keep DIR`` (``DIR/ledger-<n>``, see
:mod:`ledger_scale`; a 10^4 store is built here, in a few seconds, when none is given) is opened in a fresh
subprocess, and ``--blocks`` blocks of ``--per-block`` pre-signed real receipts (fresh decoded objects, as a node
gets them) go through :func:`node.ledger.core.chain.propose` (each receipt's two signatures verified once, on
every core, before the block is applied), :func:`~node.ledger.core.chain.commit_block` and
:meth:`~node.ledger.store.LedgerStore.append` (the block, the state changes and the state tree in one fsynced
LevelDB batch). The rate is receipts over the summed block times (seconds) of the steady state: the first
``challenge_window + 1`` blocks are a warm-up, not counted, so that every timed block both takes in a block of new
receipts and settles the receipts of the block ``challenge_window`` before it (as a busy chain does; before the window
has passed, a block only inserts, and costs about half). Each size's line also gives the state tree's work per timed
block, which does not depend on the machine's load: node reads that missed the node caches (LevelDB reads) and nodes
written, and where the block's time went (:class:`Phases`: signatures, transactions, end of block, state root,
block encoding and explorer index, batch staging, LevelDB write and fsync; wall milliseconds, the mean of the timed
blocks). ``--profile`` then applies as many blocks again under cProfile (not counted in the rate) and prints the profile
of the slowest of them, per size, to stderr.

Usage: ``.venv/bin/python bench/ledger.py --rate [--store-dir DIR] [--blocks N] [--per-block N] [--profile]``
(this file directly takes the same flags).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import ledger_scale  # (bench/ledger_scale.py: the stores, their genesis, keys and receipts)

SIZES = (10**4, 10**6)
TARGETS = {10**4: 0.5, 10**6: 0.4}  # receipts applied / raw verifies (issue 27, check 1)


def raw_verify_rate(n: int = 20_000) -> float:
    """Ed25519 verifications per second on one thread (pynacl, one key, 32-byte messages)."""
    import nacl.signing

    sk = nacl.signing.SigningKey.generate()
    vk = sk.verify_key
    msgs = [os.urandom(32) for _ in range(n)]
    sigs = [sk.sign(m).signature for m in msgs]
    t0 = time.perf_counter()
    for m, s in zip(msgs, sigs, strict=True):
        vk.verify(m, s)
    return n / (time.perf_counter() - t0)


PHASES = ("signatures", "transactions", "end of block", "state root", "of which tree", "block + index encoding",
          "batch staging", "write + fsync")


class Phases:
    """Wall time per phase of a block, summed while :attr:`on`: wraps the ledger's own functions (in this child
    process only) and the store's write batch. The wrappers cost ~1 us per call (~2,000 calls per 500-receipt
    block). ``state root`` includes the record encoding that feeds the tree (``of which tree``: the tree alone);
    ``batch staging`` is :func:`node.ledger.statedb.stage_state` without the state root (node, row and undo
    puts); ``write + fsync`` the LevelDB batch's write with ``sync=True``."""

    def __init__(self) -> None:
        self.s: dict[str, float] = dict.fromkeys(PHASES, 0.0)
        self.on = False

    def wrap(self, owner: Any, name: str, phase: str, minus: str | None = None) -> None:
        """Replace ``owner.name`` with a timed call that adds to ``phase`` (less what ``minus`` gained meanwhile)."""
        f = getattr(owner, name)
        s = self.s

        def timed(*a: Any, **k: Any) -> Any:
            if not self.on:
                return f(*a, **k)
            inner = s[minus] if minus else 0.0
            t = time.perf_counter()
            try:
                return f(*a, **k)
            finally:
                s[phase] += time.perf_counter() - t - ((s[minus] - inner) if minus else 0.0)

        setattr(owner, name, timed)

    def install(self, store: Any) -> None:
        """Wrap the phases' functions, and ``store.db`` so that its write batches time their write."""
        from node.ledger import statedb, store as store_mod
        from node.ledger.core import chain, state as state_mod, tree as tr

        self.wrap(state_mod, "presign_check", "signatures")
        self.wrap(state_mod, "apply_tx", "transactions")
        self.wrap(state_mod, "end_block", "end of block")
        self.wrap(state_mod.State, "state_root", "state root")
        self.wrap(tr.StateTree, "compute", "of which tree")
        self.wrap(chain, "tx_root", "block + index encoding")
        self.wrap(store_mod.blockcodec, "encode_record", "block + index encoding")
        self.wrap(store_mod, "index_block", "block + index encoding")
        self.wrap(statedb, "stage_state", "batch staging", minus="state root")
        store.db = _TimedDB(store.db, self)

    def take(self) -> dict[str, float]:
        """The phases' seconds since the last take."""
        out = dict(self.s)
        self.s.update(dict.fromkeys(PHASES, 0.0))
        return out


class _TimedDB:
    """``store.db`` whose write batches add their write (fsync included) to a :class:`Phases`."""

    def __init__(self, db: Any, phases: Phases) -> None:
        self._db, self._phases = db, phases

    def write_batch(self, **kw: Any) -> Any:
        return _TimedBatch(self._db.write_batch(**kw), self._phases)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._db, name)


class _TimedBatch:
    def __init__(self, wb: Any, phases: Phases) -> None:
        self._wb, self._phases = wb, phases

    def __enter__(self) -> Any:
        return self._wb.__enter__()

    def __exit__(self, *exc: Any) -> Any:
        t = time.perf_counter()
        try:
            return self._wb.__exit__(*exc)
        finally:
            if self._phases.on:
                self._phases.s["write + fsync"] += time.perf_counter() - t


def store_rate(src: Path, blocks: int, per_block: int, profile: bool = False) -> dict[str, Any]:
    """Apply ``challenge_window + 1`` warm-up blocks and ``blocks`` timed blocks of ``per_block`` receipts to a copy
    of the store at ``src`` (see the module docstring). Returns ``{"n", "receipts_per_s", "block_ms", "cpu_ms",
    "rss_mib", "profile"}`` (times of the counted blocks, in ms; ``n`` the live receipts before the first block).

    Raises:
        FileNotFoundError: no store at ``src``. RuntimeError: a receipt was refused.
    """
    from node.encoding import pack, unpack
    from node.ledger.core import tree as tr
    from node.ledger.core.tx import decode_tx
    from node.ledger.store import LedgerStore

    reads, written = [0], [0]  # the state tree's LevelDB node reads and node writes (this child process only)
    get, stage = tr.LevelNodes.get, tr.stage

    def counting_get(self: Any, node_key: bytes) -> bytes | None:
        if node_key not in self.cache.hot and node_key not in self.cache.cold:
            reads[0] += 1
        return get(self, node_key)

    def counting_stage(batch: Any, tree: Any, height: int, prune: Any) -> None:
        written[0] += len(tree.pending)
        stage(batch, tree, height, prune)

    tr.LevelNodes.get = counting_get  # type: ignore[method-assign]
    tr.stage = counting_stage

    if not (src / "CURRENT").exists():
        raise FileNotFoundError(f"no LevelDB store at {src}")
    g = ledger_scale.scale_genesis()
    val, workers, requesters = ledger_scale.keys()
    with tempfile.TemporaryDirectory(prefix="tally-rate-") as tmp:
        d = Path(tmp) / "ledger"
        shutil.copytree(src, d)
        store = LedgerStore(d, g)
        phases = Phases()
        try:
            state = store.replay()
            phases.install(store)
            n = len(state.receipts)
            pre = []
            warm = g.params.challenge_window + 1  # untimed: until each block also settles (module docstring)
            runs = warm + 2 * blocks if profile else warm + blocks  # profiled blocks come after the timed ones
            for i in range(runs * per_block):
                rc = ledger_scale.make_receipt(g, workers[i % len(workers)], requesters[i % len(requesters)],
                                               os.urandom(16), state.height, os.urandom(8))
                pre.append(decode_tx(unpack(pack(rc.to_wire()))))
            wall, cpu, profs, prof_wall, tree_reads, tree_writes = [], [], [], [], [], []
            split = dict.fromkeys(PHASES, 0.0)
            for j in range(runs):
                reads[0] = written[0] = 0
                prof = cProfile.Profile() if j >= warm + blocks else None
                c0 = time.process_time()
                phases.on = warm <= j < warm + blocks
                if prof:
                    prof.enable()
                state, dt = ledger_scale._block(store, state, pre[j * per_block:(j + 1) * per_block], val)
                if prof:
                    prof.disable()
                    profs.append(prof)
                    prof_wall.append(dt)
                elif j >= warm:  # the first ones warm the caches up and fill the challenge window
                    wall.append(dt)
                    cpu.append(time.process_time() - c0)
                    tree_reads.append(reads[0])
                    tree_writes.append(written[0])
                    for k, v in phases.take().items():
                        split[k] += v
            rss = ledger_scale.rss_mib()
        finally:
            store.close()
    out: dict[str, Any] = {"n": n, "receipts_per_s": blocks * per_block / sum(wall),
                           "block_ms": [round(x * 1e3, 1) for x in wall], "cpu_ms": [round(x * 1e3, 1) for x in cpu],
                           "rss_mib": rss, "profile": "", "tree_reads": tree_reads, "tree_writes": tree_writes,
                           "phases_ms": {k: round(v / blocks * 1e3, 1) for k, v in split.items()}}
    if profile:
        slow = max(range(len(prof_wall)), key=lambda i: prof_wall[i])
        s = io.StringIO()
        s.write(f"--- slowest of {blocks} blocks of {per_block} receipts at {n} live receipts, profiled after the "
                f"timed ones: {prof_wall[slow] * 1e3:.0f} ms under cProfile ---\n")
        pstats.Stats(profs[slow], stream=s).sort_stats("tottime").print_stats(30)
        out["profile"] = s.getvalue()
    return out


def _child(src: Path, blocks: int, per_block: int, profile: bool, timeout: float) -> dict[str, Any]:
    args = [sys.executable, str(Path(__file__).resolve()), "--child", str(src), "--rate-blocks", str(blocks),
            "--rate-per-block", str(per_block), *(["--profile"] if profile else [])]
    try:
        r = subprocess.run(args, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"the rate at {src} ran past {timeout:.0f} s and was killed") from None
    if r.returncode != 0 or not r.stdout.strip():
        raise RuntimeError(f"the rate at {src} failed (exit {r.returncode}): {r.stderr.strip()[-1500:]}")
    out: dict[str, Any] = json.loads(r.stdout.strip().splitlines()[-1])
    return out


def run_rates(store_dir: Path | None, blocks: int = 4, per_block: int = 500, profile: bool = False,
              timeout: float = 1800) -> list[str]:
    """The printed lines: the raw verify rate, then for each of 10^4 and 10^6 live receipts the receipts applied
    per second and the ratio against its target (a size whose store is missing is named, with the command that
    builds it). The raw rate is measured before and after the sizes, and their mean used (the machine drifts).

    Raises:
        RuntimeError: a child failed or timed out.
    """
    lines = []
    raw0 = raw_verify_rate()
    rows = []
    with tempfile.TemporaryDirectory(prefix="tally-rate-src-") as tmp:
        for n in SIZES:
            src = (store_dir or Path(tmp)) / f"ledger-{n}"
            if not (src / "CURRENT").exists():
                if n > 10**4:
                    rows.append((n, None))
                    continue
                ledger_scale.build(src, n)  # 10^4: seconds
            rows.append((n, _child(src, blocks, per_block, profile, timeout)))
    raw = (raw0 + raw_verify_rate()) / 2
    lines.append(f"raw pynacl verify (1 thread): {raw:.0f} /s (mean of {raw0:.0f} before and the one after)")
    for n, r in rows:
        name = ledger_scale._size(n)
        if r is None:
            lines.append(f"at {name} live receipts: not measured (no store: build one with .venv/bin/python "
                         f"bench/ledger.py --scale --sizes 10000,{n} --keep DIR, then --rate --store-dir DIR)")
            continue
        ratio = r["receipts_per_s"] / raw
        lines.append(f"at {name} live receipts ({r['n']} held): {r['receipts_per_s']:.0f} receipts/s through a "
                     f"validator ({per_block}-receipt blocks, propose + commit + fsync; {os.cpu_count()} cores), "
                     f"ratio {ratio:.2f} (target >= {TARGETS[n]}) {'MET' if ratio >= TARGETS[n] else 'NOT MET'}; "
                     f"blocks {r['block_ms']} ms, cpu {r['cpu_ms']} ms, RSS {r['rss_mib']:.0f} MiB; state tree per "
                     f"block: LevelDB node reads {r['tree_reads']}, nodes written {r['tree_writes']}")
        ph = r["phases_ms"]
        rest = sum(r["block_ms"]) / len(r["block_ms"]) - sum(v for k, v in ph.items() if k != "of which tree")
        lines.append(f"  where a block's {sum(r['block_ms']) / len(r['block_ms']):.0f} ms went (mean, wall ms): "
                     + ", ".join(f"{k} {v:.0f}" for k, v in ph.items()) + f", the rest {rest:.0f}")
        if profile:
            print(r["profile"], file=sys.stderr)
    return lines


def add_args(ap: argparse.ArgumentParser) -> None:
    """The ``--rate`` options (shared with bench/ledger.py)."""
    ap.add_argument("--store-dir", type=Path, default=None,
                    help="where --scale --keep built ledger-10000 and ledger-1000000 (default: build 10^4 only)")
    ap.add_argument("--rate-blocks", type=int, default=4,
                    help="blocks timed per size for --rate, after the warm-up ones that fill the challenge window "
                         "(default 4)")
    ap.add_argument("--rate-per-block", type=int, default=500, help="receipts per block for --rate (default 500)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_args(ap)
    ap.add_argument("--profile", action="store_true", help="cProfile the slowest block of each size (stderr)")
    ap.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(store_rate(args.child, args.rate_blocks, args.rate_per_block, args.profile)))
        return
    print("\n".join(run_rates(args.store_dir, args.rate_blocks, args.rate_per_block, args.profile)))


if __name__ == "__main__":
    main()
