"""The upstream write-up of OrbaxCheckpoint's relative folder (docs/keras-orbax-relative.md)
holds: Keras's own OrbaxCheckpoint tests with the patch's test fail on Keras as released and
pass with the patch (on JAX; measured on TensorFlow too, in the write-up), and mwhelpers' check
steps aside on the patched Keras, whose relative folder then works.  Applying the patch needs
GNU patch: without it these tests skip, except under CI=true."""

import importlib.util
import os
import subprocess
import sys
import textwrap

import pytest
from conftest import ROOT
from test_keras_lane import jax_cache_env
from test_keras_upstream import KERAS_DIR
from upstream import failed_tests, patch_of_tests, patched_copy, run_module

PATCH = ROOT / "docs" / "keras-orbax-relative" / "relative_directory.patch"
MODULE = "src/callbacks/orbax_checkpoint_test.py"
BOOTSTRAP = ROOT / "mwhelpers" / "taskside" / "_bootstrap.py"
pytestmark = [pytest.mark.skipif(KERAS_DIR is None, reason="no Keras 3"), pytest.mark.skipif(
    (importlib.util.find_spec("jax") is None or importlib.util.find_spec("orbax") is None)
    and os.environ.get("CI") != "true",
    reason="jax or orbax-checkpoint is not installed (the tutorials' lock has them)")]


@pytest.fixture(scope="module")
def patched(tmp_path_factory):
    return patched_copy(tmp_path_factory, KERAS_DIR, PATCH, "orbax-keras", must_apply=True)


def test_the_keras_tests_fail_without_the_patch_and_pass_with_it(patched, tmp_path_factory,
                                                                  tmp_path):
    cache = jax_cache_env(tmp_path_factory.mktemp("orbax-xla-cache"))
    tests = patch_of_tests(PATCH, tmp_path)
    released = patched_copy(tmp_path_factory, KERAS_DIR, tests, "orbax-keras-released")
    code, out = run_module(released, MODULE, tmp_path, "jax", env=cache)
    failed = failed_tests(out)
    assert code == 1 and failed == ["test_relative_directory_is_saved_and_loaded0",
                                    "test_relative_directory_is_saved_and_loaded1"], out
    code, out = run_module(patched, MODULE, tmp_path, "jax", env=cache)
    summary = out.strip().splitlines()[-1]
    assert code == 0 and " passed" in summary and "failed" not in summary, out


PROGRAM = textwrap.dedent("""\
    import os
    os.environ["KERAS_BACKEND"] = "jax"
    import keras
    import numpy as np
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    model.compile("sgd", "mse")
    model.fit(np.ones((8, 4)), np.ones((8, 2)), epochs=1, verbose=0,
              callbacks=[keras.callbacks.OrbaxCheckpoint("ckpt")])
    print("SAVED", sorted(os.listdir("ckpt")), flush=True)
    """)


def test_the_check_steps_aside_where_keras_resolves_the_folder_itself(patched, tmp_path):
    (tmp_path / "prog.py").write_text(PROGRAM)
    done = subprocess.run([sys.executable, "-u", str(BOOTSTRAP), "prog.py"], capture_output=True,
                          text=True, timeout=120, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": f"{patched}{os.pathsep}{ROOT}"})
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    assert "carries the fix of the OrbaxCheckpoint folder check" in out, out
    assert "[mwhelpers] OrbaxCheckpoint: " not in out, out
    assert "SAVED ['0']" in out, out
