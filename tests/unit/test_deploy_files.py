"""The deployment path (deploy/): what can be checked without a Docker engine or a Kubernetes cluster.

- The Helm values parse and use only keys of Dagster's official chart (its pydantic schema, fields
  listed below from helm/dagster/schema in dagster-io/dagster), with the K8s run launcher, an external
  PostgreSQL and the code location this project defines.
- The instance config the chart renders from these values (mirrored here for the run launcher, run
  coordinator and run monitoring) passes Dagster's own schema and loads a real K8sRunLauncher and
  QueuedRunCoordinator (with a throwaway kubeconfig instead of the in-cluster one).
- Every command the image and the manifests run exists and answers ``--help``; the code location loads.
- Dagster's code server and webserver have no authentication (issue #31): the image binds the code server
  to 127.0.0.1, and where the chart binds it to 0.0.0.0 NetworkPolicies admit only the webserver and daemon
  to it, and only the ingress controller to the webserver.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
BIN = Path(sys.executable).parent

# Top-level and nested keys of the official chart's values schema (dagster 1.13; extra keys are refused
# by the chart's JSON schema for the run launcher and daemon: `Extra.forbid`).
CHART_TOP_LEVEL = {
    "global", "nameOverride", "fullnameOverride", "rbacEnabled", "dagsterWebserver", "dagster-user-deployments",
    "postgresql", "generatePostgresqlPasswordSecret", "generateCeleryConfigSecret", "rabbitmq", "redis", "flower",
    "ingress", "imagePullSecrets", "computeLogManager", "scheduler", "runLauncher", "pythonLogs", "dagsterDaemon",
    "busybox", "migrate", "telemetry", "serviceAccount", "retention", "additionalInstanceConfig", "concurrency",
}
K8S_RUN_LAUNCHER_KEYS = {
    "image", "imagePullPolicy", "jobNamespace", "loadInclusterConfig", "kubeconfigFile", "envConfigMaps", "envSecrets",
    "envVars", "volumeMounts", "volumes", "labels", "failPodOnRunFailure", "resources", "schedulerName",
    "securityContext", "runK8sConfig",
}
USER_DEPLOYMENT_KEYS = {
    "name", "image", "dagsterApiGrpcArgs", "codeServerArgs", "includeConfigInLaunchedRuns", "port", "env",
    "envConfigMaps", "envSecrets", "annotations", "nodeSelector", "affinity", "tolerations", "podSecurityContext",
    "securityContext", "resources", "livenessProbe", "readinessProbe", "startupProbe", "labels", "volumeMounts",
    "volumes", "schedulerName",
}
DAEMON_KEYS = {
    "enabled", "image", "runCoordinator", "heartbeatTolerance", "env", "envConfigMaps", "envSecrets",
    "deploymentLabels", "labels", "nodeSelector", "affinity", "tolerations", "podSecurityContext", "securityContext",
    "resources", "livenessProbe", "readinessProbe", "startupProbe", "annotations", "runMonitoring", "runRetries",
    "sensors", "schedules", "schedulerName", "volumeMounts", "volumes",
}
POSTGRESQL_KEYS = {
    "image", "enabled", "postgresqlHost", "postgresqlUsername", "postgresqlPassword", "postgresqlDatabase",
    "postgresqlParams", "postgresqlScheme", "service",
}


@pytest.fixture(scope="module")
def values() -> dict:
    return yaml.safe_load((DEPLOY / "helm" / "values.yaml").read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def manifests() -> list[dict]:
    return [d for d in yaml.safe_load_all((DEPLOY / "k8s" / "kbindex.yaml").read_text(encoding="utf-8")) if d]


def pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def test_values_use_only_chart_keys_and_name_the_k8s_launcher_and_external_postgres(values):
    assert set(values) <= CHART_TOP_LEVEL, set(values) - CHART_TOP_LEVEL
    launcher = values["runLauncher"]
    assert launcher["type"] == "K8sRunLauncher" and set(launcher["config"]) == {"k8sRunLauncher"}
    assert set(launcher["config"]["k8sRunLauncher"]) <= K8S_RUN_LAUNCHER_KEYS
    pg = values["postgresql"]
    assert set(pg) <= POSTGRESQL_KEYS and pg["enabled"] is False and pg["postgresqlHost"]
    assert values["generatePostgresqlPasswordSecret"] is False and values["global"]["postgresqlSecretName"]
    assert set(values["dagsterDaemon"]) <= DAEMON_KEYS and values["dagsterDaemon"]["enabled"] is True
    user = values["dagster-user-deployments"]
    assert user["enabled"] is True
    (deployment,) = user["deployments"]
    assert set(deployment) <= USER_DEPLOYMENT_KEYS


def test_values_name_this_projects_code_location_and_dagster_version(values):
    (deployment,) = values["dagster-user-deployments"]["deployments"]
    args = deployment["dagsterApiGrpcArgs"]
    assert args[args.index("--module-name") + 1] == pyproject()["tool"]["dagster"]["module_name"]
    dagster_version = metadata.version("dagster")
    for component in ("dagsterWebserver", "dagsterDaemon"):
        assert values[component]["image"]["tag"] == dagster_version, component
    dockerfile_cmd = dockerfile_command()
    assert str(deployment["port"]) == dockerfile_cmd[dockerfile_cmd.index("--port") + 1]


def test_run_pods_and_the_embed_daemonset_share_the_socket_folder(values, manifests):
    launcher = values["runLauncher"]["config"]["k8sRunLauncher"]
    env = dict(item.split("=", 1) for item in launcher["envVars"])
    (mount,) = launcher["volumeMounts"]
    (volume,) = launcher["volumes"]
    (daemonset,) = [m for m in manifests if m["kind"] == "DaemonSet"]
    pod = daemonset["spec"]["template"]["spec"]
    (service,) = pod["containers"]
    service_home = {e["name"]: e["value"] for e in service["env"]}["KBINDEX_HOME"]
    assert env["KBINDEX_EMBED_SERVICE"] == mount["mountPath"] == service_home
    assert volume["hostPath"]["path"] == pod["volumes"][0]["hostPath"]["path"]
    assert launcher["securityContext"]["runAsUser"] == pod["securityContext"]["runAsUser"]  # key file is 0600


def render_instance(values: dict, namespace: str = "kbindex") -> dict:
    """The parts of dagster.yaml the chart's templates build from our values (run launcher, coordinator,
    monitoring, storage), following helm/dagster/templates/helpers/instance/*.tpl."""
    k8s = values["runLauncher"]["config"]["k8sRunLauncher"]
    launcher = {
        "load_incluster_config": k8s["loadInclusterConfig"],
        "job_namespace": k8s.get("jobNamespace") or namespace,
        "image_pull_policy": k8s["imagePullPolicy"],
        "service_account_name": values["global"]["serviceAccountName"],
        "dagster_home": values["global"]["dagsterHome"],
        "instance_config_map": "kbindex-dagster-instance",
        "postgres_password_secret": values["global"]["postgresqlSecretName"],
        "env_config_maps": [c["name"] for c in k8s.get("envConfigMaps", [])],
        "env_secrets": [s["name"] for s in k8s.get("envSecrets", [])],
        "env_vars": k8s.get("envVars", []),
        "volume_mounts": k8s.get("volumeMounts", []),
        "volumes": k8s.get("volumes", []),
        "resources": k8s.get("resources", {}),
        "security_context": k8s.get("securityContext", {}),
    }
    queued = values["dagsterDaemon"]["runCoordinator"]["config"]["queuedRunCoordinator"]
    monitoring = values["dagsterDaemon"]["runMonitoring"]
    pg = values["postgresql"]
    return {
        "run_launcher": {"module": "dagster_k8s", "class": "K8sRunLauncher", "config": launcher},
        "run_coordinator": {
            "module": "dagster._core.run_coordinator",
            "class": "QueuedRunCoordinator",
            "config": {
                "max_concurrent_runs": queued["maxConcurrentRuns"],
                "dequeue_interval_seconds": queued["dequeueIntervalSeconds"],
                "tag_concurrency_limits": queued["tagConcurrencyLimits"],
            },
        },
        "run_monitoring": {
            "enabled": monitoring["enabled"],
            "start_timeout_seconds": monitoring["startTimeoutSeconds"],
            "poll_interval_seconds": monitoring["pollIntervalSeconds"],
        },
        "storage": {
            "postgres": {
                "postgres_db": {
                    "username": pg["postgresqlUsername"],
                    "password": {"env": "DAGSTER_PG_PASSWORD"},
                    "hostname": pg["postgresqlHost"],
                    "db_name": pg["postgresqlDatabase"],
                    "port": pg["service"]["port"],
                    "params": pg["postgresqlParams"],
                }
            }
        },
        "telemetry": {"enabled": values["telemetry"]["enabled"]},
        **({"retention": {kind: {"purge_after_days": values["retention"][kind]["purgeAfterDays"]}
                          for kind in ("sensor", "schedule")}} if values.get("retention", {}).get("enabled") else {}),
    }


FAKE_KUBECONFIG = {
    "apiVersion": "v1",
    "kind": "Config",
    "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:6443"}}],
    "users": [{"name": "u", "user": {"token": "not-a-real-token"}}],
    "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
    "current-context": "x",
}


def test_rendered_instance_config_passes_dagster_schema_and_loads_the_k8s_launcher(values, tmp_path, monkeypatch):
    pytest.importorskip("dagster_k8s", reason="pip install -e '.[k8s]' (the test extra includes it)")
    from dagster._core.instance.config import dagster_instance_config
    from dagster._serdes import ConfigurableClassData

    instance = render_instance(values)
    (tmp_path / "dagster.yaml").write_text(yaml.safe_dump(instance), encoding="utf-8")
    monkeypatch.setenv("DAGSTER_PG_PASSWORD", "unused")
    config, _ = dagster_instance_config(str(tmp_path))  # the whole file against Dagster's instance schema
    assert config["run_launcher"]["class"] == "K8sRunLauncher"

    # Outside a pod there is no in-cluster config: load the same launcher config from a throwaway kubeconfig.
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump(FAKE_KUBECONFIG), encoding="utf-8")
    launcher_config = {**instance["run_launcher"]["config"], "load_incluster_config": False,
                       "kubeconfig_file": str(kubeconfig)}
    launcher = ConfigurableClassData("dagster_k8s", "K8sRunLauncher", yaml.safe_dump(launcher_config)).rehydrate(
        as_type=object
    )
    assert type(launcher).__name__ == "K8sRunLauncher"
    assert launcher.job_namespace == "kbindex" and launcher.dagster_home == values["global"]["dagsterHome"]
    coordinator_data = instance["run_coordinator"]
    coordinator = ConfigurableClassData(
        coordinator_data["module"], coordinator_data["class"], yaml.safe_dump(coordinator_data["config"])
    ).rehydrate(as_type=object)
    assert type(coordinator).__name__ == "QueuedRunCoordinator"


def test_a_wrong_launcher_key_is_refused_by_dagsters_schema(values, tmp_path):
    """The schema check above can fail: a misspelled key is an error, not silently ignored."""
    from dagster._core.errors import DagsterInvalidConfigError
    from dagster._core.instance.config import dagster_instance_config

    instance = render_instance(values)
    instance["run_monitoring"]["start_timeout"] = 300
    (tmp_path / "dagster.yaml").write_text(yaml.safe_dump(instance), encoding="utf-8")
    with pytest.raises(DagsterInvalidConfigError):
        dagster_instance_config(str(tmp_path))


def test_the_k8s_extra_pins_dagster_k8s_to_the_dagster_postgres_release():
    project = pyproject()["project"]
    (k8s_pin,) = project["optional-dependencies"]["k8s"]
    postgres_pin = next(d for d in project["dependencies"] if d.startswith("dagster-postgres=="))
    assert k8s_pin.split("==")[1] == postgres_pin.split("==")[1]
    assert '".[k8s]"' in (DEPLOY / "Dockerfile").read_text(encoding="utf-8")


def dockerfile_command() -> list[str]:
    (cmd,) = re.findall(r"^CMD (\[.*\])$", (DEPLOY / "Dockerfile").read_text(encoding="utf-8"), re.MULTILINE)
    return json.loads(cmd)


def test_dockerfile_copies_what_exists_and_the_image_keeps_out_the_rest():
    text = (DEPLOY / "Dockerfile").read_text(encoding="utf-8")
    sources = [s for line in re.findall(r"^COPY (.+)$", text, re.MULTILINE) for s in shlex.split(line)[:-1]]
    assert sources and all((ROOT / s).exists() for s in sources), sources
    ignore = (DEPLOY / "Dockerfile.dockerignore").read_text(encoding="utf-8").split()
    assert all(f"!{s}" in ignore for s in sources), "the ignore file would drop a copied source"


def _help(argv: list[str]) -> subprocess.CompletedProcess:
    exe = BIN / argv[0]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    return subprocess.run([str(exe), *argv[1:], "--help"], capture_output=True, text=True, timeout=120, env=env)


def test_every_command_the_image_and_manifests_run_exists(manifests):
    commands = [dockerfile_command(), ["dagster", "api", "execute_run"]]  # the K8s run launcher's Job command
    for manifest in manifests:
        if manifest["kind"] not in {"Job", "DaemonSet", "Deployment"}:
            continue  # NetworkPolicies run nothing
        pod = manifest["spec"]["template"]["spec"]
        commands += [c["command"] for c in pod["containers"]]
    assert ["kbindex", "migrate"] in commands and ["kbindex", "embed-service"] in commands
    for argv in commands:
        result = _help(argv)
        assert result.returncode == 0 and "Usage" in result.stdout, (argv, result.stderr[-2000:])


def test_a_missing_command_is_reported():
    """The command check can fail."""
    assert _help(["kbindex", "no-such-command"]).returncode != 0


def test_the_code_location_the_values_name_loads(values, tmp_path):
    (deployment,) = values["dagster-user-deployments"]["deployments"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "DAGSTER_HOME": str(tmp_path)}
    result = subprocess.run(
        [str(BIN / "dagster"), "definitions", "validate", *deployment["dagsterApiGrpcArgs"]],
        capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Validation successful" in result.stderr + result.stdout


def test_the_daemon_gets_the_event_batching_settings_runs_set_themselves(values):
    from pipelines.event_batching import EVENT_BATCH_ENV

    assert values["dagsterDaemon"]["env"] == EVENT_BATCH_ENV


def test_the_image_builds_the_default_model_into_its_models_dir(tmp_path):
    """The Dockerfile's prebuild line, run as the image runs it: the default profile's model lands in
    KBINDEX_MODELS_DIR (not under any KBINDEX_HOME), built offline, and a second run reuses it."""
    from resources.embedder import DEFAULT_MODEL_NAME

    text = (DEPLOY / "Dockerfile").read_text(encoding="utf-8")
    (code,) = re.findall(r'python -c "([^"]+)"', text)
    assert "ensure_built" in code and "DEFAULT_MODEL_NAME" in code
    models = Path(os.environ["KBINDEX_MODELS_DIR"])  # the session's (tests/conftest.py): built once per session
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "KBINDEX_HOME": str(tmp_path / "home")}
    for _ in range(2):
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, env=env, cwd=ROOT)
        assert done.returncode == 0, done.stderr[-2000:]
    assert (models / DEFAULT_MODEL_NAME / "kbindex-model.json").is_file()
    assert not (tmp_path / "home" / "models").exists()


def test_the_embed_service_sets_its_workers_to_its_cpu_limit(manifests):
    """The worker count defaults to the node's cores, which a CPU limit does not change: the manifest says it."""
    (daemonset,) = [m for m in manifests if m["kind"] == "DaemonSet"]
    (service,) = daemonset["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e["value"] for e in service["env"]}
    assert int(env["KBINDEX_EMBED_WORKERS"]) == int(service["resources"]["limits"]["cpu"])


# Issue #31, finding 2: the code server and the webserver answer anyone who reaches them.

EVERY_INTERFACE = {"0.0.0.0", "::", "[::]", ""}


def dockerfile_env() -> dict[str, str]:
    """The image's ENV settings (continuation lines joined)."""
    text = (DEPLOY / "Dockerfile").read_text(encoding="utf-8").replace("\\\n", " ")
    env: dict[str, str] = {}
    for line in re.findall(r"^ENV (.+)$", text, re.MULTILINE):
        for item in shlex.split(line):
            key, _, value = item.partition("=")
            env[key] = value
    return env


def code_server_host(cmd: list[str], env: dict[str, str]) -> str:
    """Where `dagster api grpc` listens: --host/-h, else DAGSTER_GRPC_HOST, else Dagster's default."""
    for flag in ("--host", "-h"):
        if flag in cmd:
            return cmd[cmd.index(flag) + 1]
    return env.get("DAGSTER_GRPC_HOST", "localhost")


def test_the_image_runs_the_code_server_on_loopback_unless_told_otherwise():
    cmd = dockerfile_command()
    assert cmd[:3] == ["dagster", "api", "grpc"]
    assert code_server_host(cmd, dockerfile_env()) not in EVERY_INTERFACE


def test_the_host_check_sees_a_bind_to_every_interface():
    """The check above can fail: the command the image ran before issue #31 binds 0.0.0.0."""
    before = ["dagster", "api", "grpc", "--host", "0.0.0.0", "--port", "3030", "--module-name", "pipelines.definitions"]
    assert code_server_host(before, {"DAGSTER_GRPC_HOST": "127.0.0.1"}) in EVERY_INTERFACE
    assert code_server_host(["dagster", "api", "grpc"], {"DAGSTER_GRPC_HOST": "0.0.0.0"}) in EVERY_INTERFACE


def _selects(selector: dict, labels: dict) -> bool:
    match = selector.get("matchLabels") or {}
    return not selector.get("matchExpressions") and bool(match) and all(labels.get(k) == v for k, v in match.items())


def ingress_sources(policies: list[dict], pod_labels: dict, port: int) -> list[dict]:
    """Every ``from`` peer the policies selecting ``pod_labels`` admit on ``port``; raises if a pod with those
    labels is selected by no Ingress policy, or a rule admits everyone (no ``from``) on that port."""
    selecting = [p for p in policies if _selects(p["spec"]["podSelector"], pod_labels)
                 and "Ingress" in p["spec"].get("policyTypes", ["Ingress"])]
    assert selecting, f"no NetworkPolicy selects {pod_labels}: any pod in the cluster reaches it"
    peers = []
    for policy in selecting:
        for rule in policy["spec"].get("ingress", []):
            ports = [p.get("port") for p in rule.get("ports", [])]
            if ports and port not in ports:
                continue
            assert rule.get("from"), f"{policy['metadata']['name']} admits every source on port {port}"
            peers += rule["from"]
    return peers


def _user_deployment(values: dict) -> dict:
    (deployment,) = values["dagster-user-deployments"]["deployments"]
    return deployment


def test_only_the_webserver_and_daemon_reach_the_code_server_the_chart_binds_to_every_interface(values, manifests):
    deployment = _user_deployment(values)
    assert "dagsterApiGrpcArgs" in deployment  # the chart then runs `dagster api grpc -h 0.0.0.0`
    policies = [m for m in manifests if m["kind"] == "NetworkPolicy"]
    webserver, daemon = values["dagsterWebserver"]["labels"], values["dagsterDaemon"]["labels"]
    peers = ingress_sources(policies, deployment["labels"], int(deployment["port"]))
    assert peers and all(set(p) == {"podSelector"} for p in peers), peers  # pods of this namespace, nothing else
    admitted = [p["podSelector"] for p in peers]
    assert all(_selects(s, webserver) or _selects(s, daemon) for s in admitted), admitted
    assert any(_selects(s, webserver) for s in admitted) and any(_selects(s, daemon) for s in admitted)
    assert not any(_selects(s, deployment["labels"]) for s in admitted)


def test_only_the_ingress_controller_reaches_the_webserver(values, manifests):
    policies = [m for m in manifests if m["kind"] == "NetworkPolicy"]
    port = int(values["dagsterWebserver"].get("service", {}).get("port", 80))  # the chart's default is 80
    peers = ingress_sources(policies, values["dagsterWebserver"]["labels"], port)
    assert peers and all(set(p) == {"namespaceSelector"} and p["namespaceSelector"].get("matchLabels") for p in peers), peers


def test_the_policy_check_sees_an_open_policy_and_a_missing_one(values):
    """The checks above can fail: no policy, or one whose rule has no ``from`` (everyone), is reported."""
    labels = _user_deployment(values)["labels"]
    with pytest.raises(AssertionError, match="no NetworkPolicy"):
        ingress_sources([], labels, 3030)
    open_policy = {"kind": "NetworkPolicy", "metadata": {"name": "open"},
                   "spec": {"podSelector": {"matchLabels": labels}, "policyTypes": ["Ingress"],
                            "ingress": [{"ports": [{"port": 3030}]}]}}
    with pytest.raises(AssertionError, match="admits every source"):
        ingress_sources([open_policy], labels, 3030)


def test_every_postgresql_connection_bound_is_in_the_deployment_and_reaches_the_pods(values, manifests):
    """Issue #32: every timeout that bounds a silent connection appears in the deployment's configuration, with
    the code's own default (so the file documents what runs), and the code server and run pods read it."""
    from dataclasses import fields

    from resources.settings import ConnectionBounds, EmbedServiceBounds

    names = {cls.env_name(f.name) for cls in (ConnectionBounds, EmbedServiceBounds) for f in fields(cls)}
    (config,) = [m for m in manifests if m["kind"] == "ConfigMap" and m["metadata"]["name"] == "kbindex-connection-bounds"]
    assert set(config["data"]) == names
    assert ConnectionBounds.from_env(config["data"]) == ConnectionBounds()
    assert EmbedServiceBounds.from_env(config["data"]) == EmbedServiceBounds()
    assert all(float(v) > 0 for v in config["data"].values())  # none turned off
    code_server = values["dagster-user-deployments"]["deployments"][0]
    launcher = values["runLauncher"]["config"]["k8sRunLauncher"]
    for where in (code_server, launcher):
        assert {"name": "kbindex-connection-bounds"} in where["envConfigMaps"]


# The Kubernetes versions the manifests are checked against, offline (kubernetes-validate bundles the
# schemas): the oldest still in upstream support when this was written, and the newest the package knows.
KUBERNETES_VERSIONS = ("1.32.0", "latest")


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_manifest_validates_against_the_kubernetes_schema(manifests, version):
    """Strict: an unknown field (a typo in a key) fails as well as a wrong type or a missing required one."""
    import kubernetes_validate
    from kubernetes_validate.utils import latest_version

    target = latest_version() if version == "latest" else version
    assert {d["kind"] for d in manifests} >= {"ConfigMap", "Job", "DaemonSet", "NetworkPolicy"}
    for doc in manifests:
        kubernetes_validate.validate(doc, target, strict=True)


def test_the_schema_check_refuses_a_misspelt_field(manifests):
    import copy

    import kubernetes_validate
    from kubernetes_validate.utils import latest_version

    (daemonset,) = [d for d in manifests if d["kind"] == "DaemonSet"]
    bad = copy.deepcopy(daemonset)
    bad["spec"]["template"]["spec"]["containers"][0]["imagePullPolicyy"] = "Always"
    with pytest.raises(kubernetes_validate.ValidationError, match="imagePullPolicyy"):
        kubernetes_validate.validate(bad, latest_version(), strict=True)


def _tick_retention(config: dict) -> dict[str, dict[str, int]]:
    """Days each tick status is kept, per instigator kind, as the daemon reads them from an instance config."""
    from dagster._core.definitions.run_request import InstigatorType
    from dagster._core.instance.config import get_default_tick_retention_settings, get_tick_retention_settings

    settings = config.get("retention") or {}
    return {kind.value: {status.value: days for status, days in get_tick_retention_settings(
                settings.get(kind.value.lower()), get_default_tick_retention_settings(kind)).items()}
            for kind in (InstigatorType.SENSOR, InstigatorType.SCHEDULE)}


@pytest.mark.parametrize("source", ["dagster.yaml", "helm values"])
def test_tick_history_is_kept_days_not_forever(source, values, tmp_path, monkeypatch):
    """The claiming sensors record a SUCCESS tick per claim (up to three a daemon loop while busy), which Dagster
    keeps forever by default: every tick status of every sensor and schedule must go after a bounded time."""
    from dagster._core.instance.config import dagster_instance_config

    if source == "dagster.yaml":
        (tmp_path / "dagster.yaml").write_text((ROOT / "dagster.yaml").read_text(), encoding="utf-8")
    else:
        (tmp_path / "dagster.yaml").write_text(yaml.safe_dump(render_instance(values)), encoding="utf-8")
        monkeypatch.setenv("DAGSTER_PG_PASSWORD", "unused")
    config, _ = dagster_instance_config(str(tmp_path))
    kept = _tick_retention(config)
    assert all(0 < days <= 30 for statuses in kept.values() for days in statuses.values()), kept
    assert set(kept["SENSOR"].values()) == {7}, kept  # one period: one purge DELETE a tick, as by default


def test_the_tick_retention_check_sees_dagsters_default():
    """Without a retention block Dagster keeps SUCCESS, FAILURE and STARTED sensor ticks forever (-1)."""
    kept = _tick_retention({})
    assert kept["SENSOR"]["SUCCESS"] == -1 and kept["SENSOR"]["SKIPPED"] == 7
