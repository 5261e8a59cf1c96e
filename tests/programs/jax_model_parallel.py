"""Keras 3 on JAX, a model split over two processes of two CPU devices each: a mesh
(batch=2, model=2) and the LayoutMap rule given as the first argument, for both kernels.

    python jax_model_parallel.py RULE [--as-two] [--scope]

Each process trains on its half of the data (rows p::2, 8 a step: a global batch of 16).
``--as-two``, in one process (four devices): the same global batches, each process's 8 rows
one after the other, as the two processes give them.  ``--scope``: the distribution is not
set for the process, the model is made in its scope and trained outside (keras-hub's way).
Prints, after one epoch, ``RESULT
{...}``: each kernel's partition spec on this process (``[null, "model"]``: split over the
model axis; ``[null, null]``: whole on every device), the shape of its first device's shard,
the bytes the first device holds of all the model's variables, and the weights.
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
if "--scope" not in sys.argv:  # --scope: the model made in the distribution's scope only
    kd.set_distribution(distribution)

keras.utils.set_random_seed(1)  # the same initial weights in every process, and alone
with distribution.scope():
    model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(32, name="d1"),
                              keras.layers.Dense(4, name="d2")])
    model.compile(keras.optimizers.SGD(0.01), "mse")
x = np.random.default_rng(0).normal(size=(64, 16)).astype("float32")
process = int(os.environ.get("KERAS_DISTRIBUTION_PROCESS_ID", "0"))
processes = int(os.environ.get("KERAS_DISTRIBUTION_NUM_PROCESSES", "1"))
if "--as-two" in sys.argv:  # one process: the global batches the two processes make
    halves = [x[0::2], x[1::2]]
    data = np.concatenate([h[i:i + 8] for i in range(0, 32, 8) for h in halves])
    batch = 16
else:
    data, batch = x[process::processes], 8
model.fit(data, data[:, :4], batch_size=batch, epochs=1, verbose=2, shuffle=False)
kernels = {layer.name: layer.kernel.value for layer in model.layers}
device_bytes = sum(shard.data.nbytes for v in model.variables
                   for shard in v.value.addressable_shards[:1])
print("RESULT " + json.dumps({
    "devices": len(devices),
    "specs": {name: list(value.sharding.spec) for name, value in kernels.items()},
    "shards": {name: list(value.addressable_shards[0].data.shape)
               for name, value in kernels.items()},
    "device_bytes": int(device_bytes),
    "model_bytes": int(sum(np.asarray(w).nbytes for w in model.get_weights())),
    "weights": [np.asarray(w).ravel().tolist() for w in model.get_weights()],
}), flush=True)
