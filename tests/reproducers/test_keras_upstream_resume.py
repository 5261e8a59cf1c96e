"""The upstream write-up of the BackupAndRestore resume (docs/keras-backup-resume.md) holds:
its reproducer shows the bug with the installed Keras, is fixed by mwhelpers' mend, and is fixed
by the patch applied to a copy of the installed Keras, whose own-style test passes too.
Applying the patch needs GNU patch: without it those tests skip, except under CI=true."""

import pytest
from conftest import ROOT
from test_keras_upstream import KERAS_DIR
from upstream import patch_of_tests, patched_copy, run_module, run_script

HERE = ROOT / "docs" / "keras-backup-resume"
REPRO, PATCH = HERE / "repro.py", HERE / "backup_and_restore.patch"
pytestmark = [pytest.mark.skipif(KERAS_DIR is None, reason="no Keras 3")]


def repro(*args, path=None):
    return run_script(REPRO, *args, path=path, root=ROOT, timeout=200)


@pytest.fixture(scope="module")
def patched(tmp_path_factory):
    return patched_copy(tmp_path_factory, KERAS_DIR, PATCH, "resume-keras")


def test_the_installed_keras_runs_the_restored_epoch_again():
    code, out = repro()
    assert code == 1 and "BUG PRESENT" in out and "steps 13 to 28" in out, out


def test_the_mend_resumes_after_the_backups_batch():
    code, out = repro("--with-mwhelpers")
    assert code == 0 and "FIXED" in out and "steps 13 to 24" in out, out
    assert "BackupAndRestore: epoch 1 resumes after its first 4 batches" in out


MODULE = "src/callbacks/backup_and_restore_test.py"  # Keras's own, with the patch's tests


def test_the_patch_resumes(patched):
    """(Keras's tests on the patched copy, the new ones included, run in
    tests/reproducers/test_keras_lane.py, on TensorFlow and JAX.)"""
    code, out = repro(path=patched)
    assert code == 0 and "FIXED" in out, out


def test_the_keras_tests_fail_without_the_patch(tmp_path_factory, tmp_path):
    """Keras's tests as the patch leaves them, on Keras as released: the resumed fits begin at
    the restored epoch's first batch (9 new tests and the changed ``test_best_case_step``
    fail; the guard that only the restored epoch skips batches passes there)."""
    tests = patch_of_tests(PATCH, tmp_path)
    unpatched = patched_copy(tmp_path_factory, KERAS_DIR, tests, "resume-keras-unpatched")
    code, out = run_module(unpatched, MODULE, tmp_path)
    assert code == 1 and "10 failed, 7 passed" in out, out
