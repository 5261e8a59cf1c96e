"""Reproducer: Keras 3's TensorBoard lets every worker write to `log_dir`.

Under multi-worker MultiWorkerMirroredStrategy every worker runs the
callback, and every worker writes its event files into `log_dir/train` and
`log_dir/validation`. TensorBoard then shows the workers' runs as one.

    python repro.py                       # the installed Keras
    python repro.py --patched-keras DIR   # DIR/keras first on the workers' path
    python repro.py --with-mwhelpers      # mwhelpers.fix_keras_multi_worker()

The script starts two copies of itself as workers on 127.0.0.1 (two free
ports, TF_CONFIG set for each). Worker 0 is the chief. Both train one small
model for 2 epochs of 4 steps with a custom loop (strategy.run of a step that
calls the optimizer's apply), so that no fix of keras-team/keras#20585 is
needed. The loop calls the callback's hooks in the order `fit` does, with
a validation loss after each epoch. `--fit` uses `model.fit` instead (it
needs a Keras without keras-team/keras#20585, or --with-mwhelpers).
`--then-evaluate` then hands the callback to an evaluation, as `evaluate`
does (a new `set_model`, then `on_test_begin` and `on_test_end`).

The parent counts the event files under log_dir/train and
log_dir/validation, and names the worker that wrote each (from the process
id in the file's name). Exit status: 0 when only the chief's files are there
and no `workertemp_*` folder is left ("FIXED"), 1 when both workers' files
are there ("BUG PRESENT"), 2 for anything else. Needs only TensorFlow and
Keras 3 (and mwhelpers for --with-mwhelpers).
"""

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time

EPOCHS, STEPS = 2, 4


def worker(args):
    """One worker: TF_CONFIG and the log folder come from the parent."""
    if args.with_mwhelpers:
        import mwhelpers

        mwhelpers.fix_keras_multi_worker()
    import numpy as np
    import tensorflow as tf

    import keras

    where = os.path.dirname(keras.__file__)
    print(f"INFO Keras {keras.__version__} ({where}), TF {tf.__version__}")
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    index = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
    with strategy.scope():
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
        model.optimizer.build(model.trainable_variables)
    tensorboard = keras.callbacks.TensorBoard(args.log_dir)

    rng = np.random.default_rng(index)
    x = rng.normal(size=(STEPS * 8, 4)).astype("float32")
    y = x.sum(axis=1, keepdims=True)
    x_val, y_val = x[:8], y[:8]
    if args.fit:
        model.fit(
            x,
            y,
            batch_size=8,
            epochs=EPOCHS,
            validation_data=(x_val, y_val),
            callbacks=[tensorboard],
            verbose=0,
        )
    else:
        custom_loop(strategy, model, tensorboard, x, y, x_val, y_val)
    if args.then_evaluate:
        # What `evaluate` does with its callbacks (a new CallbackList).
        callbacks = keras.callbacks.CallbackList([tensorboard], model=model)
        callbacks.on_test_begin()
        callbacks.on_test_end({"loss": 1.0})
    weights = [float(v) for w in model.get_weights() for v in w.ravel()]
    print("RESULT " + json.dumps({"weights": weights}), flush=True)


def custom_loop(strategy, model, tensorboard, x, y, x_val, y_val):
    """Trains under `strategy`, calling the callback's hooks as `fit` does."""
    import tensorflow as tf

    import keras

    optimizer = model.optimizer

    def train_step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(x) - y))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply(grads, model.trainable_variables)
        return loss

    def test_step(x, y):
        return tf.reduce_mean(tf.square(model(x) - y))

    @tf.function
    def train(x, y):
        loss = strategy.run(train_step, args=(x, y))
        return strategy.reduce("MEAN", loss, axis=None)

    @tf.function
    def test(x, y):
        loss = strategy.run(test_step, args=(x, y))
        return strategy.reduce("MEAN", loss, axis=None)

    callbacks = keras.callbacks.CallbackList([tensorboard], model=model)
    callbacks.on_train_begin()
    for epoch in range(EPOCHS):
        callbacks.on_epoch_begin(epoch)
        for step in range(STEPS):
            callbacks.on_train_batch_begin(step)
            batch = slice(step * 8, step * 8 + 8)
            loss = float(train(x[batch], y[batch]))
            callbacks.on_train_batch_end(step, {"loss": loss})
        callbacks.on_test_begin()
        val_loss = float(test(x_val, y_val))
        callbacks.on_test_end({"loss": val_loss})
        logs = {"loss": loss, "val_loss": val_loss}
        callbacks.on_epoch_end(epoch, logs)
    callbacks.on_train_end(logs)


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


def run_workers(args, log_dir):
    """Starts the two workers, waits for them; returns [(pid, exit code,
    log)], the exit code None for a worker killed at the timeout."""
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
    command += ["--log-dir", log_dir]
    for flag in ("with_mwhelpers", "fit", "then_evaluate"):
        if getattr(args, flag):
            command.append("--" + flag.replace("_", "-"))
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
            outcomes.append((proc.pid, code, log.read()))
        return outcomes
    finally:
        for proc, log in procs:  # our own children only, by their PIDs
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            log.close()
        for s in held:
            s.close()


def event_files(folder, pids):
    """{subfolder: [the index of the worker that wrote each event file]}."""
    found = {}
    for root, _, names in os.walk(folder):
        for name in names:
            if not name.startswith("events.out.tfevents."):
                continue
            # events.out.tfevents.<time>.<host>.<pid>.<n>.v2
            pid = int(name.split(".")[-3])
            writer = pids.index(pid) if pid in pids else "?"
            where = os.path.relpath(root, folder)
            found.setdefault(where, []).append(writer)
    return {k: sorted(v, key=str) for k, v in sorted(found.items())}


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
        "--fit", action="store_true", help="train with model.fit"
    )
    parser.add_argument(
        "--then-evaluate",
        action="store_true",
        help="then hand the callback to an evaluation",
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
    parser.add_argument("--log-dir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args)

    with tempfile.TemporaryDirectory() as log_dir:
        outcomes = run_workers(args, log_dir)
        pids = [pid for pid, _, _ in outcomes]
        files = event_files(log_dir, pids)
        left = sorted(n for n in os.listdir(log_dir) if "workertemp" in n)

    results = []
    for index, (_, code, output) in enumerate(outcomes):
        status = "timed out (killed)" if code is None else f"exit {code}"
        print(f"worker {index}: {status}")
        lines = output.splitlines()
        for line in lines:
            if line.startswith(("INFO Keras", "[mwhelpers]")):
                print("  " + line.removeprefix("INFO "))
        found = [ln for ln in lines if ln.startswith("RESULT ")]
        if code == 0 and found:
            results.append(json.loads(found[-1][len("RESULT ") :]))
        else:
            said = [ln for ln in lines if "Error" in ln]
            for line in said[-2:]:
                print("  " + line.strip()[:200])
        if args.show_logs:
            print(output)
    for where, who in files.items():
        names = ", ".join(f"worker {w}" for w in who)
        files_word = "file" if len(who) == 1 else "files"
        print(f"log_dir/{where}: {len(who)} event {files_word} ({names})")
    print(f"workertemp folders left in log_dir: {left or 'none'}")

    if len(results) < 2:
        print("FAILED (not the known bug): a worker did not finish")
        return 2
    a, b = (r["weights"] for r in results)
    if max(abs(u - v) for u, v in zip(a, b)) > 1e-6:
        print("FAILED (not the known bug): the workers' weights differ")
        return 2
    top = {k: v for k, v in files.items() if k in ("train", "validation")}
    if sorted(top) != ["train", "validation"]:
        print("FAILED (not the known bug): log_dir has no train/validation")
        return 2
    writers = [set(v) for v in top.values()]
    if all(w == {0, 1} for w in writers):
        print(
            "BUG PRESENT: both workers wrote their event files into "
            "log_dir/train and log_dir/validation"
        )
        return 1
    if all(w == {0} for w in writers) and not left:
        print(
            "FIXED: only the chief (worker 0) wrote to log_dir, and no "
            "workertemp folder is left"
        )
        return 0
    if all(w == {0} for w in writers):
        print(
            "LEFT OVER: only the chief wrote to log_dir/train and "
            f"log_dir/validation, but {', '.join(left)} is left"
        )
        return 2
    print("FAILED (not the known bug): unexpected event files")
    return 2


if __name__ == "__main__":
    sys.exit(main())
