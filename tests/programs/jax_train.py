"""Keras 3 on JAX across processes (keras.distribution), for the tests.

    KERAS_BACKEND=jax python jax_train.py [--epochs N] [--steps N]

Every process reads its place from Keras's KERAS_DISTRIBUTION_* variables (mwhelpers sets them
beside TF_CONFIG), trains a small DataParallel model on the same global batches, and prints
one line ``RESULT {...}``.
"""
import argparse
import json
import os

os.environ.setdefault("KERAS_BACKEND", "jax")

import keras

keras.distribution.initialize()  # KERAS_DISTRIBUTION_JOB_ADDRESSES, _NUM_PROCESSES, _PROCESS_ID

import jax  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402  (tf.data only: Keras shards it across the processes)

p = argparse.ArgumentParser()
p.add_argument("--epochs", type=int, default=2)
p.add_argument("--steps", type=int, default=8)
a = p.parse_args()

keras.distribution.set_distribution(keras.distribution.DataParallel(devices=jax.devices()))
keras.utils.set_random_seed(0)
rng = np.random.default_rng(0)
x = rng.normal(size=(a.steps * 32, 8)).astype("float32")
y = (x @ rng.normal(size=(8, 1))).astype("float32")
data = tf.data.Dataset.from_tensor_slices((x, y)).batch(32)
model = keras.Sequential([keras.layers.Input((8,)), keras.layers.Dense(1)])
model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
history = model.fit(data, epochs=a.epochs, verbose=2)
print("RESULT " + json.dumps({
    "process": jax.process_index(), "processes": jax.process_count(),
    "devices": jax.device_count(), "local_devices": jax.local_device_count(),
    "loss": history.history["loss"],
    "weights": [w.tolist() for w in model.get_weights()],
}), flush=True)
