"""Keras 3 on JAX, a model split over two processes of two CPU devices each: a mesh
(batch=2, model=2) and the LayoutMap rule given as the first argument, for both kernels.

    python jax_model_parallel.py RULE

Prints, after one short fit, ``RESULT {...}`` with each kernel's partition spec on this
process (``[null, "model"]``: split over the model axis; ``[null, null]``: whole on every device).
"""

import json
import os
import sys

os.environ.setdefault("KERAS_BACKEND", "jax")
# Two CPU devices in this process, unless its environment says how many (before JAX's import).
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                               " --xla_force_host_platform_device_count=2").strip()

import keras
import numpy as np
from keras import distribution as kd

if os.environ.get("KERAS_DISTRIBUTION_JOB_ADDRESSES"):
    kd.initialize()  # from KERAS_DISTRIBUTION_* (mwhelpers sets them for each task)
devices = kd.list_devices()
mesh = kd.DeviceMesh((2, len(devices) // 2), ("batch", "model"), devices)
rules = kd.LayoutMap(mesh)
rules[sys.argv[1]] = (None, "model")
distribution = kd.ModelParallel(layout_map=rules, batch_dim_name="batch")
distribution.auto_shard_dataset = False  # each process gives its own half of the batches
kd.set_distribution(distribution)

model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(32, name="d1"),
                          keras.layers.Dense(4, name="d2")])
model.compile(keras.optimizers.SGD(0.01), "mse")
x = np.random.default_rng(0).normal(size=(64, 16)).astype("float32")
process = int(os.environ.get("KERAS_DISTRIBUTION_PROCESS_ID", "0"))
processes = int(os.environ.get("KERAS_DISTRIBUTION_NUM_PROCESSES", "1"))
mine = x[process::processes]
model.fit(mine, mine[:, :4], batch_size=8, epochs=1, verbose=2)
specs = {layer.name: list(layer.kernel.value.sharding.spec) for layer in model.layers}
print("RESULT " + json.dumps({"devices": len(devices), "specs": specs}), flush=True)
