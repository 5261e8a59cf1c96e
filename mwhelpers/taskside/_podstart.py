"""The start-up of a pod of an Indexed Job that ``write_kubernetes`` wrote:
``python -u _podstart.py SCRIPT [ARGS...]``, the container's command.

It runs before the program, with the standard library and the files beside it (a ConfigMap
mounted as a folder), and:

* reads the job's shape from ``MWHELPERS_POD`` (JSON: ``job``, ``service``, ``tasks``,
  ``port``, ``peer_timeout``, ``termination_log``) and its own index from
  ``JOB_COMPLETION_INDEX``, which Kubernetes sets in each pod of an Indexed Job;
* names task ``i`` ``JOB-i.SERVICE``: the pod's host name is ``JOB-i``, and the headless
  Service that the pods name as their ``subdomain`` gives each pod that DNS name;
* waits until every task's name resolves, at most ``peer_timeout`` seconds, saying once what
  it waits for.  A pod has no name until it has an address, and TensorFlow's gRPC channels
  give up on a name that does not resolve.  Past the limit it says which names are missing and
  what to check, and ends with exit code 3;
* sets ``TF_CONFIG``, the ``keras.distribution`` variables (JAX) and JAX's gloo collectives,
  as the batch script of ``write_sbatch`` does;
* handles SIGTERM, SIGINT and SIGHUP from its start (as PID 1 it gets only what it handles):
  before the program runs, they end the pod; then they go on to the program's process group;
* runs the program under the worker start-up (``_bootstrap.py`` beside this file) as its
  child, and reaps the orphans a PID 1 inherits while it waits;
* when the program ends by an exception, writes its exit record (the same JSON as every task
  writes, cut to 4,096 bytes) to the container's termination message file, so that
  ``kubectl get pod`` shows it; exits with the program's exit code, 128 + N for signal N.

Like ``_bootstrap.py``, it is run by path and imports nothing of the mwhelpers package.
"""

import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import types
from collections.abc import Mapping
from typing import Any

# No ``from __future__ import annotations`` (as in _bootstrap.py): Python 3.10 or later
# evaluates the annotations below.
HERE = os.path.dirname(os.path.abspath(__file__))
MESSAGE_LIMIT = 4096  # bytes of a termination message that the kubelet keeps
PEERS_MISSING = 3  # the exit code when the peers' names never resolve


def _wire() -> types.ModuleType:  # wire.py beside this file, without the package
    spec = importlib.util.spec_from_file_location("mwhelpers_wire", os.path.join(HERE, "wire.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["mwhelpers_wire"] = module  # (its dataclasses look their module up)
    spec.loader.exec_module(module)
    return module


wire = _wire()


def shape(environ: Mapping[str, str]) -> tuple[str, str, int, int, float, str, int]:
    """(job, service, tasks, port, peer_timeout, termination_log, index); SystemExit saying
    what is wrong when the environment is not a pod's of such a job."""
    text = environ.get(wire.Env.POD, "")
    try:
        pod = json.loads(text)
        job, service, tasks, port = pod["job"], pod["service"], int(pod["tasks"]), int(pod["port"])
        timeout, log = float(pod["peer_timeout"]), str(pod["termination_log"])
    except (ValueError, TypeError, KeyError) as e:
        sys.exit(f"[mwhelpers pod] {wire.Env.POD} is {text!r}, not the job's shape that "
                 f"write_kubernetes writes ({type(e).__name__}: {e}); write the manifests again")
    index_text = environ.get("JOB_COMPLETION_INDEX", "")
    if not index_text.isdigit() or int(index_text) >= tasks:
        sys.exit(f"[mwhelpers pod] JOB_COMPLETION_INDEX is {index_text!r}, not a task's index "
                 f"from 0 to {tasks - 1}. Kubernetes sets it in the pods of an Indexed Job "
                 "(spec.completionMode: Indexed); this pod was not made by one")
    return job, service, tasks, port, timeout, log, int(index_text)


def unresolved(names: list[str], port: int) -> list[str]:
    out = []
    for name in names:
        try:
            socket.getaddrinfo(name, port, type=socket.SOCK_STREAM)
        except OSError:
            out.append(name)
    return out


def wait_for_names(me: str, names: list[str], port: int, timeout: float, job: str,
                   service: str) -> None:
    """Return once every name resolves; SystemExit(PEERS_MISSING) past ``timeout`` seconds."""
    start = time.monotonic()
    missing = unresolved(names, port)
    if not missing:
        return
    print(f"{me} waiting up to {timeout:g} s for these pods' names to resolve: "
          f"{', '.join(missing)}", flush=True)
    while missing and time.monotonic() - start < timeout:
        time.sleep(0.5)
        missing = unresolved(missing, port)
    if missing:
        raise TimeoutError(
            f"{me} after {timeout:g} s these pods' names still do not resolve: "
            f"{', '.join(missing)}. A pod's name exists once the pod has an address, through the "
            f"headless Service {service!r} that the pods name as their subdomain. Check that "
            f"every pod runs (kubectl get pods -l app.kubernetes.io/name={job}; a Pending "
            "pod waits for CPUs, memory or GPUs), that the Service exists in the pods' namespace "
            f"(kubectl get service {service}) with publishNotReadyAddresses: true, and that the "
            "cluster's DNS answers. peer_timeout=SECONDS in write_kubernetes sets this wait")
    print(f"{me} every pod's name resolves ({time.monotonic() - start:.1f} s)", flush=True)


def write_message(record: Any, log: str) -> None:  # a wire.ExitRecord
    """``record``, cut to what a termination message keeps, into ``log``."""
    try:
        with open(log, "w", encoding="utf-8") as f:
            f.write(record.dumps_within(MESSAGE_LIMIT))
    except OSError as e:
        print(f"[mwhelpers pod] cannot write the termination message to {log}: {e}",
              file=sys.stderr, flush=True)


def fail(exc: BaseException, log: str) -> int:
    """The start-up's own failure: its record to the termination message, its text to stderr."""
    write_message(wire.ExitRecord(type=type(exc).__name__, message=str(exc), traceback="",
                                  time=time.time(), pid=os.getpid(), exit_code=PEERS_MISSING), log)
    print(f"{type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
    return PEERS_MISSING


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        sys.exit("usage: _podstart.py SCRIPT [ARGS...]")
    # As a container's first process (PID 1), this one gets only the signals it handles: the
    # kubelet's SIGTERM, from the start.  Before the program runs it ends the pod; then it goes
    # on to the program's process group.
    child: list[int] = []

    def pass_on(signum: int, frame: object) -> None:
        if not child:
            sys.exit(128 + signum)
        try:
            os.killpg(child[0], signum)
        except OSError:
            pass

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, pass_on)
    env = os.environ
    job, service, tasks, port, timeout, log, index = shape(env)
    me = f"[pod {job}-{index}]"
    names = [f"{job}-{i}.{service}" for i in range(tasks)]
    try:
        wait_for_names(me, names, port, timeout, job, service)
    except TimeoutError as e:
        return fail(e, log)
    workers = [f"{name}:{port}" for name in names]
    env["TF_CONFIG"] = json.dumps({"cluster": {"worker": workers},
                                   "task": {"type": "worker", "index": index}})
    env["KERAS_DISTRIBUTION_JOB_ADDRESSES"] = ",".join(workers)
    env["KERAS_DISTRIBUTION_NUM_PROCESSES"] = str(tasks)
    env["KERAS_DISTRIBUTION_PROCESS_ID"] = str(index)
    env.setdefault("JAX_CPU_COLLECTIVES_IMPLEMENTATION", "gloo")
    env[wire.Env.TASK] = f"worker:{index}"
    print(f"{me} TF_CONFIG={env['TF_CONFIG']}", flush=True)
    folder = tempfile.mkdtemp(prefix="mwhelpers-")
    record = os.path.join(folder, "exit.json")
    env[wire.Env.EXIT_RECORD] = record
    try:
        proc = subprocess.Popen([sys.executable, "-u", os.path.join(HERE, "_bootstrap.py"),
                                 *argv[1:]], start_new_session=True)
        child.append(proc.pid)
        code = reap_until(proc.pid)
        written = wire.ExitRecord.read(record)  # the program's, when it ended by an exception
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    if written is not None:
        write_message(written, log)
    return 128 - code if code < 0 else code


def reap_until(pid: int) -> int:
    """Wait for ``pid``; as PID 1, also reap the orphans the kernel hands this process.  Its exit
    code as ``subprocess`` gives it (negative for a signal)."""
    while True:
        try:
            done, status = os.waitpid(-1, 0)
        except InterruptedError:
            continue
        except ChildProcessError:
            return 255  # (someone else reaped it)
        if done == pid:
            return os.waitstatus_to_exitcode(status)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
