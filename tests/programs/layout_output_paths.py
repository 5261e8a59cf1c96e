"""The output paths Keras looks a layout up by (recorded from ModelParallel.get_tensor_layout
during fit) against those the LayoutMap check reads from the model
(mwhelpers/taskside/keraslayout.py ``_outputs``), for a functional model and a Sequential one,
each with a weightless layer and a block of its own layers.  Prints ``RESULT {...}``."""

import json
import os

os.environ["KERAS_BACKEND"] = "jax"
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=2")

import keras
import numpy as np
from keras import layers
from keras.src.distribution import distribution_lib as dl

from mwhelpers.taskside.keraslayout import _outputs

seen = set()
looked_up = dl.ModelParallel.get_tensor_layout
dl.ModelParallel.get_tensor_layout = lambda self, path: (seen.add(path), looked_up(self, path))[1]
devices = dl.list_devices()
rules = dl.LayoutMap(dl.DeviceMesh((len(devices),), ["model"], devices))
rules[".*/kernel"] = (None, "model")


class Block(layers.Layer):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.dense = layers.Dense(8, name="inner_d")
        self.drop = layers.Dropout(0.1, name="inner_drop")

    def call(self, x):
        return self.drop(self.dense(x))


found = {}
for kind in ("functional", "sequential"):
    seen.clear()
    with dl.ModelParallel(layout_map=rules).scope():
        if kind == "functional":
            x = inputs = keras.Input((8,))
            for layer in (layers.Dense(8, name="fd"), layers.Dropout(0.1, name="fdrop"),
                          Block(name="blk")):
                x = layer(x)
            model = keras.Model(inputs, x, name="func")
        else:
            model = keras.Sequential([keras.Input((8,)), layers.Dense(8, name="sd"),
                                      layers.Dropout(0.1, name="sdrop"), Block(name="sblk")],
                                     name="seq")
        model.compile(optimizer="sgd", loss="mse")
        model.fit(np.ones((16, 8), "float32"), np.ones((16, 8), "float32"), batch_size=8,
                  verbose=0)
    found[kind] = {"keras": sorted(seen), "check": sorted(_outputs(model))}
print("RESULT " + json.dumps(found), flush=True)
