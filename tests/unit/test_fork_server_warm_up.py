"""The fork server's warm-up (pipelines/warm_launcher.py): what every run child would otherwise import itself.

A run child runs ``execute_run_here``, which imports Dagster's CLI package; imported after the fork, that cost
each run ~0.3 s of CPU (py-spy over ``bench.scale.small_docs``). The warm-up must leave it imported in the
parent. Checked in a fresh interpreter, so nothing this test process imported counts.
"""

import os
import subprocess
import sys
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import sys
import dagster as dg
from dagster._core.definitions.reconstruct import ReconstructableRepository
from pipelines.warm_launcher import ForkServer

before = "dagster._cli.api" in sys.modules
recon = ReconstructableRepository.for_module("bench.launcher_probe", "defs", working_directory=sys.argv[1])
origin = recon.get_reconstructable_job("warm_job").get_python_origin()
with dg.instance_for_test(temp_dir=sys.argv[2]) as instance:
    ForkServer._warm_up(None, dg.serialize_value(instance.get_ref()), dg.serialize_value(origin))
print(before, "dagster._cli.api" in sys.modules, "bench.launcher_probe" in sys.modules)
"""


def test_the_warm_up_imports_the_run_command_and_the_definitions(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(PROJECT_ROOT)}
    out = subprocess.run([sys.executable, "-c", SCRIPT, str(PROJECT_ROOT), str(tmp_path)], cwd=PROJECT_ROOT,
                         capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["False", "True", "True"], out.stdout + out.stderr[-3000:]
