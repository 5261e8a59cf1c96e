"""The upstream report of keras-team/keras#20585 (docs/keras-20585/), run for real.

The reproducer starts two MultiWorkerMirroredStrategy workers of the installed Keras 3: with
the upstream patch applied to a copy of the installed Keras it must report FIXED (exit 0).  The
unmended failure itself is shown through the magics (tests/tf/test_diagnosis.py, with
--no-keras-fix), in notebook 03 and in the matrix's keras3 environment; mwhelpers' fix in
programs it did not start (``fix_keras_multi_worker()``) in notebook 03's ``%%bash`` workers.
Once the installed Keras has fixed the bug itself (its trainer no longer holds the failing
lines), the tests that need the bug skip and say so.  Applying the patch needs GNU patch
(Debian's ``patch`` package): without it that test skips, except under CI=true.

The same for the LossScaleOptimizer hang (docs/keras-lossscale/): its patch applied to a copy
of the installed Keras must make the reproducer report FIXED; the unmended hang is shown
through the magics in tests/inprocess/test_keras3_mixed.py.
"""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT
from upstream import keras_test, patched_copy

HERE = ROOT / "docs" / "keras-20585"
REPRO, PATCH = HERE / "repro.py", HERE / "trainer.patch"
FIXED = "FIXED: both workers trained, weights equal"
# The two lines of keras/src/backend/tensorflow/trainer.py that fail (since Keras 3.5 and 3.3;
# still in 3.16's development): the patch applies only where they are.
FAILING_LINES = (
    "data_batch = self.distribute_strategy.reduce(",
    'return strategy.reduce("MEAN", v, axis=0)',
)


def _keras_dir():
    spec = importlib.util.find_spec("keras")  # finds the package without importing it
    return Path(next(iter(spec.submodule_search_locations))) if spec else None


KERAS_DIR = _keras_dir()
TRAINER = KERAS_DIR / "src" / "backend" / "tensorflow" / "trainer.py" if KERAS_DIR else None
pytestmark = [pytest.mark.skipif(
    TRAINER is None or not TRAINER.is_file(), reason="no Keras 3 (with a TensorFlow trainer)")]


def _present():
    """The failing lines the installed trainer still holds (whitespace aside)."""
    text = "".join(TRAINER.read_text().split())
    return [line for line in FAILING_LINES if "".join(line.split()) in text]


def _bug_reason():
    """Why the installed Keras cannot show the bug, or "" when it can."""
    if TRAINER is None or not TRAINER.is_file():
        return "no Keras 3"
    if not _present():
        return (f"the installed Keras ({TRAINER}) no longer has the failing lines of "
                "keras-team/keras#20585: fixed upstream")
    return ""


BUG_REASON = _bug_reason()
needs_bug = pytest.mark.skipif(bool(BUG_REASON), reason=BUG_REASON)


def repro(*args, env=None):
    """Runs the reproducer; (exit code, its output)."""
    done = subprocess.run([sys.executable, str(REPRO), "--timeout", "150", *args],
                          capture_output=True, text=True, timeout=200,
                          env={**os.environ, **(env or {})})
    return done.returncode, done.stdout + done.stderr


def verdict(output):
    lines = [ln for ln in output.splitlines() if ln.startswith(("BUG PRESENT", "FIXED", "FAILED"))]
    return lines[-1] if lines else "(no verdict)"


@pytest.fixture(scope="session")
def patched_keras(tmp_path_factory):
    """A copy of the installed Keras with docs/keras-20585/trainer.patch applied (once per
    session); the directory that holds its ``keras`` package."""
    return patched_copy(tmp_path_factory, KERAS_DIR, PATCH, "patched-keras", must_apply=True)


@needs_bug
def test_the_upstream_patch_makes_both_workers_train(patched_keras):
    code, output = repro("--patched-keras", str(patched_keras))
    assert code == 0 and verdict(output) == FIXED, output
    # The workers ran the patched copy, not the installed Keras.
    assert output.count(f"({patched_keras / 'keras'})") == 2, output


# -- Keras 3's LossScaleOptimizer under multi-worker MWMS (docs/keras-lossscale/) --------------
LSO_HERE = ROOT / "docs" / "keras-lossscale"
LSO_REPRO, LSO_PATCH = LSO_HERE / "repro.py", LSO_HERE / "loss_scale_optimizer.patch"
LSO_FIXED = "FIXED: both workers skipped the step, weights and loss scale equal"
# The line of keras/src/optimizers/loss_scale_optimizer.py that checks one replica's gradients
# only (3.15.1): the patch applies only where it is.
LSO_LINE = "return ops.all(ops.convert_to_tensor(finite_grads))"
LSO_FILE = KERAS_DIR / "src" / "optimizers" / "loss_scale_optimizer.py" if KERAS_DIR else None
LSO_REASON = "" if LSO_FILE is not None and LSO_FILE.is_file() and \
    "".join(LSO_LINE.split()) in "".join(LSO_FILE.read_text().split()) else \
    f"the installed Keras ({LSO_FILE}) no longer has the line of docs/keras-lossscale.md"


def lso_repro(*args):
    done = subprocess.run([sys.executable, str(LSO_REPRO), "--timeout", "180", *args],
                          capture_output=True, text=True, timeout=240)
    return done.returncode, done.stdout + done.stderr


@pytest.fixture(scope="session")
def lso_patched_keras(tmp_path_factory):
    """A copy of the installed Keras with docs/keras-lossscale/loss_scale_optimizer.patch."""
    return patched_copy(tmp_path_factory, KERAS_DIR, LSO_PATCH, "patched-keras-lossscale",
                        must_apply=True)


@pytest.mark.skipif(bool(LSO_REASON), reason=LSO_REASON)
def test_the_loss_scale_patch_makes_both_workers_skip_the_step(lso_patched_keras):
    code, output = lso_repro("--patched-keras", str(lso_patched_keras))
    assert code == 0 and verdict(output) == LSO_FIXED, output
    assert output.count(f"({lso_patched_keras / 'keras'})") == 2, output


@pytest.mark.skipif(bool(LSO_REASON), reason=LSO_REASON)
def test_the_loss_scale_keras_tests_fail_without_the_patch(tmp_path_factory, tmp_path):
    """Both cases of loss_scale_optimizer_distribute_test.py (two MWMS workers; MirroredStrategy
    over two logical CPUs) fail on Keras as released (they pass with the patch in
    tests/reproducers/test_keras_lane.py)."""
    test = LSO_HERE / "loss_scale_optimizer_distribute_test.py"
    (tmp_path / "released").mkdir()
    released = patched_copy(tmp_path_factory, KERAS_DIR, None, "lossscale-keras-released")
    code, out = keras_test(released, test, "src/optimizers", tmp_path / "released")
    assert code == 1 and "2 failed" in out, out


def test_steps_per_execution_above_one_fails_under_mirrored_strategy_too(tmp_path):
    """docs/guide/keras3.md: steps_per_execution > 1 fails where collective ops all-reduce.
    The kept program (docs/keras-versions/run.py) shows it in one process, MirroredStrategy on
    two logical CPUs; the matrix runs it with two MWMS workers too."""
    done = subprocess.run([sys.executable, str(ROOT / "docs" / "keras-versions" / "run.py"),
                           "--runs", "mirrored_spe", "--timeout", "240", "--logs", str(tmp_path)],
                          capture_output=True, text=True, timeout=300)
    line = next(ln for ln in done.stdout.splitlines() if ln.startswith("mirrored_spe "))
    assert '"replicas": "2"' in line, line  # two replicas really took part
    assert '"error": "You must feed a value for placeholder tensor"' in line, line
