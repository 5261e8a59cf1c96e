"""Two workers that do not run the same collective at the same point, one way per MODE.

Made to record the messages TensorFlow writes when the members of a collective disagree
(tests/recorded/, see its README).  Each task builds MultiWorkerMirroredStrategy (which
starts the server and the collective runtime, worker:0 leading the groups), then does what
MODE says, worker:1 differently from worker:0:

    python collectives_differ.py MODE

shape        all-reduce a vector of 178 values (worker:1) where worker:0 reduces one value
dtype        all-reduce float64 (worker:1) where worker:0 reduces float32
kind         all-gather (worker:1) where worker:0 all-reduces, at the same instance
group-size   a raw all-reduce in a group of 3 (worker:1) where worker:0 says 2
group-full   a raw all-reduce in a group of 1 on both tasks, with the same group key
instance-key a raw all-reduce with instance key 2 (worker:1) where worker:0 uses 1
no-source    a raw broadcast that both tasks receive and neither sends
two-sources  a raw broadcast that both tasks send
order        two all-reduces, of a scalar and of a vector, in opposite orders
model        Keras 3: a model of one Dense layer (worker:0) and of two (worker:1)
steps        Keras 3 fit with steps_per_epoch 3 (worker:0) and 5 (worker:1)
"""
import json
import os
import sys

import tensorflow as tf
from tensorflow.python.ops import collective_ops

strategy = tf.distribute.MultiWorkerMirroredStrategy()
mode = sys.argv[1]
index = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
other = index == 1
print(f"worker:{index} mode {mode}", flush=True)

GROUP = 500  # a group key of our own, apart from the strategy's


def raw_all_reduce(size, instance, timeout=0.0):
    @tf.function
    def run():
        return collective_ops.all_reduce_v2(tf.ones([2]), group_size=size, group_key=GROUP,
                                            instance_key=instance, timeout=timeout)
    return run()


def reduce_value(value):
    @tf.function
    def run():
        return strategy.reduce("SUM", strategy.run(lambda: value), axis=None)
    return run()


if mode == "shape":
    print(reduce_value(tf.ones([178]) if other else tf.ones([1])))
elif mode == "dtype":
    print(reduce_value(tf.ones([1], tf.float64) if other else tf.ones([1])))
elif mode == "kind":
    @tf.function
    def gathered():
        return strategy.gather(strategy.run(lambda: tf.ones([1])), axis=0)
    print(gathered() if other else reduce_value(tf.ones([1])))
elif mode == "group-size":
    print(raw_all_reduce(3 if other else 2, instance=1))
elif mode == "group-full":
    print(raw_all_reduce(1, instance=1))
elif mode == "instance-key":
    print(raw_all_reduce(2, instance=2 if other else 1, timeout=10.0))
elif mode in ("no-source", "two-sources"):
    @tf.function
    def broadcast():
        if mode == "two-sources":
            return collective_ops.broadcast_send_v2(tf.ones([2]), group_size=2, group_key=GROUP,
                                                    instance_key=1)
        return collective_ops.broadcast_recv_v2([2], tf.float32, group_size=2, group_key=GROUP,
                                                instance_key=1)
    print(broadcast())
elif mode == "order":
    first, second = (tf.ones([3]), tf.ones([])) if other else (tf.ones([]), tf.ones([3]))

    @tf.function
    def both():
        a = strategy.run(lambda: first)
        b = strategy.run(lambda: second)
        return strategy.reduce("SUM", a, axis=None), strategy.reduce("SUM", b, axis=None)
    print(both())
elif mode in ("model", "steps"):
    import keras
    import numpy as np

    with strategy.scope():
        layers = [keras.Input((4,)), keras.layers.Dense(1)]
        if mode == "model" and other:
            layers.insert(1, keras.layers.Dense(3))
        model = keras.Sequential(layers)
        model.compile("sgd", "mse")
    x, y = np.ones((64, 4), "float32"), np.ones((64, 1), "float32")
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(8).repeat()
    steps = (5 if other else 3) if mode == "steps" else 3
    model.fit(data, epochs=2, steps_per_epoch=steps, verbose=2)
else:
    sys.exit(f"unknown mode {mode!r}")
print("done", flush=True)
