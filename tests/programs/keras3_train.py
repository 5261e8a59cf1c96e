"""Keras 3 ``fit`` under MultiWorkerMirroredStrategy, as a user writes it: ``import keras``.

A functional model with dict inputs, trained from NumPy arrays whose last batch is partial,
with ``validation_data`` and a ``ModelCheckpoint``, then ``evaluate`` and ``predict``.  Every
worker also trains the same model without any strategy, in the same process, on the same
global batches, for the comparison.  Prints one ``RESULT {...}`` line.

    python keras3_train.py CHECKPOINT_DIR [EPOCHS]
"""
import json
import os
import sys

import tensorflow as tf

strategy = tf.distribute.MultiWorkerMirroredStrategy()

import keras  # noqa: E402
import numpy as np  # noqa: E402

folder, epochs = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 3
rng = np.random.default_rng(0)
n, global_batch = 16 * 32 + 4, 32  # 16 full global batches and one of 4 (2 per worker)
a = rng.normal(size=(n, 6)).astype("float32")
b = rng.normal(size=(n, 2)).astype("float32")
y = (a @ rng.normal(size=(6, 1)) + b @ rng.normal(size=(2, 1))).astype("float32")
x = {"a": a, "b": b}
validation = ({"a": a[:64], "b": b[:64]}, y[:64])


def build():
    keras.utils.set_random_seed(1)
    ia, ib = keras.Input((6,), name="a"), keras.Input((2,), name="b")
    h = keras.layers.Dense(8, activation="relu")(keras.layers.Concatenate()([ia, ib]))
    model = keras.Model({"a": ia, "b": ib}, keras.layers.Dense(1)(h))
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
    return model


def checksum(model):
    return float(sum(np.abs(w).sum() for w in model.get_weights()))


with strategy.scope():
    model = build()
checkpoint = os.path.join(folder, "model.keras")
history = model.fit(x, y, batch_size=global_batch, epochs=epochs, shuffle=False,
                    validation_data=validation, verbose=2,
                    callbacks=[keras.callbacks.ModelCheckpoint(checkpoint)])
evaluated = model.evaluate(x, y, batch_size=global_batch, verbose=0)
predicted = model.predict(x, batch_size=global_batch, verbose=0)

alone = build()  # no strategy: one process, the same global batches
alone_history = alone.fit(x, y, batch_size=global_batch, epochs=epochs, shuffle=False, verbose=0)
task = json.loads(os.environ["TF_CONFIG"])["task"]
saved = None
if task["index"] == 0:  # the chief's file is whole and holds the trained weights
    saved = checksum(keras.models.load_model(checkpoint))
print("RESULT " + json.dumps({
    "task": f"{task['type']}:{task['index']}", "replicas": strategy.num_replicas_in_sync,
    "loss": history.history["loss"], "val_loss": history.history["val_loss"],
    "evaluate": float(evaluated), "predict_shape": list(predicted.shape),
    "predict_head": predicted[:4, 0].tolist(), "weights_sum": checksum(model),
    "alone_loss": alone_history.history["loss"], "alone_weights_sum": checksum(alone),
    "alone_predict_head": alone.predict({"a": a[:4], "b": b[:4]}, verbose=0)[:, 0].tolist(),
    "saved_weights_sum": saved,
    "files": sorted(os.listdir(folder)),
}), flush=True)
