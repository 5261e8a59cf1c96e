"""LossScaleOptimizer under a strategy with two replicas:
MultiWorkerMirroredStrategy with two workers, and MirroredStrategy over two
logical CPUs in one process.

Upstream path: keras/src/optimizers/loss_scale_optimizer_distribute_test.py.
Each worker is a fresh Python process with its own TF_CONFIG, as a
multi-worker job runs; both listen on 127.0.0.1.  At one step the gradients
of worker 1 overflow float16 and those of worker 0 do not: both must skip
that step.  The collectives time out, so a Keras with the bug fails the test
instead of hanging it.  Under MirroredStrategy (two logical CPUs, set up as
`backend/tensorflow/distribute_test.py` does) replica 1's half of one global
batch overflows: with the bug the first replica's answer is taken for both and
every weight becomes NaN.
"""

import textwrap

import numpy as np
import pytest

from keras.src import backend
from keras.src import testing
from keras.src.testing import multi_worker

STEPS = 5

WORKER = textwrap.dedent(
    """
    import json
    import os

    import numpy as np
    import tensorflow as tf

    import keras

    options = tf.distribute.experimental.CommunicationOptions(
        timeout_seconds=60
    )
    strategy = tf.distribute.MultiWorkerMirroredStrategy(
        communication_options=options
    )
    index = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
    keras.mixed_precision.set_global_policy("mixed_float16")
    with strategy.scope():
        keras.utils.set_random_seed(1)
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
        optimizer = keras.optimizers.LossScaleOptimizer(
            keras.optimizers.SGD(0.01), initial_scale=2.0**10
        )
        optimizer.build(model.trainable_variables)

    def step(x, y):
        with tf.GradientTape() as tape:
            error = tf.cast(model(x), "float32") - y
            loss = optimizer.scale_loss(tf.reduce_mean(tf.square(error)))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply(grads, model.trainable_variables)

    @tf.function
    def train(x, y):
        strategy.run(step, args=(x, y))

    rng = np.random.default_rng(index)
    for i in range(%(steps)d):
        x = rng.normal(size=(8, 3)).astype("float32")
        y = x.sum(axis=1, keepdims=True)
        if i == 1 and index == 1:
            y[0] = 60000.0  # only this worker's gradients overflow
        train(tf.constant(x), tf.constant(y))
    print(
        "RESULT "
        + json.dumps(
            {
                "weights": [w.ravel().tolist() for w in model.get_weights()],
                "scale": float(optimizer.dynamic_scale.numpy()),
                "iterations": int(optimizer.iterations.numpy()),
            }
        )
    )
    """
    % {"steps": STEPS}
)


@pytest.mark.skipif(
    backend.backend() != "tensorflow",
    reason="MultiWorkerMirroredStrategy is a TensorFlow strategy.",
)
class LossScaleOptimizerMultiWorkerTest(testing.TestCase):
    def test_overflow_on_one_worker_skips_the_step_on_both(self):
        first, second = multi_worker.worker_results(WORKER, 2, timeout=180)
        # One step skipped on both workers, the loss scale halved once.
        for result in (first, second):
            self.assertEqual(result["iterations"], STEPS - 1)
            self.assertEqual(result["scale"], 2.0**9)
        for a, b in zip(first["weights"], second["weights"]):
            self.assertAllClose(a, b)


@pytest.mark.skipif(
    backend.backend() != "tensorflow",
    reason="MirroredStrategy is a TensorFlow strategy.",
)
class LossScaleOptimizerMirroredTest(testing.TestCase):
    def setUp(self):
        super().setUp()
        import tensorflow as tf
        from tensorflow.python.eager import context

        # Two devices, as backend/tensorflow/distribute_test.py makes them.
        cpus = tf.config.list_physical_devices("CPU")
        context._reset_context()
        tf.config.set_logical_device_configuration(
            cpus[0],
            [
                tf.config.LogicalDeviceConfiguration(),
                tf.config.LogicalDeviceConfiguration(),
            ],
        )

    def test_overflow_on_one_replica_skips_the_step_on_both(self):
        import tensorflow as tf

        import keras

        keras.mixed_precision.set_global_policy("mixed_float16")
        self.addCleanup(keras.mixed_precision.set_global_policy, "float32")
        strategy = tf.distribute.MirroredStrategy(["CPU:0", "CPU:1"])
        rng = np.random.default_rng(0)
        x = rng.normal(size=(STEPS * 16, 3)).astype("float32")
        y = x.sum(axis=1, keepdims=True)
        y[16 + 8 : 32] *= 1e6  # step 1: replica 1's half of the batch
        with strategy.scope():
            keras.utils.set_random_seed(1)
            model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
            optimizer = keras.optimizers.LossScaleOptimizer(
                keras.optimizers.SGD(0.01), initial_scale=2.0**10
            )
            model.compile(optimizer, "mse")
        data = tf.data.Dataset.from_tensor_slices((x, y)).batch(16)
        model.fit(data, epochs=1, verbose=0, shuffle=False)
        # Step 1 skipped on both replicas, the loss scale halved once, and
        # no replica's inf reached the weights.
        self.assertEqual(
            int(optimizer.inner_optimizer.iterations.numpy()), STEPS - 1
        )
        self.assertEqual(float(optimizer.dynamic_scale.numpy()), 2.0**9)
        for weight in model.get_weights():
            self.assertTrue(np.isfinite(weight).all())
