"""Failures explained: each mistake made for real, with a small program, through the magics.

Every test checks the report a learner reads (the cause first, then what it means and what to
do) and the structured ``diagnosis`` behind it; the control cases check that nothing is said
when the evidence is not there.
"""

import json
import os
import signal
import textwrap
import time

import pytest

from mwhelpers.errors import WorkerTimeout
from mwhelpers.failures import WorkerFailed

# A MultiWorkerMirroredStrategy fit of a tiny model with Keras 3 (mended by mwhelpers unless
# --no-keras-fix; tf_keras where the task's TF_USE_LEGACY_KERAS selects it); STEPS_<index>
# steps per epoch on each worker (4 unless set).
FIT = textwrap.dedent("""
    import json, os
    import numpy as np
    import tensorflow as tf
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    index = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
    with strategy.scope():
        model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(1)])
        model.compile("sgd", "mse")
    x, y = np.ones((64, 4), "float32"), np.ones((64, 1), "float32")
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(8).repeat()
    steps = int(os.environ.get("STEPS_%d" % index, "4"))
    model.fit(ds, epochs=2, steps_per_epoch=steps, verbose=2)
""")

# A custom loop whose every step is an all-reduce; STEPS_<index> steps on each worker.
LOOP = textwrap.dedent("""
    import json, os, time
    import tensorflow as tf
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    index = json.loads(os.environ["TF_CONFIG"])["task"]["index"]

    @tf.function
    def step():
        return strategy.reduce("SUM", strategy.run(lambda: tf.constant(1.0)), axis=None)

    def next_batch(i):
        if i == int(os.environ.get("SLOW_AT", "-1")) and index == 1:
            time.sleep(600)  # an input that never comes

    for i in range(int(os.environ["STEPS_%d" % index])):
        next_batch(i)
        print("step", i, float(step()), flush=True)
""")



def launch_both(ip, code, env0="", env1=""):
    for i, env in ((0, env0), (1, env1)):
        ip.run_cell_magic("worker", f"{i} --bg {env}".strip(), code)


def failed(ip, timeout=90):
    with pytest.raises(WorkerFailed) as err:
        ip.run_line_magic("waitworkers", f"--timeout {timeout}")
    return err.value


def keys(diagnosis):
    return [d["key"] for d in diagnosis]


def test_tasks_with_different_keras_are_named_first(ip, rt):
    # A learner selects tf_keras for one task only (and this environment, like the lock, has no
    # tf_keras at all): worker 0 cannot build its model, worker 1 loses its peer. With tf_keras
    # installed the same mistake fails in the collectives instead ("Collective instance 100
    # expected ... data_type 9 but got ... data_type 1"): the tasks' Keras differ either way.
    launch_both(ip, FIT, "--env TF_USE_LEGACY_KERAS=1", "--env TF_USE_LEGACY_KERAS=0")
    err = failed(ip)
    assert keys(err.diagnosis)[0] == "keras-differs"
    means = str(err).splitlines()[1]
    assert "worker:0: TensorFlow 2." in means and "with tf_keras (not installed)" in means
    assert "worker:1: TensorFlow 2." in means and "with Keras 3" in means
    assert "set TF_USE_LEGACY_KERAS in the kernel" in str(err).splitlines()[2]


def test_an_op_before_the_strategy_is_named_before_and_after_the_launch(ip, rt, write):
    write("prog.py", """
        import tensorflow as tf
        print(tf.constant([1.0, 2.0]) * 2)
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
    """)
    with pytest.raises(WorkerFailed) as err:  # it fails before its port opens
        ip.run_line_magic("worker", "0 --bg prog.py")
    warned = [ln for ln in rt.echo_lines if ln.startswith("[mwhelpers] warning:")]
    assert len(warned) == 1 and "prog.py line 3 runs a TensorFlow operation" in warned[0]
    assert "(prog.py line 4)" in warned[0]
    assert keys(err.value.diagnosis) == ["op-before-strategy"]
    assert "create the strategy right after importing TensorFlow" in str(err.value)


def test_workers_running_different_numbers_of_steps(ip, rt):
    launch_both(ip, LOOP, "--env STEPS_0=3 STEPS_1=8", "--env STEPS_0=3 STEPS_1=8")
    err = failed(ip)
    assert err.root_cause.task == "worker:1"
    assert keys(err.diagnosis) == ["unequal-steps"]
    means = err.diagnosis[0]["cause"]
    assert means.startswith("worker:0 finished (exit code 0)")
    assert "'step 2 2.0'" in means  # worker:0's last step line
    assert "same number of steps" in means and "steps_per_epoch" in err.diagnosis[0]["advice"]


def test_workers_whose_steps_per_epoch_differ_run_different_collectives(ip, rt):
    # The family of TensorFlow's messages for collectives that differ is tested on recorded logs
    # (test_diagnosis_recorded.py); this is the mistake of issue 28 made for real: worker:0 ends
    # its epoch after 3 steps while worker:1 trains on, and a collective meets another.
    both = "--ready start --env STEPS_0=3 STEPS_1=5"  # both import TensorFlow at once
    launch_both(ip, FIT, both, both)
    err = failed(ip)
    assert keys(err.diagnosis) == ["collectives-differ"]
    text = str(err).splitlines()
    assert text[0].startswith("worker:")  # the root cause first, then what it means
    assert text[1].startswith("What this means: the tasks did not run the same collective at the "
                              "same point (collective instance ")
    assert "they ran different steps, epochs, models" in text[1]
    assert text[2].startswith("What to do: run the same program with the same model, epochs and "
                              "steps_per_epoch on every task")


def test_a_stuck_job_names_the_task_behind_and_where(ip, rt):
    env = "--env STEPS_0=6 STEPS_1=6 SLOW_AT=2"
    launch_both(ip, LOOP, env, env)
    deadline = time.monotonic() + 60  # worker:1 logs step 1, then stops in next_batch(2)
    while not any(ln.startswith("step 1 ") for ln in rt.get_run("worker:1").lines()):
        assert time.monotonic() < deadline, rt.get_run("worker:1").lines()
        time.sleep(0.05)
    with pytest.raises(WorkerTimeout) as err:
        ip.run_line_magic("waitworkers", "--timeout 4")
    text = str(err.value)
    assert "  worker:1 was at line 13 of the cell, in next_batch: time.sleep(600)" in text
    assert "  worker:0 was inside TensorFlow, called from line 17 of the cell: " \
           "print(\"step\", i, float(step()), flush=True)" in text
    assert keys(err.value.diagnosis) == ["task-behind"]
    assert text.index("What this means: worker:1 is behind") < text.index("Last lines of")


def test_a_peer_that_never_started_is_named(ip, rt):
    ip.run_cell_magic("worker", "0 --bg --env STEPS_0=3", LOOP)
    with pytest.raises(WorkerTimeout) as err:
        ip.run_line_magic("waitworkers", "--timeout 8")
    assert keys(err.value.diagnosis) == ["peer-missing"]
    assert "What this means: worker:1 never started" in str(err.value)
    assert "  worker:0 was inside TensorFlow, called from line 4 of the cell" in str(err.value)


def test_a_module_beside_the_notebook_but_not_beside_the_script(ip, rt, write, tmp_path):
    write("helpers_of_mine.py", "VALUE = 1\n")  # what %%writefile does, in the kernel's folder
    (tmp_path / "programs").mkdir()
    write("programs/train.py", "import helpers_of_mine\nprint(helpers_of_mine.VALUE)\n")
    with pytest.raises(WorkerFailed) as err:
        ip.run_line_magic("worker", "0 programs/train.py")
    d = err.value.diagnosis
    assert keys(d) == ["module-missing"]
    assert d[0]["cause"] == (
        f"helpers_of_mine.py is in {tmp_path}, where the notebook wrote it, but worker:0 runs "
        f"{tmp_path}/programs/train.py, and Python looks for modules in the script's folder "
        f"{tmp_path}/programs (and the installed packages), not in the working directory")
    assert f"--env PYTHONPATH={tmp_path}" in d[0]["advice"]
    # Done as it says: the same script runs.
    ip.run_line_magic("worker", f"0 --env PYTHONPATH={tmp_path} programs/train.py")
    # A module that is nowhere: said so, with the folder the task looks in.
    write("programs/other.py", "import nowhere_to_be_found\n")
    with pytest.raises(WorkerFailed) as err:
        ip.run_line_magic("worker", "0 programs/other.py")
    assert "cannot import nowhere_to_be_found: there is no nowhere_to_be_found.py in its " \
           f"folder {tmp_path}/programs" in err.value.diagnosis[0]["cause"]


def test_a_sigkill_from_outside_is_told_apart_from_ours(ip, rt):
    sleeper = "import time\nprint('working', flush=True)\ntime.sleep(60)\n"
    ip.run_cell_magic("worker", "0 --bg --ready start", sleeper)
    run = rt.get_run(0)
    os.kill(run.pid, signal.SIGKILL)  # what the out-of-memory killer does
    err = failed(ip)
    assert keys(err.diagnosis) == ["foreign-sigkill"]
    assert f"worker:0 (pid {run.pid}) was killed by a SIGKILL that mwhelpers did not send" \
        in err.diagnosis[0]["cause"]
    assert f"'Out of memory: Killed process {run.pid}'" in err.diagnosis[0]["advice"]
    # The same signal sent by %killworker is ours: no such finding.
    ip.run_cell_magic("worker", "0 --bg --ready start", sleeper)
    ip.run_line_magic("killworker", "0")
    assert failed(ip).diagnosis == []


def test_an_unknown_failure_gets_no_guess(ip, rt, tmp_path):
    with pytest.raises(WorkerFailed) as err:
        ip.run_cell_magic("worker", "0", "raise ValueError('bad shapes')\n")
    assert err.value.diagnosis == []
    assert "What this means" not in str(err.value)
    # the root cause, the exception its exit record names, its log
    assert str(err.value).splitlines()[1] == "worker:0 raised ValueError: bad shapes"
    assert str(err.value).splitlines()[2].startswith("Last lines of worker:0's log")


def test_the_supervisor_records_and_writes_the_diagnosis(rt, write, tmp_path):
    write("helper_mod.py", "X = 1\n")
    (tmp_path / "progs").mkdir()
    write("progs/job.py", "import helper_mod\n")
    rt.define_cluster(2)
    with pytest.raises(WorkerFailed) as err:  # a program error: not restarted
        rt.supervise(script="progs/job.py", max_restarts=1, stream=False)
    said = [ln for ln in rt.echo_lines if ln.startswith("[mwhelpers] What this means:")]
    assert len(said) == 1 and "helper_mod.py is in" in said[0]
    assert "What this means: helper_mod.py is in" in str(err.value)
    record = json.loads((rt.log_dir / "attempt-1.root-cause.json").read_text())
    assert [d["key"] for d in record["diagnosis"]] == ["module-missing"]
    assert time.time() - record["ended_at"] < 60


def test_a_task_that_never_opens_its_port_says_where_it_was(ip, rt):
    slow = "import time\n\ndef load_data():\n    time.sleep(60)\n\nload_data()\n"
    with pytest.raises(WorkerTimeout) as err:
        ip.run_cell_magic("worker", "0 --bg --timeout 3", slow)
    assert keys(err.value.diagnosis) == ["peer-not-ready"]
    assert ("What this means: worker:0 is running but its TensorFlow server never started: it "
            "was at line 4 of the cell, in load_data: time.sleep(60)") in str(err.value)
