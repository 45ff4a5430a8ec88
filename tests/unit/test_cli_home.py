"""A command that only reads never creates KBINDEX_HOME: on a home that does not exist it says so and exits 1.

Commands run in-process (CliRunner) with KBINDEX_HOME naming a folder that is not there and no
KBINDEX_DATABASE_URL. Starting the embedded PostgreSQL is replaced by a stand-in that records the call and
refuses, so no server is ever started, whatever the code does.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from pipelines.cli import app
from pipelines.domain.errors import IndexWriteFailed

# Every command that only reads, with the arguments it needs.
READ_ONLY = {
    "tasks": [],
    "task": ["1"],
    "watch": ["1", "--timeout", "1"],
    "stats": [],
    "search": ["refund window", "--tenant", "acme"],
    "verify": [],
    "profile list": [],
    "db url": [],
    "source list": [],
    "source sync": ["handbook"],
    "source remove": ["handbook"],
}
# Commands that set a home up or write (open_database(writes=True)): they may create one.
CREATES_HOME = {"dev", "db start", "migrate", "api", "embed-service", "publish", "cancel", "retry",
                "profile create", "profile backfill", "profile activate", "profile rollback", "profile gate", "profile fusion", "profile rerank",
                "delete", "erase", "source add"}
NEEDS_NO_HOME = {"db stop"}  # says "not running" without a home, and creates nothing


def _leaf_commands(group, prefix: str = "") -> list[str]:
    names = []
    for name, command in group.commands.items():
        if hasattr(command, "commands"):  # a group (typer vendors its own click: no isinstance)
            names += _leaf_commands(command, f"{prefix}{name} ")
        else:
            names.append(prefix + name)
    return names


@pytest.fixture
def starts(monkeypatch, tmp_path: Path) -> list[Path]:
    """KBINDEX_HOME names a missing folder; each attempt to start PostgreSQL is recorded and refused."""
    from resources import local_postgres

    monkeypatch.setenv("KBINDEX_HOME", str(tmp_path / "missing"))
    monkeypatch.delenv("KBINDEX_DATABASE_URL", raising=False)
    calls: list[Path] = []

    def start(home: Path, **_: object) -> str:
        calls.append(home)
        raise IndexWriteFailed("stand-in: no server in this test")

    monkeypatch.setattr(local_postgres, "start", start)
    return calls


def test_every_command_is_either_read_only_or_allowed_to_create_the_home() -> None:
    """A new command lands in one of the tables below, so the tests that follow cover it."""
    commands = set(_leaf_commands(typer.main.get_command(app)))
    assert commands == set(READ_ONLY) | CREATES_HOME | NEEDS_NO_HOME


@pytest.mark.parametrize("command", sorted(READ_ONLY))
def test_read_only_commands_say_the_home_is_missing_and_create_nothing(command: str, starts, tmp_path) -> None:
    result = CliRunner().invoke(app, [*command.split(), *READ_ONLY[command]])
    assert result.exit_code == 1, result.output
    assert result.stdout == ""
    (line,) = result.stderr.splitlines()  # one line, whatever the terminal width
    home = tmp_path / "missing"
    assert line.startswith("error HOME_NOT_FOUND: ") and str(home) in line and "KBINDEX_HOME" in line, line
    assert "`kbindex dev`" in line and "`kbindex db start`" in line, line
    assert starts == [] and not home.exists()


@pytest.mark.parametrize("args", [["migrate"], ["publish", "README.md", "--tenant", "acme"], ["cancel", "1"]])
def test_commands_that_set_up_or_write_still_start_postgresql(args: list[str], starts, tmp_path) -> None:
    result = CliRunner().invoke(app, args)
    assert starts == [tmp_path / "missing"], result.output
    assert "HOME_NOT_FOUND" not in result.output


def test_an_external_database_needs_no_home(monkeypatch, starts) -> None:
    monkeypatch.setenv("KBINDEX_DATABASE_URL", "postgresql://nobody@127.0.0.1:9/none")
    result = CliRunner().invoke(app, ["db", "url"])
    assert result.exit_code == 0 and result.stdout.strip() == "postgresql://nobody@127.0.0.1:9/none"
