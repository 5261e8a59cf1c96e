"""The upstream write-up of the silent LayoutMap key (docs/keras-layoutmap.md) holds: Keras's
own JAX trainer tests with the patch's tests fail on Keras as released and pass with the patch,
and mwhelpers' check steps aside on the patched Keras, which warns itself.  Applying the patch
needs GNU patch: without it these tests skip, except under CI=true."""

import importlib.util
import os

import pytest
from conftest import ROOT
from test_jax_model_parallel import run_alone
from test_keras_lane import jax_cache_env
from test_keras_upstream import KERAS_DIR
from upstream import failed_tests, patch_of_tests, patched_copy, run_module

PATCH = ROOT / "docs" / "keras-layoutmap" / "jax_trainer.patch"
MODULE = "src/backend/jax/trainer_test.py"
DEVICES = {"XLA_FLAGS": "--xla_force_host_platform_device_count=4"}
pytestmark = [pytest.mark.skipif(KERAS_DIR is None, reason="no Keras 3"), pytest.mark.skipif(
    importlib.util.find_spec("jax") is None and os.environ.get("CI") != "true",
    reason="jax is not installed (the tutorials' lock, requirements/tutorials.txt, has it)")]


@pytest.fixture(scope="module")
def patched(tmp_path_factory):
    return patched_copy(tmp_path_factory, KERAS_DIR, PATCH, "layoutmap-keras", must_apply=True)


def test_the_keras_tests_fail_without_the_patch_and_pass_with_it(patched, tmp_path_factory,
                                                                  tmp_path):
    cache = jax_cache_env(tmp_path_factory.mktemp("layoutmap-xla-cache"))
    tests = patch_of_tests(PATCH, tmp_path)
    released = patched_copy(tmp_path_factory, KERAS_DIR, tests, "layoutmap-keras-released")
    code, out = run_module(released, MODULE, tmp_path, "jax", env={**DEVICES, **cache})
    failed = failed_tests(out)
    assert code == 1, out  # the tests that expect the warning, and nothing else
    assert failed == ["test_output_keys_of_a_functional_model",
                      "test_warns_once_when_a_layout_map_key_matches_no_path"], out
    code, out = run_module(patched, MODULE, tmp_path, "jax", env={**DEVICES, **cache})
    assert code == 0 and " passed" in out and "failed" not in out, out


def test_the_check_steps_aside_where_keras_warns_itself(patched, tmp_path):
    out = run_alone(tmp_path, "d.*kernel", PYTHONPATH=f"{patched}{os.pathsep}{ROOT}")
    assert "carries the fix of the LayoutMap check" in out, out
    assert "The LayoutMap key 'd.*kernel' matches no variable or layer output" in out, out
    assert "[mwhelpers] LayoutMap: " not in out, out
