"""mwhelpers inside a real Jupyter kernel: a restart or a shutdown of the kernel ends its
workers, and a failed worker fails the notebook under nbclient and papermill.  (A kernel killed
by SIGKILL, on every backend: test_backends.py.)

The tests described here that need more than this folder gives are in kernels/test_kernel_kernels.py."""

import os
import signal
import sys
import time

import nbformat
import pytest
import zmq
from conftest import ROOT, TREE, pid_alive
from jupyter_client import KernelManager


def kernel_env():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    return env


class Kernel:
    def __init__(self, cwd):
        # A zmq context of its own, destroyed without waiting in close(): messages still queued
        # for a kernel that was killed would otherwise hold the process-wide one at exit.
        self.context = zmq.Context()
        self.km = KernelManager(kernel_name="python3", context=self.context)
        self.km.start_kernel(cwd=str(cwd), env=kernel_env())
        self.kc = self.km.client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=60)

    @property
    def pid(self):
        return self.km.provisioner.pid

    def run(self, code, timeout=60):
        """(status, the cell's streams and traceback as text); its rich outputs (display
        data, results: {mime type: data}) are in ``self.displays``."""
        out = []
        self.displays = []

        def hook(msg):
            if msg["msg_type"] == "stream":
                out.append(msg["content"]["text"])
            elif msg["msg_type"] == "error":
                out.append("\n".join(msg["content"]["traceback"]))
            elif msg["msg_type"] in ("display_data", "execute_result"):
                self.displays.append(msg["content"]["data"])

        reply = self.kc.execute_interactive(code, output_hook=hook, timeout=timeout)
        return reply["content"]["status"], "".join(out)

    def wait_idle(self, msg_id, timeout=15):
        """Read IOPub until the kernel reports idle for the request ``msg_id``."""
        deadline = time.monotonic() + timeout
        while True:
            msg = self.kc.get_iopub_msg(timeout=max(0.1, deadline - time.monotonic()))
            if (msg["parent_header"].get("msg_id") == msg_id and msg["msg_type"] == "status"
                    and msg["content"]["execution_state"] == "idle"):
                return

    def close(self):
        self.kc.stop_channels()
        if self.km.is_alive():
            self.km.shutdown_kernel(now=True)
        self.context.destroy(linger=0)


@pytest.fixture
def kernel(tmp_path):
    k = Kernel(tmp_path)
    yield k
    k.close()


def start_tree(kernel):
    status, out = kernel.run("%load_ext mwhelpers\n")
    assert status == "ok", out
    status, out = kernel.run("%%worker 0 --bg --ready start\n" + TREE)
    assert status == "ok", out
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        status, out = kernel.run(
            "import mwhelpers\nr = mwhelpers.runtime().get_run('worker:0')\n"
            "print('worker', r.pid)\nprint('\\n'.join(r.lines()))\n")
        pids = {w.split()[0]: int(w.split()[1]) for w in out.splitlines()
                if len(w.split()) == 2 and w.split()[0] in ("worker", "child", "grandchild")}
        if len(pids) == 3:
            return list(pids.values())
        time.sleep(0.1)
    raise AssertionError(f"the worker tree never started: {out}")


def wait_all_gone(pids, within):
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if not any(pid_alive(p) for p in pids):
            return time.monotonic() - (deadline - within)
        time.sleep(0.02)
    alive = [p for p in pids if pid_alive(p)]
    for p in alive:  # do not leak them into the next tests
        os.kill(p, signal.SIGKILL)
    raise AssertionError(f"still alive {within} s after the kernel went away: {alive}")


def test_kernel_restart_ends_every_worker_within_2_s(kernel):
    pids = start_tree(kernel)
    kernel.km.restart_kernel(now=True)
    wait_all_gone(pids, within=2.0)


def test_kernel_shutdown_ends_every_worker(kernel):
    pids = start_tree(kernel)
    kernel.km.shutdown_kernel(now=False)
    wait_all_gone(pids, within=2.0)


def failing_notebook(path):
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell("%load_ext mwhelpers", metadata={"tags": []}),
        nbformat.v4.new_code_cell("%%worker 1\nprint('training...')\nraise SystemExit(3)"),
        nbformat.v4.new_code_cell("print('never reached')"),
    ]
    nbformat.write(nb, path)
    return path


def test_python_version_of_kernel_matches():
    # The kernel the tests start must be this environment's Python, or the
    # tests above would exercise another installation of mwhelpers.
    from jupyter_client.kernelspec import KernelSpecManager

    spec = KernelSpecManager().get_kernel_spec("python3")
    assert spec.argv[0] in (sys.executable, "python", "python3") or \
        os.path.realpath(spec.argv[0]) == os.path.realpath(sys.executable)
