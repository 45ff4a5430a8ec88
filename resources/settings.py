"""Where things are, from the environment: one place that reads KBINDEX_* variables."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

DEFAULT_HOME = ".kbindex"


@dataclass(frozen=True)
class Settings:
    home: Path
    """State folder: embedded PostgreSQL data, blobs, Dagster home (KBINDEX_HOME, default ./.kbindex)."""
    database_url: str | None
    """External PostgreSQL (KBINDEX_DATABASE_URL); None means the embedded server under ``home``."""
    blob_url: str
    """Where document bytes go (KBINDEX_BLOB_URL): a folder or any fsspec URL such as s3://bucket/kb."""
    model: str | None
    """Embedding model path or name (KBINDEX_MODEL); None means the packaged all-MiniLM-L6-v2."""
    artifacts_dir: Path | None = None
    """Per-task run outputs (KBINDEX_ARTIFACTS; default ``home/artifacts``, as the Dagster resource uses)."""

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> Settings:
        env = dict(os.environ if env is None else env)
        home = Path(env.get("KBINDEX_HOME") or DEFAULT_HOME).expanduser().resolve()
        return cls(
            home=home,
            database_url=env.get("KBINDEX_DATABASE_URL") or None,
            blob_url=env.get("KBINDEX_BLOB_URL") or str(home / "blobs"),
            model=env.get("KBINDEX_MODEL") or None,
            artifacts_dir=Path(env.get("KBINDEX_ARTIFACTS") or home / "artifacts"),
        )


class HomeNotFound(LookupError):
    """KBINDEX_HOME holds no embedded database, and the caller may not create one (a command that only reads).

    Not a KbindexError: those messages are sanitized of paths for API callers, and this one is only for the
    person at the terminal, to whom the path is the point. The CLI translates it in ``errors_to_exit``.
    """

    def __init__(self, home: Path) -> None:
        self.home = home
        super().__init__(
            f"no kbindex home at {home} (KBINDEX_HOME, default ./.kbindex): set KBINDEX_HOME to yours, "
            "or create one with `kbindex dev` or `kbindex db start`"
        )


def resolve_database_url(settings: Settings | None = None, *, start: bool = True, create: bool = True) -> str:
    """The PostgreSQL URL to use: the external one if configured, else the embedded server (started on demand).

    ``create=False`` refuses to make a new home: if KBINDEX_HOME holds no embedded database yet, HomeNotFound,
    and nothing is created or started.
    """
    settings = settings or Settings.from_env()
    if settings.database_url:
        return settings.database_url
    from resources import local_postgres

    if not create and not local_postgres.initialized(settings.home):
        raise HomeNotFound(settings.home)
    if start:
        return local_postgres.start(settings.home)
    url = local_postgres.running_url(settings.home)
    if url is None:
        raise RuntimeError("the embedded PostgreSQL is not running: start it with `kbindex db start`")
    return url


RETENTION_MIN_WINDOW_ENV = "KBINDEX_RETENTION_MIN_WINDOW_SECONDS"


def retention_min_window_seconds(env: dict[str, str] | None = None) -> float:
    """The shortest rollback window a retention run may be launched with (KBINDEX_RETENTION_MIN_WINDOW_SECONDS).

    Default: the 7-day window the hourly schedule uses, so the Dagster launchpad can lengthen the window
    but never shorten it (issue #31: ``window_seconds: 0`` deleted every tenant's rollback data). Only
    whoever sets the code location's environment may lower it (tests set 0).
    """
    from resources.retention import DEFAULT_WINDOW_SECONDS

    env = dict(os.environ if env is None else env)
    raw = (env.get(RETENTION_MIN_WINDOW_ENV) or "").strip()
    if not raw:
        return float(DEFAULT_WINDOW_SECONDS)
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{RETENTION_MIN_WINDOW_ENV}={raw!r} is not a number of seconds") from None
    if not value >= 0:  # also refuses nan
        raise ValueError(f"{RETENTION_MIN_WINDOW_ENV}={raw!r} must be >= 0")
    return value


def dagster_ui_url(env: dict[str, str] | None = None) -> str:
    """Where the Dagster UI answers (KBINDEX_DAGSTER_URL, default http://127.0.0.1:3000, as `kbindex dev`)."""
    env = dict(os.environ if env is None else env)
    return (env.get("KBINDEX_DAGSTER_URL") or "http://127.0.0.1:3000").rstrip("/")


def _number(env: dict[str, str], name: str, default: float) -> float:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{name} must be a number of seconds or milliseconds, not {raw!r}") from None
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be >= 0 (0 turns the bound off), not {raw!r}")
    return value


def _bounds_from_env(cls: Any, env: dict[str, str] | None) -> Any:
    """A bounds dataclass from its variables (``cls.env_name(field)``), each field's default where unset; a
    field whose default is an int stays an int."""
    env = dict(os.environ if env is None else env)
    values: dict[str, float] = {}
    for f in fields(cls):
        value = _number(env, cls.env_name(f.name), f.default)
        values[f.name] = int(value) if isinstance(f.default, int) else value
    return cls(**values)


@dataclass(frozen=True)
class ConnectionBounds:
    """How long a PostgreSQL connection may wait on the network or the server before it gives up.

    Every connection kbindex opens gets the network bounds (``resources.database.connection_params``); the
    statement bounds depend on the connection's role. With the defaults, a connection that goes silent
    (partition, dead host, half-open TCP) errors out within about ``tcp_user_timeout_ms`` (30 s): unacknowledged
    data is given up after it, and with it set, an idle connection's keepalive probes (from 10 s, every 5 s)
    end it once nothing came back for that long. The server side gets the same TCP settings for the same
    connection, so its backend also goes away, and ``idle_in_transaction_ms`` ends a transaction the client
    stopped talking in, releasing its row locks, well before a 60 s lease (KBINDEX_LEASE_SECONDS) expires.
    Each value has a KBINDEX_PG_* variable; 0 turns that bound off.
    """

    connect_timeout_s: float = 10.0
    """KBINDEX_PG_CONNECT_TIMEOUT_S: opening a connection (libpq ``connect_timeout``, per address)."""
    keepalives_idle_s: float = 10.0
    """KBINDEX_PG_KEEPALIVES_IDLE_S: silence before the first TCP keepalive probe (0: no keepalives)."""
    keepalives_interval_s: float = 5.0
    """KBINDEX_PG_KEEPALIVES_INTERVAL_S: between probes."""
    keepalives_count: int = 3
    """KBINDEX_PG_KEEPALIVES_COUNT: unanswered probes that end the connection (when tcp_user_timeout is 0)."""
    tcp_user_timeout_ms: int = 30_000
    """KBINDEX_PG_TCP_USER_TIMEOUT_MS: sent data left unacknowledged this long ends the connection (client and
    server side); it also caps the keepalive probing of an idle connection."""
    idle_in_transaction_ms: int = 30_000
    """KBINDEX_PG_IDLE_IN_TRANSACTION_MS: the server ends a session idle inside a transaction this long
    (every role but ``migration``; kbindex never waits on anything but the database inside a transaction)."""
    run_statement_timeout_ms: int = 300_000
    """KBINDEX_PG_RUN_STATEMENT_TIMEOUT_MS: one statement of a run, sensor or job (role ``run``)."""
    run_lock_timeout_ms: int = 60_000
    """KBINDEX_PG_RUN_LOCK_TIMEOUT_MS: waiting for one lock in role ``run``."""
    api_statement_timeout_ms: int = 30_000
    """KBINDEX_PG_API_STATEMENT_TIMEOUT_MS: one statement of an API request (role ``api``)."""
    api_lock_timeout_ms: int = 10_000
    """KBINDEX_PG_API_LOCK_TIMEOUT_MS: waiting for one lock in role ``api``."""
    client_check_ms: int = 5_000
    """KBINDEX_PG_CLIENT_CHECK_MS: how often the server checks, during a long statement of role ``run`` or
    ``api``, that the client is still there (``client_connection_check_interval``)."""
    reconnect_s: float = 10.0
    """KBINDEX_PG_RECONNECT_S: how long a pool retries one lost connection (after 1, 2, 4... s) before it gives
    that try up; the next request then starts a fresh one at once. psycopg_pool's own 300 s can leave a pool
    waiting out a doubled delay after PostgreSQL is back, up to as long again as it was away (0: that default)."""
    api_keepalives_idle_s: float = 2.0
    """KBINDEX_PG_API_KEEPALIVES_IDLE_S: role ``api``'s silence before the first keepalive probe (0: none). The
    API answers people: a silent PostgreSQL is a 503 within about 5 s, not a request hanging for 35 s."""
    api_keepalives_interval_s: float = 1.0
    """KBINDEX_PG_API_KEEPALIVES_INTERVAL_S: role ``api``'s time between probes."""
    api_tcp_user_timeout_ms: int = 4_000
    """KBINDEX_PG_API_TCP_USER_TIMEOUT_MS: role ``api``'s ``tcp_user_timeout`` (client and server side). Only a
    silent link hits it: a long search statement is not cut short (the server's kernel answers the probes)."""
    api_pool_timeout_s: float = 4.0
    """KBINDEX_PG_API_POOL_TIMEOUT_S: how long an API request waits for a pooled connection (while the pool
    reconnects to a PostgreSQL that is away, each request gets its 503 after this long)."""

    @staticmethod
    def env_name(field_name: str) -> str:
        """The variable that sets a bound: ``KBINDEX_PG_`` and the field's name in capitals."""
        return "KBINDEX_PG_" + field_name.upper()

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> ConnectionBounds:
        return _bounds_from_env(cls, env)

    def network(self, role: str = "tool") -> tuple[float, float, int, int]:
        """The role's (keepalives_idle_s, keepalives_interval_s, keepalives_count, tcp_user_timeout_ms): the
        ``api`` role has its own, shorter ones; every other role the shared ones."""
        if role == "api":
            return (self.api_keepalives_idle_s, self.api_keepalives_interval_s, self.keepalives_count,
                    self.api_tcp_user_timeout_ms)
        return self.keepalives_idle_s, self.keepalives_interval_s, self.keepalives_count, self.tcp_user_timeout_ms

    def silent_bound_s(self, role: str = "tool") -> float:
        """About how long a client connection that went silent takes to error out (inf: it may wait forever).

        Both bounds are needed: a client waiting for a reply with nothing of its own in flight is only ever
        woken by keepalives; one whose data is unacknowledged only by ``tcp_user_timeout`` (else Linux retries
        for ~15 minutes). With both, Linux ends the connection at the first probe after that much silence.
        """
        idle, interval, _, tcp_user_timeout_ms = self.network(role)
        if not (idle and tcp_user_timeout_ms):
            return float("inf")
        return max(tcp_user_timeout_ms / 1000.0, idle) + interval


@dataclass(frozen=True)
class EmbedServiceBounds:
    """How long a client of the embedding service over TCP waits on the network before it gives up (issue #32).

    The per-batch read deadline (KBINDEX_EMBED_SERVICE_TIMEOUT, 60 s) bounds a service that is reachable but
    does not answer; it cannot tell a dead link from a busy service, so it stays long. A silently dropped link
    (a partition, a dead host: no RST) is found by the kernel instead, also while a batch is being computed:
    TCP keepalives (the service's kernel answers them however busy its workers are) and ``tcp_user_timeout``
    for sent data left unacknowledged. With the defaults such a client errors within about 17 s
    (``silent_bound_s``) with the retryable EMBEDDING_UNAVAILABLE, not only at the read deadline (which must
    leave room for a busy service); a socket with neither would wait on the kernel: ~2 hours idle, ~15 minutes
    of retransmits. The service puts the same bounds on the connections it accepts, so the thread of a client
    that vanished ends too. Each value has a KBINDEX_EMBED_SERVICE_* variable; 0 turns it off (but ``timeout``).
    """

    connect_timeout_s: float = 5.0
    """KBINDEX_EMBED_SERVICE_CONNECT_TIMEOUT_S: opening a TCP connection to the service (0: the kernel's ~2 min)."""
    keepalives_idle_s: float = 5.0
    """KBINDEX_EMBED_SERVICE_KEEPALIVES_IDLE_S: silence before the first keepalive probe (0: no keepalives)."""
    keepalives_interval_s: float = 2.0
    """KBINDEX_EMBED_SERVICE_KEEPALIVES_INTERVAL_S: between probes."""
    keepalives_count: int = 3
    """KBINDEX_EMBED_SERVICE_KEEPALIVES_COUNT: unanswered probes that end the connection (without tcp_user_timeout)."""
    tcp_user_timeout_ms: int = 15_000
    """KBINDEX_EMBED_SERVICE_TCP_USER_TIMEOUT_MS: sent data unacknowledged this long ends the connection; it
    also caps the keepalive probing of a connection waiting for its answer."""
    timeout: float = 60.0
    """KBINDEX_EMBED_SERVICE_TIMEOUT: the per-batch read deadline (any socket read or write too), on every
    transport: a service that does not answer a batch in this long fails it with EMBEDDING_TIMEOUT (0: 60 s;
    this one is never off)."""

    @staticmethod
    def env_name(field_name: str) -> str:
        return "KBINDEX_EMBED_SERVICE_" + field_name.upper()

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> EmbedServiceBounds:
        return _bounds_from_env(cls, env)

    def silent_bound_s(self) -> float:
        """About how long a batch whose link went silent takes to error out: the network bounds (the same
        reasoning and formula as ConnectionBounds.silent_bound_s), else the read deadline: never infinite."""
        deadline = self.timeout or 60.0
        if not (self.keepalives_idle_s and self.tcp_user_timeout_ms):
            return deadline
        return min(deadline, max(self.tcp_user_timeout_ms / 1000.0, self.keepalives_idle_s) + self.keepalives_interval_s)


EMBED_SERVICE_FALLBACK_ENV = "KBINDEX_EMBED_SERVICE_FALLBACK"


def embed_service_fallback(is_tcp: bool, env: dict[str, str] | None = None) -> str:
    """What a run does when the embedding service fails it: ``local`` loads the model in the run (the default
    for a service on this machine: it is a shortcut), ``none`` fails the task's embed step with the service's
    retryable code, so the task is retried later (the default for a ``tcp://`` service: a run host that
    embeds remotely is sized without the model). KBINDEX_EMBED_SERVICE_FALLBACK overrides either."""
    env = dict(os.environ if env is None else env)
    raw = (env.get(EMBED_SERVICE_FALLBACK_ENV) or "").strip().lower()
    if not raw:
        return "none" if is_tcp else "local"
    if raw not in ("local", "none"):
        raise ValueError(f"{EMBED_SERVICE_FALLBACK_ENV} must be local or none, not {raw!r}")
    return raw


def embed_service_listen(env: dict[str, str] | None = None) -> tuple[str, int] | None:
    """Where the service also listens on TCP (KBINDEX_EMBED_SERVICE_LISTEN HOST:PORT), or None: Unix socket only."""
    from pipelines.domain.service_address import LISTEN_ANY_ENV, LISTEN_ENV, parse_listen

    env = dict(os.environ if env is None else env)
    raw = (env.get(LISTEN_ENV) or "").strip()
    if not raw:
        return None
    return parse_listen(raw, allow_any=(env.get(LISTEN_ANY_ENV) or "").strip() in ("1", "true", "yes"))


EMBED_SERVICE_KEY_ENV = "KBINDEX_EMBED_SERVICE_KEY"
EMBED_SERVICE_KEY_FILE_ENV = "KBINDEX_EMBED_SERVICE_KEY_FILE"
