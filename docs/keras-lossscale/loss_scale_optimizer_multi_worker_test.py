"""LossScaleOptimizer under MultiWorkerMirroredStrategy with two workers.

Upstream path: keras/src/optimizers/loss_scale_optimizer_multi_worker_test.py.
Each worker is a fresh Python process with its own TF_CONFIG, as a
multi-worker job runs; both listen on 127.0.0.1.  At one step the gradients
of worker 1 overflow float16 and those of worker 0 do not: both must skip
that step.  The collectives time out, so a Keras with the bug fails the test
instead of hanging it.
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

STEPS = 5

WORKER = textwrap.dedent(
    """
    import json
    import os

    import numpy as np
    import tensorflow as tf

    import keras

    options = tf.distribute.experimental.CommunicationOptions(
        timeout_seconds=20
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


def _free_ports(count):
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def _run_workers(count, timeout=120):
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
class LossScaleOptimizerMultiWorkerTest(testing.TestCase):
    def test_overflow_on_one_worker_skips_the_step_on_both(self):
        results = []
        for code, output in _run_workers(2):
            self.assertEqual(code, 0, msg=output[-3000:])
            lines = [
                ln for ln in output.splitlines() if ln.startswith("RESULT")
            ]
            self.assertLen(lines, 1, msg=output[-3000:])
            results.append(json.loads(lines[0][len("RESULT ") :]))
        first, second = results
        # One step skipped on both workers, the loss scale halved once.
        for result in results:
            self.assertEqual(result["iterations"], STEPS - 1)
            self.assertEqual(result["scale"], 2.0**9)
        for a, b in zip(first["weights"], second["weights"]):
            self.assertAllClose(a, b)
