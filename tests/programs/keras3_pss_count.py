"""Keras 3's ``optimizer.iterations`` under ParameterServerStrategy: does it count every step?

Run as every task of a cluster with a chief, workers and a ps: the workers and the ps serve;
the chief coordinates: it schedules STEPS steps of a custom loop (a Keras model and optimizer,
``apply_gradients``), each also adding 1 to a plain ``tf.Variable``, and prints one
``RESULT {...}`` line with both counts.

    python keras3_pss_count.py STEPS
"""
import json
import os
import sys

import tensorflow as tf

resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
if resolver.task_type in ("worker", "ps"):
    os.environ["GRPC_FAIL_FAST"] = "use_caller"
    server = tf.distribute.Server(resolver.cluster_spec(), job_name=resolver.task_type,
                                  task_index=resolver.task_id, protocol="grpc", start=True)
    server.join()

steps = int(sys.argv[1])
strategy = tf.distribute.ParameterServerStrategy(resolver)
coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)

import keras  # noqa: E402

with strategy.scope():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    optimizer = keras.optimizers.SGD(0.01)
    optimizer.build(model.trainable_variables)
    counted = tf.Variable(0, dtype=tf.int64)


@tf.function
def step():
    def replica_fn():
        x = tf.random.normal((8, 4))
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(model(x) ** 2)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        counted.assign_add(1)

    strategy.run(replica_fn)


for _ in range(steps):
    coordinator.schedule(step)
coordinator.join()
print("RESULT " + json.dumps({"steps": steps, "counted": int(counted.numpy()),
                              "iterations": int(optimizer.iterations.numpy()),
                              "device": optimizer.iterations.value.device}), flush=True)
