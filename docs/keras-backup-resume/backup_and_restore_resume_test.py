"""Tests for Keras's suite (to sit beside
keras/src/callbacks/backup_and_restore_test.py): a fit stopped between two
backups resumes after the newest backup's batch."""

import os

import numpy as np
import pytest

from keras.src import backend
from keras.src import callbacks
from keras.src import layers
from keras.src import optimizers
from keras.src import testing
from keras.src import utils
from keras.src.models import Sequential


class Stop(Exception):
    pass


class StopAfter(callbacks.Callback):
    """Records (epoch, batch) of every batch begun and the optimizer step
    after every batch; raises `Stop` after optimizer step `step`."""

    def __init__(self, step):
        super().__init__()
        self.step = step
        self.steps = []
        self.batches = []
        self.epoch = None

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        self.batches.append((self.epoch, batch))

    def on_train_batch_end(self, batch, logs=None):
        self.steps.append(int(self.model.optimizer.iterations.numpy()))
        if self.steps[-1] == self.step:
            raise Stop()


def make_model(**kwargs):
    utils.set_random_seed(0)
    model = Sequential([layers.Input((4,)), layers.Dense(1)])
    model.compile(optimizer=optimizers.SGD(0.01), loss="mse", **kwargs)
    return model


def make_data(unknown_size=False):
    """128 fixed samples in batches of 16, unshuffled: a dict of `fit`'s
    arguments. With `unknown_size`, a `tf.data` pipeline whose number of
    batches Keras cannot know."""
    rng = np.random.default_rng(0)
    x = rng.random((128, 4), dtype="float32")
    y = rng.random((128, 1), dtype="float32")
    if not unknown_size:
        return {"x": x, "y": y, "batch_size": 16, "shuffle": False}
    import tensorflow as tf

    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(16)
    return {"x": dataset.filter(lambda x, y: True)}


def fit_twice(backup_dir, stop_at, save_freq, unknown_size=False, **kwargs):
    """3 epochs of 8 batches (`make_data`), stopped after optimizer step
    `stop_at`, then fitted again from the backup: (the second fit's
    recorder, the model, its history)."""
    data = make_data(unknown_size)

    def fit(recorder):
        model = make_model(**kwargs)
        backup = callbacks.BackupAndRestore(backup_dir, save_freq=save_freq)
        history = model.fit(
            **data, epochs=3, callbacks=[recorder, backup], verbose=0
        )
        return model, history

    with pytest.raises(Stop):
        fit(StopAfter(stop_at))
    second = StopAfter(None)
    model, history = fit(second)
    return second, model, history


class StopInValidation(callbacks.Callback):
    def on_test_begin(self, logs=None):
        raise Stop()


class BackupAndRestoreResumeTest(testing.TestCase):
    @pytest.mark.requires_trainable_backend
    def test_resumes_after_the_saved_batch(self):
        # A backup every 3 batches: steps 3, 6, 9, 12... Stopped after step
        # 14, epoch 1's 6th batch: the newest backup is of step 12.
        second, model, history = fit_twice(
            os.path.join(self.get_temp_dir(), "backup"), 14, 3
        )
        self.assertEqual(second.batches[0], (1, 4))
        self.assertEqual(second.steps[0], 13)
        self.assertEqual(int(model.optimizer.iterations.numpy()), 24)
        self.assertEqual(history.epoch, [1, 2])

    @pytest.mark.requires_trainable_backend
    def test_a_backup_of_an_epochs_last_batch_resumes_at_the_next(self):
        # A backup every 4 batches: step 8 is epoch 0's last batch.
        second, model, history = fit_twice(
            os.path.join(self.get_temp_dir(), "backup"), 10, 4
        )
        self.assertEqual(second.batches[0], (1, 0))
        self.assertEqual(int(model.optimizer.iterations.numpy()), 24)
        self.assertEqual(history.epoch, [1, 2])

    @pytest.mark.requires_trainable_backend
    def test_the_same_with_input_of_unknown_size(self):
        # The number of batches is unknown when the backup is restored. (On
        # TensorFlow such input also counts one optimizer step more per
        # epoch, with or without a fault: compare the batches run instead.)
        second, _, history = fit_twice(
            os.path.join(self.get_temp_dir(), "backup"),
            10,
            4,
            unknown_size=True,
        )
        self.assertEqual(second.batches[0], (1, 0))
        self.assertEqual(history.epoch, [1, 2])
        self.assertEqual(
            [epoch for epoch, _ in second.batches].count(1),
            [epoch for epoch, _ in second.batches].count(2),
        )

    @pytest.mark.requires_trainable_backend
    def test_resumes_with_several_steps_per_execution(self):
        # Two batches per execution: the backups fall on even steps.
        second, model, history = fit_twice(
            os.path.join(self.get_temp_dir(), "backup"),
            14,
            4,
            steps_per_execution=2,
        )
        self.assertEqual(second.steps[0], 14)  # steps 13 and 14, one execution
        self.assertEqual(int(model.optimizer.iterations.numpy()), 24)
        self.assertEqual(history.epoch, [1, 2])

    @pytest.mark.requires_trainable_backend
    def test_the_resumed_run_ends_with_an_uninterrupted_runs_weights(self):
        # The restored epoch draws the batches trained before the backup and
        # trains on the rest: with unshuffled input, the same batches as a
        # run without the fault (counting them without drawing would not).
        for unknown_size in (False, True):
            backup_dir = os.path.join(
                self.get_temp_dir(), f"backup-{unknown_size}"
            )
            _, resumed, _ = fit_twice(backup_dir, 14, 3, unknown_size)
            model = make_model()
            model.fit(**make_data(unknown_size), epochs=3, verbose=0)
            for a, b in zip(resumed.get_weights(), model.get_weights()):
                self.assertAllClose(a, b)

    @pytest.mark.requires_trainable_backend
    @pytest.mark.skipif(
        backend.backend() == "jax",
        reason="The JAX trainer cannot run an epoch with no batch: a separate "
        "gap (its model variables are restored by a step).",
    )
    def test_a_fault_between_the_last_backup_and_the_epochs_end(self):
        # Input of unknown size; the newest backup is of epoch 0's last
        # batch, and the fault comes in validation, before the epoch's end
        # records that epoch 1 begins: the restored epoch 0 has no batch
        # left, and runs none.
        backup_dir = os.path.join(self.get_temp_dir(), "backup")
        data = make_data(unknown_size=True)
        backup = callbacks.BackupAndRestore(backup_dir, save_freq=4)
        with pytest.raises(Stop):
            make_model().fit(
                **data,
                epochs=3,
                validation_data=data["x"],
                callbacks=[backup, StopInValidation()],
                verbose=0,
            )
        second = StopAfter(None)
        backup = callbacks.BackupAndRestore(backup_dir, save_freq=4)
        history = make_model().fit(
            **data, epochs=3, callbacks=[second, backup], verbose=0
        )
        self.assertEqual(history.epoch[-1], 2)
        self.assertTrue(all(b >= 8 for e, b in second.batches if e == 0))
        batches = [epoch for epoch, _ in second.batches]
        self.assertEqual(batches.count(1), batches.count(2))
