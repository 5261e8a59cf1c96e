"""The library declares ranges; the tutorials' lock pins one environment with one TensorFlow.

Here: the tests of test_packaging that need TensorFlow; the module's text and its other tests
are in processes/test_packaging.py."""

import subprocess
import sys


def test_the_tensorflow_that_runs_is_the_cpu_build():
    code = ("import os; os.environ['TF_CPP_MIN_LOG_LEVEL'] = '3'\n"
            "import tensorflow as tf; print(tf.sysconfig.get_build_info().get('is_cuda_build'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "False", out.stderr[-2000:]
