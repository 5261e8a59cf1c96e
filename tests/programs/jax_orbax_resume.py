"""Keras 3 on JAX, a model split across processes and checkpointed with Orbax, for the tests.

    python jax_orbax_resume.py CKPT [--epochs N] [--steps N] [--kill-at STEP --marker FILE]
                               [--mesh B,M] [--restore-only] [--backup-and-restore]
                               [--relative]

A mesh (batch=B, model=M; default 2 and the rest of the devices), the kernels of ``d1`` and
``d2`` split over the model axis (ModelParallel), each process giving its rows of every global
batch of 16 (the whole batch, on a mesh whose batch axis is 1).
``keras.callbacks.OrbaxCheckpoint(CKPT)`` saves at each epoch's end, from every process
together. A start that finds a checkpoint in CKPT loads the newest one
(``model.load_weights(CKPT)``: weights and optimizer, resharded onto this mesh) and goes on
from the epoch after it.  Prints ``STEP N`` after each step (N: the optimizer's count) and,
at the end, ``RESULT {...}``.  ``--kill-at``: the last process SIGKILLs itself right after
that step, once (``--marker`` remembers it).  ``--restore-only``: load and print, no training.
``--backup-and-restore``: Keras's ``BackupAndRestore(CKPT/process_<id>)`` instead, each
process its own (what a job on TensorFlow uses).  ``--relative``: CKPT as given, not made
absolute (Orbax refuses a relative path).
"""

import argparse
import json
import os
import signal
import sys
import time

os.environ.setdefault("KERAS_BACKEND", "jax")
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                               " --xla_force_host_platform_device_count=2").strip()

import keras
import numpy as np
from jax.experimental.multihost_utils import process_allgather
from keras import distribution as kd

p = argparse.ArgumentParser()
p.add_argument("ckpt")
p.add_argument("--epochs", type=int, default=3)
p.add_argument("--steps", type=int, default=4)
p.add_argument("--kill-at", type=int, default=0)
p.add_argument("--marker", default="killed.marker")
p.add_argument("--mesh", default=None)
p.add_argument("--restore-only", action="store_true")
p.add_argument("--backup-and-restore", action="store_true")
p.add_argument("--relative", action="store_true")
a = p.parse_args()
if "--relative" not in sys.argv:  # --relative: the folder as given, which Orbax refuses
    a.ckpt = os.path.abspath(a.ckpt)

if os.environ.get("KERAS_DISTRIBUTION_JOB_ADDRESSES"):
    kd.initialize()  # from KERAS_DISTRIBUTION_* (mwhelpers sets them for each task)
devices = kd.list_devices()
batch_axis, model_axis = (map(int, a.mesh.split(",")) if a.mesh
                          else (2, len(devices) // 2))
mesh = kd.DeviceMesh((batch_axis, model_axis), ("batch", "model"), devices)
rules = kd.LayoutMap(mesh)
rules[".*/d[0-9]/kernel"] = (None, "model")
distribution = kd.ModelParallel(layout_map=rules, batch_dim_name="batch")
distribution.auto_shard_dataset = False  # each process gives its own rows of every batch
kd.set_distribution(distribution)

keras.utils.set_random_seed(1)
model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(32, name="d1"),
                          keras.layers.Dense(4, name="d2")])
model.compile(keras.optimizers.Adam(0.01), "mse")

process = int(os.environ.get("KERAS_DISTRIBUTION_PROCESS_ID", "0"))
processes = int(os.environ.get("KERAS_DISTRIBUTION_NUM_PROCESSES", "1"))
rows = 16 * a.steps
x = np.random.default_rng(0).normal(size=(rows, 16)).astype("float32")
if batch_axis > 1:  # each process gives its rows of every batch
    data, batch = x[process::processes], 16 // processes
else:  # a batch axis of one device: every process gives the whole batch
    data, batch = x, 16


def newest_epoch():
    """The epoch of the newest checkpoint in a.ckpt (Orbax's step: the epoch), or None."""
    if a.backup_and_restore or not os.path.isdir(a.ckpt):
        return None
    steps = [int(name) for name in os.listdir(a.ckpt) if name.isdigit()]
    return max(steps) if steps else None


saved = newest_epoch()
initial_epoch = 0
if saved is not None:
    model.build((None, 16))
    model.optimizer.build(model.trainable_variables)
    model.load_weights(a.ckpt)  # the newest step, resharded onto this mesh
    initial_epoch = saved + 1
    print(f"RESUME after epoch {saved}: step {int(model.optimizer.iterations)}", flush=True)


class Steps(keras.callbacks.Callback):
    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        step = int(self.model.optimizer.iterations)
        print(f"STEP {step}", flush=True)
        if step == a.kill_at and process == processes - 1 and not os.path.exists(a.marker):
            # Once the last epoch's checkpoint is on disk: Orbax saves in the background and
            # renames a step's folder to its number when every process has written its part
            # (a kill before that leaves a *.orbax-checkpoint-tmp folder, which a restart skips).
            done = os.path.join(a.ckpt, str(self.epoch - 1))
            deadline = time.monotonic() + 30
            while self.epoch and not os.path.isdir(done) and time.monotonic() < deadline:
                time.sleep(0.05)
            open(a.marker, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)


if a.backup_and_restore:
    saver = keras.callbacks.BackupAndRestore(os.path.join(a.ckpt, f"process_{process}"))
else:
    saver = keras.callbacks.OrbaxCheckpoint(a.ckpt, save_freq="epoch", max_to_keep=2)
if not a.restore_only:
    model.fit(data, data[:, :4], batch_size=batch, epochs=a.epochs, verbose=2, shuffle=False,
              initial_epoch=initial_epoch, callbacks=[Steps(), saver])
kernels = {layer.name: layer.kernel.value for layer in model.layers}
print("RESULT " + json.dumps({
    "process": process, "devices": len(devices), "mesh": [batch_axis, model_axis],
    "resumed_after": saved, "iterations": int(model.optimizer.iterations),
    "specs": {name: list(value.sharding.spec) for name, value in kernels.items()},
    "shards": {name: list(value.addressable_shards[0].data.shape)
               for name, value in kernels.items()},
    # (get_weights() cannot fetch a variable split over another process's devices too)
    "weights": [np.asarray(process_allgather(v.value, tiled=True)).ravel().tolist()
                for v in model.weights],
}), flush=True)
