"""Reproducer: Keras 3's BackupAndRestore(save_freq=N) runs the restored epoch
again from its first batch, so a fault redoes up to an epoch and the job ends
with too many optimizer steps.

    python repro.py                   # the installed Keras
    python repro.py --with-mwhelpers  # mwhelpers.fix_keras_multi_worker() first

One process, no distribution strategy: the fault is in the callback and the
trainer, not in tf.distribute. A model trains 3 epochs of 8 batches with a
backup every 3 batches, so the backups are of steps 3, 6, 9, 12, ... The first
fit stops with an exception right after step 14 (epoch 1, its 6th batch); the
newest backup is of step 12 (epoch 1, its 4th batch). A second fit, with a new
model and a new callback as after a restart, restores it. Exit status: 0 when
the second fit starts at step 13 and the job ends with 3 x 8 = 24 optimizer
steps ("FIXED"); 1 when it starts epoch 1 again and ends with more ("BUG
PRESENT"). Needs only TensorFlow and Keras 3.
"""

import argparse
import sys
import tempfile

EPOCHS, STEPS, SAVE_FREQ, STOP_AFTER = 3, 8, 3, 14


class Stop(Exception):
    pass


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--with-mwhelpers", action="store_true")
    a = p.parse_args()
    if a.with_mwhelpers:
        import mwhelpers

        mwhelpers.fix_keras_multi_worker()
    import numpy as np

    import keras

    rng = np.random.default_rng(0)
    x = rng.normal(size=(STEPS * 16, 4)).astype("float32")
    y = x @ np.array([[1.0], [2.0], [-1.0], [0.5]], "float32")

    def new_model():
        model = keras.Sequential(
            [keras.layers.Input((4,)), keras.layers.Dense(1)]
        )
        model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
        return model

    class Steps(keras.callbacks.Callback):
        def __init__(self, stop_after=None):
            super().__init__()
            self.stop_after, self.seen = stop_after, []

        def on_train_batch_end(self, batch, logs=None):
            self.seen.append(int(self.model.optimizer.iterations.numpy()))
            if self.seen[-1] == self.stop_after:
                raise Stop()

    backup = tempfile.mkdtemp()
    first = Steps(stop_after=STOP_AFTER)
    try:
        new_model().fit(
            x,
            y,
            batch_size=16,
            epochs=EPOCHS,
            verbose=0,
            callbacks=[
                first,
                keras.callbacks.BackupAndRestore(backup, save_freq=SAVE_FREQ),
            ],
        )
    except Stop:
        pass
    second = Steps()
    model = new_model()
    model.fit(
        x,
        y,
        batch_size=16,
        epochs=EPOCHS,
        verbose=0,
        callbacks=[
            second,
            keras.callbacks.BackupAndRestore(backup, save_freq=SAVE_FREQ),
        ],
    )
    final = int(model.optimizer.iterations.numpy())
    asked = EPOCHS * STEPS
    print(
        f"Keras {keras.__version__}: "
        f"first fit stopped after step {first.seen[-1]}; "
        f"the second fit ran steps {second.seen[0]} to {second.seen[-1]}; "
        f"{final} optimizer steps in all for {EPOCHS} x {STEPS} = {asked}"
    )
    if final == EPOCHS * STEPS and second.seen[0] == 13:
        print("FIXED: the restored epoch resumed after the backup's batch")
        return 0
    print(
        f"BUG PRESENT: the restored epoch ran again from its first batch "
        f"({final - EPOCHS * STEPS} steps more than asked)"
    )
    return 1


if __name__ == "__main__":
    sys.exit(main())
