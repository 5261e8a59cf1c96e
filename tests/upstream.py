"""What the tests of the upstream write-ups (docs/keras-*.md) share: a copy of the installed
Keras with a write-up's patch applied, and a Keras-style test run on such a copy.

Applying a patch needs GNU patch (Debian's ``patch`` package): without it the tests that need
one skip, except under CI=true, where they fail.
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest


def patch_of_tests(patch, folder):
    """The part of the patch file ``patch`` that changes test modules (``*_test.py``), written
    into ``folder``: Keras's tests as the patch changes them, for a Keras without its fix."""
    sections, current = [], []
    for line in Path(patch).read_text().splitlines(keepends=True):
        if line.startswith("diff --git ") and current:
            sections.append(current)
            current = []
        current.append(line)
    sections.append(current)
    kept = [s for s in sections if any(ln.startswith("+++ ") and ln.rstrip().endswith("_test.py")
                                       for ln in s)]
    out = Path(folder) / f"{Path(patch).stem}.tests.patch"
    out.write_text("".join(line for s in kept for line in s))
    return out


def patched_copy(tmp_path_factory, keras_dir, patch, name, must_apply=False):
    """The folder holding a copy of ``keras_dir`` (the installed ``keras`` package) with
    ``patch`` applied: a patch file, a list of them (applied in order), or None (the copy as
    it is).  A patch that no longer applies (Keras changed upstream) skips, or fails with
    ``must_apply``.  (:func:`patch_of_tests` makes a patch of a patch's test hunks.)"""
    patches = [] if patch is None else list(patch) if isinstance(patch, list) else [patch]
    if patches and shutil.which("patch") is None:
        reason = "GNU patch is not installed (Debian package: patch)"
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI must apply the upstream patch, but: {reason}")
        pytest.skip(reason)
    root = tmp_path_factory.mktemp(name)
    # copy2 keeps the modification times, so the copied bytecode stays valid (except the
    # patched files') and the copy imports as fast as the installed Keras.
    shutil.copytree(keras_dir, root / "keras", copy_function=shutil.copy2)
    for one in patches:
        done = subprocess.run(["patch", "-p1", "--forward", "-i", str(one)], cwd=root,
                              capture_output=True, text=True, timeout=60)
        if done.returncode != 0:
            if must_apply:
                pytest.fail(done.stdout + done.stderr)
            pytest.skip(f"{one.name} does not apply to the installed Keras (changed upstream): "
                        + done.stdout[-300:])
    return root


# The write-ups' helper for tests that run worker processes, and where it goes in Keras.
HELPER = Path(__file__).resolve().parents[1] / "docs" / "keras-testing" / "multi_worker.py"
HELPER_WHERE = "src/testing"


def add_tests(copy, files):
    """Put the write-ups' test ``files`` ({path: folder in Keras's tree}) and their helper into
    the Keras ``copy``."""
    for source, where in {**files, HELPER: HELPER_WHERE}.items():
        shutil.copy(source, copy / "keras" / where / Path(source).name)


def keras_test(patched, source, where, tmp_path, timeout=300):
    """Run the Keras-style test file ``source`` as ``keras/<where>/<its name>`` of the
    ``patched`` copy, with pytest; (exit code, output)."""
    add_tests(patched, {source: where})
    return run_module(patched, f"{where}/{source.name}", tmp_path, timeout=timeout)


def run_module(copy, module, tmp_path, backend="tensorflow", timeout=600, env=None):
    """Run Keras's test module ``module`` (``src/callbacks/x_test.py``) of the Keras ``copy``
    with pytest (``env``: more variables); (exit code, output).  Failures are shown as Python
    prints tracebacks (``--tb=native``): pytest's own form parses the failing source with
    ``ast``, which CPython 3.11.7 sometimes refuses after a test's deep recursion ("AST
    constructor recursion depth mismatch", an INTERNALERROR that ends the run)."""
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "-p", "no:xdist", "--tb=native", "--rootdir", str(copy),
                           str(copy / "keras" / module)],
                          capture_output=True, text=True, timeout=timeout, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(copy), "KERAS_BACKEND": backend,
                               **(env or {})})
    return done.returncode, done.stdout + done.stderr


def failed_tests(out):
    """The names of the tests that pytest's output ``out`` says FAILED, sorted."""
    return sorted(ln.split("::")[-1].split()[0] for ln in out.splitlines()
                  if ln.startswith("FAILED "))


def run_script(script, *args, path=None, root=None, timeout=300):
    """Run ``script`` with this Python, ``path`` (a patched copy) then ``root`` (this checkout,
    for ``--with-mwhelpers``) first on its path; (exit code, output)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(str(p) for p in (path, root) if p)}
    done = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True,
                          timeout=timeout, env=env)
    return done.returncode, done.stdout + done.stderr
