"""Run collectives_differ.py MODE on two real workers through mwhelpers and keep their logs.

    python tests/programs/record_collectives.py MODE OUT_DIR

The workers are started the way a notebook starts them (mwhelpers.Runtime: TF_CONFIG,
localhost ports, the Keras fix); the report a user would read is printed, and each task's
whole log is copied to OUT_DIR/MODE.worker-N.log, to be trimmed into tests/recorded/.
"""
import shutil
import sys
import tempfile
from pathlib import Path

from mwhelpers.errors import WorkerTimeout
from mwhelpers.failures import WorkerFailed
from mwhelpers.workers import Runtime

mode, out = sys.argv[1], Path(sys.argv[2])
out.mkdir(parents=True, exist_ok=True)
program = Path(__file__).with_name("collectives_differ.py")
with tempfile.TemporaryDirectory() as logs:
    rt = Runtime(log_dir=logs)
    try:
        rt.define_cluster(2)
        for i in range(2):
            rt.launch(f"worker:{i}", script=str(program), args=[mode], background=True,
                      ready="start")
        try:
            rt.wait(timeout=120, grace_after_failure=20)
            print("no failure")
        except (WorkerFailed, WorkerTimeout) as err:
            print(err)
        for task, run in sorted(rt.runs.items()):
            shutil.copy(run.log_path, out / f"{mode}.{str(task).replace(':', '-')}.log")
    finally:
        rt.end_all()
        rt.close()
