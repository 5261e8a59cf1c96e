"""The upstream write-up of Keras 3's TensorBoard under multi-worker MWMS
(docs/keras-tensorboard.md) holds: its reproducer shows every worker writing to log_dir with the
installed Keras, only the chief with mwhelpers' mend, and only the chief with the patch applied to
a copy of the installed Keras, whose own-style test passes too.  Applying the patch needs GNU
patch: without it those tests skip, except under CI=true."""

import pytest
from conftest import ROOT
from test_keras_upstream import KERAS_DIR
from upstream import keras_test, patched_copy, run_script

HERE = ROOT / "docs" / "keras-tensorboard"
REPRO, PATCH = HERE / "repro.py", HERE / "tensorboard.patch"
KERAS_TEST = HERE / "tensorboard_multi_worker_test.py"
TRAINER_PATCH = ROOT / "docs" / "keras-20585" / "trainer.patch"  # the fix the test is stacked on
FIXED = "FIXED: only the chief (worker 0) wrote to log_dir, and no workertemp folder is left"
pytestmark = [pytest.mark.skipif(KERAS_DIR is None, reason="no Keras 3")]


def repro(*args):
    return run_script(REPRO, *args, root=ROOT, timeout=200)


@pytest.fixture(scope="module")
def patched(tmp_path_factory):
    return patched_copy(tmp_path_factory, KERAS_DIR, PATCH, "tensorboard-keras")


def test_the_installed_keras_lets_both_workers_write_to_the_log_dir():
    code, out = repro()
    assert code == 1 and "BUG PRESENT" in out, out
    assert "log_dir/train: 2 event files (worker 0, worker 1)" in out, out
    assert "log_dir/validation: 2 event files (worker 0, worker 1)" in out, out


def test_the_mend_leaves_only_the_chiefs_files():
    code, out = repro("--with-mwhelpers")
    assert code == 0 and FIXED in out, out
    assert "this task writes to " in out and "workertemp_1 and deletes it" in out, out


def test_the_patch_leaves_only_the_chiefs_files(patched):
    """(Keras's tests on the patched copy, the new one included, run in
    tests/reproducers/test_keras_lane.py.)"""
    code, out = repro("--patched-keras", str(patched))
    assert code == 0 and FIXED in out and f"({patched / 'keras'})" in out, out


def test_the_patch_cleans_up_after_a_standalone_evaluate(patched):
    code, out = repro("--patched-keras", str(patched), "--then-evaluate")
    assert code == 0 and FIXED in out, out
    assert "log_dir/validation: 2 event files (worker 0, worker 0)" in out, out


def test_the_keras_test_fails_without_the_patch(tmp_path_factory, tmp_path):
    """On Keras with only the fix it is stacked on (keras-team/keras#20585: ``fit`` under
    multi-worker MWMS), the worker that is not the chief writes to log_dir too (the test passes
    with the patch in tests/reproducers/test_keras_lane.py)."""
    stacked = patched_copy(tmp_path_factory, KERAS_DIR, TRAINER_PATCH, "tensorboard-keras-base",
                           must_apply=True)
    code, out = keras_test(stacked, KERAS_TEST, "src/callbacks", tmp_path)
    assert code == 1 and "1 failed" in out and "workertemp_1" in out, out
