"""A one-asset job for tests/acceptance/test_warm_launcher.py and bench/launcher.py: records its process at its
first step (pid, parent, wall clock, the process's own CPU seconds so far) and can wait for a file."""

import json
import os
import time
from pathlib import Path

import dagster as dg


@dg.asset(config_schema={"out": str, "block": dg.Field(bool, default_value=False)})
def warm_probe(context: dg.AssetExecutionContext) -> int:
    """Writes {pid, ppid, wall, cpu} to OUT/<run id>.json; with ``block`` it then waits (up to 120 s) for OUT/release."""
    times = os.times()
    out = Path(context.op_config["out"])
    (out / f"{context.run_id}.json").write_text(json.dumps({
        "pid": os.getpid(), "ppid": os.getppid(), "wall": time.time(), "cpu": times.user + times.system}))
    deadline = time.monotonic() + 120
    while context.op_config["block"] and not (out / "release").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return os.getpid()


warm_job = dg.define_asset_job("warm_job", selection=[warm_probe], executor_def=dg.in_process_executor)
defs = dg.Definitions(assets=[warm_probe], jobs=[warm_job])
