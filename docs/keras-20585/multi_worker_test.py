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

# With the argument "dict", the inputs are a dict of two arrays
# (keras-team/keras#20329).
WORKER = textwrap.dedent(
    """
    import json
    import sys

    import numpy as np
    import tensorflow as tf

    import keras

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    x = np.random.default_rng(0).normal(size=(32, 3)).astype("float32")
    y = x.sum(axis=1, keepdims=True)
    if sys.argv[1:] == ["dict"]:
        inputs = {"a": x[:, :2], "b": x[:, 2:]}
    else:
        inputs = x
    data = tf.data.Dataset.from_tensor_slices((inputs, y)).batch(8)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = (
        tf.data.experimental.AutoShardPolicy.DATA
    )
    data = data.with_options(options)
    with strategy.scope():
        keras.utils.set_random_seed(1)
        if sys.argv[1:] == ["dict"]:
            a, b = keras.Input((2,), name="a"), keras.Input((1,), name="b")
            joined = keras.layers.Concatenate()([a, b])
            outputs = keras.layers.Dense(1)(joined)
            model = keras.Model({"a": a, "b": b}, outputs)
        else:
            model = keras.Sequential(
                [keras.Input((3,)), keras.layers.Dense(1)]
            )
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
        self._check(multi_worker.worker_results(WORKER, 2, timeout=240))

    def test_fit_and_evaluate_dict_inputs_with_two_workers(self):
        self._check(
            multi_worker.worker_results(WORKER, 2, args=("dict",), timeout=240)
        )

    def _check(self, results):
        first, second = results
        self.assertLen(first["loss"], 2)
        self.assertLess(first["loss"][1], first["loss"][0])
        # Synchronous training: same logs and same weights on both workers.
        self.assertAllClose(first["loss"], second["loss"])
        self.assertEqual(set(first["evaluate"]), {"loss", "mae"})
        for name, value in first["evaluate"].items():
            self.assertAllClose(value, second["evaluate"][name])
        for a, b in zip(first["weights"], second["weights"]):
            self.assertAllClose(a, b)
