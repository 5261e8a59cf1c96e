"""How a task's program ended, written by the task itself (mwhelpers/taskside/_bootstrap.py)
beside its log, and read first by the failure, the diagnosis and the timeline
(mwhelpers/exitrecord.py).  Real tasks, locally, forked from a warm-start server, and through
the agent that SSH and Slurm tasks run under.

Here: the tests of test_exitrecord that need TensorFlow; the module's text and its other tests
are in processes/test_exitrecord.py."""

import pytest
from test_exitrecord import failed

from mwhelpers.failures import PROGRAM_ERROR


@pytest.mark.parametrize("warm", ["1", "0"], ids=["warm", "cold"])
def test_warm_and_cold_tasks_write_it(rt, monkeypatch, warm):
    monkeypatch.setenv("MWHELPERS_WARM_START", warm)
    err, run = failed(rt, "import tensorflow\nraise ValueError('after the import')\n")
    assert run.process.warm is (warm == "1")
    record = run.exit_record
    assert record.summary == "ValueError: after the import" and record.pid == run.pid
    assert err.root_cause.kind == PROGRAM_ERROR and "raised ValueError" in err.root_cause.reason
