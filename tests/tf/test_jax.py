"""Keras 3 on JAX across processes (keras.distribution), launched by mwhelpers.

Real processes through the magics: two processes train as one (tests/programs/jax_train.py),
and the ways such a job goes wrong are named plainly (a process that never joins, a coordinator
that never comes up, its port taken).  The look before launch reads programs, not runs them.

The tests described here that need more than this folder gives are in inprocess/test_jax_plain.py."""

import importlib.util
import json
import os
import socket
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
from conftest import ROOT, pid_alive, results

from mwhelpers.errors import WorkerTimeout
from mwhelpers.failures import WorkerFailed
from mwhelpers.ports import reserve_ports
from mwhelpers.precheck import check

PROGRAMS = ROOT / "tests" / "programs"
HAVE_JAX = importlib.util.find_spec("jax") is not None
needs_jax = pytest.mark.skipif(
    not HAVE_JAX and os.environ.get("CI") != "true",
    reason="jax is not installed (the tutorials' lock, requirements/tutorials.txt, has it)")

# The least a JAX process does: Keras on JAX, keras.distribution.initialize() from mwhelpers'
# variables, one line once every process has joined.
JOIN = textwrap.dedent("""
    import os
    os.environ.setdefault("KERAS_BACKEND", "jax")
    import keras
    keras.distribution.initialize()
    import jax
    print("joined", jax.process_index(), jax.process_count(), flush=True)
""")
FACTS = "this task: "


@pytest.fixture
def jax_env(monkeypatch):
    monkeypatch.setenv("KERAS_BACKEND", "jax")
    monkeypatch.delenv("TF_USE_LEGACY_KERAS", raising=False)


def keys(diagnosis):
    return [d["key"] for d in diagnosis]


@needs_jax
def test_two_jax_processes_train_like_one(ip, rt, jax_env, tmp_path, capsys):
    # One process alone on the same global batches, at the same time (its own coordinator, on a
    # port reserved as the extension reserves its tasks' ports: not one picked and closed).
    [held] = reserve_ports(1)
    alone_port = held.port
    env = {**os.environ, "KERAS_DISTRIBUTION_JOB_ADDRESSES": f"localhost:{alone_port}",
           "KERAS_DISTRIBUTION_NUM_PROCESSES": "1", "KERAS_DISTRIBUTION_PROCESS_ID": "0",
           "JAX_CPU_COLLECTIVES_IMPLEMENTATION": "gloo"}
    program = [str(PROGRAMS / "jax_train.py"), "--epochs", "2", "--steps", "4"]
    alone = subprocess.Popen([sys.executable, *program], env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
    try:
        ip.run_line_magic("cluster", "2")
        shown = capsys.readouterr().out + rt.echo_lines.text + repr(rt.cluster)
        ports = [rt.cluster.port(f"worker:{i}") for i in (0, 1)]
        assert (f"KERAS_DISTRIBUTION_JOB_ADDRESSES=localhost:{ports[0]},localhost:{ports[1]}, "
                "KERAS_DISTRIBUTION_NUM_PROCESSES=2, KERAS_DISTRIBUTION_PROCESS_ID=0 on "
                "worker:0, 1 on worker:1") in shown
        ip.run_line_magic("worker", f"all --bg {' '.join(program)}")
        # worker:0 is ready when JAX's coordinator opens its port; worker:1 opens none.
        assert any(ln.startswith("[worker:1] started in the background") for ln in rt.echo_lines)
        ip.run_line_magic("waitworkers", "--timeout 150")
        out, _ = alone.communicate(timeout=150)
    finally:
        if alone.poll() is None:
            alone.kill()
            alone.wait()
        held.release()
    assert alone.returncode == 0, out
    single = json.loads([ln for ln in out.splitlines() if ln.startswith("RESULT ")][-1][7:])
    assert not [ln for ln in rt.echo_lines if ln.startswith("[mwhelpers] warning")]
    res = results(rt)
    assert [res[t]["process"] for t in ("worker:0", "worker:1")] == [0, 1]
    for r in res.values():
        assert r["processes"] == 2 and r["devices"] == 2
        assert r["loss"][-1] < r["loss"][0]
        assert r["weights"] == res["worker:0"]["weights"]  # one model on both
        for mine, theirs in zip(r["weights"], single["weights"], strict=True):
            assert np.ravel(mine) == pytest.approx(np.ravel(theirs), rel=1e-4, abs=1e-6)
    for run in rt.runs.values():
        lines = run.lines()
        (facts,) = [ln for ln in lines if FACTS in ln]
        assert "with Keras 3.15.1 on JAX " in facts, facts
        # The TensorFlow-only mends stay silent on JAX; what it says is for JAX (gloo's address).
        assert run.process.warm  # KERAS_BACKEND set in the program: its server imported with it
        said = [ln for ln in lines if ln.startswith("[mwhelpers]") and FACTS not in ln
                and "matplotlib" not in ln and "warm start:" not in ln]
        assert len(said) == 1 and said[0].startswith("[mwhelpers] JAX's gloo collectives listen "
                                                     "on "), said
    timeline = rt.timeline()
    assert {str(r.task) for r in timeline.runs} == {"worker:0", "worker:1"}


@needs_jax
def test_a_missing_process_and_a_missing_coordinator_are_named(ip, rt, jax_env, write):
    write("join.py", JOIN)
    ip.run_line_magic("cluster", "2")
    # Process 1 alone: it waits for JAX's coordinator, which worker:0 never starts.
    ip.run_line_magic("worker", "1 --bg join.py")  # ready at once: it opens no port
    # Keras imported (mwhelpers' matplotlib line), then into jax.distributed.initialize
    rt.wait_for_line("worker:1", "matplotlib is imported", timeout=90)
    time.sleep(3)
    with pytest.raises(WorkerTimeout) as err:
        ip.run_line_magic("waitworkers", "--timeout 3")
    assert keys(err.value.diagnosis) == ["jax-coordinator-missing"]
    text = str(err.value)
    assert ("What this means: worker:1 waited in jax.distributed.initialize to reach JAX's "
            "coordinator, which process 0 (worker:0) starts on its port, and worker:0 was never "
            "launched") in text
    assert "worker:1 was inside JAX, called from join.py line 5: " \
           "keras.distribution.initialize()" in text
    assert "TensorFlow server" not in text and "TF_CONFIG" not in text
    # The coordinator alone: it waits for process 1.
    ip.run_line_magic("worker", "0 --bg join.py")  # ready once the coordinator listens
    time.sleep(1)
    with pytest.raises(WorkerTimeout) as err:
        ip.run_line_magic("waitworkers", "--timeout 3")
    assert keys(err.value.diagnosis) == ["jax-process-missing"]
    assert ("What this means: worker:0 is JAX's coordinator (keras.distribution process 0 of 2) "
            "and waited in jax.distributed.initialize for process 1 (worker:1), which was "
            "never launched or ended before it connected") in str(err.value)


@needs_jax
def test_the_coordinators_port_taken_is_named(ip, rt, jax_env, write, tmp_path):
    # Each process waits for the file "go" before it joins: a warm start reaches JAX's listen
    # within milliseconds of its launch.
    write("join.py", JOIN.replace("import keras\n", "import keras\nimport time\n"
                                  "while not os.path.exists('go'):\n    time.sleep(0.05)\n"))
    ip.run_line_magic("cluster", "2")
    port = rt.cluster.port("worker:0")
    ip.run_line_magic("worker", "all --bg --ready start join.py")
    # Another program takes worker:0's port after its launch, before JAX listens on it.
    with socket.socket() as squatter:
        squatter.bind(("", port))
        squatter.listen()
        (tmp_path / "go").touch()
        # gRPC's line; then JAX raises "Failed to start RPC server", or (JAX 0.10.2, about two
        # runs in three here) crashes with SIGSEGV
        rt.wait_for_line("worker:0", "Failed to add port to server", timeout=90)
        assert rt.get_run("worker:0").wait(30) is not None
        ip.run_line_magic("killworker", "1")  # it would wait for its coordinator
        with pytest.raises(WorkerFailed) as err:
            ip.run_line_magic("waitworkers", "--timeout 30")
    root = err.value.failures[0]
    assert root.task == "worker:0"
    assert root.returncode == -11 or "Failed to start RPC server" in root.exit_record.message
    assert keys(root.diagnosis)[0] == "jax-port-taken"
    text = str(err.value)
    assert (f"worker:0 is process 0 of keras.distribution and could not start JAX's coordinator "
            f"on its port {port} ([::]:{port}): another socket held the port when JAX tried "
            "to listen on it") in text
    assert all(not pid_alive(r.pid) for r in rt.history)
    assert {str(r.task) for r in rt.timeline().runs} == {"worker:0", "worker:1"}


# -- the look before launch, on programs read not run -------------------------------------

CLUSTER = {"worker:0": {"KERAS_DISTRIBUTION_JOB_ADDRESSES": "localhost:2001,localhost:2002",
                        "KERAS_DISTRIBUTION_NUM_PROCESSES": "2",
                        "KERAS_DISTRIBUTION_PROCESS_ID": "0"},
           "worker:1": {"KERAS_DISTRIBUTION_JOB_ADDRESSES": "localhost:2001,localhost:2002",
                        "KERAS_DISTRIBUTION_NUM_PROCESSES": "2",
                        "KERAS_DISTRIBUTION_PROCESS_ID": "1"}}


def look(source, processes=CLUSTER):
    return check(textwrap.dedent(source), "train.py", {}, processes=processes)


def test_the_warning_reaches_the_cell_before_the_launch(ip, rt, write):
    # (it ends before it imports anything)
    write("train.py", "import sys\nsys.exit(0)\nimport keras\n"
                      "keras.distribution.initialize(process_id=0)\n")
    ip.run_line_magic("cluster", "2")
    ip.run_line_magic("worker", "all --bg --ready start train.py")
    warned = [ln for ln in rt.echo_lines if ln.startswith("[mwhelpers] warning")]
    assert len(warned) == 1 and "process_id=0, but the cluster gives worker:1 1" in warned[0]
    ip.run_line_magic("waitworkers", "--timeout 30")


@needs_jax
def test_a_killed_jax_process_is_restarted_and_resumes_at_the_backup(rt, jax_env, tmp_path):
    """A SIGKILL of process 1 right after step 13 under supervise (3 epochs of 8 steps, each
    process's own BackupAndRestore every 3 steps): every process is restarted, resumes after the
    backup of step 12 (mwhelpers/taskside/kerasresume.py, on JAX's epoch iterator too) and the
    job ends at exactly 24 steps."""
    rt.define_cluster(2)
    attempts = rt.supervise(script=str(PROGRAMS / "jax_train.py"), max_restarts=1, timeout=180,
                            stream=False,
                            args=["--epochs", "3", "--steps", "8", "--backup", str(tmp_path / "bk"),
                                  "--save-freq", "3", "--kill-at", "13",
                                  "--marker", str(tmp_path / "killed")])
    assert len(attempts) == 2 and attempts[0].restarted
    assert str(attempts[0].root_cause.task) == "worker:1"
    for run in attempts[1].runs:
        steps = [int(ln.split()[1]) for ln in run.lines() if ln.startswith("STEP ")]
        assert steps == list(range(13, 25)), steps  # after the backup of step 12, to exactly 24
        assert sum("epoch 1 resumes after its first 4 batches" in ln for ln in run.lines()) == 1
    res = results(rt)
    assert {r["iterations"] for r in res.values()} == {24}
    assert res["worker:0"]["weights"] == res["worker:1"]["weights"]
