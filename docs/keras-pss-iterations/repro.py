"""Keras 3: under ParameterServerStrategy, optimizer.iterations misses steps.

Needs only TensorFlow (2.16 or later) and Keras 3. Starts two workers and one
parameter server as subprocesses on this machine, then acts as the coordinator:
it schedules STEPS training steps that call a Keras optimizer's
apply_gradients, and compares optimizer.iterations with a plain tf.Variable
that each step also increments.

    python repro.py [STEPS] [--with-mwhelpers]

Expected: both counts equal STEPS. Seen with Keras 3.15.1 and TF 2.21:
the tf.Variable counts STEPS, optimizer.iterations fewer. Exit status: 0 and
"FIXED" when they are equal, 1 and "BUG" when optimizer.iterations lost steps.
``--with-mwhelpers`` calls mwhelpers.fix_keras_multi_worker() in the
coordinator first.
"""

import json
import os
import socket
import subprocess
import sys


def reserve_ports(n):
    """Binds `n` loopback ports, SO_REUSEADDR set, without listening: while
    they are open, no other program takes them, and TensorFlow's gRPC
    servers (SO_REUSEADDR too) can still bind them. Close them at the end."""
    socks = []
    for _ in range(n):
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", 0))
        socks.append(s)
    return socks


def serve(cluster, job, index):
    import tensorflow as tf

    server = tf.distribute.Server(
        tf.train.ClusterSpec(cluster),
        job_name=job,
        task_index=index,
        protocol="grpc",
        start=True,
    )
    server.join()


def coordinate(cluster, steps):
    import tensorflow as tf

    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(cluster),
        task_type="chief",
        task_id=0,
        rpc_layer="grpc",
    )
    strategy = tf.distribute.ParameterServerStrategy(resolver)
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)

    import keras

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
            variables = model.trainable_variables
            grads = tape.gradient(loss, variables)
            optimizer.apply_gradients(zip(grads, variables))
            counted.assign_add(1)

        strategy.run(replica_fn)

    for _ in range(steps):
        coordinator.schedule(step)
    coordinator.join()
    return int(counted.numpy()), int(optimizer.iterations.numpy())


def main():
    args = [a for a in sys.argv[1:] if a != "--with-mwhelpers"]
    if "--with-mwhelpers" in sys.argv[1:]:
        import mwhelpers

        mwhelpers.fix_keras_multi_worker()
    steps = int(args[0]) if args else 400
    held = reserve_ports(4)
    ports = [s.getsockname()[1] for s in held]
    cluster = {
        "chief": [f"localhost:{ports[0]}"],
        "worker": [f"localhost:{ports[1]}", f"localhost:{ports[2]}"],
        "ps": [f"localhost:{ports[3]}"],
    }
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", TF_CPP_MIN_LOG_LEVEL="2")
    servers = [
        subprocess.Popen(
            [
                sys.executable,
                __file__,
                "--serve",
                json.dumps(cluster),
                job,
                str(i),
            ],
            env=env,
        )
        for job, i in (("worker", 0), ("worker", 1), ("ps", 0))
    ]
    try:
        os.environ.update(CUDA_VISIBLE_DEVICES="", TF_CPP_MIN_LOG_LEVEL="2")
        counted, iterations = coordinate(cluster, steps)
    finally:
        for p in servers:
            p.kill()
            p.wait()
        for s in held:
            s.close()
    print(
        f"steps scheduled: {steps}; counted by a tf.Variable: {counted}; "
        f"optimizer.iterations: {iterations}"
    )
    if iterations != counted:
        print("BUG: optimizer.iterations lost", counted - iterations, "steps")
        sys.exit(1)
    print("FIXED: optimizer.iterations counted every step")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--serve"]:
        serve(json.loads(sys.argv[2]), sys.argv[3], int(sys.argv[4]))
    else:
        main()
