"""`optimizer.iterations` is counted with one update op.

Upstream path: keras/src/optimizers/optimizer_iterations_test.py.
"""

import numpy as np
import pytest

from keras.src import backend
from keras.src import optimizers
from keras.src import testing


class OptimizerIterationsTest(testing.TestCase):
    def _apply_ops(self, optimizer):
        import tensorflow as tf

        var = backend.Variable(np.ones((2,)), dtype="float32")
        optimizer.build([var])
        grads = tf.constant([0.5, 0.5])
        step = tf.function(lambda: optimizer.apply([grads], [var]))
        graph = step.get_concrete_function().graph
        return [op.type for op in graph.get_operations()], optimizer

    @pytest.mark.skipif(
        backend.backend() != "tensorflow",
        reason="Counts the ops of a TensorFlow graph.",
    )
    def test_iterations_is_one_assign_add(self):
        # Under ParameterServerStrategy the counter lives on a parameter
        # server and several workers step at once: a read followed by an
        # assign loses the steps that land in between.
        ops, optimizer = self._apply_ops(optimizers.SGD(0.1))
        self.assertIn("AssignAddVariableOp", ops)
        self.assertNotIn("AssignVariableOp", ops)
        self.assertEqual(int(optimizer.iterations.numpy()), 0)

    def test_iterations_still_counts(self):
        optimizer = optimizers.SGD(0.1)
        var = backend.Variable(np.ones((2,)), dtype="float32")
        for _ in range(3):
            optimizer.apply([np.full((2,), 0.5, "float32")], [var])
        self.assertEqual(int(optimizer.iterations.numpy()), 3)
        self.assertAllClose(var, np.full((2,), 0.85))
