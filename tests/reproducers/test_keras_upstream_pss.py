"""The upstream write-up of ParameterServerStrategy's step count (docs/keras-pss-iterations.md)
holds: its reproducer loses steps with the installed Keras, counts every step with mwhelpers'
mend and with the patch applied to a copy of the installed Keras, whose own-style test passes
too.  Applying the patch needs GNU patch: without it those tests skip, except under CI=true."""

import pytest
from conftest import ROOT
from test_keras_upstream import KERAS_DIR
from upstream import patch_of_tests, patched_copy, run_module, run_script

HERE = ROOT / "docs" / "keras-pss-iterations"
REPRO, PATCH = HERE / "repro.py", HERE / "optimizer.patch"
STEPS = "150"
pytestmark = [pytest.mark.skipif(KERAS_DIR is None, reason="no Keras 3")]


def repro(*args, path=None):
    return run_script(REPRO, STEPS, *args, path=path, root=ROOT)


@pytest.fixture(scope="module")
def patched(tmp_path_factory):
    return patched_copy(tmp_path_factory, KERAS_DIR, PATCH, "pss-keras")


def test_the_installed_keras_loses_steps():
    code, out = repro()
    assert code == 1 and "BUG: optimizer.iterations lost" in out, out


def test_the_mend_counts_every_step():
    code, out = repro("--with-mwhelpers")
    assert code == 0 and f"optimizer.iterations: {STEPS}" in out and "FIXED" in out, out


MODULE = "src/optimizers/optimizer_test.py"  # Keras's own, with the patch's test
NEW = "test_iterations_is_counted_with_the_optimizers_assign_add"


def test_the_patch_counts_every_step(patched):
    """(Keras's tests on the patched copy run in tests/reproducers/test_keras_lane.py.)"""
    code, out = repro(path=patched)
    assert code == 0 and "FIXED" in out, out


def test_the_keras_test_fails_without_the_patch(tmp_path_factory, tmp_path):
    """The regression test catches the bug: on Keras as released, ``apply`` counts with the
    variable's own read-then-write, not with the optimizer's ``assign_add``."""
    tests = patch_of_tests(PATCH, tmp_path)
    unpatched = patched_copy(tmp_path_factory, KERAS_DIR, tests, "pss-keras-unpatched")
    code, out = run_module(unpatched, MODULE, tmp_path)
    assert code == 1 and f"optimizer_test.py::OptimizerTest::{NEW}" in out, out
    assert "1 failed, 42 passed" in out, out
