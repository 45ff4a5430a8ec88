"""Every private Dagster symbol kbindex uses is registered, resolves on this Dagster, and fails soft (issue #28).

On a Dagster upgrade, run this file first: ``test_every_registered_symbol_resolves`` lists, one test id
per symbol, exactly what moved. The scan covers the product code (``pipelines/``, ``resources/``) and
the instance configuration (``dagster.yaml``); ``bench/`` and ``tests/`` may use internals freely (a
broken bench or test fails loudly, not a run).
"""

import ast
import logging
import re
import time
import types
import uuid
from pathlib import Path

import dagster as dg
import dagster_postgres
import pytest
import sqlalchemy as sa
import yaml

from resources import dagster_private
from resources.dagster_private import REGISTRY

PROJECT_ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("pipelines", "resources")
PRIVATE_MODULE = PROJECT_ROOT / "resources" / "dagster_private.py"
SYMBOLS = [(hook, path) for hook, entry in REGISTRY.items() for path in entry.symbols]


@pytest.fixture(autouse=True)
def fresh_hooks(monkeypatch):
    """Each test starts with every hook on its private path and no warning given yet."""
    monkeypatch.setattr(dagster_private, "_fallen_back", {})


def fallback_warnings(caplog, hook: str) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == dagster_private.__name__ and r.levelno == logging.WARNING and f"hook {hook!r}" in r.getMessage()]


def assert_warned_once(caplog, hook: str, symbol: str) -> None:
    messages = fallback_warnings(caplog, hook)
    assert len(messages) == 1, messages
    assert dg.__version__ in messages[0] and symbol in messages[0], messages[0]
    assert hook in dagster_private.fallen_back()


# --- the registry against the installed Dagster --------------------------------------------------

def test_the_installed_dagster_is_the_one_the_registry_was_checked_against():
    assert (dg.__version__, dagster_postgres.__version__) == (
        dagster_private.CHECKED_VERSION, dagster_private.CHECKED_POSTGRES_VERSION), (
        "Dagster changed: run this file, fix what test_every_registered_symbol_resolves lists, "
        "then update CHECKED_VERSION")


@pytest.mark.parametrize("hook,path", SYMBOLS, ids=[p for _, p in SYMBOLS])
def test_every_registered_symbol_resolves(hook, path):
    try:
        dagster_private.resolve(path)
    except Exception as exc:  # noqa: BLE001 - the failure is the message
        pytest.fail(f"Dagster {dg.__version__}: {path} (hook {hook!r}, used by {REGISTRY[hook].used_by}) "
                    f"no longer resolves: {type(exc).__name__}: {exc}. Fallback: {REGISTRY[hook].fallback}")


def test_every_hook_is_a_function_of_the_module():
    for hook, entry in REGISTRY.items():
        if hook != "instance_config":
            assert callable(getattr(dagster_private, entry.function)), hook


# --- no private use outside the registry ---------------------------------------------------------

def _python_files() -> list[Path]:
    return sorted(p for root in SCANNED for p in (PROJECT_ROOT / root).rglob("*.py"))


def _top_level(path: str) -> str:
    module, _, qualname = path.partition(":")
    return f"{module}:{qualname.partition('#')[0].split('.')[0]}" if qualname else module


def _is_private_module(module: str) -> bool:
    """``dagster._...`` or a submodule of dagster_postgres (only its top level is its public API)."""
    return module.startswith("dagster._") or module.startswith("dagster_postgres.")


def test_every_private_dagster_import_in_the_product_code_is_registered():
    registered = {_top_level(p) for _, p in SYMBOLS}
    modules = {p.partition(":")[0] for _, p in SYMBOLS}
    unregistered = []
    for file in _python_files():
        source = file.read_text()
        rel = file.relative_to(PROJECT_ROOT)
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.ImportFrom) and node.module and _is_private_module(node.module):
                unregistered += [f"{rel}:{node.lineno} {node.module}:{a.name}" for a in node.names
                                 if f"{node.module}:{a.name}" not in registered]
            elif isinstance(node, ast.Import):
                unregistered += [f"{rel}:{node.lineno} {a.name}" for a in node.names
                                 if _is_private_module(a.name) and a.name not in modules]
        # dotted paths in code or strings (config written from Python, getattr chains)
        for match in re.finditer(r"\bdagster\._[\w.]*", source):
            if not any(match.group(0) == m or match.group(0).startswith(m + ".") or m.startswith(match.group(0))
                       for m in modules):
                unregistered.append(f"{rel}: {match.group(0)}")
    assert unregistered == [], f"register these in resources/dagster_private.py REGISTRY: {unregistered}"


def _type_checking_only(tree: ast.AST) -> set[ast.AST]:
    """The nodes under ``if TYPE_CHECKING:`` (never imported at run time)."""
    return {inner for node in ast.walk(tree) if isinstance(node, ast.If) and ast.unparse(node.test) in (
        "TYPE_CHECKING", "typing.TYPE_CHECKING") for stmt in node.body for inner in ast.walk(stmt)}


def test_private_dagster_modules_are_imported_at_run_time_only_by_the_registry_module():
    offenders = []
    for file in _python_files():
        if file == PRIVATE_MODULE:
            continue
        tree = ast.parse(file.read_text())
        typing_only = _type_checking_only(tree)
        for node in ast.walk(tree):
            if node in typing_only:
                continue
            if isinstance(node, ast.ImportFrom) and node.module and _is_private_module(node.module):
                offenders.append(f"{file.relative_to(PROJECT_ROOT)}:{node.lineno} {node.module}")
            elif isinstance(node, ast.Import) and any(_is_private_module(a.name) for a in node.names):
                offenders.append(f"{file.relative_to(PROJECT_ROOT)}:{node.lineno} {ast.unparse(node)}")
    assert offenders == [], f"call the function of resources/dagster_private.py that fails soft instead: {offenders}"


def _configured_classes(node) -> list[str]:
    if isinstance(node, dict):
        found = [f"{node['module']}:{node.get('class', '')}"] if isinstance(node.get("module"), str) else []
        return found + [c for v in node.values() for c in _configured_classes(v)]
    if isinstance(node, list):
        return [c for v in node for c in _configured_classes(v)]
    return []


def test_every_private_dagster_class_named_in_dagster_yaml_is_registered():
    registered = {_top_level(p) for _, p in SYMBOLS}
    named = _configured_classes(yaml.safe_load((PROJECT_ROOT / "dagster.yaml").read_text()))
    assert [c for c in named if _is_private_module(c.partition(":")[0]) and c not in registered] == []
    assert "dagster._core.run_coordinator:QueuedRunCoordinator" in named  # the scan sees the file


PUBLIC_UNDERSCORED = {"os._exit"}
"""Documented standard-library names that start with an underscore (a forked child leaves with os._exit)."""


def _private_attributes(tree: ast.AST) -> list[ast.Attribute]:
    """``x._name`` on anything but ``self``/``cls``/``super()`` (dunders excluded)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            receiver = node.value
            if isinstance(receiver, ast.Name) and receiver.id in ("self", "cls"):
                continue
            if isinstance(receiver, ast.Call) and getattr(receiver.func, "id", None) == "super":
                continue
            if ast.unparse(node) in PUBLIC_UNDERSCORED:
                continue
            found.append(node)
    return found


def _imports_dagster(tree: ast.AST) -> bool:
    for node in ast.walk(tree):
        if isinstance(node, ast.Import) and any(a.name.split(".")[0] in ("dagster", "dagster_postgres") for a in node.names):
            return True
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in ("dagster", "dagster_postgres"):
            return True
    return False


def test_private_attributes_of_dagster_objects_are_reached_only_through_the_registry():
    registered_attrs = {re.split(r"[.#:]", p)[-1] for _, p in SYMBOLS}
    offenders = []
    for file in _python_files():
        tree = ast.parse(file.read_text())
        if not _imports_dagster(tree):
            continue  # a module without Dagster objects (zipfile's or python-docx's internals are not ours to list)
        rel = file.relative_to(PROJECT_ROOT)
        for node in _private_attributes(tree):
            if file != PRIVATE_MODULE or node.attr not in registered_attrs:
                offenders.append(f"{rel}:{node.lineno} {ast.unparse(node)}")
    assert offenders == [], ("a private attribute in a module that uses Dagster: move it into "
                             f"resources/dagster_private.py and register it: {offenders}")


# --- partition_range -----------------------------------------------------------------------------

NAME = "private_hook_test"


@pytest.fixture
def instance():
    with dg.instance_for_test() as inst:
        inst.add_dynamic_partitions(NAME, ["a", "b", "c", "d"])
        inst.delete_dynamic_partition(NAME, "b")
        inst.add_dynamic_partitions(NAME, ["b"])  # moved to the end: id order, not key order
        yield inst


def _break_dynamic_partitions_table(monkeypatch):
    import dagster._core.storage.event_log.schema as schema

    monkeypatch.delattr(schema, "DynamicPartitionsTable")  # as if it moved: the import fails


def _break_db_select(monkeypatch):
    import dagster._core.storage.sqlalchemy_compat as compat

    def changed(*_a, **_k):
        raise TypeError("db_select() takes no list any more")  # a changed signature

    monkeypatch.setattr(compat, "db_select", changed)


@pytest.mark.parametrize("breakage,symbol", [
    (_break_dynamic_partitions_table, "DynamicPartitionsTable"),
    (_break_db_select, "db_select"),
])
def test_partition_range_falls_back_to_dagsters_listing(instance, monkeypatch, caplog, breakage, symbol):
    from pipelines.partitions import VersionPartitions
    from dagster._core.definitions.partitions.context import partition_loading_context

    ours, dagsters = VersionPartitions(name=NAME), dg.DynamicPartitionsDefinition(name=NAME)
    key_range = dg.PartitionKeyRange("c", "b")
    with partition_loading_context(dynamic_partitions_store=instance):
        assert ours.get_partition_keys_in_range(key_range) == ["c", "d", "b"]  # the private path
        assert fallback_warnings(caplog, "partition_range") == []
        breakage(monkeypatch)
        assert ours.get_partition_keys_in_range(key_range) == dagsters.get_partition_keys_in_range(key_range)
        assert ours.get_partition_keys_in_range(dg.PartitionKeyRange("a", "a")) == ["a"]
        with pytest.raises(dg.DagsterInvalidInvocationError):  # a missing end is still refused
            ours.get_partition_keys_in_range(dg.PartitionKeyRange("a", "zz"))
    assert_warned_once(caplog, "partition_range", symbol)


# --- version_metadata ----------------------------------------------------------------------------

PARTS = dg.DynamicPartitionsDefinition(name=NAME)


@dg.asset(partitions_def=PARTS, backfill_policy=dg.BackfillPolicy.single_run())
def versions_with_metadata(context: dg.AssetExecutionContext) -> dg.MaterializeResult:
    for key in context.partition_keys:
        dagster_private.add_partition_metadata(context, key, {"version": key})
    return dg.MaterializeResult()


def _materialized_metadata(instance) -> dict[str, str]:
    result = dg.materialize([versions_with_metadata], instance=instance, tags={
        "dagster/asset_partition_range_start": "c", "dagster/asset_partition_range_end": "b"})
    assert result.success
    return {m.partition: m.metadata["version"].value
            for m in result.asset_materializations_for_node("versions_with_metadata")}


def test_version_metadata_takes_the_private_path_on_this_dagster(instance, caplog):
    assert _materialized_metadata(instance) == {"c": "c", "d": "d", "b": "b"}
    assert fallback_warnings(caplog, "version_metadata") == []


class _Renamed:
    """An OpExecutionContext whose ``_step_execution_context`` is gone (renamed by an upgrade)."""

    def __init__(self, real):
        self.real = real

    def __getattr__(self, name):
        if name == "_step_execution_context":
            raise AttributeError(f"'OpExecutionContext' object has no attribute {name!r}")
        return getattr(self.real, name)


def test_version_metadata_falls_back_to_add_asset_metadata(instance, monkeypatch, caplog):
    real = dg.AssetExecutionContext.op_execution_context
    monkeypatch.setattr(dg.AssetExecutionContext, "op_execution_context",
                        property(lambda self: _Renamed(real.fget(self))))
    assert _materialized_metadata(instance) == {"c": "c", "d": "d", "b": "b"}
    assert_warned_once(caplog, "version_metadata", "_step_execution_context")


# --- storage_pool --------------------------------------------------------------------------------

def _storages() -> list[types.SimpleNamespace]:
    return [types.SimpleNamespace(_engine=sa.create_engine("sqlite://")) for _ in range(3)]


def test_storage_pool_swaps_every_engine():
    storages = _storages()
    made = []
    assert dagster_private.use_pooled_engines(storages, lambda: made.append(sa.create_engine("sqlite://")) or made[-1])
    assert [s._engine for s in storages] == made  # noqa: SLF001


@pytest.mark.parametrize("case", ["attribute gone", "engine factory changed"])
def test_storage_pool_falls_back_to_the_plain_engines(caplog, case):
    storages = _storages()
    before = [s._engine for s in storages]  # noqa: SLF001
    if case == "attribute gone":
        del storages[1]._engine  # noqa: SLF001
        make = lambda: pytest.fail("an engine was made for storages that cannot take it")  # noqa: E731
    else:
        def make():
            raise TypeError("create_pg_engine() got an unexpected keyword argument 'pool_size'")

    assert dagster_private.use_pooled_engines(storages, make) is False
    if case == "attribute gone":
        before[1] = None
    assert [getattr(s, "_engine", None) for s in storages] == before  # untouched: dagster_postgres's own
    assert_warned_once(caplog, "storage_pool", "_engine")


# --- schema_checks -------------------------------------------------------------------------------

class _Checks:
    def __init__(self, tables: set[str]) -> None:
        self.tables, self.asked = tables, []

    def has_table(self, name: str) -> bool:
        self.asked.append(name)
        return name in self.tables

    def _has_instigators_table(self, conn: object) -> bool:
        self.asked.append("instigators")
        return "instigators" in self.tables


def test_schema_checks_answer_true_from_memory_and_ask_false_again():
    storage = _Checks({"runs", "instigators"})
    assert dagster_private.remember_schema_checks([storage])
    answers = [storage.has_table("runs"), storage.has_table("runs"), storage.has_table("missing"),
               storage.has_table("missing"), storage._has_instigators_table(object()),  # noqa: SLF001
               storage._has_instigators_table(object())]  # noqa: SLF001 - another connection, same question
    assert answers == [True, True, False, False, True, True]
    assert storage.asked == ["runs", "missing", "missing", "instigators"]
    assert _Checks(set()).has_table.__func__ is _Checks.has_table  # the class is untouched: other storages ask


def test_schema_checks_fall_back_to_dagsters_own(caplog):
    class Changed(_Checks):
        has_table = property(lambda self: lambda name: True)

    storage = Changed({"runs"})
    assert dagster_private.remember_schema_checks([storage]) is False
    assert "has_table" not in vars(storage) and "_has_instigators_table" not in vars(storage)
    assert_warned_once(caplog, "schema_checks", "has_table")


# --- tick_context_instance -----------------------------------------------------------------------

def test_a_tick_context_is_lent_the_kept_instance_and_keeps_its_own():
    kept = dg.DagsterInstance.ephemeral()
    bare = dg.SensorEvaluationContext(instance_ref=None)  # as the daemon's, but with no ref to build from
    assert dagster_private.lend_instance(bare, kept)
    assert bare.instance is kept and bare.log is not None  # context.instance would raise without a ref
    own = dg.DagsterInstance.ephemeral()
    given = dg.build_sensor_context(instance=own)
    assert dagster_private.lend_instance(given, kept) and given.instance is own


def test_a_tick_context_without_the_attribute_builds_its_own(caplog):
    class Changed:
        pass

    context = Changed()
    assert dagster_private.lend_instance(context, dg.DagsterInstance.ephemeral()) is False
    assert "_instance" not in vars(context)
    assert_warned_once(caplog, "tick_context_instance", "_instance")


# --- event_batching ------------------------------------------------------------------------------

def test_event_batching_is_read_on_this_dagster(caplog):
    assert dagster_private.event_batching_read()
    assert fallback_warnings(caplog, "event_batching") == []


def test_event_batching_settings_are_still_set_when_dagster_no_longer_reads_them(monkeypatch, caplog):
    import dagster._core.instance.utils as utils

    from pipelines import event_batching

    monkeypatch.delattr(utils, "_get_event_batch_size")
    env: dict[str, str] = {}
    assert event_batching.apply(env) == event_batching.EVENT_BATCH_ENV
    event_batching.apply({})
    assert_warned_once(caplog, "event_batching", "_get_event_batch_size")


# --- backfill_status -----------------------------------------------------------------------------

def _add_run(instance, status: dg.DagsterRunStatus, tags: dict[str, str]) -> dg.DagsterRun:
    return instance.add_run(dg.DagsterRun(job_name="j", run_id=str(uuid.uuid4()), status=status, tags=tags))


def test_backfill_status_takes_the_private_path_on_this_dagster(caplog):
    from dagster._core.execution.backfill import BulkActionStatus, PartitionBackfill

    with dg.instance_for_test() as instance:
        assert dagster_private.backfill_in_progress(instance) is False
        instance.add_backfill(PartitionBackfill(backfill_id="bf1", status=BulkActionStatus.REQUESTED,
                                                from_failure=False, tags={}, backfill_timestamp=time.time()))
        assert dagster_private.backfill_in_progress(instance) is True
    assert fallback_warnings(caplog, "backfill_status") == []


def test_backfill_status_falls_back_to_the_runs_backfill_tag(monkeypatch, caplog):
    import dagster._core.execution.backfill as backfill

    monkeypatch.delattr(backfill, "BulkActionStatus")
    instance = dg.DagsterInstance.ephemeral()
    assert dagster_private.backfill_in_progress(instance) is False
    _add_run(instance, dg.DagsterRunStatus.SUCCESS, {dagster_private.BACKFILL_TAG: "old"})
    _add_run(instance, dg.DagsterRunStatus.STARTED, {"other": "x"})
    assert dagster_private.backfill_in_progress(instance) is False
    _add_run(instance, dg.DagsterRunStatus.STARTING, {dagster_private.BACKFILL_TAG: "bf2"})
    assert dagster_private.backfill_in_progress(instance) is True
    assert_warned_once(caplog, "backfill_status", "BulkActionStatus")


# --- run_pids ------------------------------------------------------------------------------------

def _engine_event(instance, run, message: str, metadata: dict) -> None:
    from dagster._core.events import EngineEventData

    instance.report_engine_event(message, run, EngineEventData(metadata=metadata))


def test_run_pids_are_read_from_the_started_process_event(caplog):
    from dagster._core.events import EngineEventData

    instance = dg.DagsterInstance.ephemeral()
    run = _add_run(instance, dg.DagsterRunStatus.STARTED, {})
    instance.report_engine_event("Started process for run (pid: 4242).", run, EngineEventData.in_process(4242))
    _engine_event(instance, run, "something else", {})
    assert dagster_private.run_process_pids(instance, run.run_id) == {4242}
    assert fallback_warnings(caplog, "run_pids") == []


@pytest.mark.parametrize("metadata", [{"process_id": dg.MetadataValue.text("4242")},  # the key renamed
                                      {"pid": dg.MetadataValue.int(4242)}])  # the value's type changed
def test_run_pids_fall_back_to_killing_nothing(caplog, metadata):
    instance = dg.DagsterInstance.ephemeral()
    run = _add_run(instance, dg.DagsterRunStatus.STARTED, {})
    _engine_event(instance, run, "Started process for run (pid: 4242).", metadata)
    assert dagster_private.run_process_pids(instance, run.run_id) == set()
    assert dagster_private.run_process_pids(instance, run.run_id) == set()
    assert_warned_once(caplog, "run_pids", "EngineEventData")


# --- the run launcher (public) -------------------------------------------------------------------

def test_the_default_run_launcher_is_recognized_without_private_names(monkeypatch):
    launcher = dg.DefaultRunLauncher()
    assert dagster_private.is_default_run_launcher(launcher)
    assert not dagster_private.is_default_run_launcher(object())
    monkeypatch.delattr(dg, "DefaultRunLauncher")
    assert dagster_private.is_default_run_launcher(launcher)


# --- sensor_prelude ------------------------------------------------------------------------------

def test_a_sensor_prelude_runs_before_dagsters_own_wrapper_reads_the_context():
    seen = []

    @dg.run_failure_sensor
    def watch(context):
        seen.append("sensor")

    assert dagster_private.run_before_evaluation(watch, lambda context: seen.append(context)) is watch
    with dg.instance_for_test() as instance:
        context = dg.build_sensor_context(instance=instance)
        watch.evaluate_tick(context)  # the first tick places the cursor; the sensor's own code is not called
    assert seen == [context]


def test_a_sensor_without_the_attribute_ticks_as_before(caplog):
    class Changed:
        pass

    sensor = Changed()
    assert dagster_private.run_before_evaluation(sensor, lambda context: None) is sensor
    assert vars(sensor) == {}
    assert_warned_once(caplog, "sensor_prelude", "_evaluation_fn")
