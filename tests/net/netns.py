"""Test hosts as Linux network namespaces joined by a bridge, with NAT routers and link cuts (test infra only).

Topology of one :class:`Netns` (every name carries the run id, ``tnet-<pid>-<hex4>-``)::

    <prefix>sw        "switch" namespace: bridge br0 on 10.247.0.0/24 (no address of its own)
    <prefix><name>    public host: eth0 = 10.247.0.<n>/24 on the bridge
    <prefix><name>    host behind NAT: eth0 = 10.247.<k>.2/24, default route via its router
    <prefix><name>-gw its router: eth0 = 10.247.0.<n>/24 on the bridge, in0 = 10.247.<k>.1/24;
                      masquerade out of eth0, forwarded connections that arrive on eth0 are dropped unless
                      they belong to a connection the inside opened (outbound only)

Nothing is created in the root namespace: every link is made inside the switch namespace and moved to its host
namespace, so the host's own interfaces and routes are untouched, and two runs (parallel, or a leftover of a
crashed one) never see each other's addresses. Public hosts have no default route: they reach only the bridge.

Usage::

    with Netns() as net:                       # raises NetnsUnavailable(reason) where namespaces cannot be made
        a = net.add_host("a")                  # Host(name="a", ns="tnet-...-a", ip="10.247.0.2", ...)
        s = net.add_nat_host("s")              # s.ip private 10.247.1.2; s.public_ip = its router's 10.247.0.3
        p = net.popen(a, [sys.executable, "-c", "..."], stdout=subprocess.PIPE)
        net.cut(a); ...; net.restore(a)        # the bridge link of a (of its router for a NAT host)
    # every process started by popen is stopped and every namespace removed here (also on KeyboardInterrupt)

Needs root, iproute2 (``ip``) and ``nft`` (nftables) or ``iptables`` for NAT hosts; :func:`check_available`
finds out by creating a namespace, a bridge, a veth pair and a NAT table (not by guessing).
"""

from __future__ import annotations

import atexit
import contextlib
import ipaddress
import os
import secrets
import shutil
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

PREFIX = "tnet-"
"""Name prefix of every namespace this harness makes: ``tnet-<owner pid>-<hex4>-<name>``."""

SUBNET = ipaddress.ip_network("10.247.0.0/16")
"""Addresses of every run (each run is isolated in its own switch namespace, so runs may reuse them)."""

_CMD_TIMEOUT = 10.0  # seconds for one ip/nft command


class NetnsUnavailable(RuntimeError):
    """This machine does not allow the harness to build namespaces; the message says why."""


class NetnsError(RuntimeError):
    """A command that builds or changes the topology failed (message: the command and its stderr)."""


@dataclass
class Host:
    """One test host.

    Attributes:
        name: the name given to :meth:`Netns.add_host` / :meth:`Netns.add_nat_host`.
        ns: its network namespace (``ip netns exec <ns> ...``).
        ip: its own IPv4 address (listen here). Behind NAT this is a private address nobody outside can reach.
        public_ip: the address others see its connections come from (``ip`` for a public host, the router's
            bridge address for a host behind NAT).
        router_ns: the NAT router's namespace, None for a public host.
    """

    name: str
    ns: str
    ip: str
    public_ip: str
    router_ns: str | None = None
    _port: str = field(default="", repr=False)  # its (or its router's) port on the bridge, in the switch ns

    @property
    def behind_nat(self) -> bool:
        """True for a host made by :meth:`Netns.add_nat_host`."""
        return self.router_ns is not None


def _run(argv: Sequence[str], *, input: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    try:
        p = subprocess.run(list(argv), input=input, capture_output=True, text=True, timeout=_CMD_TIMEOUT)
    except FileNotFoundError as e:
        raise NetnsError(f"{argv[0]} not found: {e}") from None
    except subprocess.TimeoutExpired:
        raise NetnsError(f"{' '.join(argv)}: no answer within {_CMD_TIMEOUT} s") from None
    if check and p.returncode != 0:
        raise NetnsError(f"{' '.join(argv)} failed (exit {p.returncode}): {p.stderr.strip() or p.stdout.strip()}")
    return p


def list_namespaces() -> list[str]:
    """Names of every network namespace on this machine (``ip netns list``); [] where ``ip`` fails."""
    try:
        out = _run(["ip", "netns", "list"], check=False).stdout
    except NetnsError:
        return []
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _kill_ns_processes(ns: str) -> None:
    """SIGKILL every process still inside namespace ``ns`` (the harness's own children, or a crashed run's)."""
    out = _run(["ip", "netns", "pids", ns], check=False).stdout
    for tok in out.split():
        if tok.isdigit() and int(tok) != os.getpid():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(int(tok), signal.SIGKILL)


def _delete_ns(ns: str) -> None:
    _kill_ns_processes(ns)
    _run(["ip", "netns", "del", ns], check=False)


def cleanup_leftovers() -> list[str]:
    """Remove the namespaces of earlier runs of this harness whose owner process is gone (a crash, SIGKILL).

    Namespaces of runs whose owner is alive (parallel runs) are left alone. Processes still inside a removed
    namespace are killed first. Returns the names removed.
    """
    removed = []
    for ns in list_namespaces():
        if not ns.startswith(PREFIX):
            continue
        owner = ns[len(PREFIX):].split("-", 1)[0]
        if owner.isdigit() and _pid_alive(int(owner)) and int(owner) != 0:
            continue
        _delete_ns(ns)
        removed.append(ns)
    return removed


def _nat_tool() -> str | None:
    for tool in ("nft", "iptables"):
        if shutil.which(tool):
            return tool
    return None


_AVAILABLE: tuple[bool, str] | None = None


def check_available() -> None:
    """Find out, by a real attempt, whether this machine lets the harness build its topology (cached per process).

    Creates a namespace, a bridge and a veth pair in it, and a NAT table with ``nft`` or ``iptables``, then
    removes them.

    Raises:
        NetnsUnavailable: not root, ``ip`` missing, ``ip netns add`` refused, or no working nft/iptables (the
            message says which and how to fix it: ``scripts/setup-netns``).
    """
    global _AVAILABLE
    if _AVAILABLE is None:
        _AVAILABLE = _probe()
    ok, reason = _AVAILABLE
    if not ok:
        raise NetnsUnavailable(reason)


def _probe() -> tuple[bool, str]:
    if os.geteuid() != 0:
        return False, f"network namespaces need root (this process runs as uid {os.geteuid()})"
    if shutil.which("ip") is None:
        return False, "`ip` (iproute2) is not installed: run scripts/setup-netns"
    tool = _nat_tool()
    if tool is None:
        return False, "neither nft nor iptables is installed (NAT hosts need one): run scripts/setup-netns"
    ns = f"{PREFIX}{os.getpid()}-probe{secrets.token_hex(2)}"
    try:
        _run(["ip", "netns", "add", ns])
    except NetnsError as e:
        return False, f"cannot create a network namespace: {e}"
    try:
        _run(["ip", "-n", ns, "link", "add", "br0", "type", "bridge"])
        _run(["ip", "-n", ns, "link", "add", "p0", "type", "veth", "peer", "name", "p1"])
        _run(["ip", "-n", ns, "link", "set", "p0", "master", "br0"])
        if tool == "nft":
            _run(["ip", "netns", "exec", ns, "nft", "add", "table", "ip", "probe"])
        else:
            _run(["ip", "netns", "exec", ns, "iptables", "-t", "nat", "-A", "POSTROUTING", "-j", "MASQUERADE"])
    except NetnsError as e:
        return False, f"namespace created but the topology cannot be built: {e}"
    finally:
        _delete_ns(ns)
    return True, ""


class Netns:
    """One run's topology: a switch namespace with a bridge, and the hosts added to it.

    Args:
        prefix_note: ignored by the kernel; a short word (letters/digits, up to 8) put in the run id to say
            which test made it (``tnet-<pid>-<hex4><note>-...``).

    Raises:
        NetnsUnavailable: see :func:`check_available`.
        NetnsError: building the switch failed (whatever was made is removed).
    """

    def __init__(self, prefix_note: str = ""):
        check_available()
        cleanup_leftovers()
        note = "".join(c for c in prefix_note.lower() if c.isalnum())[:8]
        self.run_id = f"{os.getpid()}-{secrets.token_hex(2)}{note}"
        self.prefix = f"{PREFIX}{self.run_id}-"
        self.hosts: dict[str, Host] = {}
        self._namespaces: list[str] = []
        self._procs: list[subprocess.Popen] = []
        self._next_public = 2  # 10.247.0.<n>
        self._next_private = 1  # 10.247.<k>.0/24
        self._ports = 0
        self._closed = False
        self.switch = self.prefix + "sw"
        atexit.register(self.close)
        try:
            self._add_ns(self.switch)
            self._ip(self.switch, "link", "add", "br0", "type", "bridge")
            self._ip(self.switch, "link", "set", "br0", "up")
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------ building

    def _ip(self, ns: str, *args: str) -> None:
        _run(["ip", "-n", ns, *args])

    def _exec(self, ns: str, *argv: str, input: str | None = None) -> None:
        _run(["ip", "netns", "exec", ns, *argv], input=input)

    def _add_ns(self, ns: str) -> None:
        _run(["ip", "netns", "add", ns])
        self._namespaces.append(ns)
        self._ip(ns, "link", "set", "lo", "up")

    def _check_name(self, name: str) -> None:
        if self._closed:
            raise NetnsError("this Netns is closed")
        if not name or not all(c.isalnum() for c in name) or len(name) > 20:
            raise ValueError(f"host name must be 1-20 letters/digits, got {name!r}")
        if name in self.hosts or name == "sw":
            raise ValueError(f"host {name!r} exists already in this run")

    def _attach(self, ns: str, cidr: str) -> str:
        """veth ns:eth0 <-> switch:v<i>, the latter a bridge port; returns the switch-side name."""
        self._ports += 1
        port = f"v{self._ports}"
        self._ip(self.switch, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", ns)
        self._ip(self.switch, "link", "set", port, "master", "br0", "up")
        self._ip(ns, "addr", "add", cidr, "dev", "eth0")
        self._ip(ns, "link", "set", "eth0", "up")
        return port

    def _public_ip(self) -> str:
        if self._next_public > 254:
            raise NetnsError("no public address left on the bridge (253 hosts)")
        ip = str(SUBNET.network_address + self._next_public)
        self._next_public += 1
        return ip

    def add_host(self, name: str) -> Host:
        """A public host on the bridge, reachable by every other host of this run.

        Args:
            name: 1-20 letters/digits, unique in this run.

        Returns:
            The :class:`Host` (``ip`` == ``public_ip``, e.g. ``10.247.0.2``).

        Raises:
            ValueError: bad or duplicate name. NetnsError: a command failed.
        """
        self._check_name(name)
        ns = self.prefix + name
        self._add_ns(ns)
        ip = self._public_ip()
        port = self._attach(ns, f"{ip}/24")
        self.hosts[name] = host = Host(name, ns, ip, ip, None, port)
        return host

    def add_nat_host(self, name: str, stealth: bool = False, random_ports: bool = False) -> Host:
        """A host behind its own NAT router (outbound only): it can dial every public host, none can dial it.

        The router masquerades what leaves through its bridge link (keeping source ports where free) and drops
        forwarded connections that arrive there unless they belong to one the inside opened
        (``ct state established,related``). With ``stealth`` it also drops unsolicited connections to its own
        address (like a home router: a silent drop) instead of answering them with a TCP reset. With
        ``random_ports`` the masquerade picks a random source port for every connection (``masquerade random``:
        an address-and-port-dependent, "symmetric" NAT, RFC 4787 §4.1, where TCP hole punching cannot work);
        without it the source port is kept where free (endpoint-independent mapping, where it can).

        Returns:
            The :class:`Host`: ``ip`` its private address (10.247.<k>.2), ``public_ip`` the router's bridge
            address, ``router_ns`` the router's namespace.

        Raises:
            ValueError: bad or duplicate name. NetnsError: a command failed (nft/iptables included).
        """
        self._check_name(name)
        if self._next_private > 254:
            raise NetnsError("no private subnet left (254 NAT hosts)")
        k = self._next_private
        self._next_private += 1
        ns, router = self.prefix + name, self.prefix + name + "-gw"
        self._add_ns(router)
        self._add_ns(ns)
        pub = self._public_ip()
        port = self._attach(router, f"{pub}/24")
        gw, ip = f"10.247.{k}.1", f"10.247.{k}.2"
        self._ip(router, "link", "add", "in0", "type", "veth", "peer", "name", "eth0", "netns", ns)
        self._ip(router, "addr", "add", f"{gw}/24", "dev", "in0")
        self._ip(router, "link", "set", "in0", "up")
        self._ip(ns, "addr", "add", f"{ip}/24", "dev", "eth0")
        self._ip(ns, "link", "set", "eth0", "up")
        self._ip(ns, "route", "add", "default", "via", gw)
        self._exec(router, "sh", "-c", "echo 1 > /proc/sys/net/ipv4/ip_forward")
        self._nat_rules(router, stealth, random_ports)
        self.hosts[name] = host = Host(name, ns, ip, pub, router, port)
        return host

    def _nat_rules(self, router: str, stealth: bool, random_ports: bool = False) -> None:
        if _nat_tool() == "nft":
            masq = "masquerade random" if random_ports else "masquerade"
            rules = ("table ip nat {\n"
                     f"  chain postrouting {{ type nat hook postrouting priority 100; oifname \"eth0\" {masq}; }}\n"
                     "}\n"
                     "table ip filter {\n"
                     "  chain forward { type filter hook forward priority 0; policy drop;\n"
                     "    ct state established,related accept\n"
                     "    iifname \"in0\" oifname \"eth0\" accept\n"
                     "  }\n"
                     "}\n")
            if stealth:
                rules += ("table ip rtrin {\n"
                          "  chain input { type filter hook input priority 0; policy accept;\n"
                          "    iifname \"eth0\" ct state new drop\n"
                          "  }\n"
                          "}\n")
            self._exec(router, "nft", "-f", "-", input=rules)
            return
        ipt = ["iptables", "-w", "5"]
        self._exec(router, *ipt, "-t", "nat", "-A", "POSTROUTING", "-o", "eth0", "-j", "MASQUERADE",
                   *(["--random"] if random_ports else []))
        self._exec(router, *ipt, "-P", "FORWARD", "DROP")
        self._exec(router, *ipt, "-A", "FORWARD", "-m", "conntrack", "--ctstate", "ESTABLISHED,RELATED",
                   "-j", "ACCEPT")
        self._exec(router, *ipt, "-A", "FORWARD", "-i", "in0", "-o", "eth0", "-j", "ACCEPT")
        if stealth:
            self._exec(router, *ipt, "-A", "INPUT", "-i", "eth0", "-m", "conntrack", "--ctstate", "NEW",
                       "-j", "DROP")

    # ------------------------------------------------------------------ faults

    def _host(self, host: Host | str) -> Host:
        h = self.hosts.get(host if isinstance(host, str) else host.name)
        if h is None:
            raise ValueError(f"no host {host!r} in this run")
        return h

    def cut(self, host: Host | str) -> None:
        """Cut ``host``'s link to the bridge (its router's, behind NAT): its port on the switch goes down, so
        nothing passes either way; open TCP connections stay open on both ends and stall, as with a pulled cable.
        """
        self._ip(self.switch, "link", "set", self._host(host)._port, "down")

    def restore(self, host: Host | str) -> None:
        """Bring ``host``'s bridge link back up after :meth:`cut` (stalled connections resume)."""
        self._ip(self.switch, "link", "set", self._host(host)._port, "up")

    # ------------------------------------------------------------------ processes

    def popen(self, host: Host | str, argv: Sequence[str], env: dict[str, str] | None = None,
              **kwargs) -> subprocess.Popen:
        """Start ``argv`` inside ``host``'s namespace (``ip netns exec``); the caller's environment is passed
        through, updated with ``env``. ``kwargs`` go to :class:`subprocess.Popen` (stdout, stderr, cwd, text...).

        The process is stopped by :meth:`close` (SIGTERM, then SIGKILL after 3 s) if still running.

        Returns:
            The :class:`subprocess.Popen` (its pid is that of ``argv``: ``ip netns exec`` execs it).
        """
        h = self._host(host)
        full_env = {**os.environ, **(env or {})}
        p = subprocess.Popen(["ip", "netns", "exec", h.ns, *argv], env=full_env, **kwargs)
        self._procs.append(p)
        return p

    def run(self, host: Host | str, argv: Sequence[str], timeout: float = 30.0,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        """Run ``argv`` in ``host``'s namespace to completion (text output captured, no check of the exit code).

        Raises:
            subprocess.TimeoutExpired: it ran past ``timeout`` seconds (it is killed first).
        """
        h = self._host(host)
        return subprocess.run(["ip", "netns", "exec", h.ns, *argv], env={**os.environ, **(env or {})},
                              capture_output=True, text=True, timeout=timeout)

    def namespaces(self) -> list[str]:
        """Every namespace this run made (switch, hosts, routers) and has not removed yet."""
        return list(self._namespaces)

    # ------------------------------------------------------------------ teardown

    def close(self) -> None:
        """Stop the processes started by :meth:`popen`, then remove every namespace of this run (its links go
        with them). Idempotent; also runs at interpreter exit."""
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self.close)
        for p in self._procs:
            if p.poll() is None:
                p.terminate()
        deadline = time.monotonic() + 3.0
        for p in self._procs:
            try:
                p.wait(timeout=max(0.05, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    p.wait(timeout=2.0)
        for ns in reversed(self._namespaces):
            _delete_ns(ns)
        self._namespaces.clear()

    def __enter__(self) -> Netns:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
