"""Where the warm embedding service is, and where it may listen: parsed and refused here (pure logic).

A client finds the service through KBINDEX_EMBED_SERVICE: a folder (the service's KBINDEX_HOME, whose Unix
socket ``embedder.sock`` it connects to, as before) or ``tcp://HOST:PORT`` (``tcp://[v6]:PORT``), the
service on another host (issue #32). The service always listens on its Unix socket, and on TCP only at an
explicit KBINDEX_EMBED_SERVICE_LISTEN ``HOST:PORT``. A wildcard host (``0.0.0.0``, ``::``) would open it on
every interface of the machine: refused unless KBINDEX_EMBED_SERVICE_LISTEN_ANY=1 says so as well. Port 0
(any free port) is allowed for listening only.

Refusals are ValueErrors naming the variable: a misconfigured address is an operator's mistake, reported
where it is read, never a task's failure.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

ADDRESS_ENV = "KBINDEX_EMBED_SERVICE"
LISTEN_ENV = "KBINDEX_EMBED_SERVICE_LISTEN"
LISTEN_ANY_ENV = "KBINDEX_EMBED_SERVICE_LISTEN_ANY"

_HOSTNAME = re.compile(r"^(?=.{1,253}$)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
                       r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$")


@dataclass(frozen=True)
class ServiceAddress:
    """A Unix socket folder (``folder``) or a TCP ``host`` and ``port``: exactly one of them."""

    folder: str | None = None
    host: str | None = None
    port: int | None = None

    @property
    def is_tcp(self) -> bool:
        return self.host is not None

    def __str__(self) -> str:
        if self.host is None:
            return str(self.folder)
        return f"tcp://{join_host_port(self.host, int(self.port or 0))}"


def join_host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def parse_service_address(value: str) -> ServiceAddress:
    """KBINDEX_EMBED_SERVICE: ``tcp://HOST:PORT``, else a folder (any other ``scheme://`` is refused)."""
    text = str(value).strip()
    if not text:
        raise ValueError(f"{ADDRESS_ENV} is empty: give the service's folder or tcp://HOST:PORT")
    if "://" not in text:
        return ServiceAddress(folder=text)
    scheme, _, rest = text.partition("://")
    if scheme.lower() != "tcp":
        raise ValueError(f"{ADDRESS_ENV}={text!r}: the only scheme is tcp:// (or give a folder)")
    host, port = _host_port(rest, ADDRESS_ENV)
    if port == 0:
        raise ValueError(f"{ADDRESS_ENV}={text!r}: port 0 is not an address to connect to")
    return ServiceAddress(host=host, port=port)


def parse_listen(value: str, *, allow_any: bool = False) -> tuple[str, int]:
    """KBINDEX_EMBED_SERVICE_LISTEN ``HOST:PORT`` -> (host, port); a wildcard host only with ``allow_any``."""
    host, port = _host_port(str(value).strip(), LISTEN_ENV)
    if is_wildcard(host) and not allow_any:
        raise ValueError(f"{LISTEN_ENV}={value!r} would listen on every interface: name one address (e.g. the "
                         f"host's private one, or 127.0.0.1), or set {LISTEN_ANY_ENV}=1 as well")
    return host, port


def is_wildcard(host: str) -> bool:
    """``0.0.0.0``, ``::`` and friends: every interface of the machine."""
    try:
        return ipaddress.ip_address(host).is_unspecified
    except ValueError:
        return False


def _host_port(text: str, name: str) -> tuple[str, int]:
    """``host:port`` or ``[v6]:port``, nothing else (no user, path, query or bare IPv6)."""
    if not text or any(c in text for c in "/?#@ \t"):
        raise ValueError(f"{name}={text!r} must be HOST:PORT and nothing else")
    if text.startswith("["):
        host, closed, rest = text[1:].partition("]")
        if not closed or not rest.startswith(":"):
            raise ValueError(f"{name}={text!r}: an IPv6 address is written [ADDRESS]:PORT")
        port_text = rest[1:]
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ValueError(f"{name}={text!r}: {host!r} is not an IPv6 address") from None
    else:
        host, colon, port_text = text.rpartition(":")
        if not colon:
            raise ValueError(f"{name}={text!r} has no port: write HOST:PORT")
        if ":" in host:
            raise ValueError(f"{name}={text!r}: write an IPv6 address in brackets, [ADDRESS]:PORT")
        if not host:
            raise ValueError(f"{name}={text!r} has no host: name one (0.0.0.0 is not implied)")
        try:
            ipaddress.IPv4Address(host)
        except ValueError:
            if not _HOSTNAME.match(host) or host.replace(".", "").isdigit():
                raise ValueError(f"{name}={text!r}: {host!r} is neither an IP address nor a host name") from None
    if not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise ValueError(f"{name}={text!r}: the port must be a number from 1 to 65535")
    return host, int(port_text)
