"""A MultiWorkerMirroredStrategy job that a fault interrupts once, for the resume tests.

    python resume_train.py --data {finite,repeat,function} [--epochs N] [--backup DIR]
                           [--save-freq N] [--kill-at STEP --kill-task TASK --marker FILE]

The input is the same 256 rows in order on every run, one pass per epoch (8 global batches
of 32): ``finite`` a dataset that ends, ``repeat`` a repeated one with ``steps_per_epoch``,
``function`` ``distribute_datasets_from_function`` with ``steps_per_epoch``.  Prints
``STEP N at=T`` after each step (N: the optimizer's step count) and one line
``RESULT {...}``.  With ``--kill-at``, the task ``--kill-task`` (e.g. worker:1) SIGKILLs itself
right after step N, once (``--marker`` remembers it), as a fault would.
"""
import argparse
import json
import os
import signal
import time

os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

import tensorflow as tf

strategy = tf.distribute.MultiWorkerMirroredStrategy()

import numpy as np  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--data", choices=("finite", "repeat", "function"), required=True)
p.add_argument("--epochs", type=int, default=3)
p.add_argument("--backup", default=None)
p.add_argument("--save-freq", type=int, default=3)
p.add_argument("--kill-at", type=int, default=0)
p.add_argument("--kill-task", default="worker:1")
p.add_argument("--marker", default="killed.marker")
a = p.parse_args()

rows, global_batch = 256, 32
steps = rows // global_batch
rng = np.random.default_rng(0)
x = rng.normal(size=(rows, 8)).astype("float32")
y = (x @ rng.normal(size=(8, 1))).astype("float32")
options = tf.data.Options()
options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
rows_ds = tf.data.Dataset.from_tensor_slices((x, y))

if a.data == "finite":
    data, per_epoch = rows_ds.batch(global_batch).with_options(options), None
elif a.data == "repeat":
    data, per_epoch = rows_ds.batch(global_batch).repeat().with_options(options), steps
else:
    def per_worker(ctx):
        batch = ctx.get_per_replica_batch_size(global_batch)
        # Each worker's share of every global batch, in order: its slice of each 32 rows.
        return (rows_ds.batch(global_batch)
                .map(lambda bx, by: (bx[ctx.input_pipeline_id * batch:][:batch],
                                     by[ctx.input_pipeline_id * batch:][:batch]))
                .repeat())
    data, per_epoch = strategy.distribute_datasets_from_function(per_worker), steps

tf.keras.utils.set_random_seed(0)  # the same initial weights on every run
with strategy.scope():
    model = tf.keras.Sequential([tf.keras.layers.Input((8,)), tf.keras.layers.Dense(1)])
    model.compile(optimizer=tf.keras.optimizers.SGD(0.05), loss="mse")

task = json.loads(os.environ["TF_CONFIG"])["task"]
me = f"{task['type']}:{task['index']}"


class LogSteps(tf.keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        step = int(self.model.optimizer.iterations.numpy())
        print(f"STEP {step} at={time.time():.3f}", flush=True)
        if step == a.kill_at and me == a.kill_task and not os.path.exists(a.marker):
            open(a.marker, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)


callbacks = [LogSteps()]  # first: a step is logged before a backup of it can be written
if a.backup:
    callbacks.append(tf.keras.callbacks.BackupAndRestore(a.backup, save_freq=a.save_freq))
history = model.fit(data, epochs=a.epochs, steps_per_epoch=per_epoch, verbose=0,
                    callbacks=callbacks)
print("RESULT " + json.dumps({
    "task": me,
    "epochs_run": history.epoch,
    "iterations": int(model.optimizer.iterations.numpy()),
    "weights": [w.tolist() for w in model.get_weights()],
}), flush=True)
