"""Verification benchmark: do the genesis parameters make cheating unprofitable and detectable, and what does
checking cost?

Part A — cheaters against the real sampling and state-transition code (``node.ledger.core.state``): a worker
serves receipts one per block, faking each with probability r; every sampled receipt gets committee votes (a
fake one is voted invalid: ``tests/verify/test_cheats.py`` shows every cheat kind is caught when re-executed),
the state transition pays, slashes and adapts the sampling probability. Printed: how soon a cheater is caught,
and its balance + bond against an honest worker's (a faked receipt saves the whole cost of its work, valued at
its price). A second, faster estimate uses the same pure functions (``sampling_ppm``, ``is_sampled``) without
the ledger, for the ≥ 99 % figure.

Part B — committee compute ÷ worker compute over N real sessions through a span of the model (incremental
decoding by the worker, one prefill per committee member for sampled sessions) at the genesis sampling rate,
and the count of false-invalid verdicts among honest sessions.

Part C (``--batch``, issue 14 check 3) — a colluding pair among five workers of a batch job with k = 3, q = 2:
a real batch posted to the real state transition, its items drawn by the beacon (``node.ledger.core.batch``);
printed: the share of items whose three workers include both colluders (so that their shared wrong result would
be the majority), beside the exact hypergeometric probability C(2,2)·C(3,1)/C(5,3) = 0.3 and the binomial
estimate (each replica a colluder with probability 2/5, independently) for comparison. Then (``--audit-ppm``) the
pair plays its cheat through commits, reveals and committee audits: the share of its won items that audits
overturn, beside the sampling rate, and its mean net gain per won item (negative: cheating does not pay).

Usage: ``.venv/bin/python bench/verify.py [--model tiny|smollm2] [--trials N] [--sessions N]``;
``.venv/bin/python bench/verify.py --batch [--items N]`` runs part C alone.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import secrets
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from node.encoding import H  # noqa: E402
from node.identity import Identity, dev_seed  # noqa: E402
from node.ledger.core.batchstate import item_key  # noqa: E402
from node.ledger.core.batchtx import BatchPost, items_root  # noqa: E402
from node.ledger.core.sampling import PPM, is_sampled, sampling_ppm  # noqa: E402
from node.ledger.core.state import apply_block_body, genesis_state  # noqa: E402
from node.ledger.core.tabs.rules import draw  # noqa: E402
from node.ledger.core.tx import INVALID, VALID, Receipt, Vote  # noqa: E402
from node.ledger.genesis import Genesis, Params  # noqa: E402

C = 10**9
PARAMS = Params(**json.loads((ROOT / "genesis" / "production-params.json").read_text())["params"])
KEYS = [Identity.from_seed(dev_seed(i)) for i in range(8)]
WORKER, CLIENT, MEMBERS = KEYS[1], KEYS[0], KEYS[2:6]
TOKENS, BLOCKS = 50, 10  # one session: 50 tokens through a 10-block span
PRICE = TOKENS * BLOCKS * PARAMS.price_per_token_block


def genesis() -> Genesis:
    bal = [(CLIENT.account, 10**6 * C, 0), (WORKER.account, 0, 2 * PARAMS.slash_amount)]
    bal += [(m.account, 0, PARAMS.min_bond) for m in MEMBERS]
    return Genesis("tally-sim", 0, (CLIENT.account,), tuple(bal), PARAMS)


def run_ledger(rate: float, n: int, seed: int) -> dict:
    """One worker, ``n`` receipts (one per block), each faked with probability ``rate``."""
    rng = random.Random(seed)
    g = genesis()
    state = genesis_state(g)
    start_wealth = state.account(WORKER.account).balance + state.account(WORKER.account).bond
    fake: dict[bytes, bool] = {}
    first_catch, gain, served = None, 0, 0
    pending_votes: list = []
    h = 0
    for i in range(n):
        acc = state.account(WORKER.account)
        if acc.bond < PARAMS.min_bond:
            break  # slashed below the bond a worker needs: out of business
        cheat = rng.random() < rate
        r = Receipt(g.domain, rng.randbytes(16), WORKER.account, CLIENT.account, b"m" * 32, 0, BLOCKS, TOKENS,
                    rng.randbytes(32), rng.randbytes(32), PRICE, h).sign_worker(WORKER).countersign(CLIENT)
        fake[r.id] = cheat
        served += 1
        if cheat:
            gain += PRICE  # the work it never did
        h += 1
        state = apply_block_body(state, h, rng.randbytes(32), [r, *pending_votes])
        pending_votes = []
        for rid in list(state.open_receipts):
            rec = state.receipts[rid]
            if rec.status == "sampled" and not rec.votes:
                verdict = INVALID if fake[rid] else VALID
                pending_votes += [Vote(g.domain, rid, m, rec.round, verdict, 0).signed(
                    next(k for k in MEMBERS if k.account == m)) for m in rec.committee]
                if fake[rid] and first_catch is None:
                    first_catch = i + 1
    for _ in range(PARAMS.challenge_window + 2):  # let the last receipts settle
        h += 1
        state = apply_block_body(state, h, os.urandom(32), pending_votes)
        pending_votes = []
    acc = state.account(WORKER.account)
    wealth = acc.balance + acc.bond - start_wealth
    return {"first_catch": first_catch, "served": served, "cheat_gain": gain, "wealth": wealth,
            "slashed": acc.slashed, "supply_ok": state.supply() == g.supply}


def fast_first_catch(rate: float, n: int, seed: int) -> int | None:
    """The same sampling rule (real ``sampling_ppm`` and ``is_sampled``) without the ledger around it."""
    rng = random.Random(seed)
    valid_run = 0
    for i in range(n):
        cheat = rng.random() < rate
        p = sampling_ppm(PARAMS.sample_base_ppm, PARAMS.sample_floor_ppm, valid_run, PARAMS.adapt_step)
        if is_sampled(rng.randbytes(32), H(seed.to_bytes(8, "big"), i.to_bytes(8, "big")), p):
            if cheat:
                return i + 1
            valid_run += 1
    return None


def part_a(trials: int) -> None:
    print(f"== A. cheaters vs genesis parameters (genesis/production-params.json): "
          f"sampling {PARAMS.sample_base_ppm / PPM:g}"
          f" for new workers, halving every {PARAMS.adapt_step} valid verdicts, "
          f"floor {PARAMS.sample_floor_ppm / PPM:g}; "
          f"slash {PARAMS.slash_amount / C:g} credits; receipt price {PRICE / C:g} credits")
    n = 2000
    fast = [fast_first_catch(0.05, n, s) for s in range(50 * trials)]
    caught = sum(1 for x in fast if x is not None) / len(fast)
    print(f"   5% cheater caught within {n} receipts (sampling rule alone, {len(fast)} runs): {caught:.4f}"
          f"   (target >= 0.99)")
    new = [fast_first_catch(1.0, 10, s) for s in range(20 * trials)]
    print(f"   new worker cheating from its first receipt, caught within its first 10: "
          f"{sum(1 for x in new if x is not None) / len(new):.4f}; median first catch at receipt "
          f"{statistics.median([x for x in new if x]):g}")
    print(f"   with the ledger (apply_block_body, votes, slashing), {trials} runs of up to {n} receipts per rate:")
    print(f"   {'cheat rate':>10} {'caught within 2000':>19} {'median 1st catch':>17} {'receipts served':>16} "
          f"{'gain from fakes':>16} {'net vs honest':>14}")
    honest = [run_ledger(0.0, n, s) for s in range(max(1, trials // 4))]
    honest_wealth = statistics.mean(x["wealth"] for x in honest)
    for rate in (0.01, 0.05, 0.30, 1.00):
        runs = [run_ledger(rate, n, 1000 + s) for s in range(trials)]
        assert all(r["supply_ok"] for r in runs)
        c = [r["first_catch"] for r in runs if r["first_catch"]]
        net = statistics.mean(r["wealth"] + r["cheat_gain"] - honest_wealth * r["served"] / n for r in runs)
        print(f"   {rate:>10.0%} {len(c) / len(runs):>19.2f} {statistics.median(c) if c else float('nan'):>17g} "
              f"{statistics.mean(r['served'] for r in runs):>16.0f} "
              f"{statistics.mean(r['cheat_gain'] for r in runs) / C:>16.2f} {net / C:>14.2f}")
    print("   (net vs honest, credits: the cheater's balance + bond change plus the cost it saved on fakes, minus an"
          " honest worker's balance change over the same number of receipts; negative = cheating lost money)")


def part_b(model: str, sessions: int) -> None:
    import torch

    from node.compute.compare import distance, is_valid
    from node.compute.model import ensure_smollm2, make_tiny
    from node.compute.span import SpanModel

    torch.set_num_threads(1)
    model_dir = make_tiny(Path("/tmp/tally-bench-models"), 0) if model == "tiny" else ensure_smollm2()
    span = SpanModel(model_dir, 0, min(10, SpanModel(model_dir, 0, 1).manifest.num_blocks))
    rng = random.Random(0)
    worker_s = committee_s = 0.0
    false_invalid = sampled = 0
    valid_run = 0
    k = PARAMS.committee_size
    for i in range(sessions):
        x = torch.randn(1, 48, span.hidden_size, generator=torch.Generator().manual_seed(i))
        t0 = time.perf_counter()
        cache = span.new_cache()
        outs = [span.forward(x[:, :16], cache)] + [span.forward(x[:, t:t + 1], cache) for t in range(16, 48)]
        worker_s += time.perf_counter() - t0
        p = sampling_ppm(PARAMS.sample_base_ppm, PARAMS.sample_floor_ppm, valid_run, PARAMS.adapt_step)
        if is_sampled(rng.randbytes(32), rng.randbytes(32), p):
            sampled += 1
            t0 = time.perf_counter()
            redo = span.prefill(x)
            committee_s += k * (time.perf_counter() - t0)  # every member re-executes once
            ok = is_valid(distance(torch.cat(outs, dim=1), redo))
            false_invalid += not ok
            valid_run += ok
    print(f"== B. {sessions} real sessions (48 tokens: 16 prefill + 32 steps) through blocks "
          f"[{span.start}, {span.end}) of {span.manifest.name}, 1 torch thread")
    print(f"   sampled {sampled} (adaptive: a new worker starts at p = 1, floor {PARAMS.sample_floor_ppm / PPM:g}), "
          f"committee of {k}")
    print(f"   committee compute / worker compute: {committee_s / worker_s:.4f}   (target <= 0.05)")
    print(f"   false-invalid verdicts among honest sessions: {false_invalid}")


def batch_offers(s, ws: list[Identity]) -> list:
    """Every worker's opt-in to batch work at any price (floor 0, nonce 0) on state ``s``'s chain: only opted-in
    accounts are drawn."""
    from node.ledger.core.batchtx import BatchOffer

    return [BatchOffer(s.chain_id, w.account, 0, 0).signed(w) for w in ws]


def part_c(items: int, workers: int = 5, colluders: int = 2, k: int = 3, q: int = 2) -> dict[str, float]:
    """Share of ``items`` beacon-drawn items (k of ``workers``) in which the ``colluders`` hold a quorum ``q``.
    Returns the measured share, the hypergeometric and binomial estimates and the 95 % binomial half-width."""
    from math import comb

    keys = [Identity.from_seed(dev_seed(i)) for i in range(workers + 1)]
    req, ws = keys[0], keys[1:]
    p = Params(block_time_ms=100, max_receipt_price=C, slash_amount=100 * C)
    bal = ((req.account, 10**6 * C, 0),) + tuple((w.account, 0, 100 * C) for w in ws)
    g = Genesis("batch-bench", 0, (req.account,), bal, p)
    s = genesis_state(g)
    post = BatchPost(g.domain, req.account, b"\x01" * 16, items_root([b"%d" % i for i in range(items)]), items,
                     "generate", 16, k, q, 16, 0, 10_000, 10_000, 0).signed(req)  # the floor: 1 per token
    s = apply_block_body(s, 1, H(b"bench-beacon", b"1"), [*batch_offers(s, ws), post])
    h = 1
    while s.tables["batches"][post.batch_id].assigned < items:
        h += 1
        s = apply_block_body(s, h, H(b"bench-beacon", str(h).encode()), [])
    bad = {w.account for w in ws[:colluders]}
    hits = sum(1 for i in range(items)
               if len(bad & set(s.tables["batch_items"][item_key(post.batch_id, i)].workers)) >= q)
    share = hits / items
    hyper = sum(comb(colluders, j) * comb(workers - colluders, k - j) for j in range(q, min(k, colluders) + 1)) \
        / comb(workers, k)
    r = colluders / workers
    binom = sum(comb(k, j) * r**j * (1 - r) ** (k - j) for j in range(q, k + 1))
    half = 1.96 * (hyper * (1 - hyper) / items) ** 0.5
    print(f"== C. colluding pair: {colluders} of {workers} workers, k = {k}, q = {q}, {items} beacon-drawn items "
          f"({h - 1} blocks)")
    print(f"   share of items where the colluders form the majority: {share:.4f}")
    print(f"   hypergeometric (exact for this draw): {hyper:.4f} ± {half:.4f} (95 %)   "
          f"binomial (independent replicas, p = {r:g}): {binom:.4f}")
    return {"share": share, "hypergeometric": hyper, "binomial": binom, "half_width": half}


def part_c_audits(items: int, audit_ppm: int, workers: int = 5, colluders: int = 2, k: int = 3,
                  q: int = 2) -> dict[str, float]:
    """The same pair, now playing its cheat through the real state transition: every drawn worker commits and
    reveals (the pair a shared wrong hash, the rest the right one) and every audit committee member votes likewise
    (``node.ledger.core.batchaudit``, genesis ``batch_audit_ppm`` = ``audit_ppm``). Returns the items the pair won,
    the share of those overturned, and the pair's mean net gain per item it won (price paid, less the slashes of
    overturned ones), in base units."""
    from node.ledger.core.batchstate import AuditStatus, BatchStatus, ItemStatus
    from node.ledger.core.batchtx import BatchAuditVote, BatchCommit, BatchReveal, commitment

    keys = [Identity.from_seed(dev_seed(i)) for i in range(workers + 1)]
    req, ws = keys[0], keys[1:]
    by = {w.account: w for w in ws}
    price, slash = 10**6, 10 * C
    p = Params(block_time_ms=100, max_receipt_price=C, slash_amount=100 * C, batch_slash=slash,
               batch_audit_ppm=audit_ppm)
    bal = ((req.account, 10**6 * C, 0),) + tuple((w.account, 0, 10**4 * C) for w in ws)
    g = Genesis("batch-bench", 0, (req.account,), bal, p)
    s = genesis_state(g)
    post = BatchPost(g.domain, req.account, b"\x02" * 16, items_root([b"%d" % i for i in range(items)]), items,
                     "generate", 16, k, q, price, 0, 2, 2, 0).signed(req)
    s = apply_block_body(s, 1, H(b"bench-beacon", b"1"), [*batch_offers(s, ws), post])
    bad = {w.account for w in ws[:colluders]}
    right, wrong, salt = H(b"right"), H(b"wrong"), b"s" * 32
    h, t0 = 1, time.perf_counter()
    while s.tables["batches"][post.batch_id].status != BatchStatus.SETTLED:
        b, txs, h = s.tables["batches"][post.batch_id], [], h + 1
        for i in range(b.assigned):
            it = s.tables["batch_items"][item_key(post.batch_id, i)]
            if it.status == ItemStatus.ASSIGNED:
                for w in it.workers:
                    r = wrong if w in bad else right
                    if it.commitment_of(w) is None:
                        c = commitment(post.batch_id, i, it.attempt, w, r, salt)
                        txs.append(BatchCommit(g.domain, w, post.batch_id, i, it.attempt, c).signed(by[w]))
                    elif all(x != w for x, _ in it.reveals) and len(it.commits) == len(it.workers):
                        txs.append(BatchReveal(g.domain, w, post.batch_id, i, it.attempt, r, salt).signed(by[w]))
            elif it.audit == AuditStatus.OPEN:
                for m in it.audit_committee:
                    if all(x != m for x, _ in it.audit_votes):
                        txs.append(BatchAuditVote(g.domain, m, post.batch_id, i, wrong if m in bad else right)
                                   .signed(by[m]))
        s = apply_block_body(s, h, H(b"bench-beacon", str(h).encode()), txs)
    won = [s.tables["batch_items"][item_key(post.batch_id, i)] for i in range(items)]
    won = [it for it in won if bad <= set(it.workers)]
    caught = sum(1 for it in won if it.audit == AuditStatus.OVERTURNED)
    gain = (len(won) * colluders * price - caught * colluders * slash) / max(1, len(won))
    rate = audit_ppm / PPM
    half = 1.96 * (rate * (1 - rate) / max(1, len(won))) ** 0.5
    print(f"   with audits at {rate:g} ({items} items played through the state transition, {h - 1} blocks, "
          f"{time.perf_counter() - t0:.0f} s):")
    print(f"   items the pair won: {len(won)}; overturned by an audit: {caught} ({caught / max(1, len(won)):.3f}; "
          f"sampling rate {rate:g} ± {half:.3f} (95 %))")
    print(f"   the pair's mean net gain per item it won: {gain / C:+.4f} credits (price {price / C:g} each, "
          f"slash {slash / C:g} each when overturned; expected {colluders * (price - rate * slash) / C:+.4f})")
    return {"won": len(won), "caught": caught, "gain": gain}


def part_d(trials: int, count: int, fake_ppm: int) -> dict:
    """Part D (issue 37): a worker fakes ``fake_ppm`` of an epoch batch's ``count`` receipts. The draw is the
    ledger's own (:func:`node.ledger.core.tabs.rules.draw`, over random beacons), with the production genesis' m for
    a new worker and for one at the sampling floor; a batch is lost whole with any drawn fake. Prints the measured
    catch rate and the cheater's expected gain over an honest worker per batch: at most ``f·V − P·(V + S)`` (it
    saves at most the fakes' value ``f·V``; caught, it loses the batch ``V`` and the slash ``S``)."""
    doc = json.loads((Path(__file__).resolve().parents[1] / "genesis" / "production-params.json").read_text())
    p = Params(**doc["params"])
    p.check()
    fakes = set(range(0, count, max(1, PPM // fake_ppm)))  # spread evenly; the draw is uniform anyway
    f = len(fakes) / count
    value = count * 10 * p.price_per_token_block * 4  # a batch of 10-token, 4-block receipts
    print(f"D. a worker faking {f:.2%} of a {count}-receipt epoch batch (production genesis: batch_samples "
          f"{p.batch_samples}, slash {p.slash_amount / C:g} credits; batch value {value / C:g} credits)")
    out = {}
    for who, run in (("new worker", 0), ("worker at the sampling floor", 10**6)):
        ppm = sampling_ppm(p.sample_base_ppm, p.sample_floor_ppm, run, p.adapt_step)
        m = min(count, max(2, p.batch_samples * ppm // p.sample_base_ppm))
        caught = sum(1 for _ in range(trials) if fakes.intersection(draw(secrets.token_bytes(32), b"k" * 32, count, m)))
        rate = caught / trials
        gain = f * value - rate * (value + p.slash_amount)
        print(f"   {who}: m = {m} drawn; caught in {caught} of {trials} batches ({rate:.4f}; 1 - (1 - f)^m = "
              f"{1 - (1 - f) ** m:.4f}); expected gain over honest work per batch <= {gain / C:+.3f} credits "
              f"({'a loss' if gain < 0 else 'PROFITABLE'})")
        out[who] = {"m": m, "rate": rate, "gain": gain}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="tiny", choices=["tiny", "smollm2"])
    ap.add_argument("--trials", type=int, default=20)
    ap.add_argument("--sessions", type=int, default=400)
    ap.add_argument("--batch", action="store_true", help="run part C alone: a colluding pair in a k = 3 batch job")
    ap.add_argument("--items", type=int, default=2000, help="items of part C's batch (default 2000)")
    ap.add_argument("--audit-ppm", type=int, default=50_000,
                    help="part C, second half: the pair plays its cheat with genesis batch_audit_ppm at this rate "
                         "(default 50000 = 5 %%; 0 skips it)")
    ap.add_argument("--audit-items", type=int, default=1000, help="items of that batch (default 1000)")
    ap.add_argument("--tabs", action="store_true", help="run part D alone: a worker faking receipts of an epoch "
                                                        "batch against the production genesis' draw (issue 37)")
    ap.add_argument("--tab-receipts", type=int, default=6000, help="part D: receipts in the batch (default 6000)")
    ap.add_argument("--fake-ppm", type=int, default=10_000, help="part D: fraction faked, ppm (default 1 %%)")
    args = ap.parse_args()
    if args.tabs:
        part_d(max(args.trials, 20_000), args.tab_receipts, args.fake_ppm)
        return
    if args.batch:
        part_c(args.items)
        if args.audit_ppm:
            part_c_audits(args.audit_items, args.audit_ppm)
        return
    part_a(args.trials)
    part_b(args.model, args.sessions)


if __name__ == "__main__":
    main()
