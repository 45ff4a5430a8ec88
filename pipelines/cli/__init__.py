"""``kbindex`` command line. Each command module registers its commands on the shared app."""

from pipelines.cli import api_command, db_commands, dev_command, embed_service_command, profile_commands, publish_commands, search_commands, task_commands, verify_command  # noqa: F401  (registration)
from pipelines.cli import source_commands  # noqa: F401  (registration; its own line: fewer merge conflicts)
from pipelines.cli.app import app, main

__all__ = ["app", "main"]
