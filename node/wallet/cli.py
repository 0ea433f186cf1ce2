"""``node wallet balance | history | transfer | bond | unbond | validator join|leave | validators``: the HTTP wallet
(:mod:`node.api.wallet`) from the command line, against the node whose data dir is given (like ``node job``), so a user
never needs curl. Without ``--no-wait`` a transfer, bond or unbond waits for its block until ``--timeout``; when it
gives up it says what happened to the transaction (still pending and why, or dropped and why: the node's
``/v1/txs/{id}/status``) and exits with :data:`EXIT_PENDING` or :data:`EXIT_DROPPED`.

Amounts are decimal credit strings checked on this side with the canonical parser
(:func:`node.encoding.parse_amount`) before anything is sent; accounts are peer IDs checked likewise. Output is
human-readable (``key  value`` lines, like bitcoin-cli's plain answers) or, with ``--json``, the API's JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from ..encoding import format_amount, parse_amount
from ..identity import account_from_str, account_to_str
from .client import NodeApi, NotIncluded, WalletError

MAX_PAGE = 200  # the API's largest page (node.api.wallet Limit)
MAX_PAGES = 100_000  # --all stops after this many pages (a bound on the loop; 20 million events)
TIMEOUT_S = 60.0
EXIT_PENDING = 2  # gave up waiting: the transaction is still pending (the reason is printed)
EXIT_DROPPED = 3  # the node dropped the transaction (the reason is printed)


class InputError(ValueError):
    """An argument refused on this side, before anything is sent."""


def check_amount(text: str) -> str:
    """The canonical spelling of a positive decimal credit amount.

    Raises:
        InputError: not one (the canonical parser's reason).
    """
    try:
        return format_amount(parse_amount(text))
    except ValueError as e:
        raise InputError(f"bad amount {text!r}: {e}") from None


def check_account(text: str) -> str:
    """The peer ID string of an account given as a peer ID or 64 hex characters.

    Raises:
        InputError: neither.
    """
    try:
        return account_to_str(account_from_str(text))
    except ValueError:
        raise InputError(f"bad account {text!r}: give a peer ID (12D3KooW..., as `node key` prints)") from None


def _seconds(text: str) -> float:
    try:
        x = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0 < x <= 86_400:
        raise argparse.ArgumentTypeError("--timeout must be more than 0 and at most 86400 seconds")
    return x


def _page_size(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if not 1 <= n <= MAX_PAGE:
        raise argparse.ArgumentTypeError(f"--limit must be 1..{MAX_PAGE}")
    return n


def add_wallet_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser], default_data_dir: Path) -> None:
    """``node wallet``: ``--data-dir`` and ``--json`` go before the subcommand (``--json`` also after it)."""
    w = sub.add_parser("wallet", help="balance, history, tabs, transfer, bond, unbond",
                       description="The wallet of a local node's account (its peer ID). Talks to the node running "
                                   "in --data-dir: its API URL is read from node.json and its token from api_token. "
                                   "Amounts are decimal credits, e.g. 1.5.")
    w.add_argument("--data-dir", type=Path, default=default_data_dir, help="the node's data dir (default: %(default)s)")
    w.add_argument("--json", action="store_true", help="print the API's JSON instead of text")
    ws = w.add_subparsers(dest="wallet_cmd", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="print the API's JSON")
    b = ws.add_parser("balance", parents=[common], help="balance, bond and escrow")
    b.add_argument("account", nargs="?", help="another account to look at (default: the node's own)")
    h = ws.add_parser("history", parents=[common], help="the account's history, newest first")
    h.add_argument("account", nargs="?", help="another account to look at (default: the node's own)")
    h.add_argument("--limit", type=_page_size, default=20,
                   help=f"events per page, 1..{MAX_PAGE} (default: %(default)s)")
    h.add_argument("--cursor", help="start at this page (the `next` a previous page printed)")
    h.add_argument("--all", action="store_true", help="every page, to the first event")
    sends = argparse.ArgumentParser(add_help=False)
    sends.add_argument("--no-wait", action="store_true",
                       help="print the transaction id at once instead of waiting until it is in a block")
    sends.add_argument("--timeout", type=_seconds, default=TIMEOUT_S,
                       help="seconds to wait for the block (default: %(default)s); when it gives up, the wallet "
                            f"says why the transaction is still pending and exits {EXIT_PENDING}; a transaction the "
                            f"node dropped is reported with the node's reason, exit {EXIT_DROPPED}")
    t = ws.add_parser("transfer", parents=[common, sends], help="send credits to another account")
    t.add_argument("to", help="the recipient's peer ID")
    t.add_argument("amount", help="credits, a decimal string (e.g. 1.5)")
    for name, what in (("bond", "lock credits of the balance as the node's worker bond"),
                       ("unbond", "release bond back to the balance (once no receipt of the node is pending)")):
        x = ws.add_parser(name, parents=[common, sends], help=what)
        x.add_argument("amount", help="credits, a decimal string (e.g. 100)")
    val = ws.add_parser("validator", parents=[common, sends],
                        help="join or leave the validator set (effective two blocks after inclusion)",
                        description="join: ask to validate (the node must be bonded with at least the genesis "
                                    "min_validator_bond; its voting power is its bond). leave: stop validating, "
                                    "keeping the bond. Either takes effect at the height two after the block "
                                    "that includes it; `node wallet validators` shows the set and pending changes.")
    val.add_argument("action", choices=("join", "leave"))
    ws.add_parser("validators", parents=[common], help="the validator set, voting power and pending changes")
    tb = ws.add_parser("tabs", parents=[common], help="tabs (locked, owed, redeemed); pending versus spendable credits",
                       description="The account's tabs on a chain that settles through them (issue 37): those it "
                                   "opened to pay servers and those it is paid through as a server; and its "
                                   "credits pending in epoch batches not yet final versus spendable.")
    tb.add_argument("account", nargs="?", help="another account to look at (default: the node's own)")


# ------------------------------------------------------------------ text output

def _cr(amount: dict[str, Any] | None) -> str:
    return "-" if amount is None else f"{amount['credits']} credits"


def format_balance(acc: dict[str, Any]) -> str:
    """``node wallet balance``: an ``/v1/accounts/{id}`` answer as ``key  value`` lines."""
    lines = [f"account  {acc['account']}", f"balance  {_cr(acc['balance'])}", f"bond     {_cr(acc['bond'])}",
             f"escrow   {_cr(acc['escrow'])}"]
    if acc["slashed"]["base_units"] != "0":
        lines.append(f"slashed  {_cr(acc['slashed'])}")
    if acc["bond"]["base_units"] != "0":
        lines.append(f"eligible {'yes' if acc['eligible'] else 'no (bond below min_bond)'}")
    lines.append(f"height   {acc['height']}")
    return "\n".join(lines)


def format_tabs(t: dict[str, Any]) -> str:
    """``node wallet tabs``: spendable and pending credits, then one line per tab."""
    lines = [f"account    {t['account']}", f"spendable  {_cr(t['spendable'])}",
             f"pending    {_cr(t['pending'])} ({t['open_batches']} epoch batch(es) not final)",
             f"locked     {_cr(t['locked_in_tabs'])} in tabs it opened", f"height     {t['height']}"]
    for x in t["tabs"]:
        role = "pays" if x["requester"] == t["account"] else "paid by"
        other = x["worker"] if x["requester"] == t["account"] else x["requester"]
        lines.append(f"  tab {x['tab'][:16]}  {role} {other}  locked {_cr(x['locked'])}  redeemed "
                     f"{_cr(x['redeemed'])}" + (f"  owed {_cr(x['owed'])}" if x.get("owed") else "")
                     + f"  nonce {x['nonce']}"
                     + (f"  closes at {x['closes_at']}" if x.get("closes_at") else ""))
    if not t["tabs"]:
        lines.append("  no tabs (the chain settles receipt by receipt, or none was opened)")
    return "\n".join(lines)


def format_events(events: list[dict[str, Any]]) -> str:
    """``node wallet history``: one line per history event (height, kind, role, amount, reference)."""
    lines = []
    for e in events:
        ref = e.get("tx") or e.get("receipt") or ""
        amount = e["amount"]["credits"] if e.get("amount") else "-"
        line = f"{e['height']:>8}  {e['kind']:<10} {e.get('role') or '-':<10} {amount:>20}  {ref}"
        if e.get("effect"):
            line += f"  ({e['effect']})"
        lines.append(line.rstrip())
    return "\n".join(lines)


def format_submitted(sub: dict[str, Any], tx: dict[str, Any] | None) -> str:
    """A submitted transaction (its id, kind, amount) and its height once ``tx`` (its ``TxOut``) is known."""
    lines = [f"txid    {sub['id']}", f"kind    {sub['kind']}", f"amount  {_cr(sub['amount'])}"]
    lines.append(f"height  {tx['height']}" if tx else "height  (pending: not waited for)")
    return "\n".join(lines)


# ------------------------------------------------------------------ commands

def _history(api: NodeApi, args: argparse.Namespace) -> None:
    account = check_account(args.account) if args.account else api.peer_id
    events: list[dict[str, Any]] = []
    cursor, pages = args.cursor, 0
    while True:
        page = api.get(f"/v1/accounts/{account}/history", limit=MAX_PAGE if args.all else args.limit, cursor=cursor)
        events += page["events"]
        cursor, pages = page.get("next"), pages + 1
        if not args.all or not cursor or pages >= MAX_PAGES:
            break
    if args.json:
        print(json.dumps({"account": account, "events": events, "next": cursor}, indent=2))
        return
    print(format_events(events) if events else f"no events for {account}")
    if cursor:
        print(f"more: node wallet --data-dir {args.data_dir} history --cursor {cursor}"
              + (f" {account}" if args.account else ""), file=sys.stderr)


def format_validators(vals: dict[str, Any]) -> str:
    """``node wallet validators``: the set's power and quorum, one line per validator and pending change."""
    lines = [f"height   {vals['height']}", f"power    {vals.get('total_power', '-')} (a commit needs "
             f"{vals.get('quorum_power', '-')})",
             "changes  " + ("by bond (min_validator_bond "
                            f"{_cr(vals.get('min_validator_bond'))})" if vals.get("changes")
                            else "no (fixed in genesis)")]
    lines += [f"  {x['account']}  power {x.get('power', '1')}  signed {x['signed']}/{vals['window']}"
              for x in vals["validators"]]
    lines += [f"pending  {c['account']}  power {c['from_power']} -> {c['power']} from height {c['effective_height']}"
              for c in vals.get("pending", [])]
    return "\n".join(lines)


def _send(api: NodeApi, args: argparse.Namespace) -> None:
    if args.wallet_cmd == "validator":
        sub = api.post("/v1/validator", {"action": args.action})
        tx = None if args.no_wait else api.wait_included(sub, args.timeout)
        if args.json:
            print(json.dumps({**sub, **({"height": tx["height"]} if tx else {})}, indent=2))
        else:
            print("\n".join([f"txid    {sub['id']}", f"kind    {sub['kind']}",
                             f"height  {tx['height']}" if tx else "height  (pending: not waited for)"]))
        return
    amount = check_amount(args.amount)
    if args.wallet_cmd == "transfer":
        sub = api.post("/v1/transfer", {"to": check_account(args.to), "amount": amount})
    else:
        sub = api.post(f"/v1/{args.wallet_cmd}", {"amount": amount})
    tx = None
    if not args.no_wait:
        print(f"submitted {sub['kind']} {sub['id']}; waiting until it is in a block...", file=sys.stderr)
        tx = api.wait_included(sub, args.timeout)
    if args.json:
        out = dict(sub)
        if tx is not None:
            out.update(height=tx["height"], block_hash=tx["block_hash"])
        print(json.dumps(out, indent=2))
    else:
        print(format_submitted(sub, tx))


def run_wallet_command(args: argparse.Namespace) -> int:
    """Run one ``node wallet`` subcommand; a refusal or an unreachable node exits 1 with one line on stderr."""
    try:
        if args.wallet_cmd in ("transfer", "bond", "unbond"):
            check_amount(args.amount)  # refused before the node is even looked for
            if args.wallet_cmd == "transfer":
                check_account(args.to)
        if getattr(args, "account", None):
            check_account(args.account)
        api = NodeApi(args.data_dir)
        try:
            if args.wallet_cmd == "balance":
                account = check_account(args.account) if args.account else api.peer_id
                acc = api.get(f"/v1/accounts/{account}")
                print(json.dumps(acc, indent=2) if args.json else format_balance(acc))
            elif args.wallet_cmd == "history":
                _history(api, args)
            elif args.wallet_cmd == "tabs":
                account = check_account(args.account) if args.account else api.peer_id
                got = api.get(f"/v1/accounts/{account}/tabs")
                print(json.dumps(got, indent=2) if args.json else format_tabs(got))
            elif args.wallet_cmd == "validators":
                vals = api.get("/v1/validators")
                print(json.dumps(vals, indent=2) if args.json else format_validators(vals))
            else:
                _send(api, args)
        finally:
            api.close()
    except NotIncluded as e:
        if getattr(args, "json", False) and e.status is not None:
            print(json.dumps(e.status, indent=2))
        print(f"node wallet: {e}", file=sys.stderr)
        return EXIT_DROPPED if e.dropped else EXIT_PENDING
    except (InputError, WalletError) as e:
        print(f"node wallet: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("node wallet: interrupted (a submitted transaction may still be included; see `node wallet history`)",
              file=sys.stderr)
        return 130
    return 0
