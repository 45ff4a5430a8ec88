"""A run launcher that starts each run in a process forked from a warm parent (issue #34, part 2).

Dagster's DefaultRunLauncher asks the code server to *spawn* a fresh interpreter per run: a run spends
~1.5-2 s importing Dagster and the definitions and building its instance before its first step.
``WarmRunLauncher`` (named by one ``run_launcher`` block in dagster.yaml) sends the run id to a long-lived
**fork server** on this host instead. The fork server is an interpreter that has imported Dagster, loaded
the run's definitions and built an instance once; per run it forks a child, and the child runs the run
exactly as ``dagster api execute_run`` does (resources/dagster_private.py ``execute_run_here``: the same
signal set-up and command body, so the run's events, logs, its own threads, failure and cancel handling
are Dagster's own).

What must not cross a fork is rebuilt in the child: it builds its own instance (its own database
engines and connections) from the instance ref; the parent keeps no database connection open while it
forks (it opens one only to report a crashed child, and closes it again) and runs no thread, so no lock
or socket is shared. Threads (the run's heartbeat, the lease keeper) start in the child, during the run.

What the default launcher gives, and where it is here:
- **terminate**: the run is reported CANCELING, the fork server sends its child SIGTERM (Dagster's
  interrupt: the run ends CANCELED) and SIGKILL after ``kill_grace_seconds``; a stopped (SIGSTOP) child
  gets SIGKILL at once. Without the fork server, the caller signals the pid itself (checked by its start
  time, so a recycled pid is never hit).
- **crash detection**: the fork server reaps its children; one that exits while its run is not finished
  gets an engine event and the run is reported failed (a CANCELING run: canceled), as the code server
  does for its run processes. The run-failure sensor then records RUN_CRASHED.
- **run monitoring**: ``check_run_worker_health`` reads the child's pid and start time from the run's
  tags (written by the child before the run starts) and reports a dead or replaced process as FAILED,
  so the monitoring daemon fails the run even if the fork server itself died.
- **a lost launch**: a run left STARTING with no worker recorded, which the fork server never forked
  (its launch failed while PostgreSQL was away, so the failure was never recorded), is found by
  ``launch_was_lost``; the claiming sensor fails it (pipelines/sensors.py ``fail_lost_launches``) instead of
  leaving it to run monitoring's start timeout.
- **code changes**: a fork server whose loaded project files changed on disk since it started refuses
  the launch and exits once its runs end; the launcher starts a new one (a spawned run would import the
  new code too).

Limits: one host (the pid checks read /proc; a launcher on another host reports the worker RUNNING and
leaves it to the run timeouts); the fork server inherits the environment of the process that first
launches a run (the daemon under ``dagster dev``), not a code location's own. The K8s deployment keeps
``K8sRunLauncher``. This module is Dagster wiring (a class dagster.yaml names, Dagster's run execution),
so it lives in ``pipelines/``; it imports nothing of the product's pipelines.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import selectors
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import dagster as dg

from resources import dagster_private
from resources.dagster_storage import PROCESS_NAME_ENV

_api = dagster_private.run_launcher_api()

PID_TAG = "kbindex/run_worker_pid"
"""The run's worker process (a fork server child), written by the child before the run starts."""
START_TAG = "kbindex/run_worker_start"
"""That process's start time (/proc/PID/stat field 22): a recycled pid has another."""
HOST_TAG = "kbindex/run_worker_host"
"""The host it runs on: pids mean nothing elsewhere."""
SERVER_TAG = "kbindex/run_worker_server"
"""The fork server's pid (the run process's parent)."""
STOP_GRACE_SECONDS = 15
"""A fork server told to stop (SIGTERM) SIGKILLs the runs still alive this long after."""
REPORT_RETRY_SECONDS = 2.0
"""How often the fork server tries again to record a run's exit that PostgreSQL could not take."""
LAUNCHES_REMEMBERED = 10_000
"""Run ids a fork server remembers having forked (the newest), for ``launch_was_lost``."""
SOCKET_PATH_MAX = 100
"""Unix socket paths longer than this (the limit is 108 bytes) move to a short folder under the temp dir."""


# --- /proc ---------------------------------------------------------------------------------------

def process_state(pid: int) -> tuple[str, int] | None:
    """(state letter, start time in clock ticks) of ``pid`` from /proc, or None if there is none."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return fields[0], int(fields[19])
    except (OSError, ValueError, IndexError):
        return None


def _alive(pid: int, start: int | None) -> bool:
    """Whether ``pid`` is still the process that started at ``start`` (a zombie counts as gone)."""
    state = process_state(pid)
    return state is not None and state[0] not in ("Z", "X") and (start is None or state[1] == start)


# --- the launcher (in every process that loads the instance: daemon, webserver, code server) ------

class WarmRunLauncher(_api.RunLauncher, _api.ConfigurableClass):
    """Launches each run in a child forked from a warm fork server on this host (see the module docstring)."""

    def __init__(self, inst_data: Any = None, socket_dir: str | None = None, kill_grace_seconds: int = 10,
                 start_timeout_seconds: int = 120) -> None:
        self._inst_data = inst_data
        self._socket_dir = socket_dir
        self.kill_grace_seconds = kill_grace_seconds
        self.start_timeout_seconds = start_timeout_seconds
        self._servers: list[subprocess.Popen[bytes]] = []
        super().__init__()

    @property
    def inst_data(self) -> Any:
        return self._inst_data

    @classmethod
    def config_type(cls) -> dict[str, Any]:
        return {
            "socket_dir": dg.Field(dg.Noneable(dg.StringSource), is_required=False, default_value=None,
                                   description="Folder of the fork server's socket (default: under DAGSTER_HOME)."),
            "kill_grace_seconds": dg.Field(int, is_required=False, default_value=10,
                                           description="SIGTERM to SIGKILL on terminate."),
            "start_timeout_seconds": dg.Field(int, is_required=False, default_value=120,
                                              description="Longest wait for a new fork server's first launch."),
        }

    @classmethod
    def from_config_value(cls, inst_data: Any, config_value: dict[str, Any]) -> WarmRunLauncher:
        return cls(inst_data=inst_data, **config_value)

    # -- where the fork server listens --

    def socket_path(self) -> Path:
        folder = Path(self._socket_dir) if self._socket_dir else Path(self._instance.root_directory) / "warm_launcher"
        path = folder / "fork.sock"
        if len(str(path)) > SOCKET_PATH_MAX:
            import hashlib

            digest = hashlib.sha256(str(folder.resolve()).encode()).hexdigest()[:16]
            path = Path(tempfile.gettempdir()) / f"kbindex-warm-{os.getuid()}-{digest}" / "fork.sock"
        path.parent.mkdir(parents=True, exist_ok=True)
        os.chmod(path.parent, 0o700)
        return path

    def _request(self, message: dict[str, Any], timeout: float) -> dict[str, Any]:
        return request(self.socket_path(), message, timeout)

    def _ensure_server(self) -> None:
        """Connect to the fork server, or start one (one starter at a time: a lock file beside the socket)."""
        path = self.socket_path()
        for proc in list(self._servers):  # reap fork servers of ours that exited
            if proc.poll() is not None:
                self._servers.remove(proc)
        with open(path.parent / "start.lock", "a+") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                request(path, {"op": "ping"}, 5)
                return
            except TimeoutError:  # alive but busy (warming up, reporting an exit): the launch waits its turn
                return
            except OSError:  # no socket, or nobody listening on it
                pass
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            proc = subprocess.Popen([sys.executable, "-m", "pipelines.warm_launcher", str(path)],
                                    stdin=subprocess.DEVNULL, env={**os.environ, PROCESS_NAME_ENV: "fork-server"})
            self._servers.append(proc)
            deadline = time.monotonic() + self.start_timeout_seconds
            while True:
                try:
                    request(path, {"op": "ping"}, 5)
                    return
                except TimeoutError:  # it accepted the connection: started, busy warming up
                    return
                except OSError:
                    if proc.poll() is not None:
                        raise dg.DagsterError(f"the warm fork server exited with {proc.returncode}") from None
                    if time.monotonic() > deadline:
                        raise dg.DagsterError("the warm fork server did not start") from None
                    time.sleep(0.05)

    def launch_run(self, context: Any) -> None:
        run = context.dagster_run
        origin = run.job_code_origin
        if origin is None:
            raise dg.DagsterInvariantViolationError(f"run {run.run_id} has no job code origin to load")
        message = {"op": "launch", "run_id": run.run_id, "instance_ref": dg.serialize_value(self._instance.get_ref()),
                   "origin": dg.serialize_value(origin)}
        for _ in range(3):  # a fork server that saw the code change says so and goes; the next one is fresh
            self._ensure_server()
            reply = self._request(message, self.start_timeout_seconds)
            if reply.get("stale"):
                continue
            if "pid" not in reply:
                raise dg.DagsterError(f"the warm fork server could not launch run {run.run_id}: {reply.get('error')}")
            return
        raise dg.DagsterError("the warm fork server kept reporting changed code")

    def _worker(self, run: dg.DagsterRun) -> tuple[int, int | None] | None:
        tags = run.tags
        if PID_TAG not in tags or tags.get(HOST_TAG) != socket.gethostname():
            return None
        start = tags.get(START_TAG)
        return int(tags[PID_TAG]), int(start) if start else None

    def terminate(self, run_id: str) -> bool:
        if not self.has_instance:
            return False
        run = self._instance.get_run_by_id(run_id)
        if run is None or run.is_finished:
            return False
        self._instance.report_run_canceling(run)
        worker = self._worker(run)
        if worker is None:
            self._instance.report_engine_event("No run worker process recorded on this host to terminate.",
                                               run, cls=self.__class__)
            return False
        pid, start = worker
        try:
            reply = self._request({"op": "terminate", "pid": pid, "start": start,
                                   "grace": self.kill_grace_seconds}, 10)
            if reply.get("ok"):
                return True
        except OSError:
            pass
        # No fork server (it died or was stopped), or the worker is not its child: signal it here.
        if not _alive(pid, start):
            return False
        stopped = (process_state(pid) or ("?", 0))[0] == "T"
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL if stopped else signal.SIGTERM)
        return True

    @property
    def supports_check_run_worker_health(self) -> bool:
        return True

    def check_run_worker_health(self, run: dg.DagsterRun) -> Any:
        worker = self._worker(run)
        if worker is None:
            return _api.CheckRunHealthResult(_api.WorkerStatus.RUNNING, "no run worker recorded on this host")
        pid, start = worker
        if _alive(pid, start):
            return _api.CheckRunHealthResult(_api.WorkerStatus.RUNNING, run_worker_id=str(pid))
        return _api.CheckRunHealthResult(_api.WorkerStatus.FAILED, f"run worker process {pid} is gone",
                                         run_worker_id=str(pid))

    def launch_was_lost(self, run: dg.DagsterRun) -> bool:
        """Whether ``run``, left STARTING, has no run process and never will get one.

        So when no worker recorded itself on the run and the fork server on this host never forked one for
        it: the launch failed before the fork (or never reached the server) and Dagster could not record the
        failure, as when PostgreSQL went away just as the run was dequeued. Such a run would hold its queue
        place until run monitoring's start timeout. False when in doubt (the server busy past 10 s).
        """
        if PID_TAG in run.tags:
            return False
        try:
            return not self._request({"op": "knows", "run_id": run.run_id}, 10).get("known", True)
        except TimeoutError:
            return False
        except OSError:  # no fork server listening: none that forked it here is taking launches
            return True

    def get_run_worker_debug_info(self, run: dg.DagsterRun, include_container_logs: bool | None = True) -> str | None:
        worker = self._worker(run)
        return None if worker is None else f"run worker pid {worker[0]} (fork server {run.tags.get(SERVER_TAG)})"


def request(path: Path, message: dict[str, Any], timeout: float) -> dict[str, Any]:
    """One JSON line to the fork server at ``path`` and its one-line answer (OSError if it is not there)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(timeout)
        conn.connect(str(path))
        conn.sendall(json.dumps(message).encode() + b"\n")
        data = b""
        while not data.endswith(b"\n"):
            chunk = conn.recv(65536)
            if not chunk:
                raise ConnectionError("the fork server closed the connection without an answer")
            data += chunk
    return json.loads(data)


# --- the fork server -----------------------------------------------------------------------------

class ForkServer:
    """Accepts launch/terminate requests on a Unix socket (owner only); forks one child per run; reaps them."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.started = time.time()
        self.parent = os.getppid()
        self.children: dict[int, tuple[str, str]] = {}  # pid -> (run id, serialized instance ref)
        self.kill_at: dict[int, float] = {}
        self.unreported: dict[int, tuple[str, str, int]] = {}  # exits PostgreSQL could not take yet
        self.next_report = 0.0
        self.warm: set[str] = set()
        self.launched: dict[str, None] = {}  # run ids forked, oldest first (LAUNCHES_REMEMBERED newest)
        self.accepting = True
        self.stop_requested = False
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)
        try:
            self.listener.bind(str(path))
        finally:
            os.umask(old)
        os.chmod(path, 0o600)
        self.inode = os.stat(path).st_ino
        self.listener.listen(64)
        self.selector = selectors.DefaultSelector()
        self.selector.register(self.listener, selectors.EVENT_READ)

    def serve(self) -> None:
        signal.signal(signal.SIGTERM, self._on_term)
        while True:
            if self.accepting and (self.stop_requested or os.getppid() != self.parent):
                self._stop_accepting()
            if not self.accepting and not self.children:
                self._retry_reports()  # a last try for exits PostgreSQL could not take
                return
            for _key, _ in self.selector.select(timeout=0.2) if self.accepting else []:
                self._accept()
            if not self.accepting:
                time.sleep(0.2)
            self._reap()
            self._escalate()
            self._retry_reports()

    def _on_term(self, *_: object) -> None:
        self.stop_requested = True

    def _stop_accepting(self) -> None:
        """Unlink our socket (a new launcher then starts a fresh server) and finish the runs we have."""
        self.accepting = False
        if self.stop_requested:  # shutting down: the runs get the launcher's grace, then SIGKILL
            deadline = time.monotonic() + STOP_GRACE_SECONDS
            for pid in self.children:
                self.kill_at.setdefault(pid, deadline)
        self.selector.unregister(self.listener)
        self.listener.close()
        with contextlib.suppress(OSError):
            if os.stat(self.path).st_ino == self.inode:
                self.path.unlink()

    def _accept(self) -> None:
        """Answer one request. The server outlives every client: one that went away before its answer (its own
        timeout ran out while this server was busy, e.g. recording an exit over a slow link) or that sends
        nothing in time loses only its answer. Such a client once killed the server (BrokenPipeError on the
        answer), and with it the launch waiting behind it in the backlog."""
        try:
            conn, _ = self.listener.accept()
        except OSError:
            return
        with conn:
            try:
                data = self._read_request(conn)
            except OSError:
                return
            if data is None:
                return
            try:
                message = json.loads(data)
                reply = getattr(self, "_op_" + message["op"])(message, conn)
            except Exception as exc:  # noqa: BLE001 - answered to the launcher, which raises it
                reply = {"error": f"{type(exc).__name__}: {exc}"}
            if reply is not None:
                try:
                    conn.sendall(json.dumps(reply).encode() + b"\n")
                except OSError as exc:
                    print(f"warm launcher: a client left before its answer ({type(exc).__name__}): {reply}",
                          file=sys.stderr)

    @staticmethod
    def _read_request(conn: socket.socket) -> bytes | None:
        """The request line of a client of this user, or None (another user's, or closed before a full line)."""
        conn.settimeout(10)
        uid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))[1]
        if uid != os.getuid():
            return None
        data = b""
        while not data.endswith(b"\n"):
            chunk = conn.recv(65536)
            if not chunk:
                return None
            data += chunk
        return data

    def _op_ping(self, message: dict[str, Any], conn: socket.socket) -> dict[str, Any]:
        return {"pid": os.getpid(), "children": len(self.children)}

    def _op_launch(self, message: dict[str, Any], conn: socket.socket) -> dict[str, Any] | None:
        if self._code_changed():
            self._stop_accepting()  # the next launcher starts a fresh server; our runs finish here
            return {"stale": True}
        ref, origin = message["instance_ref"], message["origin"]
        if origin not in self.warm:
            self._warm_up(ref, origin)
            self.warm.add(origin)
        pid = os.fork()
        if pid == 0:  # the run's process
            try:
                conn.close()
                self.listener.close()
            finally:
                run_child(message["run_id"], ref)  # never returns
        self.children[pid] = (message["run_id"], ref)
        self.launched[message["run_id"]] = None
        while len(self.launched) > LAUNCHES_REMEMBERED:
            del self.launched[next(iter(self.launched))]
        return {"pid": pid}

    def _op_knows(self, message: dict[str, Any], conn: socket.socket) -> dict[str, Any]:
        return {"known": message["run_id"] in self.launched}

    def _op_terminate(self, message: dict[str, Any], conn: socket.socket) -> dict[str, Any]:
        pid = int(message["pid"])
        if pid not in self.children or not _alive(pid, message.get("start")):
            return {"ok": False}
        stopped = (process_state(pid) or ("?", 0))[0] == "T"
        os.kill(pid, signal.SIGKILL if stopped else signal.SIGTERM)  # a stopped process cannot handle SIGTERM
        self.kill_at.setdefault(pid, time.monotonic() + float(message.get("grace", 10)))
        return {"ok": True}

    def _warm_up(self, ref: str, origin: str) -> None:
        """Import what a run needs and build an instance once, then close it: no connection stays open."""
        with dg.DagsterInstance.from_ref(dg.deserialize_value(ref)):
            pass
        dagster_private.warm_run_command()
        try:
            dagster_private.warm_definitions(dg.deserialize_value(origin))
        except Exception:  # noqa: BLE001 - the child loads (and reports) the definitions itself
            traceback.print_exc()

    def _code_changed(self) -> bool:
        """Whether a loaded module's file outside the Python installation changed since we started."""
        installed = tuple({sys.prefix, sys.base_prefix, sys.exec_prefix})
        for module in list(sys.modules.values()):
            file = getattr(module, "__file__", None)
            if not file or file.startswith(installed) or "site-packages" in file:
                continue
            try:
                if os.stat(file).st_mtime > self.started:
                    return True
            except OSError:
                continue
        return False

    def _escalate(self) -> None:
        now = time.monotonic()
        for pid, at in list(self.kill_at.items()):
            if pid not in self.children:
                del self.kill_at[pid]
            elif now >= at:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
                del self.kill_at[pid]

    def _reap(self) -> None:
        while self.children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid not in self.children:
                continue
            run_id, ref = self.children.pop(pid)
            self.kill_at.pop(pid, None)
            self.unreported[pid] = (run_id, ref, status)
        self._retry_reports(force=True)

    def _retry_reports(self, force: bool = False) -> None:
        """Report exits not yet recorded, every REPORT_RETRY_SECONDS: one that failed (PostgreSQL away) is tried
        again, since run monitoring cannot rescue a run that never left STARTING."""
        if not self.unreported or (not force and time.monotonic() < self.next_report):
            return
        self.next_report = time.monotonic() + REPORT_RETRY_SECONDS
        for pid, (run_id, ref, status) in list(self.unreported.items()):
            try:
                _report_exit(run_id, ref, pid, status)
            except Exception as exc:  # noqa: BLE001 - kept and tried again
                print(f"warm launcher: could not record the exit of run {run_id} yet ({type(exc).__name__}: {exc})",
                      file=sys.stderr)
            else:
                del self.unreported[pid]


def _report_exit(run_id: str, ref: str, pid: int, status: int) -> None:
    """As the code server does for its run processes: a run not finished when its process ended crashed."""
    how = (f"was killed by signal {os.WTERMSIG(status)}" if os.WIFSIGNALED(status)
           else f"exited with code {os.WEXITSTATUS(status)}")
    with dg.DagsterInstance.from_ref(dg.deserialize_value(ref)) as instance:
        run = instance.get_run_by_id(run_id)
        if run is not None and not run.is_finished:
            _report_unfinished(instance, run, pid, how)


def _report_unfinished(instance: dg.DagsterInstance, run: dg.DagsterRun, pid: int, how: str) -> None:
    message = f"Run execution process for {run.run_id} (pid {pid}, forked by the warm run launcher) {how}."
    instance.report_engine_event(message, run, cls=WarmRunLauncher)
    if run.status == dg.DagsterRunStatus.CANCELING:
        instance.report_run_canceled(run, message=message)
    else:
        instance.report_run_failed(run, message)


def run_child(run_id: str, ref: str) -> None:
    """The forked run process: its own instance, the run as ``dagster api execute_run`` runs it, exit."""
    code = 1
    try:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        os.environ[PROCESS_NAME_ENV] = "run"  # its storage connections' application_name
        with dg.DagsterInstance.from_ref(dg.deserialize_value(ref)) as instance:
            state = process_state(os.getpid())
            instance.add_run_tags(run_id, {PID_TAG: str(os.getpid()), START_TAG: str(state[1] if state else ""),
                                           HOST_TAG: socket.gethostname(), SERVER_TAG: str(os.getppid())})
            code = dagster_private.execute_run_here(run_id, instance)
    except BaseException:  # noqa: BLE001 - whatever happened, this process must not return into the server
        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def main(argv: list[str]) -> None:
    server = ForkServer(Path(argv[0]))
    server.serve()


if __name__ == "__main__":
    from pipelines.warm_launcher import main as _main  # one copy of this module's classes, not a __main__ twin

    _main(sys.argv[1:])
