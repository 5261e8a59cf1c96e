"""A test for Keras's suite
(keras/src/callbacks/backup_and_restore_resume_test.py): a fit stopped between
two backups resumes after the newest backup's batch."""

import os

import numpy as np
import pytest

from keras.src import callbacks
from keras.src import layers
from keras.src import optimizers
from keras.src import testing
from keras.src.models import Sequential


class Stop(Exception):
    pass


class StopAfter(callbacks.Callback):
    def __init__(self, step):
        super().__init__()
        self.step = step
        self.steps = []

    def on_train_batch_end(self, batch, logs=None):
        self.steps.append(int(self.model.optimizer.iterations.numpy()))
        if self.steps[-1] == self.step:
            raise Stop()


def make_model():
    model = Sequential([layers.Input((4,)), layers.Dense(1)])
    model.compile(optimizer=optimizers.SGD(0.01), loss="mse")
    return model


class BackupAndRestoreResumeTest(testing.TestCase):
    @pytest.mark.requires_trainable_backend
    def test_resumes_after_the_saved_batch(self):
        x = np.random.rand(128, 4).astype("float32")
        y = np.random.rand(128, 1).astype("float32")
        backup_dir = os.path.join(self.get_temp_dir(), "backup")
        # 3 epochs of 8 batches, a backup every 3 batches: steps 3, 6, 9, 12...
        first = StopAfter(
            14
        )  # epoch 1, its 6th batch; the newest backup: step 12
        with self.assertRaises(Stop):
            make_model().fit(
                x,
                y,
                batch_size=16,
                epochs=3,
                callbacks=[
                    first,
                    callbacks.BackupAndRestore(backup_dir, save_freq=3),
                ],
                verbose=0,
            )
        second = StopAfter(None)
        model = make_model()
        history = model.fit(
            x,
            y,
            batch_size=16,
            epochs=3,
            callbacks=[
                second,
                callbacks.BackupAndRestore(backup_dir, save_freq=3),
            ],
            verbose=0,
        )
        self.assertEqual(second.steps[0], 13)
        self.assertEqual(int(model.optimizer.iterations.numpy()), 24)
        self.assertEqual(history.epoch, [1, 2])
