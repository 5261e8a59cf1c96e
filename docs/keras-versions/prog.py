"""The worker program of docs/keras-versions.md: Keras 3 `fit` under MWMS.

    python prog.py fit OUT_DIR     # fit, evaluate, predict; prints WEIGHTS
    python prog.py spe OUT_DIR     # the same fit compiled with steps_per_execution=2
    python prog.py mirrored-spe OUT_DIR   # steps_per_execution=2 under MirroredStrategy on
                                          # two logical CPUs, in one process (no TF_CONFIG)

A Dense(16, relu) + Dense(1) regression on 1,024 fixed NumPy samples, SGD(0.05), MSE with
MAE as metric, built and compiled in the strategy's scope. `fit` reads a tf.data dataset
(global batch 64, AutoShardPolicy.DATA) for 3 epochs with validation data; then `evaluate`
and `predict`; then one line `WEIGHTS <sum> <hash>` of all the weights. Run it as every task
of a cluster (TF_CONFIG); `run.py` beside it does that.
"""

import hashlib
import json
import sys

import numpy as np
import tensorflow as tf

mode, out = sys.argv[1], sys.argv[2]
if mode == "mirrored-spe":
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
else:
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
print("REPLICAS", strategy.num_replicas_in_sync, flush=True)
import keras  # noqa: E402  (after the strategy, as the tutorials do)

rng = np.random.default_rng(0)
x = rng.normal(size=(1024, 8)).astype("float32")
y = (x @ rng.normal(size=(8, 1)) + 0.1 * rng.normal(size=(1024, 1))).astype("float32")


def dataset(n):
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = (
        tf.data.experimental.AutoShardPolicy.DATA)
    ds = tf.data.Dataset.from_tensor_slices((x[:n], y[:n])).batch(64)
    return ds.with_options(options)


with strategy.scope():
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, "relu"),
                              keras.layers.Dense(1)])
    model.compile(keras.optimizers.SGD(0.05), "mse", metrics=["mae"],
                  steps_per_execution=2 if mode.endswith("spe") else 1)

history = model.fit(dataset(1024), epochs=3, validation_data=dataset(256), verbose=2)
print("HISTORY", json.dumps({k: [round(float(v), 4) for v in vs]
                             for k, vs in history.history.items()}), flush=True)
print("EVALUATE", round(float(model.evaluate(dataset(256), verbose=0)[0]), 4), flush=True)
print("PREDICT", len(model.predict(dataset(256), verbose=0)), flush=True)
flat = np.concatenate([np.ravel(w) for w in model.get_weights()])
digest = hashlib.sha256(np.round(flat, 5).tobytes()).hexdigest()[:12]
print(f"WEIGHTS {flat.sum():.6f} {digest}", flush=True)
