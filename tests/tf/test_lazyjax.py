"""lazyjax: where JAX is installed, a TensorFlow task imports it only when it is used (real TF,
Keras, JAX)."""

import json

import pytest

from mwhelpers.taskside.lazyjax import NOTICE

jax = pytest.importorskip("jax", reason="JAX is not installed (the tutorials' lock holds it)")

PROGRAM = """
import json, sys
import tensorflow as tf
import keras
from tensorflow.lite.python import util
after_import = "jax" in sys.modules
import jax                      # the program's own import gets the real JAX
real = type(jax).__name__ == "module" and hasattr(jax, "numpy")
doubled = util._jit(lambda v: v * 2)(3)   # TF Lite's jit: JAX's own
print("RESULT " + json.dumps({"after_import": after_import, "real": real, "jit": int(doubled)}),
      flush=True)
"""


def result(rt, **env):
    run = rt.launch("worker:0", code=PROGRAM, timeout=120, env=env)
    line = [ln for ln in run.lines() if ln.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT "):]), run.lines()


def test_tensorflow_in_a_task_imports_jax_only_when_it_is_used(rt):
    rt.define_cluster(workers=1)
    out, lines = result(rt)
    assert out == {"after_import": False, "real": True, "jit": 6}
    assert lines.count(NOTICE) == 1
    rt.define_cluster(workers=1)
    out, lines = result(rt, MWHELPERS_LAZY_JAX="0")  # turned off: TensorFlow's own import
    assert out == {"after_import": True, "real": True, "jit": 6}
    assert NOTICE not in lines
