"""Every private Dagster symbol kbindex uses, and the public path each use falls back to (issue #28).

kbindex reaches into Dagster internals where the public API costs O(all partition keys) per call, or
has no setting for what we need. A Dagster upgrade may move or change any of them. Each use goes
through a function here: a failure of the private part (``HOOK_ERRORS``: an import, an attribute, a
changed signature or shape) is caught at the point of use, logged once per process as a warning that
names the hook, its symbols and the Dagster version, and the call takes the public path instead (the
hook stays on it for the rest of the process). A run on an upgraded Dagster is then slower, not failed,
and crash bisection never sees it.

``REGISTRY`` is the list: hook -> who calls it, the private symbols, what each is for, the fallback.
``tests/unit/test_dagster_private.py`` checks that the installed Dagster is ``CHECKED_VERSION``,
that every symbol resolves, that no private use outside this list exists in ``pipelines/`` and
``resources/`` (and dagster.yaml), and that each fallback gives the right answer.

Symbol paths read ``module:Qualified.name``; ``Class#attr`` is an attribute set on instances (its
class body assigns ``self.attr``); ``env:NAME`` is an environment variable read by the symbol listed
beside it in ``ENV_READERS``.

This module lives in ``resources/`` because resources/dagster_storage.py uses it and ``resources``
never imports ``pipelines``.
"""

from __future__ import annotations

import importlib
import inspect
import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import dagster as dg
import sqlalchemy as db

CHECKED_VERSION = "1.13.27"
"""The Dagster version every symbol below was read against."""
CHECKED_POSTGRES_VERSION = "0.29.27"
"""The dagster-postgres release paired with it (its private ``_engine`` and ``utils`` are used too)."""

log = logging.getLogger(__name__)

HOOK_ERRORS: tuple[type[BaseException], ...] = (
    ImportError, AttributeError, TypeError, LookupError, ValueError,
    db.exc.ArgumentError, db.exc.CompileError, db.exc.NoSuchColumnError,
)
"""What a moved or changed private symbol raises. Database errors (``DBAPIError``) are not in it: the
public path would meet the same database, and a transient one must not switch a hook off."""


@dataclass(frozen=True)
class Hook:
    """One use of Dagster internals: the function here that makes it, its callers, its public fallback."""

    function: str
    used_by: str
    symbols: dict[str, str]
    """symbol path -> what kbindex uses it for"""
    fallback: str


REGISTRY: dict[str, Hook] = {
    "partition_range": Hook(
        function="partition_keys_in_range",
        used_by="pipelines/partitions.py (VersionPartitions.get_partition_keys_in_range)",
        symbols={
            "dagster._core.definitions.partitions.context:partition_loading_context":
                "the instance Dagster is resolving partitions with (its dynamic_partitions_store)",
            "dagster._core.storage.event_log.sql_event_log:SqlEventLogStorage":
                "only a SQL event storage has the dynamic_partitions table",
            "dagster._core.storage.event_log.sql_event_log:SqlEventLogStorage.index_connection":
                "a connection to that table",
            "dagster._core.storage.event_log.schema:DynamicPartitionsTable":
                "the table: partitions_def_name, partition, id (id order = Dagster's key order)",
            "dagster._core.storage.sqlalchemy_compat:db_select":
                "SELECT across SQLAlchemy versions, as Dagster builds its own",
        },
        fallback="DynamicPartitionsDefinition.get_partition_keys_in_range: lists every key of the "
                 "definition and slices it (correct, O(all keys) per call)",
    ),
    "bounded_ranges": Hook(
        function="bound_dynamic_ranges",
        used_by="resources/dagster_storage.py (KbindexDagsterStorage: every process on kbindex's instance)",
        symbols={
            "dagster:DynamicPartitionsDefinition.get_partition_keys_in_range":
                "replaced on the class (named definitions only) by partition_keys_in_range: the daemon, the "
                "webserver and Dagster's own run bookkeeping resolve ranges with the plain definition of the "
                "code location's snapshot, never VersionPartitions",
        },
        fallback="Dagster's own method, left in place: the daemon lists every key of the definition when it "
                 "records a run's planned materializations (4 times per run: 1.6 s at 100k keys vs 0.13 s at 1k)",
    ),
    "version_metadata": Hook(
        function="add_partition_metadata",
        used_by="pipelines/assets.py (_report)",
        symbols={
            "dagster._core.execution.context.op_execution_context:OpExecutionContext._step_execution_context":
                "the step context behind the asset context",
            "dagster._core.execution.context.system:StepExecutionContext#_metadata_accumulator":
                "where add_asset_metadata records metadata after its key check",
            "dagster._core.execution.context.metadata_logging:OutputMetadataAccumulator.with_additional_asset_metadata":
                "records one partition's metadata",
        },
        fallback="context.add_asset_metadata(metadata, partition_key=key): the same metadata, after a "
                 "check that resolves the step's key range on each call (O(run) per call with VersionPartitions)",
    ),
    "storage_pool": Hook(
        function="use_pooled_engines",
        used_by="resources/dagster_storage.py (KbindexDagsterStorage)",
        symbols={
            "dagster_postgres.event_log.event_log:PostgresEventLogStorage#_engine":
                "the event storage's NullPool engine, replaced by a pooled one",
            "dagster_postgres.run_storage.run_storage:PostgresRunStorage#_engine":
                "the run storage's engine, likewise",
            "dagster_postgres.schedule_storage.schedule_storage:PostgresScheduleStorage#_engine":
                "the schedule storage's engine, likewise",
            "dagster_postgres.utils:create_pg_engine":
                "builds the pooled engine with dagster_postgres's dialect settings (not exported at top level)",
            "dagster._serdes:ConfigurableClassData":
                "type annotation only (imported under TYPE_CHECKING)",
        },
        fallback="plain dagster_postgres storage: its NullPool engines, a new connection per storage call",
    ),
    "schema_checks": Hook(
        function="remember_schema_checks",
        used_by="resources/dagster_storage.py (KbindexDagsterStorage)",
        symbols={
            **{f"dagster._core.storage.schedules.sql_schedule_storage:SqlScheduleStorage.{name}":
               "a table check (SQLAlchemy reflection: one catalog query) on every call that needs it"
               for name in ("has_instigators_table", "_has_instigators_table", "has_secondary_index_table",
                            "has_built_index")},
            **{f"dagster._core.storage.runs.sql_run_storage:SqlRunStorage.{name}":
               "a column or table check (catalog queries) on every runs or backfills read that needs it"
               for name in ("has_run_stats_index_cols", "has_bulk_actions_selector_cols", "has_backfill_id_column",
                            "has_bulk_action_job_name_column", "has_backfill_tags_table")},
            **{f"dagster._core.storage.event_log.sql_event_log:SqlEventLogStorage.{name}":
               "a table or column check (catalog queries) on every call that needs it"
               for name in ("has_table", "has_asset_key_col", "_has_asset_key_col_on_connection")},
        },
        fallback="Dagster's own checks, each a catalog query on every call (a sensor tick over a 500 ms link "
                 "waits on ~7 of them; a quarter of an idle daemon's statements)",
    ),
    "tick_context_instance": Hook(
        function="lend_instance",
        used_by="pipelines/sensors.py (tick_instance)",
        symbols={
            "dagster._core.definitions.sensor_definition:SensorEvaluationContext#_instance":
                "the instance behind context.instance and context.log; set to the process's kept tick instance "
                "so that logging a claim does not build a new instance from the daemon's ref",
        },
        fallback="Dagster builds an instance from the ref the first time a tick logs (three storages, new "
                  "connections and catalog queries), as before",
    ),
    "sensor_prelude": Hook(
        function="run_before_evaluation",
        used_by="pipelines/sensors.py (record_crashed_runs: lends the kept tick instance)",
        symbols={
            "dagster._core.definitions.sensor_definition:SensorDefinition#_evaluation_fn":
                "the function a tick evaluates; wrapped so kbindex's prelude runs before Dagster's own wrapper "
                "(a run-status sensor reads context.instance before the decorated function is called)",
        },
        fallback="the tick as Dagster evaluates it: a run-status sensor builds an instance from the daemon's ref "
                 "on every tick (new connections and catalog queries, ~4 statements a second of an idle "
                 "deployment)",
    ),
    "event_batching": Hook(
        function="event_batching_read",
        used_by="pipelines/event_batching.py (apply)",
        symbols={
            "env:DAGSTER_EVENT_BATCH_SIZE": "a step's materializations written as one batch",
            "dagster._core.instance.utils:_get_event_batch_size": "where Dagster reads DAGSTER_EVENT_BATCH_SIZE",
            "env:DAGSTER_EMIT_PARTITION_SUBSET_IN_PLANNED_EVENTS": "one planned event per asset per run",
            "dagster._core.storage.event_log.base:EventLogStorage."
            "supports_partition_subset_in_asset_materialization_planned_events":
                "where Dagster reads DAGSTER_EMIT_PARTITION_SUBSET_IN_PLANNED_EVENTS",
        },
        fallback="the variables are still set; a Dagster that no longer reads them writes one event per "
                 "INSERT and one planned event per partition (Dagster's default: correct, slower)",
    ),
    "backfill_status": Hook(
        function="backfill_in_progress",
        used_by="pipelines/sensors.py (claim sensor: may keys move?)",
        symbols={
            "dagster._core.execution.backfill:BulkActionStatus":
                "BulkActionStatus.REQUESTED for instance.get_backfills(status=..., limit=1)",
        },
        fallback="a backfill is in progress if a run not yet finished carries the dagster/backfill tag "
                 "(O(live runs); misses only a requested backfill that has launched no run yet, whose "
                 "ranges are not resolved yet either)",
    ),
    "run_pids": Hook(
        function="run_process_pids",
        used_by="pipelines/sensors.py (_kill_child_run_process)",
        symbols={
            "dagster._core.events:EngineEventData":
                "the 'Started process for run' engine event's data: metadata['pid'] = MetadataValue.text(pid)",
            "dagster._core.events:EngineEventData.in_process": "where that pid metadata is written",
        },
        fallback="no pids: nothing is killed, the run is still reported canceled (its slot is freed; a "
                 "stopped run process stays until the code server or an operator ends it)",
    ),
    "warm_launcher": Hook(
        function="run_launcher_api",
        used_by="pipelines/warm_launcher.py (WarmRunLauncher, its fork server and run children)",
        symbols={
            "dagster._core.launcher.base:RunLauncher": "the launcher's base class (not exported at top level)",
            "dagster._core.launcher.base:LaunchRunContext": "type of launch_run's argument",
            "dagster._core.launcher.base:CheckRunHealthResult": "what check_run_worker_health returns",
            "dagster._core.launcher.base:WorkerStatus": "RUNNING / FAILED for run monitoring",
            "dagster._serdes:ConfigurableClass": "a launcher dagster.yaml can name with a config block",
            "dagster._serdes:ConfigurableClassData": "the config block's data (inst_data)",
            "dagster._cli.api:_execute_run_command_body":
                "the body of `dagster api execute_run`: a forked child runs the run exactly as that command does",
            "dagster._utils.interrupts:capture_interrupts":
                "the command's signal set-up around that body (SIGTERM/SIGINT become a run interrupt)",
            "dagster._utils.hosted_user_process:recon_job_from_origin":
                "the fork server loads a run's definitions once, before any fork",
        },
        fallback="none for the classes: if they move, the instance fails to load when Dagster starts, before any "
                 "work (name DefaultRunLauncher in dagster.yaml); a failed warm-up of the definitions is "
                 "skipped (each child loads them itself: slower, correct)",
    ),
    "instance_config": Hook(
        function="(none: configuration)",
        used_by="dagster.yaml (run_coordinator)",
        symbols={
            "dagster._core.run_coordinator:QueuedRunCoordinator":
                "the run queue (Dagster's documented module path for it)",
        },
        fallback="none at run time: if it moves, the instance fails to load when Dagster starts, before "
                 "any work; name the new module in dagster.yaml",
    ),
}

ENV_READERS = {
    "DAGSTER_EVENT_BATCH_SIZE": "dagster._core.instance.utils:_get_event_batch_size",
    "DAGSTER_EMIT_PARTITION_SUBSET_IN_PLANNED_EVENTS":
        "dagster._core.storage.event_log.base:EventLogStorage."
        "supports_partition_subset_in_asset_materialization_planned_events",
}

_fallen_back: dict[str, str] = {}
"""Hooks on their public path in this process -> why (the warning was logged when it was added)."""


def fallen_back() -> dict[str, str]:
    """The hooks that failed in this process, and why."""
    return dict(_fallen_back)


def _fall_back(hook: str, why: BaseException | str) -> None:
    """Put ``hook`` on its public path for this process; warn the first time."""
    if hook in _fallen_back:
        return
    reason = f"{type(why).__name__}: {why}" if isinstance(why, BaseException) else why
    _fallen_back[hook] = reason
    entry = REGISTRY[hook]
    log.warning(
        "Dagster %s (kbindex was checked against %s): private hook %r failed (%s); using the public path "
        "instead: %s. Private symbols of this hook: %s",
        dg.__version__, CHECKED_VERSION, hook, reason, entry.fallback, ", ".join(entry.symbols),
    )


def resolve(path: str) -> object:
    """The object a registry path names (raises if it does not resolve); ``env:`` paths resolve to their reader."""
    if path.startswith("env:"):
        name = path.removeprefix("env:")
        reader = resolve(ENV_READERS[name])
        source = inspect.getsource(reader.fget if isinstance(reader, property) else reader)
        if name not in source:
            raise LookupError(f"{ENV_READERS[name]} no longer reads {name}")
        return reader
    module_name, _, qualname = path.partition(":")
    qualname, _, instance_attr = qualname.partition("#")
    obj: Any = importlib.import_module(module_name)
    for part in qualname.split("."):
        obj = inspect.getattr_static(obj, part)
    assigned = rf"self\.{re.escape(instance_attr)}\s*(?::[^=]*)?=(?!=)"  # annotated or not
    if instance_attr and not re.search(assigned, inspect.getsource(obj)):
        raise AttributeError(f"{path}: {qualname} no longer sets self.{instance_attr}")
    return obj


# --- partition_range -----------------------------------------------------------------------------

def partition_keys_in_range(name: str, start: str, end: str, public: Callable[[], Sequence[str]]) -> Sequence[str]:
    """The keys of dynamic partitions ``name`` from ``start`` to ``end``, in Dagster's (insertion) order.

    Two bounded queries on Dagster's ``dynamic_partitions`` table (the ends' ids, then the rows between
    them). ``public()`` (Dagster's own resolution, listing every key) answers where no SQL event
    storage is reachable, and, with a warning, when a private symbol fails. A missing end raises
    ``DagsterInvalidInvocationError`` as Dagster does.
    """
    keys = None
    if "partition_range" not in _fallen_back:
        try:
            storage = _sql_event_storage()
            keys = None if storage is None else _keys_between(storage, name, start, end)
        except HOOK_ERRORS as exc:
            _fall_back("partition_range", exc)
    return public() if keys is None else keys


def bound_dynamic_ranges() -> bool:
    """Make every *named* ``DynamicPartitionsDefinition`` in this process resolve a key range as
    ``VersionPartitions`` does (``partition_keys_in_range``); True if it is in place.

    The code location's definitions use ``VersionPartitions``, but the daemon (recording a run's planned
    materializations when it creates the run), the webserver and the run bookkeeping in Dagster's instance
    work from the location's snapshot, a plain ``DynamicPartitionsDefinition``, and resolve a run's range by
    listing every key (bench.scale.runs --daemon: run creation 0.13 s at 1k keys, 1.6 s at 100k). Same keys,
    same order; a definition without a name, or any failure, keeps Dagster's own resolution."""
    if "bounded_ranges" in _fallen_back:
        return False
    try:
        cls = dg.DynamicPartitionsDefinition
        dagsters = cls.get_partition_keys_in_range
        if getattr(dagsters, "kbindex_bounded", False):
            return True

        def get_partition_keys_in_range(self: Any, partition_key_range: dg.PartitionKeyRange) -> Sequence[str]:
            if self.name is None:
                return dagsters(self, partition_key_range)
            return partition_keys_in_range(self.name, partition_key_range.start, partition_key_range.end,
                                           public=lambda: dagsters(self, partition_key_range))

        get_partition_keys_in_range.kbindex_bounded = True  # type: ignore[attr-defined]
        get_partition_keys_in_range.__doc__ = dagsters.__doc__
        cls.get_partition_keys_in_range = get_partition_keys_in_range
        return True
    except HOOK_ERRORS as exc:
        _fall_back("bounded_ranges", exc)
        return False


def _sql_event_storage() -> Any:
    """The SQL event storage of the instance Dagster is resolving partitions with, if any."""
    from dagster._core.definitions.partitions.context import partition_loading_context
    from dagster._core.storage.event_log.sql_event_log import SqlEventLogStorage

    with partition_loading_context() as ctx:
        store = ctx.dynamic_partitions_store
    instance = getattr(store, "instance", store)  # a CachingInstanceQueryer wraps the instance
    storage = getattr(instance, "event_log_storage", None)
    return storage if isinstance(storage, SqlEventLogStorage) else None


def _keys_between(storage: Any, name: str, start: str, end: str) -> list[str]:
    from dagster._core.storage.event_log.schema import DynamicPartitionsTable as T
    from dagster._core.storage.sqlalchemy_compat import db_select

    named = T.c.partitions_def_name == name
    with storage.index_connection() as conn:
        ids = dict(conn.execute(db_select([T.c.partition, T.c.id]).where(
            db.and_(named, T.c.partition.in_([start, end])))).fetchall())
        missing = [k for k in (start, end) if k not in ids]
        if missing:
            raise dg.DagsterInvalidInvocationError(
                f"Partition range {start} to {end} is not a valid range. Nonexistent partition keys: {missing}")
        if start == end:
            return [start]
        rows = conn.execute(db_select([T.c.partition]).where(
            db.and_(named, T.c.id.between(ids[start], ids[end]))).order_by(T.c.id)).fetchall()
    return [r[0] for r in rows]


# --- version_metadata ----------------------------------------------------------------------------

def add_partition_metadata(context: dg.AssetExecutionContext, key: str, metadata: dict[str, Any]) -> None:
    """``context.add_asset_metadata(metadata, partition_key=key)`` without its per-call range check.

    The public call resolves the step's key range on every call to check that ``key`` is in it (640
    calls per 160-version run, issue #14). Callers pass keys from the step's own partition keys, so
    the check cannot fail: record the metadata the way that method does after its check. Fallback:
    the public call.
    """
    if "version_metadata" not in _fallen_back:
        try:
            step = context.op_execution_context._step_execution_context  # noqa: SLF001 - see docstring
            step._metadata_accumulator = step._metadata_accumulator.with_additional_asset_metadata(  # noqa: SLF001
                asset_key=context.asset_key, metadata=metadata, partition_key=key)
            return
        except HOOK_ERRORS as exc:
            _fall_back("version_metadata", exc)
    context.add_asset_metadata(metadata, partition_key=key)


# --- storage_pool --------------------------------------------------------------------------------

def use_pooled_engines(storages: Sequence[object], make_engine: Callable[[], db.engine.Engine]) -> bool:
    """Swap each dagster_postgres storage's NullPool engine for ``make_engine()``; whether it was done.

    dagster_postgres has no setting for its pool: swap the engine the way its own
    ``optimize_for_webserver`` does (same attribute). All or none: on a failure the storages keep
    their own engines (plain dagster_postgres, a connection per call) and a warning is logged.
    """
    if "storage_pool" in _fallen_back:
        return False
    made: list[db.engine.Engine] = []
    try:
        old = [s._engine for s in storages]  # noqa: SLF001 - see docstring
        if not all(isinstance(e, db.engine.Engine) for e in old):
            raise TypeError(f"_engine is not a SQLAlchemy Engine: {[type(e).__name__ for e in old]}")
        for _ in storages:
            made.append(make_engine())
    except HOOK_ERRORS as exc:
        for engine in made:
            engine.dispose()
        _fall_back("storage_pool", exc)
        return False
    for storage, before, after in zip(storages, old, made, strict=True):
        storage._engine = after  # noqa: SLF001
        before.dispose()
    return True


def create_pg_engine(url: str, **kwargs: Any) -> db.engine.Engine:
    """dagster_postgres's engine factory (its dialect settings), for ``use_pooled_engines``'s ``make_engine``.

    Not exported at dagster_postgres's top level: a move or a changed signature raises inside
    ``make_engine``, where ``use_pooled_engines`` falls back.
    """
    from dagster_postgres.utils import create_pg_engine

    return create_pg_engine(url, **kwargs)


# --- schema_checks -------------------------------------------------------------------------------

SCHEMA_CHECKS = ("has_instigators_table", "_has_instigators_table", "has_secondary_index_table", "has_built_index",
                 "has_run_stats_index_cols", "has_bulk_actions_selector_cols", "has_backfill_id_column",
                 "has_bulk_action_job_name_column", "has_backfill_tags_table",
                 "has_table", "has_asset_key_col", "_has_asset_key_col_on_connection")
"""Dagster storage methods that ask PostgreSQL's catalog whether a table, column or data migration exists."""


def remember_schema_checks(storages: Sequence[object]) -> bool:
    """Make each storage's schema checks (``SCHEMA_CHECKS`` it has) answer True from memory once they have.

    Dagster asks the catalog on every call that depends on an optional table or column: a sensor tick
    reflects the table list ~7 times; idle, 8.3 of the 40.6 statements a second Dagster sent (``bench.idle``).
    What exists stays (migrations only add, nothing here drops a table), so a True answer is kept for the
    life of the storage; a False one is asked again, as before. Shadowed per storage object (an attribute of
    the instance, not the class): other storages in the process are untouched. On a failure: Dagster's own
    checks, with a warning.
    """
    if "schema_checks" in _fallen_back:
        return False
    plan: list[tuple[object, str, Callable[..., Any]]] = []
    try:
        for storage in storages:
            for name in SCHEMA_CHECKS:
                if not hasattr(type(storage), name):
                    continue
                check = getattr(storage, name)
                if not callable(check) or isinstance(inspect.getattr_static(type(storage), name), property):
                    raise TypeError(f"{type(storage).__name__}.{name} is no longer a method")
                plan.append((storage, name, check))
        if not plan:
            raise AttributeError(f"none of {SCHEMA_CHECKS} on {[type(s).__name__ for s in storages]}")
    except HOOK_ERRORS as exc:
        _fall_back("schema_checks", exc)
        return False
    for storage, name, check in plan:
        setattr(storage, name, _true_once_known(check))
    return True


def _true_once_known(check: Callable[..., Any]) -> Callable[..., Any]:
    """``check``, answering True without asking for arguments it once answered True for (a connection argument
    is passed through, not part of the key)."""
    known: set[tuple[Any, ...]] = set()

    def remembered(*args: Any) -> Any:
        key = tuple(a for a in args if isinstance(a, str | int | tuple))
        if key in known:
            return True
        answer = check(*args)
        if answer is True:
            known.add(key)
        return answer

    remembered.__wrapped__ = check  # type: ignore[attr-defined]
    return remembered


# --- tick_context_instance -----------------------------------------------------------------------

def lend_instance(context: object, instance: dg.DagsterInstance) -> bool:
    """Make ``context.instance`` (and so ``context.log``) of a sensor tick ``instance``; whether it was done.

    A context evaluated by the daemon holds only the instance's ref and builds an instance from it the first
    time a tick asks (``context.log`` does, for the tick's captured logs), then disposes of it. A context that
    already has an instance (built, or given by a test) keeps it. The context never disposes of an instance
    it did not build. On a failure: Dagster builds its own, as before.
    """
    if "tick_context_instance" in _fallen_back:
        return False
    try:
        if "_instance" not in vars(context):
            raise AttributeError(f"{type(context).__name__} has no _instance")
        if vars(context)["_instance"] is None:
            context._instance = instance  # type: ignore[attr-defined]  # noqa: SLF001 - see docstring
    except HOOK_ERRORS as exc:
        _fall_back("tick_context_instance", exc)
        return False
    return True


# --- sensor_prelude ------------------------------------------------------------------------------

def run_before_evaluation(sensor: dg.SensorDefinition, prelude: Callable[[Any], object]) -> dg.SensorDefinition:
    """``sensor``, its ticks calling ``prelude(context)`` first (before Dagster's own wrapper reads the context).

    An exception in the prelude is the tick's, as one in the sensor's own code would be. On a failure of the hook
    the sensor is returned unchanged (ticks as before).
    """
    if "sensor_prelude" in _fallen_back:
        return sensor
    try:
        evaluate = vars(sensor)["_evaluation_fn"]
        if not callable(evaluate):
            raise TypeError(f"{type(sensor).__name__}._evaluation_fn is not callable")

        def evaluate_after_prelude(context: Any) -> Any:
            prelude(context)
            return evaluate(context)

        sensor._evaluation_fn = evaluate_after_prelude  # type: ignore[attr-defined]  # noqa: SLF001 - see docstring
    except HOOK_ERRORS as exc:
        _fall_back("sensor_prelude", exc)
    return sensor


# --- event_batching ------------------------------------------------------------------------------

def event_batching_read() -> bool:
    """Whether this Dagster still has the code that reads the batching variables (warns once if not).

    Setting the variables cannot fail; a Dagster that stops reading them silently writes one event
    per INSERT again. Fallback: nothing to do (Dagster's default is correct, only slower).
    """
    if "event_batching" in _fallen_back:
        return False
    try:
        from dagster._core.instance.utils import _get_event_batch_size
        from dagster._core.storage.event_log.base import EventLogStorage

        planned = inspect.getattr_static(
            EventLogStorage, "supports_partition_subset_in_asset_materialization_planned_events")
        if not callable(_get_event_batch_size) or not isinstance(planned, property):
            raise TypeError("the readers of the batching variables changed shape")
    except HOOK_ERRORS as exc:
        _fall_back("event_batching", exc)
        return False
    return True


# --- sensors: backfill_status, run_pids, and the public run launcher -----------------------------

_UNFINISHED = [dg.DagsterRunStatus.QUEUED, dg.DagsterRunStatus.NOT_STARTED, dg.DagsterRunStatus.STARTING,
               dg.DagsterRunStatus.STARTED, dg.DagsterRunStatus.CANCELING]
BACKFILL_TAG = "dagster/backfill"
"""The tag Dagster puts on every run a backfill launches (its id)."""


def backfill_in_progress(instance: dg.DagsterInstance) -> bool:
    """Whether a backfill is requested (its runs' key ranges are resolved only as each run executes).

    Fallback (``BulkActionStatus`` moved or ``get_backfills`` changed): whether a run not yet finished
    carries the ``dagster/backfill`` tag, public and O(live runs).
    """
    if "backfill_status" not in _fallen_back:
        try:
            from dagster._core.execution.backfill import BulkActionStatus

            return bool(instance.get_backfills(status=BulkActionStatus.REQUESTED, limit=1))
        except HOOK_ERRORS as exc:
            _fall_back("backfill_status", exc)
    runs = instance.get_runs(filters=dg.RunsFilter(statuses=_UNFINISHED))
    return any(BACKFILL_TAG in run.tags for run in runs)


_STARTED_PROCESS = re.compile(r"Started process for (run|resuming job) \(pid: \d+\)")


def run_process_pids(instance: dg.DagsterInstance, run_id: str) -> set[int]:
    """The pids the run's "Started process" engine events name (``EngineEventData`` metadata ``pid``).

    Fallback (the event data changed shape, or an event announces a process without a pid entry):
    an empty set, so the caller kills nothing and only reports the run canceled.
    """
    if "run_pids" in _fallen_back:
        return set()
    pids: set[int] = set()
    announced = False
    try:
        for entry in instance.all_logs(run_id, of_type=dg.DagsterEventType.ENGINE_EVENT):
            event = entry.dagster_event
            data = event.event_specific_data if event is not None else None
            if data is None:
                continue
            pid = data.metadata.get("pid")
            if pid is None:
                announced = announced or bool(_STARTED_PROCESS.search(event.message or ""))
                continue
            if not (isinstance(pid.value, str) and pid.value.isdigit()):
                raise TypeError(f"pid metadata is {pid!r}, not MetadataValue.text(str(pid))")
            pids.add(int(pid.value))
    except HOOK_ERRORS as exc:
        _fall_back("run_pids", exc)
        return set()
    if announced and not pids:
        _fall_back("run_pids", "a 'Started process' engine event carries no pid metadata")
    return pids


def is_default_run_launcher(launcher: object) -> bool:
    """Whether ``launcher`` is Dagster's DefaultRunLauncher (public since ``dg.DefaultRunLauncher``: no private use).

    Should the public name go, the class name in its MRO decides (no warning: nothing private).
    """
    cls = getattr(dg, "DefaultRunLauncher", None)
    if isinstance(cls, type):
        return isinstance(launcher, cls)
    return any(c.__name__ == "DefaultRunLauncher" for c in type(launcher).__mro__)


# --- warm_launcher -------------------------------------------------------------------------------

def run_launcher_api() -> Any:
    """Dagster's run-launcher extension point: the base classes a launcher named in dagster.yaml needs.

    No fallback: a launcher cannot be built without them, so a moved symbol fails the instance load at
    start-up (before any run), with this hook named; dagster.yaml's DefaultRunLauncher needs none of them.
    """
    from types import SimpleNamespace

    from dagster._core.launcher.base import CheckRunHealthResult, LaunchRunContext, RunLauncher, WorkerStatus
    from dagster._serdes import ConfigurableClass, ConfigurableClassData

    return SimpleNamespace(RunLauncher=RunLauncher, LaunchRunContext=LaunchRunContext,
                           CheckRunHealthResult=CheckRunHealthResult, WorkerStatus=WorkerStatus,
                           ConfigurableClass=ConfigurableClass, ConfigurableClassData=ConfigurableClassData)


def execute_run_here(run_id: str, instance: dg.DagsterInstance) -> int:
    """Run ``run_id`` in this process as ``dagster api execute_run`` does: its signal set-up, its body.

    The body writes the "Started process for run (pid: N)" engine event, runs the job with
    ``core_execute_run`` (run start/success/failure/cancel events, the run's own threads) and reports a
    failure it raises into the event log. Returns the command's exit code (0 unless set up to fail).
    """
    from dagster._cli.api import _execute_run_command_body
    from dagster._utils.interrupts import capture_interrupts

    with capture_interrupts():
        return _execute_run_command_body(run_id, instance, lambda _event: None, set_exit_code_on_failure=False)


def warm_run_command() -> None:
    """Import what ``execute_run_here`` imports: Dagster's CLI package, whose click options are built at import.

    A fork server does this before forking; a run child that imported it itself spent ~0.3 s of CPU on it,
    about a fifth of a small-document run's CPU (py-spy over ``bench.scale.small_docs``). No fallback: a
    moved module fails ``execute_run_here`` just the same.
    """
    import dagster._cli.api  # noqa: F401


def warm_definitions(job_code_origin: object) -> bool:
    """Load the job's repository and job definitions into this process (a fork server does, before forking).

    Fallback (a moved loader): nothing is loaded here, each run child loads them itself as the default
    launcher's run process does; whether it was done is returned.
    """
    if "warm_launcher" in _fallen_back:
        return False
    try:
        from dagster._utils.hosted_user_process import recon_job_from_origin

        recon_job_from_origin(job_code_origin).get_definition()  # type: ignore[arg-type]
    except HOOK_ERRORS as exc:
        _fall_back("warm_launcher", exc)
        return False
    return True
