"""I/O: database, embedded PostgreSQL, migrations, task queue, blob store, embedder, index sink.

Plain client classes live in their own modules and are what the CLI and HTTP API use;
``resources.dagster_resources`` wraps them as Dagster ``ConfigurableResource``s.
This package never imports the Dagster wiring in ``pipelines`` (only ``pipelines.domain``).
"""
