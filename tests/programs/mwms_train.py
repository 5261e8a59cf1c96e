"""A tiny MultiWorkerMirroredStrategy job for the tests and the benchmark.

``tf.keras`` is whichever Keras the environment selects: Keras 3 by default (mended by
mwhelpers' start-up for keras-team/keras#20585), tf_keras with TF_USE_LEGACY_KERAS=1.
Prints one JSON line ``RESULT {...}`` with what the tests check.

    python mwms_train.py [--epochs N] [--steps N] [--backup DIR] [--save-freq F] [--log-steps]
                         [--step-seconds S]

``--log-steps`` prints ``STEP N at=T`` after each step (N: the optimizer's step count,
which a restored backup carries on; T: this machine's clock), for restart tests;
``--step-seconds`` makes each step last that much longer, as a bigger model would.
"""
import argparse
import json
import os

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
p.add_argument("--log-steps", action="store_true")
p.add_argument("--step-seconds", type=float, default=0.0)
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

if a.log_steps or a.step_seconds:
    import time

    class LogSteps(tf.keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            time.sleep(a.step_seconds)
            if a.log_steps:
                print(f"STEP {int(self.model.optimizer.iterations.numpy())} at={time.time():.3f}",
                      flush=True)

    # First: a step is logged once it is done, before a backup of it can be written (a task
    # ended between the two would otherwise leave a saved step that no log shows).
    callbacks.insert(0, LogSteps())

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
