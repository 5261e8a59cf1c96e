"""Keras 3 with ``mixed_float16`` under MirroredStrategy in one process, over two logical CPUs,
where replica 1's half of one global batch overflows float16.

12 global batches of 32, one epoch of ``fit``; the second half of global batch
``OVERFLOW_STEP`` (replica 1's share) has targets a million times larger.  The same model is
trained on the same global batches without a strategy, for the comparison.  Prints one
``RESULT {...}`` line: the steps the inner optimizer applied, the loss scale, whether every weight is
finite, whether the two replicas hold the same weights, and the sums of the weights of both
runs.

    python keras3_mixed_mirrored.py [--mend] [OVERFLOW_STEP]

``--mend`` calls ``mwhelpers.fix_keras_multi_worker()`` first.
"""
import json
import sys

import numpy as np
import tensorflow as tf

if "--mend" in sys.argv:
    import mwhelpers

    mwhelpers.fix_keras_multi_worker()
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)

import keras  # noqa: E402

keras.mixed_precision.set_global_policy("mixed_float16")
numbers = [a for a in sys.argv[1:] if a.isdigit()]
overflow_step = int(numbers[0]) if numbers else 4
steps, global_batch = 12, 32
rng = np.random.default_rng(0)
x = rng.normal(size=(steps * global_batch, 4)).astype("float32")
y = (x @ rng.normal(size=(4, 1))).astype("float32")
half = overflow_step * global_batch + global_batch // 2
y[half:half + global_batch // 2] *= 1e6  # replica 1's share of that global batch


def train(strategy):
    with strategy.scope():
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"),
                                  keras.layers.Dense(1)])
        model.compile(keras.optimizers.SGD(0.01), "mse")
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(global_batch)
    model.fit(data, epochs=1, verbose=0, shuffle=False)
    return model


mirrored = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
model = train(mirrored)
alone = train(tf.distribute.get_strategy())
per_replica = [[np.asarray(v) for v in mirrored.experimental_local_results(w.value)]
               for w in model.weights]
print("RESULT " + json.dumps({
    "replicas": mirrored.num_replicas_in_sync,
    "iterations": int(model.optimizer.inner_optimizer.iterations.numpy()),
    "loss_scale": float(model.optimizer.dynamic_scale.numpy()),
    "finite": bool(all(np.isfinite(v).all() for w in per_replica for v in w)),
    "replicas_equal": bool(all(np.array_equal(w[0], v, equal_nan=True) for w in per_replica
                               for v in w)),
    "weights_sum": float(sum(np.sum(w[0]) for w in per_replica)),
    "alone": {"iterations": int(alone.optimizer.inner_optimizer.iterations.numpy()),
              "loss_scale": float(alone.optimizer.dynamic_scale.numpy()),
              "weights_sum": float(sum(np.sum(w.numpy()) for w in alone.weights))},
}), flush=True)
