"""Pure domain logic: no Dagster, no database, no HTTP. Both layers depend on it."""
