"""A tiny MultiWorkerMirroredStrategy job for the tests and the benchmark.

tf_keras (TF_USE_LEGACY_KERAS=1, set before TensorFlow is imported): Keras 3's
fit fails under MWMS (keras-team/keras#20585).  Prints one JSON line
``RESULT {...}`` with what the tests check.

    python mwms_train.py [--epochs N] [--steps N] [--backup DIR] [--save-freq F]
"""
import argparse
import json
import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

import tensorflow as tf

# The strategy first: collective ops must be configured before any op runs.
strategy = tf.distribute.MultiWorkerMirroredStrategy()

import numpy as np  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--epochs", type=int, default=3)
p.add_argument("--steps", type=int, default=10)
p.add_argument("--backup", default=None)
p.add_argument("--save-freq", default="epoch")
a = p.parse_args()

rng = np.random.default_rng(0)
x = rng.normal(size=(512, 8)).astype("float32")
y = x @ rng.normal(size=(8, 1)).astype("float32")
per_worker_batch = 16
global_batch = per_worker_batch * strategy.num_replicas_in_sync
ds = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(global_batch).prefetch(2)

with strategy.scope():
    model = tf.keras.Sequential([tf.keras.layers.Input((8,)), tf.keras.layers.Dense(1)])
    model.compile(optimizer=tf.keras.optimizers.SGD(0.05), loss="mse")

callbacks = []
if a.backup:
    freq = int(a.save_freq) if a.save_freq.isdigit() else a.save_freq
    callbacks.append(tf.keras.callbacks.BackupAndRestore(a.backup, save_freq=freq))

history = model.fit(ds, epochs=a.epochs, steps_per_epoch=a.steps, verbose=2, callbacks=callbacks)
task = json.loads(os.environ["TF_CONFIG"])["task"]
print("RESULT " + json.dumps({
    "task": f"{task['type']}:{task['index']}",
    "replicas": strategy.num_replicas_in_sync,
    "epochs_run": history.epoch,
    "loss": history.history["loss"],
    "iterations": int(model.optimizer.iterations.numpy()),
    "weights_sum": float(sum(float(np.sum(w)) for w in model.get_weights())),
}), flush=True)
