"""TensorBoard under MultiWorkerMirroredStrategy with two workers.

Upstream path: keras/src/callbacks/tensorboard_multi_worker_test.py.
Each worker is a fresh Python process with its own TF_CONFIG, as a
multi-worker job runs; both listen on 127.0.0.1. Worker 0 is the chief.
Both `fit`, `evaluate` and `predict` with the same `log_dir` (`fit` under
multi-worker MultiWorkerMirroredStrategy needs the fix of
keras-team/keras#20585, which this test is stacked on). Only the chief may
write there; the other worker writes to `log_dir/workertemp_1`, removed
when `fit`, `evaluate` or `predict` ends.
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
    x = np.ones((16, 3), "float32")
    y = x[:, :1]

    def own_event_folders():
        folders = set()
        for root, _, names in os.walk(log_dir):
            for name in names:
                if name.split(".")[-3] == str(os.getpid()):
                    folders.add(os.path.relpath(root, log_dir))
        return sorted(folders)

    class Before(keras.callbacks.Callback):
        # After TensorBoard's `on_epoch_end`, before its `on_train_end`.
        def on_epoch_end(self, epoch, logs=None):
            self.folders = own_event_folders()

    board = keras.callbacks.TensorBoard(log_dir)
    before = Before()
    model.fit(
        x,
        y,
        batch_size=8,
        epochs=2,
        validation_data=(x, y),
        callbacks=[board, before],
        verbose=0,
    )
    # `evaluate` and `predict` after `fit`, with the same callback.
    model.evaluate(x, y, batch_size=8, callbacks=[board], verbose=0)
    after_evaluate = sorted(os.listdir(log_dir))
    model.predict(x, batch_size=8, callbacks=[board], verbose=0)
    after_predict = sorted(os.listdir(log_dir))
    # A `predict` whose callback never made its folder (no graph written).
    quiet_dir = os.path.join(sys.argv[2], f"quiet-{os.getpid()}")
    quiet = keras.callbacks.TensorBoard(quiet_dir, write_graph=False)
    model.predict(x, batch_size=8, callbacks=[quiet], verbose=0)
    print(
        "RESULT "
        + json.dumps(
            {
                "pid": os.getpid(),
                "before": before.folders,
                "after_evaluate": after_evaluate,
                "after_predict": after_predict,
                "quiet_left": os.path.exists(quiet_dir),
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
