"""Keras 3 with ``mixed_float16`` under MultiWorkerMirroredStrategy, where the samples of one
global batch overflow float16 on one worker only.

12 global batches of 32 (16 per worker), one epoch.  The last sample of global batch
``OVERFLOW_STEP`` (worker 1's half of it) has a target so large that its float16 gradients
overflow at the loss scale (2**10): LossScaleOptimizer must skip that step and halve the
scale, on every worker.  ``fit`` trains with ``model.fit``; ``loop`` with a custom loop
(``strategy.run`` of a step that calls the optimizer's ``apply``), which needs no mend of
``fit``.  Every worker also trains the same model without a strategy on the same global
batches, for the comparison.  Prints ``step N`` after each step and one ``RESULT {...}`` line.

    python keras3_mixed.py fit|loop [OVERFLOW_STEP]
"""
import json
import os
import sys

import tensorflow as tf

strategy = tf.distribute.MultiWorkerMirroredStrategy()

import keras  # noqa: E402
import numpy as np  # noqa: E402

keras.mixed_precision.set_global_policy("mixed_float16")
how = sys.argv[1] if len(sys.argv) > 1 else "fit"
overflow_step = int(sys.argv[2]) if len(sys.argv) > 2 else 4
steps, global_batch = 12, 32
rng = np.random.default_rng(0)
x = rng.normal(size=(steps * global_batch, 4)).astype("float32")
y = (x @ rng.normal(size=(4, 1))).astype("float32")
y[overflow_step * global_batch + global_batch - 1] = 60000.0  # in worker 1's half of the batch


class Steps(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        print(f"step {batch}", flush=True)


def build():
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"),
                              keras.layers.Dense(1)])
    # A loss scale that overflows only on the large target (the default, 2**15, also overflows
    # on one process's first batch of 32, and not on a worker's 16).
    optimizer = keras.mixed_precision.LossScaleOptimizer(keras.optimizers.SGD(0.01),
                                                         initial_scale=2.0**10)
    model.compile(optimizer=optimizer, loss="mse")
    return model


def loop(model):
    """The custom loop: each replica's mean squared error over the global batch, scaled."""
    optimizer = model.optimizer
    optimizer.build(model.trainable_variables)

    def step(xb, yb):
        with tf.GradientTape() as tape:
            error = tf.cast(model(xb, training=True), "float32") - yb
            loss = tf.reduce_sum(tf.square(error)) / global_batch
            scaled = optimizer.scale_loss(loss)
        optimizer.apply(tape.gradient(scaled, model.trainable_variables),
                        model.trainable_variables)
        return loss

    @tf.function
    def train(batch):
        return strategy.reduce("SUM", strategy.run(step, args=batch), axis=None)

    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(global_batch)
    for i, batch in enumerate(strategy.experimental_distribute_dataset(data)):
        train(batch)
        print(f"step {i}", flush=True)


def state(model):
    return {"weights_sum": float(sum(np.abs(w).sum() for w in model.get_weights())),
            "loss_scale": float(model.optimizer.dynamic_scale.numpy()),
            "iterations": int(model.optimizer.iterations.numpy())}


with strategy.scope():
    model = build()
if how == "loop":
    with strategy.scope():
        loop(model)
else:
    model.fit(x, y, batch_size=global_batch, epochs=1, shuffle=False, verbose=0,
              callbacks=[Steps()])
alone = build()  # no strategy: one process, the same global batches
alone.fit(x, y, batch_size=global_batch, epochs=1, shuffle=False, verbose=0)
task = json.loads(os.environ["TF_CONFIG"])["task"]
print("RESULT " + json.dumps({"task": f"{task['type']}:{task['index']}", **state(model),
                              "alone": state(alone)}), flush=True)
