# A custom training loop under MultiWorkerMirroredStrategy with Keras 3: strategy.run in a
# tf.function, no Keras trainer involved. Prints STEP lines and a RESULT line.
import json
import os
import sys

import tensorflow as tf

strategy = tf.distribute.MultiWorkerMirroredStrategy()

import keras  # noqa: E402
import mnist_setup  # noqa: E402
import numpy as np  # noqa: E402

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 20
global_batch = 64 * strategy.num_replicas_in_sync
dataset = strategy.experimental_distribute_dataset(mnist_setup.mnist_dataset(global_batch))

with strategy.scope():
    model = keras.Sequential([keras.layers.Input((28, 28)), keras.layers.Flatten(),
                              keras.layers.Dense(64, activation="relu"), keras.layers.Dense(10)])
    optimizer = keras.optimizers.SGD(0.1)
loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")


@tf.function
def train_step(batch):
    def step_fn(images, labels):
        with tf.GradientTape() as tape:
            loss = tf.nn.compute_average_loss(loss_fn(labels, model(images, training=True)),
                                              global_batch_size=global_batch)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return loss
    return strategy.reduce("sum", strategy.run(step_fn, args=batch), axis=None)


losses = []
iterator = iter(dataset)
for step in range(1, steps + 1):
    losses.append(float(train_step(next(iterator))))
    print(f"STEP {step} loss {losses[-1]:.4f}", flush=True)
task = json.loads(os.environ["TF_CONFIG"])["task"]
print("RESULT " + json.dumps({"task": f"{task['type']}:{task['index']}", "keras": keras.__version__,
                              "first_loss": losses[0], "last_loss": losses[-1],
                              "weights_sum": float(sum(np.sum(w) for w in model.get_weights()))}),
      flush=True)
