"""fit/evaluate under MultiWorkerMirroredStrategy with two worker processes.

Upstream path: keras/src/backend/tensorflow/multi_worker_test.py
(keras-team/keras#20585). Each worker is a fresh Python process with its own
TF_CONFIG, as a multi-worker job runs; both listen on 127.0.0.1.
"""

import textwrap

import pytest

from keras.src import backend
from keras.src import testing
from keras.src.testing import multi_worker

WORKER = textwrap.dedent(
    """
    import json

    import numpy as np
    import tensorflow as tf

    import keras

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    x = np.random.default_rng(0).normal(size=(32, 3)).astype("float32")
    y = x.sum(axis=1, keepdims=True)
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(8)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = (
        tf.data.experimental.AutoShardPolicy.DATA
    )
    data = data.with_options(options)
    with strategy.scope():
        keras.utils.set_random_seed(1)
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse", metrics=["mae"])
    history = model.fit(data, epochs=2, verbose=0)
    evaluation = model.evaluate(data, verbose=0, return_dict=True)
    print(
        "RESULT "
        + json.dumps(
            {
                "loss": history.history["loss"],
                "evaluate": evaluation,
                "weights": [w.ravel().tolist() for w in model.get_weights()],
            }
        )
    )
    """
)


@pytest.mark.skipif(
    backend.backend() != "tensorflow",
    reason="MultiWorkerMirroredStrategy is a TensorFlow strategy.",
)
class MultiWorkerMirroredStrategyTest(testing.TestCase):
    def test_fit_and_evaluate_with_two_workers(self):
        first, second = multi_worker.worker_results(WORKER, 2, timeout=240)
        self.assertLen(first["loss"], 2)
        self.assertLess(first["loss"][1], first["loss"][0])
        # Synchronous training: same logs and same weights on both workers.
        self.assertAllClose(first["loss"], second["loss"])
        self.assertEqual(set(first["evaluate"]), {"loss", "mae"})
        for name, value in first["evaluate"].items():
            self.assertAllClose(value, second["evaluate"][name])
        for a, b in zip(first["weights"], second["weights"]):
            self.assertAllClose(a, b)
