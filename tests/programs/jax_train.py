"""Keras 3 on JAX across processes (keras.distribution), for the tests.

    KERAS_BACKEND=jax python jax_train.py [--epochs N] [--steps N]
                      [--backup DIR --save-freq N --kill-at STEP --marker FILE]

Every process reads its place from Keras's KERAS_DISTRIBUTION_* variables (mwhelpers sets them
beside TF_CONFIG), trains a small DataParallel model on the same global batches, and prints
one line ``RESULT {...}``.  With ``--backup``, each process keeps a
``BackupAndRestore(DIR/process_<id>, save_freq)`` of its own (Keras 3's callbacks have no chief)
and prints ``STEP N`` after each step (N: the optimizer's step count); with ``--kill-at``,
process 1 SIGKILLs itself right after that step, once (``--marker`` remembers it).
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
p.add_argument("--backup", default=None)
p.add_argument("--save-freq", type=int, default=3)
p.add_argument("--kill-at", type=int, default=0)
p.add_argument("--marker", default="killed.marker")
a = p.parse_args()

keras.distribution.set_distribution(keras.distribution.DataParallel(devices=jax.devices()))
keras.utils.set_random_seed(0)
rng = np.random.default_rng(0)
x = rng.normal(size=(a.steps * 32, 8)).astype("float32")
y = (x @ rng.normal(size=(8, 1))).astype("float32")
data = tf.data.Dataset.from_tensor_slices((x, y)).batch(32)
model = keras.Sequential([keras.layers.Input((8,)), keras.layers.Dense(1)])
model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
callbacks = []
if a.backup:
    import signal

    class Steps(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            step = int(self.model.optimizer.iterations)
            print(f"STEP {step}", flush=True)
            if step == a.kill_at and jax.process_index() == 1 and not os.path.exists(a.marker):
                open(a.marker, "w").close()
                os.kill(os.getpid(), signal.SIGKILL)

    folder = os.path.join(a.backup, f"process_{jax.process_index()}")
    callbacks = [Steps(), keras.callbacks.BackupAndRestore(folder, save_freq=a.save_freq)]
history = model.fit(data, epochs=a.epochs, verbose=2, callbacks=callbacks)
print("RESULT " + json.dumps({
    "process": jax.process_index(), "processes": jax.process_count(),
    "devices": jax.device_count(), "local_devices": jax.local_device_count(),
    "loss": history.history["loss"], "epochs_run": history.epoch,
    "iterations": int(model.optimizer.iterations),
    "weights": [w.tolist() for w in model.get_weights()],
}), flush=True)
