"""A throwaway ``dagster dev`` for the benches and the end-to-end tests: start, wait, find run processes, stop.

It runs ``dagster dev -m pipelines.definitions`` (webserver, daemon, code server, run processes as
the code server's ``spawn_main`` children) in its own process group with the caller's environment and
``kbindex dev``'s event-batching settings (pipelines/event_batching.py),
logging to ``root/dagster.log``. ``stop`` continues stopped children (a SIGSTOPped run ignores
SIGTERM), terminates the group and then kills whatever children are left, so no gRPC code server
or run outlives the harness.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

PROJECT_ROOT = Path(__file__).resolve().parents[1]
WARM_LAUNCHER_BLOCK = """
run_launcher:
  module: pipelines.warm_launcher
  class: WarmRunLauncher
  config:
    kill_grace_seconds: 10
"""
"""dagster.yaml's run_launcher block: the warm launcher, the project's default (removed for ``default``)."""


def run_launcher_choice() -> str:
    """``default`` or ``warm``: the run launcher tests and benches put into their dagster.yaml (KBINDEX_RUN_LAUNCHER)."""
    choice = os.environ.get("KBINDEX_RUN_LAUNCHER", "warm")
    if choice not in ("default", "warm"):
        raise ValueError(f"KBINDEX_RUN_LAUNCHER={choice!r}: expected 'default' or 'warm'")
    return choice


def dagster_yaml(text: str | None = None, launcher: str | None = None) -> str:
    """The project's dagster.yaml (or ``text``) with the run launcher ``launcher`` (default: run_launcher_choice())."""
    text = (PROJECT_ROOT / "dagster.yaml").read_text() if text is None else text
    has_block = WARM_LAUNCHER_BLOCK.strip() in text
    if (launcher or run_launcher_choice()) == "warm":
        return text if has_block else text + WARM_LAUNCHER_BLOCK
    return text.replace(WARM_LAUNCHER_BLOCK.strip(), "# run_launcher: Dagster's DefaultRunLauncher") if has_block else text


def write_dagster_yaml(home: Path, launcher: str | None = None) -> Path:
    """Write ``home/dagster.yaml``: the project's, with the chosen run launcher."""
    path = home / "dagster.yaml"
    path.write_text(dagster_yaml(launcher=launcher))
    return path


def spawn_in_own_session(cmd: list[str], **kwargs: Any) -> subprocess.Popen[bytes]:
    """``Popen(cmd)`` in a session of its own, with SIGINT at its default even if this process ignores it.

    ``dagster dev`` maps SIGTERM to its SIGINT handler, so one that inherits an ignored SIGINT (its bench
    started with ``&`` from a script, or under nohup) ignores ``stop``'s SIGTERM: its webserver, daemon and
    code server kept running until the SIGKILL 30 s later (seen here: a bench.scale.migration round stopped
    with ``kill``). A Python handler, unlike SIG_IGN, is not inherited across exec, so one is set for the
    spawn and SIG_IGN put back (in the main thread, the only one that may set handlers)."""
    import threading

    ignored = (threading.current_thread() is threading.main_thread()
               and signal.getsignal(signal.SIGINT) is signal.SIG_IGN)
    if ignored:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        return subprocess.Popen(cmd, start_new_session=True, **kwargs)
    finally:
        if ignored:
            signal.signal(signal.SIGINT, signal.SIG_IGN)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class DagsterDev:
    def __init__(self, root: Path, env: dict[str, str]) -> None:
        from pipelines import event_batching

        # As `kbindex dev` sets Dagster's environment (an explicit value in ``env`` wins): the daemon writes each
        # run's planned events, one per asset rather than one per asset and version. The chaos rounds once ran
        # without it: over a 500-ms link, 4 x 8 planned events took ~100 s of every run's creation.
        self.root, self.env = root, event_batching.apply(env)
        self.port = free_port()
        self.log_path = root / "dagster.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: Any = None

    def start(self) -> None:
        self._log = open(self.log_path, "wb")
        self.proc = spawn_in_own_session(
            [sys.executable, "-m", "dagster", "dev", "-m", "pipelines.definitions", "-a", "defs",
             "-h", "127.0.0.1", "-p", str(self.port)],
            env=self.env, cwd=str(PROJECT_ROOT), stdout=self._log, stderr=subprocess.STDOUT,
        )

    def wait_ready(self, timeout: float = 120.0) -> float:
        """Seconds until the webserver answers (the daemon starts alongside it)."""
        started = time.monotonic()
        while time.monotonic() - started < timeout:
            self.check_alive()
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/server_info", timeout=2) as resp:
                    if resp.status == 200:
                        return time.monotonic() - started
            except OSError:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"dagster dev did not answer within {timeout:.0f} s\n{self.log_tail()}")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def check_alive(self) -> None:
        """Raise if ``dagster dev`` exited or the code location failed to load (with the log's tail)."""
        if self.proc is not None and self.proc.poll() is not None:
            raise RuntimeError(f"dagster dev exited with {self.proc.returncode}\n{self.log_tail()}")
        if "Error loading repository location" in self.log_tail(200_000):
            raise RuntimeError(f"the code location failed to load\n{self.log_tail()}")

    def log_tail(self, chars: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def children(self) -> list[Any]:
        import psutil

        if self.proc is None:
            return []
        try:
            return psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.Error:
            return []

    def stacks(self, timeout: float = 20.0) -> str:
        """Every Python thread's stack in dagster dev and its processes (``py-spy dump``), to see where a stalled
        round waits; empty if py-spy is not installed (it is not a dependency: ``pip install py-spy``)."""
        import shutil

        import psutil

        spy = shutil.which("py-spy")
        if spy is None or self.proc is None:
            return ""
        out = []
        for p in [psutil.Process(self.proc.pid), *self.children()]:
            try:
                head = f"=== pid {p.pid}: {' '.join(p.cmdline())[:160]}"
                dump = subprocess.run([spy, "dump", "--pid", str(p.pid)], capture_output=True, text=True,
                                      timeout=timeout)
                out.append(f"{head}\n{dump.stdout or dump.stderr}")
            except (psutil.Error, subprocess.SubprocessError, OSError) as exc:
                out.append(f"=== pid {p.pid}: {type(exc).__name__}: {exc}")
        return "\n".join(out)

    def run_processes(self) -> list[Any]:
        """Run workers: the code server's multiprocessing ``spawn_main`` children, or the warm fork server's."""
        import psutil

        out = []
        for p in self.children():
            try:
                # (the daemon's own command line names the warm launcher too, inside its instance ref)
                if "spawn_main" in " ".join(p.cmdline()) or p.parent().cmdline()[1:3] == ["-m", "pipelines.warm_launcher"]:
                    out.append(p)
            except psutil.Error:
                pass
        return out

    def stop(self) -> None:
        import psutil

        if self.proc is None:
            return
        kids = self.children()
        for p in kids:  # a stopped child ignores SIGTERM until continued
            try:
                p.send_signal(signal.SIGCONT)
            except psutil.Error:
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        except ProcessLookupError:
            pass
        for p in kids:  # code servers and runs that left the group or ignored SIGTERM
            try:
                p.kill()
            except psutil.Error:
                pass
        self.proc = None
        if self._log is not None:
            self._log.close()
            self._log = None


# The Dagster UI's own GraphQL (dagster-webserver 1.13 bundle), trimmed to the fields kbindex reads:
# the tests and benches that drive the UI path send exactly what the UI sends.
UI_ASSETS = ["parsed_document", "document_chunks", "chunk_embeddings", "search_index"]
LAUNCH_BACKFILL = """
mutation LaunchPartitionBackfill($backfillParams: LaunchBackfillParams!) {
  launchPartitionBackfill(backfillParams: $backfillParams) {
    __typename
    ... on LaunchBackfillSuccess { backfillId }
    ... on PartitionSetNotFoundError { message }
    ... on PartitionKeysNotFoundError { message }
    ... on UnauthorizedError { message }
    ... on PythonError { message stack }
  }
}"""
LAUNCH_RUN = """
mutation LaunchPipelineExecution($executionParams: ExecutionParams!) {
  launchPipelineExecution(executionParams: $executionParams) {
    __typename
    ... on LaunchRunSuccess { run { id pipelineName } }
    ... on PipelineNotFoundError { message }
    ... on InvalidSubsetError { message }
    ... on RunConfigValidationInvalid { errors { message } }
    ... on PythonError { message stack }
  }
}"""
REPOSITORY = "query { repositoriesOrError { ... on RepositoryConnection { nodes { name location { name } } } } }"
SENSOR_ID = "query($selector: SensorSelector!) { sensorOrError(sensorSelector: $selector) { ... on Sensor { id } } }"
STOP_SENSOR = """mutation($id: String!) {
  stopSensor(id: $id) { ... on StopSensorMutationResult { instigationState { status } } }
}"""
