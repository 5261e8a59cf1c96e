"""The upstream write-up of Keras 3's TensorBoard under multi-worker MWMS
(docs/keras-tensorboard.md) holds: its reproducer shows every worker writing to log_dir with the
installed Keras, only the chief with mwhelpers' mend, and only the chief with the patch applied to
a copy of the installed Keras, whose own-style test passes too.  Applying the patch needs GNU
patch: without it those tests skip, except under CI=true."""

import os
import shutil
import subprocess
import sys

import pytest
from conftest import ROOT
from test_keras_upstream import KERAS_DIR

HERE = ROOT / "docs" / "keras-tensorboard"
REPRO, PATCH = HERE / "repro.py", HERE / "tensorboard.patch"
KERAS_TEST = HERE / "tensorboard_multi_worker_test.py"
FIXED = "FIXED: only the chief (worker 0) wrote to log_dir, and no workertemp folder is left"
pytestmark = [pytest.mark.tf, pytest.mark.skipif(KERAS_DIR is None, reason="no Keras 3")]


def repro(*args):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, str(REPRO), *args], capture_output=True, text=True,
                          timeout=200, env=env)
    return done.returncode, done.stdout + done.stderr


@pytest.fixture(scope="module")
def patched(tmp_path_factory):
    if shutil.which("patch") is None:
        reason = "GNU patch is not installed (Debian package: patch)"
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI must apply the upstream patch, but: {reason}")
        pytest.skip(reason)
    root = tmp_path_factory.mktemp("tensorboard-keras")
    shutil.copytree(KERAS_DIR, root / "keras", copy_function=shutil.copy2)
    done = subprocess.run(["patch", "-p1", "--forward", "-i", str(PATCH)], cwd=root,
                          capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        pytest.skip("the patch does not apply to the installed Keras (changed upstream): "
                    + done.stdout[-300:])
    return root


def test_the_installed_keras_lets_both_workers_write_to_the_log_dir():
    code, out = repro()
    assert code == 1 and "BUG PRESENT" in out, out
    assert "log_dir/train: 2 event files (worker 0, worker 1)" in out, out
    assert "log_dir/validation: 2 event files (worker 0, worker 1)" in out, out


def test_the_mend_leaves_only_the_chiefs_files():
    code, out = repro("--with-mwhelpers")
    assert code == 0 and FIXED in out, out
    assert "this task writes to " in out and "workertemp_1 and deletes it" in out, out


def test_the_patch_leaves_only_the_chiefs_files_and_its_keras_test_passes(patched, tmp_path):
    code, out = repro("--patched-keras", str(patched))
    assert code == 0 and FIXED in out and f"({patched / 'keras'})" in out, out
    test = patched / "keras" / "src" / "callbacks" / KERAS_TEST.name
    shutil.copy(KERAS_TEST, test)
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "-p", "no:xdist", "--rootdir", str(patched), str(test)],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(patched),
                               "KERAS_BACKEND": "tensorflow"})
    assert done.returncode == 0 and "1 passed" in done.stdout, done.stdout + done.stderr
