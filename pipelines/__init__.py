"""kbindex: the application layer.

``pipelines.domain`` is pure logic (errors, task states, parsing, chunking, ids) with no
framework or database imports; the Dagster wiring, the CLI and the HTTP API sit beside it.
This file stays empty so importing the domain never pays for importing Dagster.
"""
