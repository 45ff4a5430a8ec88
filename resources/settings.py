"""Where things are, from the environment: one place that reads KBINDEX_* variables."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

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
