"""fit/evaluate under MultiWorkerMirroredStrategy with two worker processes.

Upstream path: keras/src/backend/tensorflow/multi_worker_test.py
(keras-team/keras#20585). Each worker is a fresh Python process with its own
TF_CONFIG, as a multi-worker job runs; both listen on 127.0.0.1.
"""

import json
import os
import socket
import subprocess
import sys
import tempfile
import textwrap

import pytest

import keras
from keras.src import backend
from keras.src import testing

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


def _free_ports(count):
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def _run_workers(count, timeout=240):
    """Runs WORKER in `count` processes; returns [(exit code, output)]."""
    cluster = {"worker": [f"127.0.0.1:{p}" for p in _free_ports(count)]}
    # The workers import the same Keras as this test.
    keras_root = os.path.dirname(os.path.dirname(keras.__file__))
    path = [keras_root, os.environ.get("PYTHONPATH", "")]
    env = dict(
        os.environ,
        KERAS_BACKEND="tensorflow",
        TF_CPP_MIN_LOG_LEVEL="2",
        PYTHONPATH=os.pathsep.join(p for p in path if p),
    )
    procs = []
    try:
        for index in range(count):
            task = {"type": "worker", "index": index}
            env["TF_CONFIG"] = json.dumps({"cluster": cluster, "task": task})
            log = tempfile.TemporaryFile("w+")
            procs.append(
                (
                    subprocess.Popen(
                        [sys.executable, "-c", WORKER],
                        env=env,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        text=True,
                    ),
                    log,
                )
            )
        results = []
        for proc, log in procs:
            try:
                code = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                code = "timeout"
            log.seek(0)
            results.append((code, log.read()))
        return results
    finally:
        for proc, log in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            log.close()


@pytest.mark.skipif(
    backend.backend() != "tensorflow",
    reason="MultiWorkerMirroredStrategy is a TensorFlow strategy.",
)
class MultiWorkerMirroredStrategyTest(testing.TestCase):
    def test_fit_and_evaluate_with_two_workers(self):
        results = []
        for code, output in _run_workers(2):
            self.assertEqual(code, 0, msg=output[-3000:])
            lines = [
                ln for ln in output.splitlines() if ln.startswith("RESULT")
            ]
            self.assertLen(lines, 1, msg=output[-3000:])
            results.append(json.loads(lines[0][len("RESULT ") :]))
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
