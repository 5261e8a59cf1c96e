"""Diagnosis rules on logs recorded from real failed jobs (tests/recorded/), without TensorFlow.

Each log is a real task's whole log, kept as it was written (tests/recorded/README.md says how
each was made); the rule reads it the way a failure record carries it (its last lines) and must
name the mistake.  Where a rule also reads how the task was launched, a real task without
TensorFlow writes the recorded log as its output.  One case of each mistake made for real, end
to end, is in tests/tf/test_diagnosis.py (Keras 3's unmended fit: notebook 03, run by
tests/kernels/test_notebooks.py).
"""

import pytest
from conftest import ROOT

from mwhelpers.diagnosis import explain_failure
from mwhelpers.failures import Failure, WorkerFailed
from mwhelpers.logs import TAIL, tail_lines

RECORDED = ROOT / "tests" / "recorded"


def failure_of(name, task="worker:1"):
    """The failure record of a task that exited 1 with the recorded log ``name``."""
    path = RECORDED / name
    return Failure(task=task, pid=1, returncode=1, exit="exit code 1", note="", ended_at=0.0,
                   uptime=3.0, log_path=str(path), tail=tail_lines(path, 200)[-TAIL:])


SAME_PROGRAM = "run the same program with the same model, epochs and steps_per_epoch on every task"
PATHS = "they ran different steps, epochs, models or code paths"
HOW_MANY = ("they did not agree on how many devices take part in it (under "
            "MultiWorkerMirroredStrategy: the number of workers times each one's GPUs)")
SAME_GPUS = "give every task the same number of GPUs (%cluster --gpus-per-task"
ONE_SENDER = "let exactly one task send each broadcast"


@pytest.mark.parametrize("log, what, why, advice", [
    # Keras 3 fit, steps_per_epoch 3 on worker 0 and 5 on worker 1 (issue 28): worker 0 reduced
    # a scalar at the end of its epoch while worker 1 all-reduced its gradients (5 values)
    ("collective-steps.log", "collective instance 114 had shape [] on worker:0 and [5] on another "
     "task", "they ran different steps, epochs, models, batch sizes or code paths",
     "give every task batches of the same size"),
    # worker 1 all-reduced a vector of 178 where worker 0 all-reduced a scalar
    ("collective-shape.log", "collective instance 100 had shape [178] on worker:1 and [1] on "
     "another task", "they ran different steps, epochs, models, batch sizes or code paths",
     SAME_PROGRAM),
    # worker 1 all-reduced a float64 where worker 0 all-reduced a float32
    ("collective-dtype.log", "collective instance 100 had data type float32 on one task and "
     "float64 on another", PATHS, SAME_PROGRAM),
    # worker 1 gathered (its first collective: the shapes, int32) where worker 0 all-reduced
    ("collective-kind.log", "collective instance 100 was an all-reduce of float32 on one task and "
     "an all-gather of int32 on another", PATHS, SAME_PROGRAM),
    ("collective-group-size.log", "worker:1 joined collective group 500 as a group of 3 devices, "
     "which another task had made a group of 2", HOW_MANY, SAME_GPUS),
    ("collective-group-full.log", "worker:1 asked to join collective group 500, which was already "
     "full: the tasks that joined first had made it a group of fewer devices", HOW_MANY,
     SAME_GPUS),
    ("collective-no-sender.log", "collective instance 1 was a broadcast that its 2 devices all "
     "waited to receive and none sent", PATHS, ONE_SENDER),
    ("collective-two-senders.log", "collective instance 1 was a broadcast sent by two devices, "
     "ranks 0 and 1", PATHS, ONE_SENDER),
])
def test_collectives_that_differ_between_tasks(log, what, why, advice):
    (finding,) = explain_failure([failure_of(log)])
    assert finding.key == "collectives-differ"
    assert finding.cause == f"the tasks did not run the same collective at the same point ({what}): {why}"
    assert advice in finding.advice


def test_a_collective_that_timed_out_is_not_called_a_mismatch():
    """Instance keys that differ never meet: the tasks wait until a timeout, which a slow or
    stuck peer gives too, so it says nothing certain."""
    assert explain_failure([failure_of("collective-timeout.log", task="worker:0")]) == []


def test_a_log_without_the_evidence_gets_no_finding(tmp_path):
    path = tmp_path / "other.log"
    path.write_text("Traceback (most recent call last):\nValueError: something else\n")
    f = Failure(task="worker:0", pid=1, returncode=1, exit="exit code 1", note="", ended_at=0.0,
                uptime=1.0, log_path=str(path), tail=tail_lines(path))
    assert explain_failure([f]) == []


def test_steps_per_execution_above_one():
    """Keras 3.15 fit with compile(steps_per_execution=2) on two MWMS workers (mended), as
    recorded: its several-steps loop fails on a placeholder."""
    (finding,) = explain_failure([failure_of("steps-per-execution.log", task="worker:0")])
    assert finding.key == "steps-per-execution"
    assert finding.cause.startswith("worker:0 ran Keras fit with steps_per_execution > 1 under a "
                                    "multi-replica strategy")
    assert finding.advice == "compile with steps_per_execution=1 (the default) for a distributed fit"


KERAS3_MEANS = ("worker:{n} ran model.fit under MultiWorkerMirroredStrategy with Keras 3{used} "
                "unmended, which fails this way (keras-team/keras#20585); ")


def test_keras3_fit_unmended_started_elsewhere():
    """The log of a task that ran Keras 3 fit unmended, read without its run (its last lines
    only, without the line that names its Keras): a program mwhelpers did not start, or that
    did not get the fix."""
    (finding,) = explain_failure([failure_of("keras3-fit-unmended.log")])
    assert finding.key == "keras3-fit"
    assert finding.cause == KERAS3_MEANS.format(n=1, used="") + (
        "the program was not started by mwhelpers or did not get its fix; call "
        "mwhelpers.fix_keras_multi_worker() before fit")
    assert "leave mwhelpers' Keras fix on" in finding.advice
    assert "TF_USE_LEGACY_KERAS=1" in finding.advice


# A task that writes a recorded log as its own output and fails: a real run for the rules that
# read more than the log (how the task was launched), without TensorFlow.
REPLAY = "import os, sys\nsys.stdout.write(open(os.environ['RECORDED']).read())\nsys.exit(1)\n"


def test_keras3_fit_unmended_with_the_fix_turned_off(rt):
    rt.define_cluster(1)
    rt.launch("worker:0", code=REPLAY, background=True, ready="start", keras_fix=False,
              env={"RECORDED": str(RECORDED / "keras3-fit-unmended.log")})
    with pytest.raises(WorkerFailed) as err:
        rt.wait(timeout=30)
    assert [d["key"] for d in err.value.diagnosis] == ["keras3-fit"]
    text = str(err.value).splitlines()
    assert text[0] == "worker:0 failed: exit code 1"  # the root cause first
    assert text[1] == "What this means: " + KERAS3_MEANS.format(n=0, used=" (Keras 3.15.1)") + (
        "mwhelpers' fix was turned off for it (MWHELPERS_KERAS_FIX=0 or --no-keras-fix)")
    assert text[2].startswith("What to do: leave mwhelpers' Keras fix on")
    assert "Attempt to convert a value (PerReplica" in str(err.value)
