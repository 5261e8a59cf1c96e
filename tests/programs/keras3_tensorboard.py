"""Keras 3 ``fit`` under MultiWorkerMirroredStrategy with a ``TensorBoard`` callback.

Prints one ``RESULT {...}`` line with the task and its weights' sum after training.  With
``plain`` the callback runs as Keras wrote it (mwhelpers' TensorBoard mend undone; the fit
mend stays, without which fit fails).

    python keras3_tensorboard.py LOG_DIR [plain]
"""
import json
import os
import sys

import tensorflow as tf

strategy = tf.distribute.MultiWorkerMirroredStrategy()

import keras  # noqa: E402
import numpy as np  # noqa: E402

if sys.argv[2:] == ["plain"]:
    for name in ("set_model", "on_train_begin", "on_train_end", "on_test_end", "on_predict_end"):
        method = getattr(keras.callbacks.TensorBoard, name)
        setattr(keras.callbacks.TensorBoard, name, getattr(method, "__wrapped__", method))
rng = np.random.default_rng(0)
x = rng.normal(size=(256, 4)).astype("float32")
y = x.sum(axis=1, keepdims=True)
with strategy.scope():
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
board = keras.callbacks.TensorBoard(sys.argv[1])
model.fit(x, y, batch_size=32, epochs=2, shuffle=False, verbose=2,
          validation_data=(x[:64], y[:64]), callbacks=[board])
# The same callback again, outside fit: each call's set_model makes new writers.
model.evaluate(x[:64], y[:64], batch_size=32, verbose=0, callbacks=[board])
model.predict(x[:64], batch_size=32, verbose=0, callbacks=[board])
task = json.loads(os.environ["TF_CONFIG"])["task"]
print("RESULT " + json.dumps({
    "task": f"{task['type']}:{task['index']}",
    "weights_sum": float(sum(np.abs(w).sum() for w in model.get_weights()))}), flush=True)
