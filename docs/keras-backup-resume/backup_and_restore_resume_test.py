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


def make_model(**kwargs):
    model = Sequential([layers.Input((4,)), layers.Dense(1)])
    model.compile(optimizer=optimizers.SGD(0.01), loss="mse", **kwargs)
    return model


def fit_twice(backup_dir, stop_at, save_freq, **kwargs):
    """3 epochs of 8 batches, stopped after optimizer step `stop_at`, then
    fitted again from the backup: (the steps of the second fit, the model,
    its history)."""
    x = np.random.rand(128, 4).astype("float32")
    y = np.random.rand(128, 1).astype("float32")
    first = StopAfter(stop_at)
    with pytest.raises(Stop):
        make_model(**kwargs).fit(
            x,
            y,
            batch_size=16,
            epochs=3,
            callbacks=[
                first,
                callbacks.BackupAndRestore(backup_dir, save_freq=save_freq),
            ],
            verbose=0,
        )
    second = StopAfter(None)
    model = make_model(**kwargs)
    history = model.fit(
        x,
        y,
        batch_size=16,
        epochs=3,
        callbacks=[
            second,
            callbacks.BackupAndRestore(backup_dir, save_freq=save_freq),
        ],
        verbose=0,
    )
    return second.steps, model, history


class BackupAndRestoreResumeTest(testing.TestCase):
    @pytest.mark.requires_trainable_backend
    def test_resumes_after_the_saved_batch(self):
        # A backup every 3 batches: steps 3, 6, 9, 12... Stopped after step
        # 14, epoch 1's 6th batch: the newest backup is of step 12.
        steps, model, history = fit_twice(
            os.path.join(self.get_temp_dir(), "backup"), 14, 3
        )
        self.assertEqual(steps[0], 13)
        self.assertEqual(int(model.optimizer.iterations.numpy()), 24)
        self.assertEqual(history.epoch, [1, 2])

    @pytest.mark.requires_trainable_backend
    def test_a_backup_of_an_epochs_last_batch_resumes_at_the_next(self):
        # A backup every 4 batches: step 8 is epoch 0's last batch.
        steps, model, history = fit_twice(
            os.path.join(self.get_temp_dir(), "backup"), 10, 4
        )
        self.assertEqual(steps[0], 9)
        self.assertEqual(int(model.optimizer.iterations.numpy()), 24)
        self.assertEqual(history.epoch[-1], 2)

    @pytest.mark.requires_trainable_backend
    def test_resumes_with_several_steps_per_execution(self):
        # Two batches per execution: the backups fall on even steps.
        steps, model, _ = fit_twice(
            os.path.join(self.get_temp_dir(), "backup"),
            14,
            4,
            steps_per_execution=2,
        )
        self.assertEqual(steps[0], 14)  # steps 13 and 14, one execution
        self.assertEqual(int(model.optimizer.iterations.numpy()), 24)
