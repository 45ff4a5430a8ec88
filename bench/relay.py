"""A slow link without netem: a TCP relay that holds every chunk for a fixed delay, plus nftables packet loss.

The kernel here has no ``sch_netem``, so latency is added in user space. ``python -m bench.relay LISTEN_HOST
LISTEN_PORT UPSTREAM_UNIX_SOCKET DELAY_MS [INITIAL_MS]`` (run inside namespace A by ``start_relay``) accepts TCP
connections on A's veth address and joins each to PostgreSQL's Unix socket, holding every chunk read from
either side for the current delay before writing it on: 250 ms each way adds 500 ms to every round trip. One
queue and one writer per direction, so bytes leave in the order they came, even across a change of delay (a
chunk never overtakes the one before it; nothing is merged across directions). An end of stream or an error on
either side ends both. It prints ``LISTENING`` once it accepts connections.

The delay starts at ``INITIAL_MS`` (default ``DELAY_MS``); SIGUSR1 sets it to ``DELAY_MS`` and SIGUSR2 to 0
(``Relay.slow`` / ``Relay.fast``), for every open connection at once: bench.chaos --network runs its whole
round through a relay and slows the link for one period only.

Packet loss is ``Hosts.lose`` (bench/netns.py): a share of the packets arriving over the veth dropped in both
namespaces (nftables ``numgen random``), which TCP retransmits, as on a lossy link; ``Hosts.stop_losing`` (or
``Hosts.heal``, which every test's teardown calls) ends it.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

RELAY_PORT = 6432


class Delay:
    """The relay's current delay in seconds, shared by every connection: ``slow`` (the configured one) or 0."""

    def __init__(self, slow: float, initial: float) -> None:
        self.slow, self.seconds = slow, initial


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: Delay) -> None:
    """Copy ``reader`` to ``writer``, each chunk the current delay after it arrived, in arrival order."""
    held: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()
    loop = asyncio.get_running_loop()

    async def read() -> None:
        try:
            while chunk := await reader.read(65536):
                held.put_nowait((loop.time() + delay.seconds, chunk))
        except OSError:
            pass
        held.put_nowait((loop.time() + delay.seconds, b""))  # the end, delayed like the bytes before it

    async def write() -> None:
        while True:
            due, chunk = await held.get()
            wait = due - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            if not chunk:
                return
            writer.write(chunk)
            await writer.drain()

    reading = asyncio.ensure_future(read())
    try:
        await write()
    finally:
        reading.cancel()


async def _serve(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter, socket_path: str,
                 delay: Delay) -> None:
    try:
        server_r, server_w = await asyncio.open_unix_connection(socket_path)
    except OSError:
        client_w.close()
        return
    pumps = [asyncio.ensure_future(_pump(client_r, server_w, delay)),
             asyncio.ensure_future(_pump(server_r, client_w, delay))]
    try:  # either direction ending (EOF or error) ends the connection: PostgreSQL has no half-close
        await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for pump in pumps:
            pump.cancel()
        for w in (client_w, server_w):
            w.close()


async def relay(host: str, port: int, socket_path: str, delay: Delay) -> None:
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGUSR1, lambda: setattr(delay, "seconds", delay.slow))
    loop.add_signal_handler(signal.SIGUSR2, lambda: setattr(delay, "seconds", 0.0))
    server = await asyncio.start_server(lambda r, w: _serve(r, w, socket_path, delay), host, port)
    print("LISTENING", flush=True)
    async with server:
        await server.serve_forever()


# -- the caller's side ----------------------------------------------------------------------------


def start_relay(hosts, delay_ms: float, port: int = RELAY_PORT, initial_ms: float | None = None) -> Relay:
    """The relay inside namespace A on its veth address, in front of PostgreSQL's Unix socket, delaying
    ``initial_ms`` (default ``delay_ms``) each way; returns once it listens. Stop it with ``.kill()``."""
    from bench.netns import PORT, SERVER_ADDR

    socket_path = str(hosts.socket_dir / f".s.PGSQL.{PORT}")
    initial = delay_ms if initial_ms is None else initial_ms
    # ip netns exec execs the command: the pid is the relay's own (signals reach it)
    return _launch(["ip", "netns", "exec", hosts.ns_db, sys.executable, "-m", "bench.relay", SERVER_ADDR,
                    str(port), socket_path, str(delay_ms), str(initial)])


@contextmanager
def local_relay(url: str, delay_ms: float) -> Iterator[int]:
    """A relay on 127.0.0.1 in front of ``url``'s Unix socket (the embedded server), ``delay_ms`` each way, with no
    namespaces (benches that time round trips, not faults); yields its port once it listens, kills it after."""
    from psycopg.conninfo import conninfo_to_dict

    from bench.dagster_dev import free_port

    info = conninfo_to_dict(url)
    socket_dir = str(info.get("host") or "")
    if not socket_dir.startswith("/"):
        raise SystemExit("a delayed link needs the embedded server (a Unix socket): unset KBINDEX_DATABASE_URL")
    port = free_port()
    relay = _launch([sys.executable, "-m", "bench.relay", "127.0.0.1", str(port),
                     f"{socket_dir}/.s.PGSQL.{info.get('port') or 5432}", str(delay_ms)])
    try:
        yield port
    finally:
        relay.kill()


def url_through_relay(url: str, delay_ms: float, stack: ExitStack) -> str:
    """``url`` (the embedded server's) reached through a ``local_relay`` adding ``delay_ms`` each way, which
    ``stack`` stops."""
    from psycopg.conninfo import make_conninfo

    return make_conninfo(url, host="127.0.0.1", port=stack.enter_context(local_relay(url, delay_ms)))


def _launch(cmd: list[str]) -> Relay:
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=_project_root())
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if line.strip() != "LISTENING":
        proc.kill()
        raise RuntimeError(f"the relay did not start: {line!r} {proc.stderr.read() if proc.stderr else ''}")
    return Relay(proc)


class Relay:
    """A started relay process: ``slow()`` / ``fast()`` switch its delay for every connection, ``kill()`` ends it."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc

    def slow(self) -> None:
        self.proc.send_signal(signal.SIGUSR1)

    def fast(self) -> None:
        self.proc.send_signal(signal.SIGUSR2)

    def kill(self) -> None:
        self.proc.kill()
        self.proc.communicate(timeout=30)


def _project_root() -> str:
    from pathlib import Path

    return str(Path(__file__).resolve().parents[1])


def relay_url(database: str, port: int = RELAY_PORT) -> str:
    """For clients in namespace B: TCP over the link to the relay, which adds the delay."""
    from bench.netns import SERVER_ADDR

    return f"postgresql://postgres@{SERVER_ADDR}:{port}/{database}"


if __name__ == "__main__":
    listen_host, listen_port, upstream, delay_ms = sys.argv[1:5]
    initial_ms = sys.argv[5] if len(sys.argv) > 5 else delay_ms
    asyncio.run(relay(listen_host, int(listen_port), upstream, Delay(float(delay_ms) / 1000.0, float(initial_ms) / 1000.0)))
