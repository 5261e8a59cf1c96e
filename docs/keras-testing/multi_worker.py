"""Runs a program as the workers of a multi-worker job, for tests.

Upstream path: keras/src/testing/multi_worker.py. Each worker is a fresh
Python process with its own `TF_CONFIG`, as a multi-worker job runs, and
listens on 127.0.0.1. The workers import the same Keras as the test.

The workers' ports are reserved until they exit: the test binds each one
with `SO_REUSEADDR` and does not listen on it. A port picked, closed and
handed on could be taken by any process before the worker binds it; a
reserved one can be bound only by a process that sets `SO_REUSEADDR` too,
as TensorFlow's gRPC server does. That is Linux's rule for a socket bound
but not listening; other systems may want `SO_REUSEPORT` (not checked).
The workers see no GPU.
"""

import json
import os
import socket
import subprocess
import sys
import tempfile
import time

# The folder that holds this Keras: keras/src/testing/multi_worker.py.
KERAS_ROOT = os.path.dirname(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
)


def _reserve_ports(count):
    sockets = []
    for _ in range(count):
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", 0))
        sockets.append(s)
    return sockets


def run_workers(program, count, args=(), timeout=120):
    """Runs `python -c program *args` as `count` workers.

    With one worker, `TF_CONFIG` is not set (a job of one process). Returns
    `[(exit code or "timeout", output)]`, in task order; `timeout` bounds
    the whole job.
    """
    path = [KERAS_ROOT, os.environ.get("PYTHONPATH", "")]
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    env.update(
        KERAS_BACKEND="tensorflow",
        TF_CPP_MIN_LOG_LEVEL="2",
        CUDA_VISIBLE_DEVICES="",
        PYTHONPATH=os.pathsep.join(p for p in path if p),
    )
    sockets = _reserve_ports(count)
    ports = [s.getsockname()[1] for s in sockets]
    cluster = {"worker": [f"127.0.0.1:{p}" for p in ports]}
    procs = []
    try:
        for index in range(count):
            if count > 1:
                task = {"type": "worker", "index": index}
                env["TF_CONFIG"] = json.dumps(
                    {"cluster": cluster, "task": task}
                )
            log = tempfile.TemporaryFile("w+")
            command = [sys.executable, "-c", program, *map(str, args)]
            proc = subprocess.Popen(
                command, env=env, stdout=log, stderr=subprocess.STDOUT
            )
            procs.append((proc, log))
        deadline = time.monotonic() + timeout
        results = []
        for proc, log in procs:
            try:
                code = proc.wait(timeout=max(deadline - time.monotonic(), 0))
            except subprocess.TimeoutExpired:
                code = "timeout"
            log.seek(0)
            results.append((code, log.read()))
        return results
    finally:
        for proc, log in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            log.close()
        for s in sockets:
            s.close()


def worker_results(program, count, args=(), timeout=120):
    """Runs `program` as `count` workers (`run_workers`); returns the JSON
    object of the one line `RESULT {...}` each worker printed, in task
    order. Raises `AssertionError`, with the worker's output, where a worker
    failed or did not print one such line."""
    results = []
    for index, (code, output) in enumerate(
        run_workers(program, count, args, timeout)
    ):
        lines = [ln for ln in output.splitlines() if ln.startswith("RESULT ")]
        if code != 0 or len(lines) != 1:
            raise AssertionError(
                f"worker {index} exited with {code}:\n{output[-3000:]}"
            )
        results.append(json.loads(lines[0][len("RESULT ") :]))
    return results
