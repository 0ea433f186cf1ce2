"""``node genesis new|show`` (a network of your own) and ``node key`` (a data dir's peer ID).

``node genesis new`` builds the genesis document from flags, runs it through :func:`node.ledger.genesis.parse_genesis`
— the very check ``node start --genesis FILE`` runs, the p·S > (1 − p)·G rule included — writes it to a temporary
file, loads that file back with :func:`~node.ledger.genesis.load_genesis` and only then moves it into place, so a
file that a node would refuse is never written. The flag parsing and the report are pure functions; the commands
at the bottom do the I/O.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import re
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from importlib import resources
from pathlib import Path
from typing import Any

from .encoding import format_amount, parse_amount
from .identity import KEY_FILE, KeyFileError, account_from_str, account_to_str, load_or_create
from .ledger.core.sampling import PPM
from .ledger.genesis import Genesis, GenesisError, Params, check_bootstrap_addr, load_genesis, parse_genesis

DEVNET_CHAIN = "tally-devnet"
PARAM_SOURCES = ("production", "devnet")
# ``heartbeat_ms`` of a new genesis from ``--params production`` when neither --heartbeat nor the parameters set
# it (``--params devnet`` and files without it keep 0: a block every block time, as the devnet). An idle chain makes a
# block this often only to show it is alive: beacons, challenge windows and every other timeout get their blocks
# at block_time_ms anyway (node.ledger.core.liveness), so nothing waits on the heartbeat. 30 s lets a follower tell a
# quiet chain from a halted one within a minute (two missed heartbeats) and costs 2,880 empty blocks a day, about
# 200 B each stored (bench/ledger.py --idle): under 0.6 MB a day, against 172,800 blocks at a 500 ms block time.
DEFAULT_HEARTBEAT_MS = 30_000


class FlagError(ValueError):
    """A ``node genesis new`` flag that cannot be turned into a genesis (the message names the flag)."""


# ------------------------------------------------------------------ flags -> genesis document (pure)

def parse_genesis_time(text: str) -> int:
    """``--genesis-time``: milliseconds since the Unix epoch, from ISO 8601 (``2026-01-01T00:00:00Z``; a time
    without an offset is UTC) or a whole number of milliseconds.

    Raises:
        FlagError: neither form, or before 1970.
    """
    t = text.strip()
    if t.isascii() and t.isdigit():
        return int(t)
    try:
        d = datetime.fromisoformat(t[:-1] + "+00:00" if t.endswith(("Z", "z")) else t)
    except ValueError:
        raise FlagError(f"--genesis-time {text!r}: give ISO 8601 UTC (e.g. 2026-01-01T00:00:00Z) or milliseconds "
                        "since the Unix epoch") from None
    if d.tzinfo is None:
        d = d.replace(tzinfo=UTC)
    ms = round(d.timestamp() * 1000)
    if ms < 0:
        raise FlagError(f"--genesis-time {text!r} is before 1970")
    return ms


_DURATION = re.compile(r"(\d+)\s*(ms|s|m|h)?")
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, None: 1000}


def parse_duration_ms(text: str, flag: str = "--heartbeat") -> int:
    """A duration such as ``30s``, ``1500ms``, ``2m`` or ``1h`` (a bare number is seconds) in milliseconds.

    Raises:
        FlagError: not such a duration.
    """
    m = _DURATION.fullmatch(text.strip().lower())
    if m is None:
        raise FlagError(f"{flag} {text!r}: give a duration such as 30s, 1500ms, 2m or 1h")
    return int(m.group(1)) * _UNIT_MS[m.group(2)]


def apply_heartbeat(params: dict[str, Any], heartbeat: str | None,
                    default_ms: int = DEFAULT_HEARTBEAT_MS) -> dict[str, Any]:
    """``--heartbeat`` over ``params``: its value, else the parameters' own ``heartbeat_ms``, else ``default_ms``
    (raised to ``block_time_ms`` if below it; 0 leaves it out). ``heartbeat_ms`` 0 keeps a block every block time.

    Raises:
        FlagError: a bad duration, or ``--heartbeat`` together with ``--param heartbeat_ms`` / a params file's
            different ``heartbeat_ms``.
    """
    out = dict(params)
    if heartbeat is not None:
        ms = parse_duration_ms(heartbeat)
        if "heartbeat_ms" in out and out["heartbeat_ms"] != ms:
            raise FlagError(f"--heartbeat {heartbeat} and heartbeat_ms={out['heartbeat_ms']} disagree; give it once")
        out["heartbeat_ms"] = ms
    elif "heartbeat_ms" not in out and default_ms:
        bt = out.get("block_time_ms", Params().block_time_ms)
        out["heartbeat_ms"] = max(default_ms, bt) if isinstance(bt, int) else default_ms
    return out


def _peer(text: str, flag: str) -> bytes:
    try:
        return account_from_str(text)
    except ValueError:
        raise FlagError(f"{flag} {text!r}: not a peer ID (12D3KooW..., as `node key` prints)") from None


def _amount(text: str, flag: str, what: str) -> int:
    try:
        return parse_amount(text, allow_zero=True)
    except ValueError as e:
        raise FlagError(f"{flag}: {what}: {e}") from None


def parse_validator_flag(text: str) -> tuple[bytes, int | None]:
    """``--validator PEER_ID[=BOND]``: the validator's account and the bond in base units (None: not given)."""
    peer, sep, bond = text.partition("=")
    return _peer(peer, "--validator"), (_amount(bond, f"--validator {text}", "bond") if sep else None)


def parse_account_flag(text: str) -> tuple[bytes, int, int]:
    """``--account PEER_ID=BALANCE[:BOND]``: ``(account, balance, bond)`` in base units."""
    peer, sep, amounts = text.partition("=")
    if not sep:
        raise FlagError(f"--account {text!r}: write PEER_ID=BALANCE or PEER_ID=BALANCE:BOND (credits)")
    bal, sep2, bond = amounts.partition(":")
    flag = f"--account {text}"
    return _peer(peer, "--account"), _amount(bal, flag, "balance"), (_amount(bond, flag, "bond") if sep2 else 0)


def genesis_resource(name: str) -> dict[str, Any]:
    """A JSON file shipped in the ``genesis`` package (``devnet.json``, ``production-params.json``)."""
    doc: dict[str, Any] = json.loads(resources.files("genesis").joinpath(name).read_text())  # a JSON object
    return doc


def params_source(source: str, read_file: Callable[[str], str] = lambda p: Path(p).read_text()) -> dict[str, Any]:
    """``--params``: the parameter dict of ``production`` (genesis/production-params.json), ``devnet`` (the
    embedded devnet genesis) or a JSON FILE (a genesis file, a ``{"params": {...}}`` file, or a bare dict).

    Raises:
        FlagError: unreadable or not a JSON object of parameters.
    """
    if source == "production":
        doc = genesis_resource("production-params.json")
    elif source == "devnet":
        doc = genesis_resource("devnet.json")
    else:
        try:
            doc = json.loads(read_file(source))
        except OSError as e:
            raise FlagError(f"--params {source}: {e.strerror or e}") from None
        except json.JSONDecodeError as e:
            raise FlagError(f"--params {source}: not JSON: {e}") from None
    params = doc.get("params", doc) if isinstance(doc, dict) else None
    if not isinstance(params, dict):
        raise FlagError(f"--params {source}: not a JSON object of parameters")
    return {k: v for k, v in params.items() if k != "note"}


def apply_param_overrides(params: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """``--param NAME=VALUE`` (an integer, base units / ppm / blocks / ms as the parameter's unit) over ``params``.

    Raises:
        FlagError: not NAME=VALUE, an unknown name, or a value that is not an integer.
    """
    out = dict(params)
    known = list(Params.__dataclass_fields__)
    for text in overrides:
        name, sep, value = text.partition("=")
        if not sep:
            raise FlagError(f"--param {text!r}: write NAME=VALUE")
        if name not in known:
            raise FlagError(f"--param {name}: unknown parameter; known: {', '.join(known)}")
        try:
            out[name] = int(value, 10)
        except ValueError:
            raise FlagError(f"--param {text!r}: the value must be an integer (in the parameter's unit)") from None
    return out


def build_doc(chain_id: str, validators: list[str], accounts: list[str], params: dict[str, Any],
              bootstrap: list[str], genesis_time_ms: int) -> dict[Any, Any]:
    """The genesis document for ``node genesis new``'s flags; accounts keep the order of ``--account``, then
    validators with a bond and no ``--account`` entry (balance 0). Checks what :func:`parse_genesis` cannot
    see (duplicates, a bond given twice) and leaves every other check to it.

    Raises:
        FlagError: a duplicated validator or account, a bond given twice, the reserved devnet chain id, or a
            bad bootstrap address.
    """
    if chain_id == DEVNET_CHAIN:
        raise FlagError(f"--chain-id {DEVNET_CHAIN} is the embedded devnet's; choose another (chains named "
                        "tally-test* allow the test switches and --dev-account)")
    vals = [parse_validator_flag(v) for v in validators]
    if not vals:
        raise FlagError("give at least one --validator PEER_ID")
    seen: set[bytes] = set()
    for a, _ in vals:
        if a in seen:
            raise FlagError(f"--validator {account_to_str(a)} is given twice")
        seen.add(a)
    rows: dict[bytes, list[int]] = {}
    for text in accounts:
        a, bal, bond = parse_account_flag(text)
        if a in rows:
            raise FlagError(f"--account {account_to_str(a)} is given twice")
        rows[a] = [bal, bond]
    for a, vbond in vals:
        if vbond is None:
            continue
        if a in rows and rows[a][1]:
            raise FlagError(f"the bond of {account_to_str(a)} is given twice (--validator ...=BOND and --account "
                            "...:BOND); give it once")
        rows.setdefault(a, [0, 0])[1] = vbond
    boot: list[str] = []
    for b in bootstrap:
        try:
            boot.append(check_bootstrap_addr(b))
        except GenesisError as e:
            raise FlagError(f"--bootstrap: {e}") from None
    if len(set(boot)) != len(boot):
        raise FlagError("a --bootstrap address is given twice")
    draft = Genesis(chain_id, genesis_time_ms, tuple(a for a, _ in vals),
                    tuple((a, bal, bond) for a, (bal, bond) in rows.items()), Params(), tuple(boot))
    doc = draft.to_doc()
    doc["params"] = params  # unchecked yet: parse_genesis checks them with everything else
    return doc


# ------------------------------------------------------------------ report (pure)

def _credits(units: int) -> str:
    return f"{format_amount(units)} credits"


def iso_time(ms: int) -> str:
    """Milliseconds since the epoch as ISO 8601 UTC (``2026-01-01T00:00:00Z``; milliseconds shown if any)."""
    d = datetime.fromtimestamp(ms / 1000, tz=UTC)
    return d.strftime("%Y-%m-%dT%H:%M:%S") + (f".{ms % 1000:03d}" if ms % 1000 else "") + "Z"


def genesis_warnings(g: Genesis) -> list[str]:
    """Advice on a genesis that a node accepts but that may not be what was meant."""
    out: list[str] = []
    bonds = {a: bond for a, _, bond in g.balances}
    for v in g.validators:
        if not bonds.get(v):
            out.append(f"validator {account_to_str(v)} has no bond: double signing would cost it nothing")
    for a, _, bond in g.balances:
        if 0 < bond < g.params.min_bond:
            out.append(f"{account_to_str(a)} is bonded below min_bond ({_credits(bond)} < "
                       f"{_credits(g.params.min_bond)}): it cannot serve or sit on committees")
    if g.supply == 0:
        out.append("no account has credits: nobody can pay for work")
    for b in g.bootstrap:
        host = b.split("/")[2] if b.count("/") > 2 else ""
        try:
            if ipaddress.ip_address(host).is_loopback:
                out.append(f"bootstrap {b} is a loopback address: only nodes on this machine can dial it")
        except ValueError:
            pass
    return out


def safety_line(p: Params) -> str:
    """The p·S > (1 − p)·G rule with this genesis's numbers (DESIGN.md, Verification §4)."""
    ps = p.sample_floor_ppm * p.slash_amount // PPM
    qg = (PPM - p.sample_floor_ppm) * p.max_receipt_price // PPM
    return (f"p·S = {p.sample_floor_ppm / PPM:g} × {format_amount(p.slash_amount)} = {format_amount(ps)} credits > "
            f"(1 − p)·G = {(PPM - p.sample_floor_ppm) / PPM:g} × {format_amount(p.max_receipt_price)} = "
            f"{format_amount(qg)} credits")


def describe(g: Genesis, where: str) -> str:
    """``node genesis show``'s human-readable report of a genesis that passed every check."""
    bonds = {a: bond for a, _, bond in g.balances}
    lines = [f"genesis       {where}",
             f"chain id      {g.chain_id}",
             f"hash          {g.hash.hex()}",
             f"genesis time  {iso_time(g.genesis_time_ms)} ({g.genesis_time_ms} ms)",
             f"validators    {len(g.validators)}"]
    lines += [f"  {account_to_str(v)}  bond {_credits(bonds.get(v, 0))}" for v in g.validators]
    lines.append(f"accounts      {len(g.balances)}, total supply {_credits(g.supply)}")
    lines += [f"  {account_to_str(a)}  balance {format_amount(bal):>14}  bond {format_amount(bond):>14}"
              for a, bal, bond in g.balances]
    lines.append("params")
    width = max(len(k) for k in g.params.__dict__)
    lines += [f"  {k:<{width}}  {v}" for k, v in g.params.__dict__.items()]
    lines.append(f"bootstrap     {len(g.bootstrap) or '(none: give --bootstrap to node start)'}")
    lines += [f"  {b}" for b in g.bootstrap]
    lines.append(f"checks        ok ({safety_line(g.params)})")
    lines += [f"warning       {w}" for w in genesis_warnings(g)]
    return "\n".join(lines)


# ------------------------------------------------------------------ argparse

def add_genesis_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``node genesis new|show``."""
    g = sub.add_parser("genesis", help="make or inspect a genesis file (a network of your own)",
                       description="Write a genesis file for a network of your own, or show one and run every "
                                   "check a node runs at start.")
    gs = g.add_subparsers(dest="genesis_cmd", required=True)
    n = gs.add_parser("new", help="write a genesis file from flags and print its hash",
                      formatter_class=argparse.RawDescriptionHelpFormatter,
                      description="Write a genesis file that `node start --genesis FILE` reads, after running every "
                                  "check a node runs at start (a genesis a node would refuse is never written). "
                                  "Prints the genesis hash on stdout. Amounts are decimal credits (e.g. 1000, "
                                  "0.5); get a peer ID with `node key --create --data-dir DIR`.",
                      epilog="example:\n  node genesis new --chain-id my-net --out genesis.json \\\n"
                             "    --validator 12D3KooWA...=200 --account 12D3KooWA...=1000 \\\n"
                             "    --account 12D3KooWB...=100:200 --params production \\\n"
                             "    --bootstrap /dns4/boot.example.org/tcp/4001/p2p/12D3KooWA...")
    n.add_argument("--chain-id", required=True, help="the chain's name, 1..64 characters (tally-test* chains "
                                                     "allow the test switches)")
    n.add_argument("--validator", action="append", default=[], metavar="PEER_ID[=BOND]",
                   help="a consensus validator, optionally with its bond in credits (repeatable)")
    n.add_argument("--account", action="append", default=[], metavar="PEER_ID=BALANCE[:BOND]",
                   help="an account's starting balance and optional bond, in credits (repeatable), e.g. "
                        "12D3KooW...=100:200")
    n.add_argument("--params", default="production", metavar="production|devnet|FILE",
                   help="chain parameters: genesis/production-params.json, the embedded devnet's, or a JSON file "
                        "(default: %(default)s)")
    n.add_argument("--param", action="append", default=[], metavar="NAME=VALUE",
                   help="override one parameter, an integer in its unit (base units, ppm, blocks, ms), e.g. "
                        "block_time_ms=500 (repeatable)")
    n.add_argument("--heartbeat", metavar="DURATION",
                   help="the longest time between two blocks when the chain is idle, e.g. 30s, 2m, 1500ms (a bare "
                        "number is seconds): with no transaction to include and no receipt, job or run whose "
                        "beacon or timeout needs a block, validators make an empty block only this often; "
                        "otherwise a block comes every block_time_ms. 0 makes a block every block_time_ms, "
                        "idle or not. At most 1h. (default: the --params' heartbeat_ms, else "
                        f"{DEFAULT_HEARTBEAT_MS // 1000}s for production and 0 for devnet or a file without it)")
    n.add_argument("--bootstrap", action="append", default=[], metavar="MULTIADDR",
                   help="an address nodes dial at start when `node start` has no --bootstrap, ending in "
                        "/p2p/<peer ID> (repeatable; not part of the genesis hash)")
    n.add_argument("--genesis-time", metavar="TIME",
                   help="ISO 8601 UTC (2026-01-01T00:00:00Z) or ms since the epoch; no block is older "
                        "(default: now, rounded down to the second)")
    n.add_argument("--out", type=Path, required=True, help="the genesis file to write")
    n.add_argument("--force", action="store_true", help="overwrite --out if it exists")
    s = gs.add_parser("show", help="print a genesis file and run every check a node runs at start",
                      description="Print a genesis file (default: the embedded devnet) and run every check a node "
                                  "runs at start; exits non-zero with the reason when one fails.")
    s.add_argument("file", nargs="?", type=Path, help="genesis JSON file (default: the embedded devnet)")
    s.add_argument("--json", action="store_true", help="print the hash and the parsed document as JSON")


def add_key_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser], default_data_dir: Path) -> None:
    """``node key``."""
    k = sub.add_parser("key", help="print a data dir's peer ID (= ledger account)",
                       description=f"Print the peer ID of the node key in <data-dir>/{KEY_FILE} (the libp2p peer "
                                   "ID is also the node's ledger account). With --create, make the key (mode 0600) "
                                   "if there is none yet.")
    k.add_argument("--data-dir", type=Path, default=default_data_dir, help="the node's data dir (default: %(default)s)")
    k.add_argument("--create", action="store_true", help="create the key if the data dir has none")


# ------------------------------------------------------------------ commands (I/O)

def _write_new(g: Genesis, out: Path, force: bool) -> None:
    """Write ``g`` to ``out`` via a temporary file that :func:`load_genesis` must read back as ``g``; without
    ``force`` an existing ``out`` is never replaced (``os.link`` refuses atomically).

    Raises:
        FileExistsError: ``out`` exists and not ``force``.
        GenesisError: the written file does not read back as ``g`` (a bug; nothing is left behind).
    """
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps(g.to_doc(), indent=2) + "\n")
        back = load_genesis(tmp)
        if back != g or back.hash != g.hash:
            raise GenesisError("the written file does not read back as the same genesis")
        if force:
            os.replace(tmp, out)
        else:
            os.link(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)


def _genesis_new(args: argparse.Namespace) -> int:
    if args.out.exists() and not args.force:
        sys.exit(f"node genesis new: {args.out} exists; not overwriting it (--force replaces it)")
    try:
        gtime = (parse_genesis_time(args.genesis_time) if args.genesis_time is not None
                 else int(time.time()) * 1000)
        params = apply_heartbeat(apply_param_overrides(params_source(args.params), args.param),
                                 getattr(args, "heartbeat", None),
                                 DEFAULT_HEARTBEAT_MS if args.params == "production" else 0)
        doc = build_doc(args.chain_id, args.validator, args.account, params, args.bootstrap, gtime)
        g = parse_genesis(doc)
    except (FlagError, GenesisError) as e:
        sys.exit(f"node genesis new: {e}; nothing written")
    try:
        _write_new(g, args.out, args.force)
    except FileExistsError:
        sys.exit(f"node genesis new: {args.out} exists; not overwriting it (--force replaces it)")
    except (OSError, GenesisError) as e:
        sys.exit(f"node genesis new: cannot write {args.out}: {getattr(e, 'strerror', None) or e}")
    for w in genesis_warnings(g):
        print(f"warning: {w}", file=sys.stderr)
    print(f"wrote {args.out}: chain {g.chain_id}, {len(g.validators)} validator(s), {len(g.balances)} account(s), "
          f"supply {_credits(g.supply)}, genesis time {iso_time(g.genesis_time_ms)}", file=sys.stderr)
    print(g.hash.hex())
    return 0


def _genesis_show(args: argparse.Namespace) -> int:
    where = str(args.file) if args.file is not None else "embedded devnet (genesis/devnet.json)"
    try:
        g = load_genesis(args.file)
    except GenesisError as e:
        sys.exit(f"node genesis show: check failed: {e}")
    except OSError as e:
        sys.exit(f"node genesis show: cannot read {args.file}: {e.strerror or e}")
    if args.json:
        print(json.dumps({"hash": g.hash.hex(), "supply": format_amount(g.supply), "genesis": g.to_doc()},
                         indent=2))
    else:
        print(describe(g, where))
    return 0


def run_genesis_command(args: argparse.Namespace) -> int:
    """``node genesis new|show``; the exit status (a failure exits with its one-line reason)."""
    return _genesis_new(args) if args.genesis_cmd == "new" else _genesis_show(args)


def run_key_command(args: argparse.Namespace) -> int:
    """``node key``: the peer ID on stdout; with ``--create`` a missing key is made first (said on stderr)."""
    path = args.data_dir / KEY_FILE
    existed = path.exists()
    if not existed and not args.create:
        sys.exit(f"node key: no node key in {args.data_dir} ({path} does not exist); create one with "
                 f"`node key --create --data-dir {args.data_dir}` (or start a node there)")
    try:
        ident = load_or_create(args.data_dir)
    except KeyFileError as e:
        sys.exit(f"node key: {e}")
    except OSError as e:
        sys.exit(f"node key: cannot {'read' if existed else 'create'} {path}: {e.strerror or e}")
    if not existed:
        print(f"created {path} (mode 0600)", file=sys.stderr)
    print(ident.peer_id)
    return 0
