"""Helpers of the thirty-node test (issue 39, :mod:`tests.net.test_swarm30`): the swarm's composition from a seed,
per-process CPU and memory read from ``/proc``, and three small programs run inside a namespace (test infra only)::

    python -m tests.net.swarm30 gen DATA_DIR PROMPTS_JSON TOKENS STOP_FILE SECONDS   # a client's generation loop
    python -m tests.net.swarm30 blocks DATA_DIR IDS_FILE SECONDS                     # where each receipt landed
    python -m tests.net.swarm30 attack SECONDS SRC CHAIN GENESIS_HEX CLASSES TARGET...  # a hostile peer

``gen`` calls the node's ``POST /v1/generate`` in a loop (one prompt after another) until STOP_FILE exists or
SECONDS passed, printing one JSON line per call: ``{"i", "prompt", "t0", "t1", "status", "tokens", "route",
"receipts", "error"}`` (status 200 or the API's error status). ``blocks`` waits until every receipt id of IDS_FILE
(one per line) is ``included`` at the node (or SECONDS passed), then reads every block from 1 to the head and prints
``{"head", "status": {id: status}, "where": {id: [heights]}}``. ``attack`` runs the attackers of
:mod:`tests.security.attacker` one after another (CLASSES comma-separated, cycled; each TARGET in turn) for SECONDS,
from the namespace's own address SRC (not a loopback one), printing each attacker's JSON report.

Only the standard library is imported at the top: the programs import httpx, trio or the attackers themselves.
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SPAN_KINDS = ["0:2", "2:4", "4:6", "0:3", "3:6"]  # the tiny model's 6 blocks, each covered 2-3 times per five
CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")


@dataclass
class Plan:
    """Who runs what in one seeded swarm.

    Attributes:
        validators, servers, clients: node names by role (``servers`` are those started at first).
        spans: server (and joiner) name -> ``--span`` value.
        nat: servers behind a NAT router of their own.
        joiners: servers in the genesis (bonded) that start only while the clients generate.
        prompts: prompt ids the clients cycle through (client ``k`` starts at prompt ``k``).
        seed: the seed everything above was drawn from (leavers are drawn from it later, among the servers routes
            used).
    """

    seed: int
    validators: list[str]
    servers: list[str]
    clients: list[str]
    joiners: list[str]
    spans: dict[str, str]
    nat: list[str]
    prompts: list[list[int]]
    churn: int
    rng: random.Random = field(repr=False, default_factory=random.Random)

    @property
    def node_count(self) -> int:
        """``node start`` processes running at once (the joiners replace as many leavers)."""
        return len(self.validators) + len(self.servers) + len(self.clients)


def make_plan(seed: int, nodes: int, vocab: int = 320) -> Plan:
    """The composition of a swarm of ``nodes`` processes running at once.

    30 nodes: 4 validators, 5 clients, 21 span servers of the tiny model (each of :data:`SPAN_KINDS` 4-5 times,
    shuffled), 2 of them behind NAT, 3 leaving and 3 joining (spans drawn from :data:`SPAN_KINDS`). Under 20 nodes
    (a quick run): 2 validators, ``nodes // 6`` clients (at least 1), servers of 0:3, 3:6, 0:3, 3:6, 0:2, ... (so that
    one can leave and be replaced), 1 NAT server, 1 leaving and 1 joining.

    Raises:
        ValueError: fewer than 8 nodes (too few servers to lose one and keep every block covered).
    """
    if nodes < 8:
        raise ValueError("at least 8 nodes: 2 validators, a client and 5 servers")
    rng = random.Random(seed)
    big = nodes >= 20
    nv, nc = (4, 5) if big else (2, max(1, nodes // 6))
    ns = nodes - nv - nc
    churn = 3 if big else 1
    # a quick run: a second server of some spans, so that one can leave and be failed over
    base = SPAN_KINDS if big else ["0:3", "3:6", "0:3", "3:6", *SPAN_KINDS]
    kinds = (base * (ns // len(base) + 1))[:ns]
    rng.shuffle(kinds)
    servers = [f"s{i}" for i in range(ns)]
    joiners = [f"j{i}" for i in range(churn)]
    spans = dict(zip(servers, kinds, strict=True)) | {j: rng.choice(SPAN_KINDS) for j in joiners}
    nat = rng.sample(servers, 2 if big else 1)
    prompts = [[rng.randrange(1, vocab) for _ in range(rng.randint(3, 8))] for _ in range(4)]
    return Plan(seed, [f"v{i}" for i in range(nv)], servers, [f"c{i}" for i in range(nc)], joiners, spans, nat,
                prompts, churn, rng)


def replaceable_without(spans: dict[str, str], gone: set[str]) -> bool:
    """Whether every span of the servers ``gone`` is still served by a server of ``spans`` not in ``gone``.

    A failover replaces a dead hop by a chain of servers covering exactly its blocks (``RouteClient._replace``),
    so a server whose span starts at a block no other server starts at cannot be failed over, even where spans
    starting elsewhere cover its blocks (a full route exists): see the test's note."""
    left = {span for name, span in spans.items() if name not in gone}
    return all(spans[g] in left for g in gone)


# ---------------------------------------------------------------------------------------------------- /proc


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of process ``pid`` (its threads included); None once it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw.rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime, stime (fields 14 and 15 of proc(5))


def rss_mb(pid: int) -> float | None:
    """Resident memory of ``pid`` in MiB; None once it is gone."""
    try:
        pages = int(Path(f"/proc/{pid}/statm").read_text().split()[1])
    except (OSError, IndexError, ValueError):
        return None
    return pages * PAGE / (1 << 20)


def sample_cpu(pids: dict[str, int], seconds: float) -> dict[str, float]:
    """Each process's CPU use over the next ``seconds`` as a percentage of one core (absent if it exited)."""
    t0 = time.monotonic()
    before = {n: cpu_seconds(p) for n, p in pids.items()}
    time.sleep(seconds)
    after = {n: cpu_seconds(p) for n, p in pids.items()}
    dt = time.monotonic() - t0
    out = {}
    for n in pids:
        b, a = before[n], after[n]
        if a is not None and b is not None:
            out[n] = 100.0 * (a - b) / dt
    return out


def failovers_in_log(text: str) -> tuple[int, int]:
    """``(failed hops, replacements)`` a client logged (:mod:`node.inference.client`: ``hop ... failed at token``
    and ``replaced ... by ...``)."""
    failed = sum(1 for ln in text.splitlines() if "failed at token" in ln and " hop " in ln)
    replaced = sum(1 for ln in text.splitlines() if " replaced " in ln and " after replaying " in ln)
    return failed, replaced


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The JSON lines of ``path`` (a line cut by a killed writer is skipped); [] if it does not exist."""
    if not path.exists():
        return []
    out = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


# ---------------------------------------------------------------------------------------------------- programs


def _api(data_dir: Path) -> tuple[str, dict[str, str]]:
    api = json.loads((data_dir / "node.json").read_text())["api"]
    token = (data_dir / "api_token").read_text().strip()
    return api, {"Authorization": f"Bearer {token}"}


def gen_main(data_dir: Path, prompts: list[list[int]], tokens: int, stop: Path, seconds: float) -> None:
    """The ``gen`` program (see the module docstring)."""
    import httpx

    api, auth = _api(data_dir)
    start_at = int(os.environ.get("SWARM30_FIRST_PROMPT", "0"))
    deadline = time.monotonic() + seconds
    i = 0
    with httpx.Client(timeout=150.0, headers=auth) as http:
        while time.monotonic() < deadline and not stop.exists():
            k = (start_at + i) % len(prompts)
            t0 = time.time()
            row: dict[str, Any] = {"i": i, "prompt": k, "t0": t0}
            try:
                r = http.post(api + "/v1/generate", json={"prompt_ids": prompts[k], "max_new_tokens": tokens})
                row["status"] = r.status_code
                body = r.json()
                if r.is_success:
                    row |= {"tokens": body["tokens"], "route": body["route"], "receipts": body["receipts"]}
                else:
                    row["error"] = body
            except (httpx.HTTPError, ValueError) as e:
                row |= {"status": 0, "error": f"{type(e).__name__}: {e}"}
            row["t1"] = time.time()
            print(json.dumps(row), flush=True)
            i += 1
            time.sleep(3.0)  # room for the rest of the swarm on 2 cores


def blocks_main(data_dir: Path, ids: list[str], seconds: float) -> None:
    """The ``blocks`` program (see the module docstring)."""
    import httpx

    api, _ = _api(data_dir)
    deadline = time.monotonic() + seconds
    status: dict[str, str] = {}
    with httpx.Client(timeout=20.0) as http:
        while time.monotonic() < deadline:
            for rid in ids:
                if status.get(rid) != "included":
                    status[rid] = http.get(f"{api}/v1/txs/{rid}/status").json().get("status", "?")
            if all(s == "included" for s in status.values()):
                break
            time.sleep(1.0)
        head = http.get(f"{api}/v1/status").json()["height"]
        want = set(ids)
        where: dict[str, list[int]] = {rid: [] for rid in ids}
        for h in range(1, head + 1):
            for tx in http.get(f"{api}/v1/blocks/{h}").json()["txs"]:
                if tx["id"] in want:
                    where[tx["id"]].append(h)
    print(json.dumps({"head": head, "status": status, "where": where}), flush=True)


def attack_main(seconds: float, src: str, chain: str, genesis: str, classes: list[str], targets: list[str]) -> None:
    """The ``attack`` program (see the module docstring): each round one class against one target for up to 12 s."""
    import trio

    from tests.security import attacker

    os.nice(5)  # as the suite's attackers do: on 2 cores the attack should measure the targets, not its own CPU
    deadline = time.monotonic() + seconds
    rnd = 0
    extra = {"idle": ["--sockets", "100"], "bomb": ["--phase", "pre", "--size", str(1 << 20), "--streams", "2"],
             "drip": ["--streams", "2", "--sockets", "8"], "identities": ["--hold", "20", "--parallel", "4"]}
    while (left := deadline - time.monotonic()) > 3.0:
        cls, target = classes[rnd % len(classes)], targets[rnd % len(targets)]
        a = attacker.parse([cls, "--target", target, "--chain", chain, "--genesis", genesis, "--src", src,
                            "--seconds", str(min(12.0, left - 1.0)), "--nice", "0", *extra.get(cls, [])])
        t0 = time.monotonic()
        try:
            out = trio.run(attacker.CLASSES[cls], a)
        except Exception as e:  # noqa: BLE001 - a failed round is reported, and the attack goes on
            out = {"error": f"{type(e).__name__}: {e}"[:300]}
        out |= {"class": cls, "target": target, "elapsed_s": round(time.monotonic() - t0, 2)}
        print(json.dumps(out, default=str), flush=True)
        rnd += 1


def main(argv: list[str]) -> int:
    """Dispatch ``gen``, ``blocks`` or ``attack`` (see the module docstring)."""
    cmd, args = argv[0], argv[1:]
    if cmd == "gen":
        gen_main(Path(args[0]), json.loads(args[1]), int(args[2]), Path(args[3]), float(args[4]))
    elif cmd == "blocks":
        blocks_main(Path(args[0]), Path(args[1]).read_text().split(), float(args[2]))
    elif cmd == "attack":
        attack_main(float(args[0]), args[1], args[2], args[3], args[4].split(","), args[5:])
    else:
        print(f"unknown command {cmd}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
