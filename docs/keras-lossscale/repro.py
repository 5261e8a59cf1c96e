"""Reproducer: Keras 3's LossScaleOptimizer hangs multi-worker training.

Under MultiWorkerMirroredStrategy, LossScaleOptimizer decides whether to
skip a step from each worker's own gradients, before they are all-reduced.
When the gradients of one worker overflow float16 and those of the other do
not, the first skips the step and the second waits for it in the step's
all-reduce: the job hangs.

    python repro.py                       # the installed Keras
    python repro.py --patched-keras DIR   # DIR/keras first on the workers' path
    python repro.py --with-mwhelpers      # mwhelpers.fix_keras_multi_worker()

The script starts two copies of itself as workers on 127.0.0.1 (two free
ports, TF_CONFIG set for each).  Each worker trains a small model under
mixed_float16 with a custom loop (strategy.run of a step that calls the
optimizer's apply) for 6 steps, on batches of its own.  At step 2 the batch
of worker 1 only has a target so large that its gradients overflow.  The
collectives time out after --collective-timeout seconds.
Exit status: 0 when both workers skipped that step and hold equal weights
and loss scales ("FIXED"), 1 when the workers hung at that step ("BUG
PRESENT"), 2 for anything else.  Needs only TensorFlow and Keras 3 (and
mwhelpers for --with-mwhelpers).
"""

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time

STEPS, OVERFLOW_STEP = 6, 2


def worker(args):
    """One worker: TF_CONFIG comes from the parent."""
    if args.with_mwhelpers:
        import mwhelpers

        mwhelpers.fix_keras_multi_worker()
    import numpy as np
    import tensorflow as tf

    import keras

    where = os.path.dirname(keras.__file__)
    print(f"INFO Keras {keras.__version__} ({where}), TF {tf.__version__}")
    options = tf.distribute.experimental.CommunicationOptions(
        timeout_seconds=args.collective_timeout
    )
    strategy = tf.distribute.MultiWorkerMirroredStrategy(
        communication_options=options
    )
    index = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
    keras.mixed_precision.set_global_policy("mixed_float16")
    with strategy.scope():
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        optimizer = keras.mixed_precision.LossScaleOptimizer(
            keras.optimizers.SGD(0.01), initial_scale=2.0**10
        )
        optimizer.build(model.trainable_variables)

    def step(x, y):
        with tf.GradientTape() as tape:
            error = tf.cast(model(x), "float32") - y
            loss = tf.reduce_mean(tf.square(error))
            scaled = optimizer.scale_loss(loss)
        grads = tape.gradient(scaled, model.trainable_variables)
        optimizer.apply(grads, model.trainable_variables)

    @tf.function
    def train(x, y):
        strategy.run(step, args=(x, y))

    rng = np.random.default_rng(index)
    for i in range(STEPS):
        x = rng.normal(size=(8, 4)).astype("float32")
        y = x.sum(axis=1, keepdims=True)
        if i == OVERFLOW_STEP and index == 1:
            y[0] = 60000.0  # this worker's gradients overflow float16
        train(tf.constant(x), tf.constant(y))
        print(f"INFO step {i} done", flush=True)
    result = {
        "weights": [float(v) for w in model.get_weights() for v in w.ravel()],
        "loss_scale": float(optimizer.dynamic_scale.numpy()),
        "iterations": int(optimizer.inner_optimizer.iterations.numpy()),
    }
    print("RESULT " + json.dumps(result), flush=True)


def reserve_ports(count):
    """Binds `count` loopback ports, SO_REUSEADDR set, without listening.

    While the sockets are open, no other program's bind to port 0 and no
    outgoing connection takes these ports; TensorFlow's gRPC server, which
    sets SO_REUSEADDR too, can still bind them (Linux's rule for a socket
    bound but not listening). A port picked and closed at once could be
    taken before the worker binds it. Close the sockets when the workers
    have exited."""
    sockets = []
    for _ in range(count):
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", 0))
        sockets.append(s)
    return sockets


def run_workers(args):
    """Starts the two workers, waits for them; returns [(exit code, log)],
    the exit code None for a worker killed at the timeout."""
    held = reserve_ports(2)
    ports = [s.getsockname()[1] for s in held]
    cluster = {"worker": [f"127.0.0.1:{p}" for p in ports]}
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    if args.patched_keras:
        path = os.path.abspath(args.patched_keras)
        if not os.path.isfile(os.path.join(path, "keras", "__init__.py")):
            sys.exit(f"{path} has no keras/__init__.py")
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (path, env.get("PYTHONPATH")) if p
        )
    command = [sys.executable, os.path.abspath(__file__), "--worker"]
    command += ["--collective-timeout", str(args.collective_timeout)]
    if args.with_mwhelpers:
        command.append("--with-mwhelpers")
    procs = []
    try:
        for index in range(2):
            task = {"type": "worker", "index": index}
            env["TF_CONFIG"] = json.dumps({"cluster": cluster, "task": task})
            log = tempfile.TemporaryFile("w+")
            out = dict(stdout=log, stderr=subprocess.STDOUT)
            procs.append((subprocess.Popen(command, env=env, **out), log))
        deadline = time.monotonic() + args.timeout
        outcomes = []
        for proc, log in procs:
            try:
                code = proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                code = None
            log.seek(0)
            outcomes.append((code, log.read()))
        return outcomes
    finally:
        for proc, log in procs:  # our own children only, by their PIDs
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            log.close()
        for s in held:
            s.close()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--with-mwhelpers",
        action="store_true",
        help="call mwhelpers.fix_keras_multi_worker() in the workers",
    )
    parser.add_argument(
        "--patched-keras",
        metavar="DIR",
        help="put DIR (holding a keras/ package) first on the workers' path",
    )
    parser.add_argument(
        "--collective-timeout",
        type=float,
        default=15,
        help="seconds a collective waits for its peers (default: 15)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=120,
        help="seconds before the workers are killed (default: 120)",
    )
    parser.add_argument(
        "--show-logs", action="store_true", help="print the workers' logs"
    )
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args)

    results, stopped = [], []
    for index, (code, output) in enumerate(run_workers(args)):
        status = "timed out (killed)" if code is None else f"exit {code}"
        print(f"worker {index}: {status}")
        lines = output.splitlines()
        for line in lines:
            if line.startswith(("INFO Keras", "[mwhelpers]")):
                print("  " + line.removeprefix("INFO "))
        done = [ln for ln in lines if ln.startswith("INFO step ")]
        stopped.append(len(done))
        print(f"  steps done: {len(done)} of {STEPS}")
        found = [ln for ln in lines if ln.startswith("RESULT ")]
        if code == 0 and found:
            results.append(json.loads(found[-1][len("RESULT ") :]))
            print(f"  {found[-1]}")
        else:
            words = ("Error:", "timed out", "{{node ")
            said = [ln for ln in lines if any(w in ln for w in words)]
            for line in said[-2:]:
                print("  " + line.strip()[:200])
        if args.show_logs:
            print(output)

    if len(results) < 2:
        if min(stopped) == OVERFLOW_STEP:
            print(
                f"BUG PRESENT: the workers stopped at step {OVERFLOW_STEP}, "
                "where only worker 1's gradients overflow: one skipped the "
                "step, the other waited in its all-reduce"
            )
            return 1
        print("FAILED (not the known bug): a worker did not finish")
        return 2
    a, b = results
    if max(abs(u - v) for u, v in zip(a["weights"], b["weights"])) > 1e-6:
        print("FAILED (not the known bug): the workers' weights differ")
        return 2
    if a["loss_scale"] != b["loss_scale"] or a["iterations"] != STEPS - 1:
        print("FAILED (not the known bug): the step was not skipped on both")
        return 2
    print("FIXED: both workers skipped the step, weights and loss scale equal")
    return 0


if __name__ == "__main__":
    sys.exit(main())
