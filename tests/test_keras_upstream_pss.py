"""The upstream write-up of ParameterServerStrategy's step count (docs/keras-pss-iterations.md)
holds: its reproducer loses steps with the installed Keras, counts every step with mwhelpers'
mend and with the patch applied to a copy of the installed Keras, whose own-style test passes
too.  Applying the patch needs GNU patch: without it those tests skip, except under CI=true."""

import os
import shutil
import subprocess
import sys

import pytest
from conftest import ROOT
from test_keras_upstream import KERAS_DIR

HERE = ROOT / "docs" / "keras-pss-iterations"
REPRO, PATCH = HERE / "repro.py", HERE / "core.patch"
STEPS = "150"
pytestmark = [pytest.mark.tf, pytest.mark.skipif(KERAS_DIR is None, reason="no Keras 3")]


def repro(*args, path=None):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (str(path) if path else "", str(ROOT)) if p)}
    done = subprocess.run([sys.executable, str(REPRO), STEPS, *args], capture_output=True,
                          text=True, timeout=300, env=env)
    return done.returncode, done.stdout + done.stderr


@pytest.fixture(scope="module")
def patched(tmp_path_factory):
    if shutil.which("patch") is None:
        reason = "GNU patch is not installed (Debian package: patch)"
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI must apply the upstream patch, but: {reason}")
        pytest.skip(reason)
    root = tmp_path_factory.mktemp("pss-keras")
    shutil.copytree(KERAS_DIR, root / "keras", copy_function=shutil.copy2)
    done = subprocess.run(["patch", "-p1", "--forward", "-i", str(PATCH)], cwd=root,
                          capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        pytest.skip("the patch does not apply to the installed Keras (changed upstream): "
                    + done.stdout[-300:])
    return root


def test_the_installed_keras_loses_steps():
    code, out = repro()
    assert code == 1 and "BUG: optimizer.iterations lost" in out, out


def test_the_mend_counts_every_step():
    code, out = repro("--with-mwhelpers")
    assert code == 0 and f"optimizer.iterations: {STEPS}" in out and "FIXED" in out, out


def test_the_patch_counts_every_step_and_its_keras_test_passes(patched, tmp_path):
    code, out = repro(path=patched)
    assert code == 0 and "FIXED" in out, out
    test = patched / "keras" / "src" / "backend" / "tensorflow" / "parameter_server_test.py"
    shutil.copy(HERE / "parameter_server_test.py", test)
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "-p", "no:xdist", "--rootdir", str(patched), str(test)],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(patched),
                               "KERAS_BACKEND": "tensorflow"})
    assert done.returncode == 0 and "2 passed" in done.stdout, done.stdout + done.stderr
