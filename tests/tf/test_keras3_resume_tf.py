"""Keras 3 BackupAndRestore(save_freq=N) resumes at the saved batch in every worker mwhelpers
starts (mwhelpers/taskside/kerasresume.py; docs/keras-backup-resume.md).

Here: the tests of test_keras3_resume that need TensorFlow; the module's text and its other
tests are in inprocess/test_keras3_resume.py."""

import json
import shutil
import signal

from chaos import redone, steps_of
from conftest import results
from test_keras3_resume import EPOCHS, KILL_AT, PROGRAM, SAVE_FREQ, STEPS, close, weights


def test_a_killed_worker_resumes_at_the_saved_batch(rt, tmp_path):
    """One run without a fault (the three inputs give the same batches in the same order, so
    the same weights), then one supervised run per input with the fault."""
    shutil.copy(PROGRAM, "train.py")
    rt.define_cluster(2)
    common = ["--epochs", str(EPOCHS), "--save-freq", str(SAVE_FREQ)]
    rt.launch_all(script="train.py", args=["--data", "finite", *common], timeout=120)
    plain_steps, plain = weights(rt)
    assert plain_steps == EPOCHS * STEPS
    for data in ("finite", "repeat", "function"):
        attempts = rt.supervise(
            script="train.py", max_restarts=1, timeout=120, stream=False,
            args=["--data", data, *common, "--backup", str(tmp_path / data),
                  "--kill-at", str(KILL_AT), "--kill-task", "worker:1",
                  "--marker", str(tmp_path / f"{data}.killed")])
        assert len(attempts) == 2 and attempts[0].restarted, data
        assert attempts[0].root_cause.returncode == -signal.SIGKILL
        assert str(attempts[0].root_cause.task) == "worker:1"
        final, resumed = weights(rt)
        assert final == EPOCHS * STEPS, data  # Keras 3 alone ends at 28: epoch 1 again from its start
        done = {s for a in attempts for r in a.runs for s, _ in steps_of(r)}
        assert done == set(range(1, final + 1)), data  # no step skipped
        assert redone(attempts) == [KILL_AT - 12], data  # only the steps after the newest backup
        assert [steps_of(r)[0][0] for r in attempts[1].runs] == [13, 13], data
        assert close(resumed, plain), (data, resumed, plain)  # the same batches, in the same order
        for run in attempts[1].runs:
            lines = run.lines()
            assert sum("BackupAndRestore: epoch 1 resumes after its first 4 batches" in ln
                       for ln in lines) == 1, data
            assert json.loads(next(ln for ln in reversed(lines)
                                   if ln.startswith("RESULT "))[7:])["epochs_run"] == [1, 2]
        assert not (tmp_path / data).exists()  # the backup goes once training is done


def test_without_the_mend_keras3_runs_the_epoch_again(rt, tmp_path):
    """One task, the mend off: Keras 3 restores epoch 1 and runs it from its first batch."""
    shutil.copy(PROGRAM, "train.py")
    rt.define_cluster(1)
    attempts = rt.supervise(script="train.py", max_restarts=1, timeout=120, stream=False,
                            keras_fix=False,
                            args=["--data", "repeat", "--epochs", str(EPOCHS), "--save-freq",
                                  str(SAVE_FREQ), "--backup", str(tmp_path / "bk"),
                                  "--kill-at", "7", "--kill-task", "worker:0"])
    assert len(attempts) == 2
    (result,) = results(rt).values()
    # The newest backup is of step 6 (epoch 0's 6th batch); epoch 0 runs again: 6 steps more.
    assert result["iterations"] == EPOCHS * STEPS + 6
    assert steps_of(attempts[1].runs[0])[0][0] == 7
