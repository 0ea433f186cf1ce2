"""A Jepsen-style run of four Tally validators on network namespace hosts (test infra for ``test_jepsen.py``).

Set up as an operator would: ``node key --create`` per host, one ``node genesis new`` (devnet parameters, each
validator bonded 200 and holding 1,000 credits, every validator in the bootstrap list), ``node start`` per host.
One validator, drawn from the seed, is *slow*: every byte to and from it passes a delaying TCP relay
(``jepsen_relay.py``; the kernel has no netem): it listens on 127.0.0.1 behind a relay on its address, dials the
others through relays of its own (bound to a second address of its host), and a firewall rule stops its direct
dials.

A workload sends a 0.001 credit transfer from every validator's wallet API about once a second; a fault
schedule drawn from the seed cuts the network in every shape (2|2, 3|1, 1|1|2, a bridge node that sees both sides
of a split) with nftables drop rules between hosts, cuts a validator off from every host and, while its wallet's
transfers are only in its mempool and outbox, kills it with SIGKILL, heals and restarts it. After the last fault
the workload runs :data:`WHOLE_S` more on the healed network. Checks (:meth:`Jepsen.check_final`): no two nodes
stored different blocks at a height (every node's reopened LevelDB); every node progresses within
:data:`PROGRESS_S` after every heal; the wallets worked (no transfer refused, at least :data:`MIN_TRANSFERS`
accepted per validator, at least :data:`MIN_AFTER_RESTART` by the restarted one after its restart, at least one
accepted by the killed one while it was cut off); every accepted transfer and generation receipt is in exactly one
block within :data:`SETTLE_S` of the end (none dropped), the stranded ones included; each waited at most
:data:`LATENCY_S` of whole-network time for its block (the issue's bug: a restarted validator's transfers sat in
its mempool while the network was whole); with the swarm, at least :data:`MIN_GENERATIONS` generations succeeded;
the supply is conserved on every node's reopened LevelDB.
"""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from node.ledger.core.state import genesis_state
from node.ledger.genesis import load_genesis
from node.ledger.store import LedgerStore

from .netns import Host, Netns
from .tally import ROOT, cli, create_key

PORT = 4001  # every validator's address (the slow one's relay listens there)
INNER_PORT = 4002  # the slow validator's own listener, on 127.0.0.1 behind its relay
RELAY_BASE = 5001  # the slow validator's outbound relays, on 127.0.0.1
PROGRESS_S = 60.0  # seconds within which every node must pass the height reached before a heal (generous: 2 CPUs)
LATENCY_S = 10.0  # seconds of whole network within which an accepted transaction must be in a block (see check_final)
WHOLE_S = 20.0  # seconds the workload runs on the healed network after the last fault
SLOW_RECOVERY_S = 10.0  # seconds: a recovery slower than this prints the consensus states (the run goes on)
SETTLE_S = 60.0  # seconds after the last heal (and progress) for every accepted transaction to be included
MIN_TRANSFERS = 25  # accepted transfers per validator, at least (measured at load 3-12: 75-193 each, the killed 91-141)
MIN_AFTER_RESTART = 8  # transfers the restarted validator's wallet accepts after its restart, at least (seen: 54-80)
MIN_GENERATIONS = 10  # generations that returned tokens, at least, with the swarm (seen: 13-21, of 15-25 tried)
CONSENSUS_KEPT = 40  # consensus states kept per node (each as it changed) for a failure's dump
SHAPES = ("halves", "majority", "split3", "bridge", "kill")
# Every host's rules: packets from and to the addresses in set ``cut`` are dropped (a partition); TCP packets from and
# to those in ``refuse`` are answered with a reset (a validator cut off before its kill: its connections close). The
# reset a host makes for its own outgoing packet comes back as if from the peer: the input chain lets it pass.
NFT_TABLE = """table inet jepsen {
  set cut { type ipv4_addr; }
  set refuse { type ipv4_addr; }
  chain in { type filter hook input priority 0;
    ip saddr @refuse tcp flags & rst == rst accept;
    ip saddr @refuse meta l4proto tcp reject with tcp reset; ip saddr @refuse drop;
    ip saddr @cut drop; }
  chain out { type filter hook output priority 0;
    ip daddr @refuse meta l4proto tcp reject with tcp reset; ip daddr @refuse drop;
    ip daddr @cut drop; }
}
"""


class JepsenFailure(AssertionError):
    """A check failed; the message says which and how (the test adds the seed)."""


class Agent:
    """``jepsen_agent.py`` in a host: one HTTP call at a time to that host's node API."""

    def __init__(self, net: Netns, host: Host, data_dir: Path):
        self.proc = net.popen(host, [sys.executable, str(ROOT / "tests/net/jepsen_agent.py"), str(data_dir)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                              cwd=ROOT)
        self.lock = threading.Lock()

    def call(self, method: str, path: str, body: dict | None = None, timeout: float = 10.0) -> tuple[int, object]:
        """``(HTTP status, JSON body)``; ``(0, why)`` when the node does not answer within ``timeout`` seconds."""
        with self.lock:
            self.proc.stdin.write(json.dumps({"m": method, "p": path, "b": body, "t": timeout}) + "\n")
            self.proc.stdin.flush()
            line = self.proc.stdout.readline()
        if not line:
            return 0, "agent gone"
        out = json.loads(line)
        return out["s"], out.get("j", out.get("e"))


@dataclass
class Val:
    name: str
    host: Host
    data_dir: Path
    peer_id: str
    ips: list[str]
    slow: bool = False
    proc: subprocess.Popen | None = None
    agent: Agent | None = None
    log: Path | None = None

    @property
    def addr(self) -> str:
        return f"/ip4/{self.host.ip}/tcp/{PORT}/p2p/{self.peer_id}"


@dataclass
class Accepted:
    node: str
    id: str
    nonce: int  # -1 for a receipt
    at: float  # time.time() when the API answered
    sent: float = 0.0  # time.time() when the call was made (0: not recorded)


@dataclass
class Record:
    """What the run saw, for the checks and the summary."""

    accepted: list[Accepted] = field(default_factory=list)
    refused: list[tuple[str, float, str]] = field(default_factory=list)  # (node, time.time(), its answer)
    unreachable: int = 0
    restarts: dict[str, float] = field(default_factory=dict)  # node -> time.time() its restarted API was up
    # node -> (cut off from every host, killed): times between which its wallet's transfers reached nobody
    stranded: dict[str, tuple[float, float]] = field(default_factory=dict)
    phases: list[str] = field(default_factory=list)
    recover_s: list[float] = field(default_factory=list)
    faults: list[tuple[float, float]] = field(default_factory=list)  # time.time() from a fault to progress after it
    generations: int = 0  # generations that returned tokens
    generation_failures: list[str] = field(default_factory=list)
    # node -> its last consensus states (seconds since the start, state, mempool size, peers), each when it changed
    consensus: dict[str, list[tuple[float, str, int, int]]] = field(default_factory=dict)


class Jepsen:
    """One run: ``setup()``, ``start()``, ``run_schedule()``, ``settle()``, ``check_final()``; ``close()`` stops
    the workload (the :class:`Netns` stops the processes and removes the hosts)."""

    def __init__(self, net: Netns, tmp: Path, model_cache: Path, seed: int, log=print, swarm: bool = True,
                 slow: bool = True, params: str = "devnet", min_transfers: int = MIN_TRANSFERS,
                 allow_dropped: bool = False):
        self.net, self.tmp, self.cache, self.seed, self.say = net, tmp, model_cache, seed, log
        self.slow = slow  # one validator (drawn from the seed) behind delaying relays
        self.params = params  # the genesis's --params (devnet: a block every block time, idle or not)
        self.swarm = swarm  # also a span server "s" (every block of the tiny model) and a client "c" generating
        self.min_transfers = min_transfers  # accepted transfers per validator, at least
        self.min_generations = MIN_GENERATIONS if swarm else 0
        self.allow_dropped = allow_dropped  # a dropped transaction (with its reason) passes: jepsen_table reports it
        self.rng = random.Random(seed)
        self.vals: dict[str, Val] = {}
        self.rec = Record()
        self.genesis_path = tmp / "genesis.json"
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._rec_lock = threading.Lock()
        self.t0 = time.time()  # the run's start, for the consensus dump's times

    # ------------------------------------------------------------------ set-up

    def setup(self) -> None:
        names = ["v1", "v2", "v3", "v4"]
        for name in names:
            host = self.net.add_host(name)
            d = self.tmp / name
            self.vals[name] = Val(name, host, d, create_key(d), [host.ip])
        slow = self.vals[self.rng.choice(names)]  # drawn either way: a seed draws the same schedule with or without
        self.delay = self.rng.choice([0.02, 0.05, 0.1])
        second = f"10.247.0.{200 + names.index(slow.name)}"
        if self.slow:
            slow.slow = True
            self._sh(slow.host, "ip", "addr", "add", f"{second}/24", "dev", "eth0")
            slow.ips.append(second)
        args = ["genesis", "new", "--chain-id", "tally-test-jepsen", "--params", self.params, "--out",
                str(self.genesis_path), "--force"]
        for v in self.vals.values():
            args += ["--validator", f"{v.peer_id}=200", "--account", f"{v.peer_id}=1000", "--bootstrap", v.addr]
        self.extra: list[str] = []  # the server and the client: on one side of every partition, never killed
        if self.swarm:
            for name, funds in (("s", "100:200"), ("c", "1000")):
                host = self.net.add_host(name)
                d = self.tmp / name
                self.vals[name] = Val(name, host, d, create_key(d), [host.ip])
                self.extra.append(name)
                args += ["--account", f"{self.vals[name].peer_id}={funds}"]
        cli(*args)
        for v in self.vals.values():
            self._nft(v.host, NFT_TABLE)
        if not self.slow:
            self.say(f"jepsen seed {self.seed}: no slow validator")
            return
        others = [v for n, v in self.vals.items() if not v.slow and n not in self.extra]
        self._nft(slow.host, "table inet jepsenslow {\n  chain out { type filter hook output priority 0; "
                             f"ip saddr {slow.host.ip} tcp dport {PORT} drop; }}\n}}\n")
        specs = [f"{slow.host.ip}:{PORT}=127.0.0.1:{INNER_PORT}"]
        specs += [f"127.0.0.1:{RELAY_BASE + i}={o.host.ip}:{PORT}@{second}" for i, o in enumerate(others)]
        self.relay = self.net.popen(slow.host, [sys.executable, str(ROOT / "tests/net/jepsen_relay.py"),
                                                str(self.delay), *specs], stdout=subprocess.PIPE, text=True, cwd=ROOT)
        if self.relay.stdout.readline().strip() != "ready":
            raise JepsenFailure("the delaying relay did not start")
        self.slow_bootstrap = [f"/ip4/127.0.0.1/tcp/{RELAY_BASE + i}/p2p/{o.peer_id}" for i, o in enumerate(others)]
        self.say(f"jepsen seed {self.seed}: slow validator {slow.name} behind a {self.delay * 1e3:.0f} ms relay")

    def _sh(self, host: Host, *argv: str) -> None:
        r = subprocess.run(["ip", "netns", "exec", host.ns, *argv], capture_output=True, text=True, timeout=10)
        if r.returncode != 0:
            raise JepsenFailure(f"{' '.join(argv)} in {host.name}: {r.stderr}")

    def _nft(self, host: Host, rules: str) -> None:
        r = subprocess.run(["ip", "netns", "exec", host.ns, "nft", "-f", "-"], input=rules, capture_output=True,
                           text=True, timeout=10)
        if r.returncode != 0:
            raise JepsenFailure(f"nft in {host.name}: {r.stderr}\n{rules}")

    def start_node(self, name: str) -> None:
        v = self.vals[name]
        v.log = self.tmp / f"{name}.log"
        argv = [sys.executable, "-m", "node.cli", "start", "--data-dir", str(v.data_dir), "--genesis",
                str(self.genesis_path), "--model", "tiny", "--model-cache", str(self.cache), "--api-port", "0"]
        if v.slow:
            argv += ["--listen", f"/ip4/127.0.0.1/tcp/{INNER_PORT}", "--announce", f"/ip4/{v.host.ip}/tcp/{PORT}",
                     "--bootstrap", *self.slow_bootstrap]
        else:
            argv += ["--listen", f"/ip4/{v.host.ip}/tcp/{PORT}"]
        if name == "s":
            argv += ["--span", "all"]
        (v.data_dir / "node.json").unlink(missing_ok=True)
        with open(v.log, "ab") as f:
            v.proc = self.net.popen(v.host, argv, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT,
                                    env={"PYTHONUNBUFFERED": "1"})

    def wait_up(self, name: str, timeout: float = 180.0) -> None:
        v = self.vals[name]
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if v.proc.poll() is not None:
                raise JepsenFailure(f"{name} exited with {v.proc.returncode}:\n{self.tail(name)}")
            info = v.data_dir / "node.json"
            if info.exists():
                try:
                    if json.loads(info.read_text()).get("pid") == v.proc.pid:
                        return
                except ValueError:
                    pass
            time.sleep(0.3)
        raise JepsenFailure(f"{name} not up within {timeout} s:\n{self.tail(name)}")

    def start(self) -> None:
        """Start every node and its agent; wait until all are up and the chain passes height 2 everywhere."""
        t0 = time.monotonic()
        for name in self.vals:
            self.start_node(name)
        for name, v in self.vals.items():
            self.wait_up(name)
            v.agent = Agent(self.net, v.host, v.data_dir)
        self.wait_progress(2, "start")
        self.say(f"{len(self.vals)} nodes up and past height 2 in {time.monotonic() - t0:.1f} s")

    # ------------------------------------------------------------------ observing

    def height(self, name: str) -> int | None:
        """``name``'s stored height (None: no answer); its consensus state goes to :attr:`Record.consensus`."""
        s, body = self.vals[name].agent.call("GET", "/v1/status")
        if s != 200:
            return None
        c = body.get("consensus")
        if c is not None:
            key = (f"h{c['height']} r{c['round']} {c['step']} pv{c['prevotes']} pc{c['precommits']} "
                   f"prop={int(c['proposal'])} lock{c['locked_round']} valid{c['valid_round']} "
                   f"higher{c['higher_rounds']} lag{c.get('timeout_lag')} q{c.get('queued')} mesh{c.get('mesh')}")
            with self._rec_lock:
                log = self.rec.consensus.setdefault(name, [])
                if not log or log[-1][1] != key:  # a state only when it changed: a stall shows as one line
                    log.append((time.time() - self.t0, key, body["mempool"], len(body.get("peers", []))))
                    del log[:-CONSENSUS_KEPT]
        return body["height"]

    def heights(self) -> dict[str, int | None]:
        return {n: self.height(n) for n in self.vals}

    def wait_progress(self, target: int, why: str, bound: float = PROGRESS_S) -> float:
        """Wait until every node is at ``target`` or above; seconds it took.

        Raises:
            JepsenFailure: not within ``bound`` seconds.
        """
        t0 = time.monotonic()
        while True:
            hs = self.heights()
            if all(h is not None and h >= target for h in hs.values()):
                return time.monotonic() - t0
            if time.monotonic() - t0 > bound:
                raise JepsenFailure(f"no progress to height {target} within {bound:g} s after {why}: heights {hs}\n"
                                    + self.diagnose() + self.consensus_dump()
                                    + "\n".join(f"--- {n}\n{self.tail(n)}" for n in self.vals))
            time.sleep(0.5)

    def diagnose(self) -> str:
        """Each node's connected peers (by name), gossip mesh size and mempool, for a failure message."""
        by_id = {v.peer_id: n for n, v in self.vals.items()}
        out = []
        for n, v in self.vals.items():
            s, st = v.agent.call("GET", "/v1/status")
            if s != 200:
                out.append(f"{n}: no answer ({st})")
                continue
            peers = sorted(by_id.get(p, p[:8]) for p in st.get("peers", []))
            out.append(f"{n}: height {st['height']} head {st['head_hash'][:12]} mempool {st['mempool']} "
                       f"peers {peers} network {json.dumps(st.get('network'))[:300]}")
        return "\n".join(out) + "\n"

    def consensus_dump(self) -> str:
        """The last consensus states every node reported (:meth:`height` records one per poll), oldest first."""
        with self._rec_lock:
            return "".join(f"--- consensus of {n} (first seen at, state, mempool, peers)\n"
                           + "".join(f"{t:7.1f}s {key} mempool {mp} peers {peers}\n" for t, key, mp, peers in lines)
                           for n, lines in self.rec.consensus.items())

    def tail(self, name: str, lines: int = 25) -> str:
        log = self.vals[name].log
        if log is None or not log.exists():
            return "(no log)"
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])

    # ------------------------------------------------------------------ workload

    def start_workload(self) -> None:
        for i, name in enumerate(self.validators):
            t = threading.Thread(target=self._transfers, args=(name, random.Random(self.seed * 10 + i)), daemon=True)
            t.start()
            self._threads.append(t)
        if self.swarm:
            t = threading.Thread(target=self._generations, args=(random.Random(self.seed * 10 + 9),), daemon=True)
            t.start()
            self._threads.append(t)

    @property
    def validators(self) -> list[str]:
        return [n for n in self.vals if n not in self.extra]

    def _generations(self, rng: random.Random) -> None:
        """The client generates 8 tokens of a random prompt every 2-4 s; its receipts are accepted transactions
        (its node submits them) and are held to the same check as the transfers."""
        while not self._stop.wait(rng.uniform(2.0, 4.0)):
            prompt = [rng.randrange(1, 200) for _ in range(rng.randrange(2, 8))]
            s, body = self.vals["c"].agent.call("POST", "/v1/generate", {"prompt_ids": prompt, "max_new_tokens": 8},
                                                timeout=60)
            with self._rec_lock:
                if s == 200:
                    self.rec.generations += 1
                    now = time.time()
                    self.rec.accepted += [Accepted("c", rid, -1, now) for rid in body["receipts"]]
                else:
                    self.rec.generation_failures.append(f"{s} {str(body)[:120]}")

    def _transfers(self, name: str, rng: random.Random) -> None:
        others = [self.vals[n].peer_id for n in self.validators if n != name]
        while not self._stop.wait(rng.uniform(0.7, 1.3)):
            sent = time.time()
            s, body = self.vals[name].agent.call("POST", "/v1/transfer", {"to": rng.choice(others), "amount": "0.001"})
            with self._rec_lock:
                if s == 200:
                    self.rec.accepted.append(Accepted(name, body["id"], body["nonce"], time.time(), sent))
                elif s == 0:
                    self.rec.unreachable += 1
                else:
                    self.rec.refused.append((name, time.time(), f"{s} {str(body)[:200]}"))

    def stop_workload(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=30)

    # ------------------------------------------------------------------ faults

    def cut(self, blocked: set[frozenset[str]], how: str = "cut") -> None:
        """Drop every packet between the hosts of each pair in ``blocked`` (both ways, every address); with
        ``how="refuse"``, answer each TCP packet with a reset instead (connections close at once on both sides)."""
        for name, v in sorted(self.vals.items(), key=lambda kv: -sum(kv[0] in pair for pair in blocked)):
            ips = [ip for other, o in self.vals.items() if frozenset((name, other)) in blocked for ip in o.ips]
            rules = f"flush set inet jepsen {how}\n" + (f"add element inet jepsen {how} {{ {', '.join(ips)} }}\n"
                                                        if ips else "")
            self._nft(v.host, rules)

    def heal(self) -> None:
        for v in self.vals.values():
            self._nft(v.host, "flush set inet jepsen cut\nflush set inet jepsen refuse\n")

    def run_schedule(self, hold: tuple[float, float] = (6.0, 12.0)) -> None:
        """Every shape once, in an order and with members and durations drawn from the seed; after each, heal
        and wait for progress past the highest height seen before the heal."""
        shapes = list(SHAPES)
        self.rng.shuffle(shapes)
        names = self.validators
        for shape in shapes:
            order = names[:]
            self.rng.shuffle(order)
            hold_s = round(self.rng.uniform(*hold), 1)
            began = time.time()
            if shape == "kill":
                victim = order[0]
                alone = round(hold_s / 2, 1)
                desc = f"{victim} cut off for {alone} s, then kill -9 for {hold_s} s"
                # cut off with TCP resets, its own host's rules first: its connections close at once and what it
                # gossips meanwhile reaches nobody. With dropped packets it waited in TCP send buffers (the slow
                # validator's in its relay, which outlives it) and arrived after the heal; with the victim's rules
                # applied fourth its first transfers reached the server or the client. Either way a node that did
                # not load its outbox at start passed (seed 694402820): its "stranded" transfers got into blocks
                self.cut({frozenset((victim, o)) for o in self.vals if o != victim}, "refuse")  # its host first
                alone_since = time.time()
                time.sleep(alone)  # its wallet accepts transfers that only it holds: its mempool and outbox
                self.vals[victim].proc.send_signal(signal.SIGKILL)
                self.vals[victim].proc.wait(timeout=10)
                self.rec.stranded[victim] = (alone_since, time.time())
                time.sleep(hold_s)
                self.heal()
                self.start_node(victim)
                self.wait_up(victim)
                self.rec.restarts[victim] = time.time()
            else:
                groups = {"halves": [order[:2], order[2:]], "majority": [order[:3], order[3:]],
                          "split3": [order[:1], order[1:2], order[2:]]}.get(shape)
                if groups is not None:
                    for e in self.extra:  # the server and the client sit on one side (else they would bridge it)
                        self.rng.choice(groups).append(e)
                    blocked = {frozenset((a, b)) for g in groups for h in groups if g is not h for a in g for b in h}
                    desc = f"{shape} {' | '.join(','.join(sorted(g)) for g in groups)} for {hold_s} s"
                else:  # bridge: order[0] sees both sides, which do not see each other
                    left, right = order[1:2], order[2:]
                    for e in self.extra:
                        self.rng.choice([left, right]).append(e)
                    blocked = {frozenset((a, b)) for a in left for b in right}
                    desc = f"bridge {order[0]} between {','.join(left)} and {','.join(sorted(right))} for {hold_s} s"
                self.cut(blocked)
                time.sleep(hold_s)
                self.heal()
            top = max(h for h in self.heights().values() if h is not None)
            took = self.wait_progress(top + 2, desc)
            if took > SLOW_RECOVERY_S:  # passed, but slowly: show how the rounds went
                self.say(f"{desc}: slow recovery ({took:.1f} s)\n{self.consensus_dump()}")
            self.rec.faults.append((began, time.time()))
            self.rec.phases.append(f"{desc}: healed, every node past {top + 2} in {took:.1f} s")
            self.rec.recover_s.append(took)
            self.say(self.rec.phases[-1])
        time.sleep(WHOLE_S)  # the healed network, with the workload still running

    # ------------------------------------------------------------------ the end

    def settle(self) -> dict[str, dict]:
        """Stop the workload; wait (at most :data:`SETTLE_S`) until every accepted transfer's submitter says it
        is included or dropped, asking each once every node's mempool is empty (or half that time passed).
        Returns each id's last status."""
        self.stop_workload()
        t0 = time.monotonic()
        deadline = t0 + SETTLE_S
        while time.monotonic() < t0 + SETTLE_S / 2 and not self.drained():
            time.sleep(0.5)  # a few status calls, not hundreds, while the last transactions reach their blocks
        drained = time.monotonic() - t0
        final: dict[str, dict] = {}
        open_ = list(self.rec.accepted)

        def ask(node: str, mine: list[Accepted]) -> list[Accepted]:  # one node's, in order; those still open
            still = []
            for a in mine:
                s, body = self.vals[node].agent.call("GET", f"/v1/txs/{a.id}/status")
                if s == 200 and body["status"] in ("included", "dropped"):
                    final[a.id] = body
                else:
                    final[a.id] = body if s == 200 else {"status": f"no answer ({body})"}
                    still.append(a)
            return still

        while open_:
            by_node: dict[str, list[Accepted]] = {}
            for a in open_:
                by_node.setdefault(a.node, []).append(a)
            with ThreadPoolExecutor(len(by_node)) as pool:  # every node's agent at once
                open_ = [a for still in pool.map(ask, by_node, by_node.values()) for a in still]
            if open_ and time.monotonic() > deadline:
                break
            if open_:
                time.sleep(2)
        self.say(f"mempools empty after {drained:.1f} s; statuses of {len(self.rec.accepted)} accepted transactions "
                 f"asked by {time.monotonic() - t0:.1f} s")
        return final

    def drained(self) -> bool:
        """Every node answers and its mempool is empty."""
        for v in self.vals.values():
            s, body = v.agent.call("GET", "/v1/status")
            if s != 200 or body["mempool"]:
                return False
        return True

    def stop_all(self) -> None:
        for v in self.vals.values():
            if v.proc is not None and v.proc.poll() is None:
                v.proc.terminate()
        for v in self.vals.values():
            if v.proc is not None:
                try:
                    v.proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    v.proc.kill()
                    v.proc.wait(timeout=10)

    def check_final(self, final: dict[str, dict]) -> str:
        """Every check on the reopened LevelDBs (nodes stopped first). Returns a one-paragraph summary.

        Raises:
            JepsenFailure: which check failed and how.
        """
        problems = self.workload_problems()
        for a in self.rec.accepted:
            st = final.get(a.id, {})
            if st.get("status") not in ("included", "dropped"):
                problems.append(f"{a.node} accepted {a.id[:16]} (nonce {a.nonce}) and it is neither included nor "
                                f"dropped {SETTLE_S:g} s after the last heal: {st}")
            elif st["status"] == "dropped" and not self.allow_dropped:
                problems.append(f"{a.node} accepted {a.id[:16]} (nonce {a.nonce}) and dropped it: "
                                f"{st.get('reason')}")
            elif st["status"] == "dropped" and not st.get("reason"):
                problems.append(f"{a.node} dropped {a.id[:16]} without a reason")
        self.stop_all()
        g = load_genesis(self.genesis_path)
        supply = genesis_state(g).supply()
        chains: dict[str, list[bytes]] = {}
        counts: dict[str, int] = {}
        landed: dict[str, float] = {}  # tx id -> its block's time (seconds since the epoch), on the longest chain
        longest = None
        for name, v in self.vals.items():
            store = LedgerStore(v.data_dir / "ledger", g)
            try:
                state = store.replay()
                if state.supply() != supply:
                    problems.append(f"{name}: supply {state.supply()} after replaying its LevelDB, genesis {supply}")
                chains[name] = [store.get_block(h)[0].hash for h in range(1, store.head + 1)]
                if longest is None or store.head > len(chains[longest]):
                    longest = name
                    counts, landed = {}, {}
                    for h in range(1, store.head + 1):
                        block = store.get_block(h)[0]
                        for tx in block.txs:
                            counts[tx.id.hex()] = counts.get(tx.id.hex(), 0) + 1
                            landed.setdefault(tx.id.hex(), block.header.time_ms / 1000)
            finally:
                store.close()
        names = list(chains)
        for i, a in enumerate(names):
            for b in names[i + 1:]:
                for h, (x, y) in enumerate(zip(chains[a], chains[b], strict=False), start=1):
                    if x != y:
                        problems.append(f"fork: {a} and {b} stored different blocks at height {h}")
                        break
        for acc in self.rec.accepted:
            n = counts.get(acc.id, 0)
            st = final.get(acc.id, {}).get("status")
            if n > 1:
                problems.append(f"{acc.id[:16]} is in {n} blocks")
            elif n == 0 and st != "dropped":
                problems.append(f"{acc.id[:16]} ({acc.node}, nonce {acc.nonce}) is in no block of {longest} and its "
                                f"submitter said {st}")
            elif n == 1 and st == "dropped":
                problems.append(f"{acc.id[:16]} is in a block but its submitter {acc.node} said dropped: "
                                f"{final[acc.id].get('reason')}")
        # the bug: a restarted validator's transfers sat in its mempool while the network was whole. Every
        # included transfer must have reached its block within LATENCY_S of time in which the network was whole
        # (the time from acceptance to the block, less the time under faults until progress resumed).
        slow = 0
        worst = 0.0
        for acc in self.rec.accepted:
            if acc.id not in landed:
                continue
            end = landed[acc.id]
            whole = end - acc.at - sum(max(0.0, min(b, end) - max(a, acc.at)) for a, b in self.rec.faults)
            worst = max(worst, whole)
            if whole > LATENCY_S:
                slow += 1
                if slow <= 5:
                    problems.append(f"{acc.node} accepted {acc.id[:16]} (nonce {acc.nonce}) and it waited {whole:.1f} "
                                    f"s for a block while the network was whole (at most {LATENCY_S:g} s)")
        if slow > 5:
            problems.append(f"... {slow} transactions in all waited more than {LATENCY_S:g} s")
        if self.swarm and self.rec.generations < self.min_generations:
            problems.append(f"{self.rec.generations} generations succeeded (at least {self.min_generations}); "
                            f"{len(self.rec.generation_failures)} failed: {self.rec.generation_failures[-5:]}")
        included = sum(1 for a in self.rec.accepted if counts.get(a.id, 0) == 1)
        dropped = [final[a.id].get("reason", "") for a in self.rec.accepted if counts.get(a.id, 0) == 0]
        receipts = sum(1 for a in self.rec.accepted if a.nonce < 0)
        gens = (f" and {receipts} receipts of {self.rec.generations} generations "
                f"({len(self.rec.generation_failures)} failed)" if self.swarm else "")
        summary = (f"seed {self.seed}: {len(self.rec.accepted) - receipts} transfers{gens} accepted, "
                   f"{included} in exactly one block, "
                   f"{len(dropped)} reported dropped {sorted(set(dropped))[:3]}; {len(self.rec.refused)} refused at "
                   f"submission, {self.rec.unreachable} while a node was down; per validator "
                   f"{ {n: sum(a.node == n and a.nonce >= 0 for a in self.rec.accepted) for n in self.validators} }"
                   f", after its restart {self._after_restart()}, accepted while cut off before its kill "
                   f"{self._stranded()}; heights "
                   f"{ {n: len(c) for n, c in chains.items()} }, no fork, supply {supply} on every LevelDB; "
                   f"recovery after heals {[round(x, 1) for x in self.rec.recover_s]} s; the longest wait for a block "
                   f"while the network was whole {worst:.1f} s")
        if problems:
            raise JepsenFailure("\n".join(problems[:20]) + f"\n({len(problems)} problems)\nphases: {self.rec.phases}")
        return summary

    def _after_restart(self) -> dict[str, int]:
        """Transfers each restarted validator's wallet accepted after its restart."""
        return {n: sum(a.node == n and a.nonce >= 0 and a.at > t for a in self.rec.accepted)
                for n, t in self.rec.restarts.items()}

    def _stranded(self) -> dict[str, int]:
        """Transfers each killed validator accepted while it was cut off from every other host, before its kill:
        they were only in its mempool and its outbox file when it died."""
        return {n: sum(a.node == n and a.nonce >= 0 and cut < a.sent and a.at < killed for a in self.rec.accepted)
                for n, (cut, killed) in self.rec.stranded.items()}

    def workload_problems(self) -> list[str]:
        """The wallets worked: no transfer refused (a funded wallet's 0.001 has no reason to be), at least
        ``min_transfers`` accepted per validator, at least :data:`MIN_AFTER_RESTART` by a restarted validator after
        its restart, and at least one accepted by a killed validator while it was cut off (else the kill proved
        nothing about the outbox)."""
        problems = []
        for node, at, answer in self.rec.refused[:10]:
            after = self.rec.restarts.get(node)
            when = f"{at - after:.1f} s after its restart" if after is not None and at > after else \
                f"at {at - self.t0:.1f} s"
            problems.append(f"{node} refused a transfer {when}: {answer}")
        if len(self.rec.refused) > 10:
            problems.append(f"... {len(self.rec.refused)} transfers refused in all")
        for n in self.validators:
            got = sum(a.node == n and a.nonce >= 0 for a in self.rec.accepted)
            if got < self.min_transfers:
                problems.append(f"{n} accepted {got} transfers (at least {self.min_transfers})")
        for n, got in self._after_restart().items():
            if got < MIN_AFTER_RESTART:
                problems.append(f"{n} accepted {got} transfers after its restart (at least {MIN_AFTER_RESTART})")
        for n, got in self._stranded().items():
            if got < 1:
                problems.append(f"{n} accepted no transfer while it was cut off before its kill")
        return problems

    def close(self) -> None:
        self._stop.set()
