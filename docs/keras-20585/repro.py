"""Reproducer for keras-team/keras#20585 (Keras 3, multi-worker MWMS).

Keras 3's fit and evaluate fail under MultiWorkerMirroredStrategy as soon as
two worker processes take part.

    python repro.py                       # the installed Keras
    python repro.py --patched-keras DIR   # DIR/keras first on the workers' path
    python repro.py --with-mwhelpers      # mwhelpers.fix_keras_multi_worker()

The script starts two copies of itself as workers on 127.0.0.1 (two free
ports, TF_CONFIG set for each). Every worker builds a one-layer model under
MultiWorkerMirroredStrategy, trains it for two epochs and evaluates it.
Exit status: 0 when both workers trained and hold equal weights ("FIXED"),
1 when a worker failed with one of the two known errors ("BUG PRESENT"),
2 for anything else (a timeout, another error).  Needs only TensorFlow and
Keras 3 (and mwhelpers for --with-mwhelpers).
"""

import argparse
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time

# The two failures of keras-team/keras#20585, as the workers report them.
KNOWN_ERRORS = {
    "Attempt to convert a value (PerReplica": (
        "TensorFlowTrainer._maybe_symbolic_build reduces a whole batch "
        "of PerReplica values"
    ),
    "Invalid reduction dimension 0 for input with 0 dimensions": (
        "reduce_per_replica reduces the scalar logs with axis=0"
    ),
}


def worker(with_mwhelpers):
    """One worker: TF_CONFIG comes from the parent."""
    if with_mwhelpers:
        import mwhelpers

        mwhelpers.fix_keras_multi_worker()
    import numpy as np
    import tensorflow as tf

    import keras

    keras.config.disable_traceback_filtering()  # show Keras's own frames
    where = os.path.dirname(keras.__file__)
    print(f"INFO Keras {keras.__version__} ({where}), TF {tf.__version__}")
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 4)).astype("float32")
    y = x @ np.array([[1.0], [2.0], [-1.0], [0.5]], "float32")
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(16)
    options = tf.data.Options()
    policy = tf.data.experimental.AutoShardPolicy.DATA
    options.experimental_distribute.auto_shard_policy = policy
    data = data.with_options(options)
    with strategy.scope():
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        model.compile(keras.optimizers.SGD(0.1), loss="mse")
    history = model.fit(data, epochs=2, verbose=0)
    evaluated = model.evaluate(data, verbose=0)
    weights = [float(v) for w in model.get_weights() for v in w.ravel()]
    result = {
        "loss": history.history["loss"],
        "evaluate": evaluated,
        "weights": weights,
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


def last_error(output):
    """The last exception message in a log, on one line, without the
    tensors a PerReplica value prints."""
    lines = output.splitlines()
    starts = [
        i
        for i, line in enumerate(lines)
        if re.match(r"^[\w.]*(Error|Exception)\b.*:", line)
    ]
    if not starts:
        return "(no error line)"
    message = []
    for line in lines[starts[-1] :]:
        if not line.strip():
            break
        message.append(line.strip())
    text = re.sub(
        r"PerReplica:\{.*?\}\)", "PerReplica:{...})", " ".join(message)
    )
    return text if len(text) < 240 else text[:237] + "..."


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
        "--timeout",
        type=float,
        default=180,
        help="seconds before the workers are killed (default: 180)",
    )
    parser.add_argument(
        "--show-logs", action="store_true", help="print the workers' logs"
    )
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args.with_mwhelpers)

    results, errors = [], []
    for index, (code, output) in enumerate(run_workers(args)):
        status = "timed out (killed)" if code is None else f"exit {code}"
        print(f"worker {index}: {status}")
        for line in output.splitlines():
            if line.startswith(("INFO ", "[mwhelpers]")):
                print("  " + line.removeprefix("INFO "))
        found = [ln for ln in output.splitlines() if ln.startswith("RESULT ")]
        if code == 0 and found:
            result = json.loads(found[-1][len("RESULT ") :])
            results.append(result)
            losses = ", ".join(f"{v:.4f}" for v in result["loss"])
            print(f"  fit losses: {losses}; evaluate: {result['evaluate']:.4f}")
        elif code is None:
            errors.append(f"a worker {status}")
        else:
            errors.append(last_error(output))
            print("  " + errors[-1])
        if args.show_logs:
            print(output)

    known = [
        (error, why)
        for error in errors
        for signature, why in KNOWN_ERRORS.items()
        if signature in error
    ]
    if known:
        print(f"BUG PRESENT: {known[0][1]}: {known[0][0]}")
        return 1
    if errors:
        print(f"FAILED (not the known bug): {errors[0]}")
        return 2
    a, b = (r["weights"] for r in results)
    if max(abs(u - v) for u, v in zip(a, b)) > 1e-5:
        print("FAILED (not the known bug): the workers' weights differ")
        return 2
    print("FIXED: both workers trained, weights equal")
    return 0


if __name__ == "__main__":
    sys.exit(main())
