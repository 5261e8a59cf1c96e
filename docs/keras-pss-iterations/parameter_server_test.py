"""Keras variables' assign_add under ParameterServerStrategy.

Upstream path: keras/src/backend/tensorflow/parameter_server_test.py.
The test is the coordinator; two workers and a parameter server run as
subprocesses on 127.0.0.1.
"""

import json
import socket
import subprocess
import sys

import pytest
import tensorflow as tf

import keras
from keras.src import backend
from keras.src import testing

SERVE = (
    "import json, sys; import tensorflow as tf; "
    "tf.distribute.Server(tf.train.ClusterSpec(json.loads(sys.argv[1])), "
    "job_name=sys.argv[2], task_index=int(sys.argv[3]), protocol='grpc')"
    ".join()"
)


def _free_ports(n):
    sockets = [socket.socket() for _ in range(n)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


@pytest.mark.skipif(
    backend.backend() != "tensorflow",
    reason="ParameterServerStrategy is TensorFlow's",
)
class ParameterServerTest(testing.TestCase):
    def test_assign_add_is_one_update_op(self):
        v = backend.Variable(0, dtype="int64", trainable=False)
        graph = tf.function(lambda: v.assign_add(1)).get_concrete_function()
        ops = [op.type for op in graph.graph.get_operations()]
        self.assertIn("AssignAddVariableOp", ops)
        self.assertNotIn("AssignVariableOp", ops)

    def test_iterations_counts_every_scheduled_step(self):
        ports = _free_ports(4)
        address = [f"127.0.0.1:{p}" for p in ports]
        spec = {"chief": address[:1], "worker": address[1:3], "ps": address[3:]}
        servers = [
            subprocess.Popen(
                [sys.executable, "-c", SERVE, json.dumps(spec), job, str(i)]
            )
            for job, i in (("worker", 0), ("worker", 1), ("ps", 0))
        ]
        for p in servers:
            self.addCleanup(p.wait)
            self.addCleanup(p.kill)
        resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
            tf.train.ClusterSpec(spec),
            task_type="chief",
            task_id=0,
            rpc_layer="grpc",
        )
        strategy = tf.distribute.ParameterServerStrategy(resolver)
        coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
        with strategy.scope():
            model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
            optimizer = keras.optimizers.SGD(0.01)
            optimizer.build(model.trainable_variables)

        @tf.function
        def step():
            def replica_fn():
                x = tf.random.normal((8, 4))
                with tf.GradientTape() as tape:
                    loss = tf.reduce_mean(model(x) ** 2)
                variables = model.trainable_variables
                grads = tape.gradient(loss, variables)
                optimizer.apply_gradients(zip(grads, variables))

            strategy.run(replica_fn)

        steps = 200
        for _ in range(steps):
            coordinator.schedule(step)
        coordinator.join()
        self.assertEqual(int(optimizer.iterations.numpy()), steps)
