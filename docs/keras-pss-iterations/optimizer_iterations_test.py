"""`optimizer.iterations` is counted with one update op.

Upstream path: keras/src/optimizers/optimizer_iterations_test.py.
"""

import numpy as np
import pytest

from keras.src import backend
from keras.src import optimizers
from keras.src import testing


class OptimizerIterationsTest(testing.TestCase):
    def _counter_updates(self, optimizer):
        """The types of the ops of a traced `apply` that write the counter."""
        import tensorflow as tf

        var = backend.Variable(np.ones((2,)), dtype="float32")
        optimizer.build([var])
        grads = tf.constant([0.5, 0.5])
        step = tf.function(lambda: optimizer.apply([grads], [var]))
        graph = step.get_concrete_function().graph
        handle = optimizer.iterations.value.handle
        inside = [i for e, i in graph.captures if e is handle]
        self.assertLen(inside, 1)
        return [
            op.type
            for op in graph.get_operations()
            if op.type.startswith("Assign") and op.inputs[0] is inside[0]
        ]

    @pytest.mark.skipif(
        backend.backend() != "tensorflow",
        reason="Reads the ops of a TensorFlow graph.",
    )
    def test_iterations_is_one_assign_add(self):
        # Under ParameterServerStrategy the counter lives on a parameter
        # server and several workers step at once: a read followed by an
        # assign loses the steps that land in between.
        optimizer = optimizers.SGD(0.1)
        self.assertEqual(
            self._counter_updates(optimizer), ["AssignAddVariableOp"]
        )
        self.assertEqual(int(optimizer.iterations.numpy()), 0)

    def test_iterations_still_counts(self):
        optimizer = optimizers.SGD(0.1)
        var = backend.Variable(np.ones((2,)), dtype="float32")
        for _ in range(3):
            optimizer.apply([np.full((2,), 0.5, "float32")], [var])
        self.assertEqual(int(optimizer.iterations.numpy()), 3)
        self.assertAllClose(var, np.full((2,), 0.85))
