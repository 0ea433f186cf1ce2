"""Attack benchmark (issue 23, check 3): an honest client's speed and the target's memory under each attack class
of the hostile-peer suite, beside the same measured without an attack, side by side in one run.

Starts the suite's devnet (:mod:`tests.security.devnet`): as separate ``node start`` processes on loopback, the
target (dev key 0: the validator, a span server of blocks [0, 3) of a tiny Llama with a 16 MiB head file, relaying
for others, a snapshot every 20 blocks) and a server of blocks [3, 6); the honest client (dev key 2,
:mod:`tests.security.honest`) listens on and dials from 127.0.1.2 and generates 8 tokens greedily in a loop
through both. Then, for each attack class, ``--rounds`` times: a baseline window of ``--seconds`` with no attack,
then a window of ``--seconds`` while the class's attacker process (:mod:`tests.security.attacker`, from
127.0.0.2 or its /24, reniced by 5) attacks the target (the window is the attack as the attacker reports it: its
start-up and imports are left out). It prints one line per class:

* ``tokens/s``: tokens of the honest generations that completed in the attack windows ÷ the same in the
  baseline windows (target >= 0.8);
* ``peak RSS``: the target's peak resident set in the attack windows ÷ in the baseline windows (``psutil`` every
  100 ms; target <= 1.5), and the growth in MiB (the suite's bound: < 64 MiB);
* whether every honest generation that overlapped an attack window was the reference greedy decoding, the
  target's CPU use (cores: CPU seconds per second) in the attack windows beside the baseline windows, the
  attacker process's own CPU seconds, and its summary (what it managed to do),

then a summary line: the worst ratio of each kind and whether all classes met both targets. The first line,
``control``, is no attack: its "attacker" only spins its CPU for the window (sending nothing), so its ratios are
this run's noise floor and the cost of an attacker's own CPU use alone; it is left out of the summary.

**Pinning (the default).** A real attacker runs on machines of its own; here it shares the host's cores with the
target and the honest client, and on 2 cores the attacker's own CPU use lowers the honest client's tokens/s
whatever the node does. So by default the machine's CPUs are split in two halves (2 cores: CPU 0 and CPU 1): the
target, the server and the honest client run on the first half, every attacker process (and this script) on the
second, in the baseline and the attack windows alike (the affinity is set once, before the first window, and
printed as read back).

On a machine with other load (other jobs, other builds), a busy attacker CPU pushes that load onto the target's
CPUs: the scheduler balances runnable tasks across cores, so while the attacker runs, the target, server and
client get a smaller share of theirs, whatever the attack does (measured: the ``control`` spinner alone cut the
honest tokens/s to 0.75 at a load average of 15). So when pinned, each baseline window also runs an attacker
process on the attackers' CPUs, the ``spin`` control (no traffic, its CPU kept busy at the attackers' niceness):
the baseline and the attack then displace the same outside load, and the ratio is what the attack's traffic costs.
On an otherwise idle machine the spinner changes nothing (it has its own CPUs); ``--quiet-baseline`` leaves it
out. ``--unpinned`` leaves every process free to run on every core, as before (the reniced
attacker then competes with the target for CPU; compare the two modes' ratios to see how much of a drop is the
attacker's own CPU). Other load on the machine falls on both halves and lowers both windows alike.

Class 4 of the suite (a lying and a crashing state-sync peer) needs a second node started with ``--state-sync``
and is not a steady-state attack; it is tested in ``tests/security/test_attacks.py`` and not benched here.

Usage: ``.venv/bin/python bench/attack.py [--seconds 12] [--rounds 2] [--classes bomb-pre,idle,...]
[--unpinned] [--quiet-baseline] [--keep DIR]``. Compare the ratios of one run, not numbers across runs.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.security.devnet import (  # test infra: bench runs from a checkout
    ATTACKER_SRC,
    Devnet,
    RssSampler,
    attack_shortfalls,
    pin,
)

TOKENS_TARGET = 0.8  # honest tokens/s under attack / without, at least
RSS_TARGET = 1.5  # target's peak RSS under attack / without, at most
CONTROL = "control"  # no attack: the attacker process only spins its CPU; not an attack class, not in the summary


def classes(net: Devnet) -> dict[str, tuple[str, list[str], str]]:
    """name -> (attacker subcommand, its arguments, source address)."""
    return {
        CONTROL: ("spin", [], ATTACKER_SRC),
        "bomb-pre": ("bomb", ["--phase", "pre"], ATTACKER_SRC),
        "bomb-post": ("bomb", ["--phase", "post", "--streams", "2"], ATTACKER_SRC),
        "idle": ("idle", ["--sockets", "400"], ATTACKER_SRC),
        "idle-/24": ("idle", ["--sockets", "400", "--spread"], "127.0.3.2"),
        "identities": ("identities", ["--hold", "300"], ATTACKER_SRC),
        "noread": ("noread", ["--model-id", net.model_id, "--streams", "100"], ATTACKER_SRC),
        "drip": ("drip", [], ATTACKER_SRC),
        "relay": ("relay", [], ATTACKER_SRC),
    }


def children_cpu() -> float:
    """CPU seconds (user + system) of this process's waited-for children so far."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def window(seconds: float) -> tuple[float, float]:
    t0 = time.time()
    time.sleep(seconds)
    return t0, time.time()


def measure(net: Devnet, name: str, cls: str, args: list[str], src: str, seconds: float, rounds: int,
            others: dict[str, RssSampler], spin_baseline: bool) -> dict:
    """``rounds`` pairs of a baseline and an attack window, in the order A B, B A, ... (so that a drift of the
    honest client's rate over the run, e.g. as the chain grows, does not favour either kind; use an even
    ``rounds``); the ratios and what the attacker reported.

    An attack window is the attack itself, as the attacker process reports it (from just before its trio loop
    starts to its end, wall clock): its interpreter's start-up and imports, which take seconds on loaded cores and
    during which nothing attacks, are left out of the tokens/s, RSS and target CPU of the window. ``others``: CPU
    samplers of the server and the honest client, whose CPU seconds per window are reported too. With
    ``spin_baseline`` each baseline window is a ``spin`` control process (see the module doc) instead of a sleep."""
    other = {"base": dict.fromkeys(others, 0.0), "attack": dict.fromkeys(others, 0.0)}
    tok = {"base": 0.0, "attack": 0.0}
    length = {"base": 0.0, "attack": 0.0}
    rss = {"base": 0, "attack": 0}
    target = {"base": 0.0, "attack": 0.0}
    bad, attacks, cpu = 0, [], 0.0

    def account(kind: str, t0: float, t1: float) -> None:
        time.sleep(0.3)  # the RSS/CPU samplers' next sample covers t1
        target[kind] += net.rss.cpu_between(t0, t1)
        for k, smp in others.items():
            other[kind][k] += smp.cpu_between(t0, t1)
        tok[kind] += net.honest.tokens_per_s(t0, t1) * (t1 - t0)
        length[kind] += t1 - t0
        rss[kind] = max(rss[kind], net.rss.peak(t0, t1))

    def baseline() -> None:
        if spin_baseline:
            spun = net.run_attacker("spin", src=src, seconds=seconds)
            account("base", spun["t0"], spun["t1"])
        else:
            account("base", *window(seconds))

    def attack() -> None:
        nonlocal bad, cpu
        c0, t0 = children_cpu(), time.time()
        attacks.append(net.run_attacker(cls, *args, src=src, seconds=seconds))
        t0, t1 = attacks[-1].get("t0", t0), attacks[-1].get("t1", time.time())
        cpu += children_cpu() - c0
        account("attack", t0, t1)
        bad += sum(1 for g in net.honest.between(t0, t1) if g.get("tokens") != net.want)

    for i in range(rounds):  # A B, B A, A B, ...: a drift of the honest rate over the run cancels out
        for step in ((baseline, attack) if i % 2 == 0 else (attack, baseline)):
            step()
    base_tok, base_len, base_rss, target_base, other_base = (tok["base"], length["base"], rss["base"],
                                                             target["base"], other["base"])
    att_tok, att_len, att_rss, target_att, other_att = (tok["attack"], length["attack"], rss["attack"],
                                                        target["attack"], other["attack"])
    base, under = base_tok / base_len, att_tok / att_len
    return {"class": name, "tokens_s_base": base, "tokens_s_attack": under,
            "tokens_ratio": under / base if base else 0.0, "rss_base": base_rss, "rss_attack": att_rss,
            "rss_ratio": att_rss / base_rss if base_rss else float("inf"), "bad_gens": bad,
            "alive": net.alive(), "attacker_cpu_s": cpu, "attacks": attacks,
            "target_cpu_share_base": target_base / base_len, "target_cpu_share_attack": target_att / att_len,
            "target_cpu_s_base": target_base, "target_cpu_s_attack": target_att,
            "others_cpu_share": {k: (other_att[k] / att_len, other_base[k] / base_len) for k in others},
            "attacker_affinity": sorted(net.attacker_affinity) if net.attacker_affinity is not None else None}


def split_cpus() -> tuple[set[int], set[int]]:
    """This process's CPUs in two halves: (for the target, server and honest client; for the attackers).

    Raises:
        SystemExit: fewer than 2 CPUs to split.
    """
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        raise SystemExit("pinning needs at least 2 CPUs; run with --unpinned")
    half = len(cpus) // 2
    return set(cpus[:half]), set(cpus[half:])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="Targets: tokens/s ratio >= 0.8, peak RSS ratio <= 1.5, per class.")
    p.add_argument("--seconds", type=float, default=12.0, help="length of each baseline and attack window")
    p.add_argument("--rounds", type=int, default=2, help="baseline + attack window pairs per class (even: A B, B A)")
    p.add_argument("--classes", help="comma-separated subset of: control, bomb-pre, bomb-post, idle, idle-/24, "
                                     "identities, noread, drip, relay (default: all)")
    p.add_argument("--unpinned", action="store_true",
                   help="do not pin: attackers share every core with the target and the honest client")
    p.add_argument("--quiet-baseline", action="store_true",
                   help="pinned: baseline windows leave the attackers' CPUs idle instead of running a spin control")
    p.add_argument("--keep", type=Path, help="keep data dirs and logs here (default: a temp dir, removed)")
    args = p.parse_args()
    tmp = args.keep or Path(tempfile.mkdtemp(prefix="tally-attack-"))
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "models").mkdir(exist_ok=True)
    net = Devnet(tmp, tmp / "models")
    rows = []
    try:
        print("starting the devnet (target, server, honest client on 127.0.1.2) ...", flush=True)
        net.start()
        if args.unpinned:
            print(f"unpinned: every process may run on CPUs {sorted(os.sched_getaffinity(0))}", flush=True)
        else:
            node_cpus, attack_cpus = split_cpus()
            got = {name: sorted(pin(proc.pid, node_cpus)) for name, proc in
                   (("target", net.target), ("server", net.server), ("honest client", net.procs[-1]))}
            net.attacker_cpus = attack_cpus
            got["attackers and this bench"] = sorted(pin(os.getpid(), attack_cpus))
            print("pinned: " + "; ".join(f"{k} on CPUs {v}" for k, v in got.items()), flush=True)
        table = classes(net)
        others = {"server": RssSampler(net.server.pid), "honest": RssSampler(net.procs[-1].pid)}
        names = args.classes.split(",") if args.classes else list(table)
        unknown = [n for n in names if n not in table]
        if unknown:
            p.error(f"unknown classes {unknown}; choose from {list(table)}")
        print(f"each class: {args.rounds} x ({args.seconds:g} s baseline, {args.seconds:g} s attack); honest client "
              f"{len(net.want)} tokens per generation", flush=True)
        for name in names:
            if not net.alive():
                print(f"{name:11s} not run: the target is dead", flush=True)
                break
            cls, cargs, src = table[name]
            r = measure(net, name, cls, cargs, src, args.seconds, args.rounds, others,
                        spin_baseline=not args.unpinned and not args.quiet_baseline)
            if name != CONTROL:
                rows.append(r)
            short = [] if name == CONTROL else [x for a in r["attacks"] for x in attack_shortfalls(cls, a)]
            r["shortfalls"] = short  # an attack that did not happen (crashed, hung, never reached the target)
            ok = r["tokens_ratio"] >= TOKENS_TARGET and r["rss_ratio"] <= RSS_TARGET and not r["bad_gens"] \
                and r["alive"] and not short
            brief = {k: v for k, v in r["attacks"][-1].items() if k not in ("class", "elapsed_s", "t0", "t1")}
            print(f"{name:11s} tokens/s {r['tokens_s_attack']:6.2f} / {r['tokens_s_base']:6.2f} = "
                  f"{r['tokens_ratio']:5.2f}  peak RSS {r['rss_attack'] / 2**20:6.1f} / {r['rss_base'] / 2**20:6.1f} "
                  f"MiB = {r['rss_ratio']:5.2f} (+{(r['rss_attack'] - r['rss_base']) / 2**20:.1f} MiB)  "
                  f"bad generations {r['bad_gens']}  target CPU {r['target_cpu_share_attack']:.2f} / "
                  f"{r['target_cpu_share_base']:.2f} cores ({r['target_cpu_s_attack']:.1f} / "
                  f"{r['target_cpu_s_base']:.1f} CPU s), "
                  + ", ".join(f"{k} {a:.2f} / {b:.2f}" for k, (a, b) in r["others_cpu_share"].items())
                  + f"  attacker CPU {r['attacker_cpu_s']:.1f} s"
                  f"{' on CPUs ' + str(r['attacker_affinity']) if r['attacker_affinity'] else ''}  "
                  f"{'met' if ok else 'NOT met'}  attacker: {json.dumps(brief)}"
                  + (f"  THE ATTACK DID NOT HAPPEN: {short}" if short else ""), flush=True)
    finally:
        net.stop()
        if args.keep is None:
            shutil.rmtree(tmp, ignore_errors=True)
    if rows:
        worst_tok = min(rows, key=lambda r: r["tokens_ratio"])
        worst_rss = max(rows, key=lambda r: r["rss_ratio"])
        met = all(r["tokens_ratio"] >= TOKENS_TARGET and r["rss_ratio"] <= RSS_TARGET and not r["bad_gens"]
                  and r["alive"] and not r["shortfalls"] for r in rows)
        print(f"summary: {len(rows)} classes; worst tokens/s ratio {worst_tok['tokens_ratio']:.2f} "
              f"({worst_tok['class']}, target >= {TOKENS_TARGET}); worst peak RSS ratio "
              f"{worst_rss['rss_ratio']:.2f} ({worst_rss['class']}, target <= {RSS_TARGET}); "
              f"{'all met' if met else 'NOT all met'}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
