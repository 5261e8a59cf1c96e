"""The notebooks' worker programs as a learner copies them: started by hand, two plain Python
processes with a TF_CONFIG each, no mwhelpers start-up.  Each program arms the Keras mends it
relies on with its own ``mwhelpers.fix_keras_multi_worker()`` call, so it trains there too
(keras-team/keras#20585 would stop its first ``fit``)."""

import json
import os
import subprocess
import sys

import pytest
from conftest import ROOT, notebook_programs

from mwhelpers.ports import reserve_ports


@pytest.mark.parametrize("notebook,program,args,said", [
    ("05_saving_multi_worker.ipynb", "save_demo.py", ["out", "2"], "RESULT "),
    ("06_backup_and_restore.ipynb", "train_bar.py", ["backup", "epoch", "2", "4"], "DONE "),
    ("08_evaluator_tensorboard.ipynb", "train.py", ["2", "4"], "Epoch 2/2"),
])
def test_a_notebook_program_trains_when_started_by_hand(tmp_path, notebook, program, args, said):
    for name, parts in notebook_programs(ROOT / "notebooks" / notebook).items():
        (tmp_path / name).write_text("".join(parts))
    held = reserve_ports(2)  # a file lock each, kept until the workers end: no other test takes them
    workers = [f"localhost:{r.port}" for r in held]
    env = {k: v for k, v in os.environ.items() if not k.startswith("MWHELPERS_")}
    env.update(PYTHONPATH=str(ROOT), CUDA_VISIBLE_DEVICES="", TF_CPP_MIN_LOG_LEVEL="2")
    procs, logs = [], []
    try:
        for index in (0, 1):
            log = open(tmp_path / f"worker_{index}.log", "w")
            logs.append(log)
            config = {"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}}
            procs.append(subprocess.Popen(
                [sys.executable, program, *args], cwd=tmp_path, stdout=log,
                stderr=subprocess.STDOUT, env={**env, "TF_CONFIG": json.dumps(config)}))
        codes = [p.wait(timeout=240) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        for log in logs:
            log.close()
        for r in held:
            r.release()
    texts = [(tmp_path / f"worker_{i}.log").read_text() for i in (0, 1)]
    assert codes == [0, 0], texts
    for text in texts:
        assert "fit and evaluate mended for multi-worker" in text, text
        assert said in text, text
