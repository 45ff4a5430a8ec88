"""The kbindex HTTP API and status page (``kbindex api``); see pipelines.api.app for the routes."""

from pipelines.api.app import create_app

__all__ = ["create_app"]
