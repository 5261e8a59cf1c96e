"""TensorBoard under MultiWorkerMirroredStrategy with two workers.

Upstream path: keras/src/callbacks/tensorboard_multi_worker_test.py.
Each worker is a fresh Python process with its own TF_CONFIG, as a
multi-worker job runs; both listen on 127.0.0.1. Worker 0 is the chief.
Both train with a custom loop that calls the callback's hooks as `fit`
does, and write to the same `log_dir`. Only the chief may write there; the
other worker writes to `log_dir/workertemp_1`, removed when training ends.
"""

import os
import textwrap

import pytest

from keras.src import backend
from keras.src import testing
from keras.src.testing import multi_worker

WORKER = textwrap.dedent(
    """
    import json
    import os
    import sys

    import numpy as np
    import tensorflow as tf

    import keras

    log_dir = sys.argv[1]
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    with strategy.scope():
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse")
        model.optimizer.build(model.trainable_variables)

    def step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(x) - y))
        grads = tape.gradient(loss, model.trainable_variables)
        model.optimizer.apply(grads, model.trainable_variables)
        return loss

    @tf.function
    def train(x, y):
        loss = strategy.run(step, args=(x, y))
        return strategy.reduce("MEAN", loss, axis=None)

    def own_event_folders():
        folders = set()
        for root, _, names in os.walk(log_dir):
            for name in names:
                if name.split(".")[-3] == str(os.getpid()):
                    folders.add(os.path.relpath(root, log_dir))
        return sorted(folders)

    x = np.ones((8, 3), "float32")
    board = keras.callbacks.TensorBoard(log_dir)
    callbacks = keras.callbacks.CallbackList([board], model=model)
    callbacks.on_train_begin()
    for epoch in range(2):
        callbacks.on_epoch_begin(epoch)
        callbacks.on_train_batch_begin(0)
        loss = float(train(x, x[:, :1]))
        callbacks.on_train_batch_end(0, {"loss": loss})
        callbacks.on_test_begin()
        callbacks.on_test_end({"loss": loss})
        callbacks.on_epoch_end(epoch, {"loss": loss, "val_loss": loss})
    before_end = own_event_folders()
    callbacks.on_train_end()
    # `evaluate` and `predict` after `fit`, with the same callback: each
    # makes a list of its own, which sets the model again.
    callbacks = keras.callbacks.CallbackList([board], model=model)
    callbacks.on_test_begin()
    callbacks.on_test_end({"loss": loss})
    after_evaluate = sorted(os.listdir(log_dir))
    callbacks = keras.callbacks.CallbackList([board], model=model)
    callbacks.on_predict_begin()
    callbacks.on_predict_end()
    after_predict = sorted(os.listdir(log_dir))
    # A `predict` whose callback never made its folder (no graph written).
    quiet_dir = os.path.join(sys.argv[2], f"quiet-{os.getpid()}")
    quiet = keras.callbacks.TensorBoard(quiet_dir, write_graph=False)
    callbacks = keras.callbacks.CallbackList([quiet], model=model)
    callbacks.on_predict_begin()
    callbacks.on_predict_end()
    quiet_left = os.path.exists(quiet_dir)
    print(
        "RESULT "
        + json.dumps(
            {
                "pid": os.getpid(),
                "before": before_end,
                "after_evaluate": after_evaluate,
                "after_predict": after_predict,
                "quiet_left": quiet_left,
            }
        )
    )
    """
)


@pytest.mark.skipif(
    backend.backend() != "tensorflow",
    reason="MultiWorkerMirroredStrategy is a TensorFlow strategy.",
)
class TensorBoardMultiWorkerTest(testing.TestCase):
    def test_only_the_chief_writes_to_log_dir(self):
        log_dir = os.path.join(self.get_temp_dir(), "logs")
        chief, other = multi_worker.worker_results(
            WORKER, 2, [log_dir, self.get_temp_dir()]
        )
        # While training, each worker wrote its own train and validation
        # files: the chief to `log_dir`, the other to its temporary folder.
        self.assertEqual(chief["before"], ["train", "validation"])
        self.assertEqual(
            other["before"],
            [
                os.path.join("workertemp_1", "train"),
                os.path.join("workertemp_1", "validation"),
            ],
        )
        # A standalone `evaluate` and `predict` leave no temporary folder
        # behind either (each worker looks right after its own call).
        self.assertNotIn("workertemp_1", other["after_evaluate"])
        self.assertNotIn("workertemp_1", other["after_predict"])
        self.assertFalse(other["quiet_left"])
        # Afterwards only the chief's files are left.
        self.assertEqual(sorted(os.listdir(log_dir)), ["train", "validation"])
        for folder in ("train", "validation"):
            for name in os.listdir(os.path.join(log_dir, folder)):
                self.assertEqual(name.split(".")[-3], str(chief["pid"]))
