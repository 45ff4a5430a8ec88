"""A slow link without netem: a TCP relay that holds every chunk for a fixed delay, plus nftables packet loss.

The kernel here has no ``sch_netem``, so latency is added in user space. ``python relay.py LISTEN_HOST
LISTEN_PORT UPSTREAM_UNIX_SOCKET DELAY_MS`` (run inside namespace A by ``start_relay``) accepts TCP
connections on A's veth address and joins each to PostgreSQL's Unix socket, holding every chunk read from
either side ``DELAY_MS`` before writing it on: 250 ms each way adds 500 ms to every round trip. One queue
and one writer per direction, and the same delay for every chunk, so bytes leave in the order they came
(nothing is reordered, nothing merged across directions). An end of stream or an error on either side ends
both. It prints ``LISTENING`` once it accepts connections.

Packet loss is ``Hosts.lose`` (bench/netns.py): a share of the packets arriving over the veth dropped in both
namespaces (nftables ``numgen random``), which TCP retransmits, as on a lossy link; ``Hosts.stop_losing`` (or
``Hosts.heal``, which every test's teardown calls) ends it.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

RELAY_PORT = 6432


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: float) -> None:
    """Copy ``reader`` to ``writer``, each chunk ``delay`` seconds after it arrived, in arrival order."""
    held: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()
    loop = asyncio.get_running_loop()

    async def read() -> None:
        try:
            while chunk := await reader.read(65536):
                held.put_nowait((loop.time() + delay, chunk))
        except OSError:
            pass
        held.put_nowait((loop.time() + delay, b""))  # the end, delayed like the bytes before it

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
                 delay: float) -> None:
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


async def relay(host: str, port: int, socket_path: str, delay: float) -> None:
    server = await asyncio.start_server(lambda r, w: _serve(r, w, socket_path, delay), host, port)
    print("LISTENING", flush=True)
    async with server:
        await server.serve_forever()


# -- the test side --------------------------------------------------------------------------------


def start_relay(hosts, delay_ms: float, port: int = RELAY_PORT) -> subprocess.Popen[str]:
    """The relay inside namespace A on its veth address, in front of PostgreSQL's Unix socket; returns once
    it listens. Stop it with ``.kill()``."""
    from bench.netns import PORT, SERVER_ADDR

    socket_path = str(hosts.socket_dir / f".s.PGSQL.{PORT}")
    proc = subprocess.Popen(
        ["ip", "netns", "exec", hosts.ns_db, sys.executable, str(Path(__file__).resolve()), SERVER_ADDR,
         str(port), socket_path, str(delay_ms)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if line.strip() != "LISTENING":
        proc.kill()
        raise RuntimeError(f"the relay did not start: {line!r} {proc.stderr.read() if proc.stderr else ''}")
    return proc


def relay_url(database: str, port: int = RELAY_PORT) -> str:
    """For clients in namespace B: TCP over the link to the relay, which adds the delay."""
    from bench.netns import SERVER_ADDR

    return f"postgresql://postgres@{SERVER_ADDR}:{port}/{database}"


if __name__ == "__main__":
    listen_host, listen_port, upstream, delay_ms = sys.argv[1:5]
    asyncio.run(relay(listen_host, int(listen_port), upstream, float(delay_ms) / 1000.0))
