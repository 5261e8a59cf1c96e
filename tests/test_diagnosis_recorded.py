"""Diagnosis rules on logs recorded from real failed jobs (tests/recorded/), without TensorFlow.

Each log is a real task's whole log, kept as it was written; the rule reads it the way a
failure record carries it (its last lines) and must name the mistake.  The same mistakes made
for real, end to end, are in tests/test_diagnosis.py.
"""

import pytest
from conftest import ROOT

from mwhelpers.diagnosis import explain_failure
from mwhelpers.failures import Failure
from mwhelpers.logs import TAIL, tail_lines

RECORDED = ROOT / "tests" / "recorded"


def failure_of(name, task="worker:1"):
    """The failure record of a task that exited 1 with the recorded log ``name``."""
    path = RECORDED / name
    return Failure(task=task, pid=1, returncode=1, exit="exit code 1", note="", ended_at=0.0,
                   uptime=3.0, log_path=str(path), tail=tail_lines(path, 200)[-TAIL:])


@pytest.mark.parametrize("log, what", [
    # worker 1 all-reduced a vector of 178 where worker 0 all-reduced a scalar
    ("collective-shape.log", "collective instance 100 had shape [178] there and [1] on another task"),
    # worker 1 all-reduced a float64 where worker 0 all-reduced a float32
    ("collective-dtype.log", "collective instance 100 had data type float32 on one task and "
                             "float64 on another"),
])
def test_collectives_that_differ_between_tasks(log, what):
    (finding,) = explain_failure([failure_of(log)])
    assert finding.key == "collectives-differ"
    assert finding.cause == (f"the tasks did not run the same collective at the same point "
                             f"(worker:1: {what}): they ran different steps, epochs, models or "
                             "code paths")
    assert "the same model, epochs and steps_per_epoch on every task" in finding.advice


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

