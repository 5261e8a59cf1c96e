"""Interactive tasks (``mwhelpers.interactive``): every task of the cluster an ipyparallel
engine with its own TF_CONFIG, started and guarded as any task, and cells run on all of them.

Real engines, a real controller, real collectives: a MultiWorkerMirroredStrategy step from
every task leaves equal weights; a task that raises while its peer waits in the all-reduce
fails the cell within seconds with the raise first, and the cluster restarts; a task that died
is reported before the next cell; a timeout says where each task was; the controller listens
on loopback only, its files are the user's alone, and a client without the key runs nothing; a
SIGKILLed kernel leaves no engine and no controller; the magics in a real kernel, with rich
output and live views; chief, ps and evaluator engines, and a ParameterServerStrategy driven
from the chief's engine; a skipped step ended by the timeout; the cells on the timeline.  The
same on the SSH and Slurm test hosts.

The tests described here that need more than this folder gives are in hosts/test_interactive_hosts.py,
tf/test_interactive_tf.py."""

import json
import os
import signal
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest
from conftest import pid_alive
from test_kernel import Kernel

from mwhelpers.errors import CellFailed, UsageError
from mwhelpers.watcher import CellLimits

pytest.importorskip("ipyparallel", reason="ipyparallel is not installed (mwhelpers[interactive])")

# A TensorFlow informational line and mwhelpers' line naming the task's TensorFlow and Keras:
# hidden in cells unless verbose.
INFO = "I0000 00:00:1795362805.988331   26599 grpc_server_lib.cc:467] Started server"
FACTS = ("[mwhelpers] this task: TensorFlow 2.21.0 with Keras 3.15.1 "
         "(TF_USE_LEGACY_KERAS=unset at import)")

STRATEGY = """
import os
import keras
import tensorflow as tf
strategy = tf.distribute.MultiWorkerMirroredStrategy()
task = int(os.environ["MWHELPERS_TASK"].split(":")[1])
with strategy.scope():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    optimizer = keras.optimizers.SGD(0.1)

@tf.function
def step(x, y):
    def one(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((model(x) - y) ** 2) / strategy.num_replicas_in_sync
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss
    return strategy.run(one, args=(x, y))
"""

# Each task its own batch: the weights agree only because the gradients were all-reduced.
STEP = """
x = tf.random.stateless_normal((8, 4), seed=(task, 1))
loss = float(step(x, tf.ones((8, 1))))
"""

SKIP_ONE = """
if task == 1:
    raise RuntimeError("worker 1 skips this step")
loss = float(step(x, tf.ones((8, 1))))
"""


def engines_of(rt):
    return [rt.runs[t] for t in rt.engines.tasks]


def controller_pids(eng):
    return [p.pid for p in eng.controller.process.processes()]


def test_output_streams_by_task_values_come_back_and_timeouts_say_where(rt):
    rt.define_cluster(2)
    eng = rt.interactive()
    heard = []
    eng.run("import os, time\ntask = os.environ['MWHELPERS_TASK']\n", echo=None)
    values = eng.run("print('first from', task, flush=True)\ntime.sleep(1.5)\n"
                     "print('second')\ntask.upper()",
                     echo=lambda t, stream, text: heard.append((time.monotonic(), str(t), text)))
    end = time.monotonic()
    assert {(who, text) for _, who, text in heard} >= {
        ("worker:0", "first from worker:0"), ("worker:1", "first from worker:1"),
        ("worker:0", "second"), ("worker:1", "second")}
    firsts = [at for at, _, text in heard if text.startswith("first")]
    assert max(firsts) < end - 1.0  # streamed while the cell ran, not after
    assert {str(t): v for t, v in values.items()} == {"worker:0": "'WORKER:0'",
                                                      "worker:1": "'WORKER:1'"}
    assert {str(t): v for t, v in eng.pull("task", "worker:1").items()} == {"worker:1": "worker:1"}
    # Output that arrived before a cell's printer was in place (a fast task on a busy machine)
    # is shown once, when it attaches.
    from mwhelpers.ippresults import Execution
    from mwhelpers.pxoutput import Printer
    ar = Execution(eng.view().execute("print('early', flush=True)", block=False))
    ar.wait(30)
    ar.wait_for_output(5)
    early = []
    printer = Printer([eng.runs[t] for t in eng.tasks],
                       lambda t, stream, text: early.append((str(t), text)))
    printer.detach(ar, printer.attach(ar))
    printer.flush()
    assert sorted(early) == [("worker:0", "early"), ("worker:1", "early")], early
    eng.push({"scale": 3})
    assert set(eng.pull("scale * 2").values()) == {6}
    assert eng.targets("1") == [eng.tasks[1]] and eng.targets([0]) == [eng.tasks[0]]
    with pytest.raises(UsageError, match="no engine 7; the engines are 0 \\(worker:0\\), 1"):
        eng.targets([7])

    t = time.monotonic()
    with pytest.raises(CellFailed) as failed:
        eng.run("time.sleep(60)", timeout=1)
    assert time.monotonic() - t < 8
    text = str(failed.value)
    assert "worker:0, worker:1 did not finish cell 3 within 1 s" in text
    assert "worker:0 was at line 1 of the cell: time.sleep(60)" in text, text
    assert all(r.running for r in engines_of(rt))  # interrupted, not ended: only slow
    assert eng.run("task")[eng.tasks[0]] == "'worker:0'"  # and they answer again
    # The timeline knows each task's cells and how they ended, and draws them.
    tl = rt.timeline()
    cells = [(n, state) for n, start, end, state in tl.cells(rt.runs[eng.tasks[1]])]
    assert cells == [(1, "ok"), (2, "ok"), (3, "timed out"), (4, "ok")], cells
    assert all(end >= start for _, start, end, _ in tl.cells(rt.runs[eng.tasks[1]]))
    assert tl.png()[:4] == b"\x89PNG"
    from mwhelpers.live import TaskView
    assert "; idle after cell 4" in repr(TaskView(rt.runs[eng.tasks[1]]))  # the live view

    # A cell's output is shown as a %%worker cell shows a task's: through the runtime's echo
    # (the cell's stdout, not a red stderr block), without TF's informational lines and
    # mwhelpers' facts line unless verbose, and within the cell limits (the first lines, a
    # note, then the last lines when the cell ends).
    rt.cell_limits = CellLimits(head=3, tail=2, width=12)
    rt.echo_lines.clear()
    noisy = ("import sys\nfor i in range(10):\n    print('line', i, 'x' * (20 if i == 1 else 0))\n"
             "print(" + repr(INFO) + ", file=sys.stderr)\nprint(" + repr(FACTS) + ", file=sys.stderr)")
    eng.run(noisy, targets="worker:0")
    assert rt.echo_lines == [
        "[worker:0] line 0 ", "[worker:0] line 1 xxxxx ... [15 more characters]",
        "[worker:0] line 2 ",
        "[worker:0] ... more than 3 lines: the rest is not shown; its last 2 lines are shown "
        "when this watch ends",
        "[worker:0] ... 5 lines left out", "[worker:0] line 8 ", "[worker:0] line 9 "], rt.echo_lines
    rt.verbose, rt.cell_limits = True, CellLimits(head=None)
    rt.echo_lines.clear()
    eng.run(noisy, targets="worker:0")
    assert len(rt.echo_lines) == 12, rt.echo_lines
    assert {f"[worker:0] {INFO}", f"[worker:0] {FACTS}"} <= set(rt.echo_lines)
    rt.verbose = False

    rt.kill("worker:1")  # %killworker
    with pytest.raises(CellFailed, match="worker:1 ended before this cell: killed by SIGKILL"):
        eng.run("1")
    run0 = rt.runs[eng.tasks[0]]
    pids = controller_pids(eng) + [run0.pid]
    rt.end_all()  # %killbgscripts: the engines and the controller
    assert eng.closed and rt.engines is None and not any(pid_alive(p) for p in pids)


def test_an_engine_that_dies_in_a_cell_is_reported_as_the_jobs_failure_report_says_it(rt):
    """The cell's failure names the task that died first, with what %waitworkers would say of
    it (what that means, when recognised; its log's last lines, where what is written below
    Python goes: a C++ check's message, an abort); the peer still running is dumped, then
    ended, as the job ends a stuck task."""
    rt.define_cluster(2)
    eng = rt.interactive()
    eng.run("import os, sys, time\ntask = os.environ['MWHELPERS_TASK']\n")
    with pytest.raises(CellFailed) as failed:
        eng.run("if task == 'worker:1':\n"
                "    os.write(2, b'F0000 check failed: what a C++ library says\\n')\n"
                "    os._exit(3)\ntime.sleep(60)\n", grace=0.5)
    text = str(failed.value)
    assert "worker:1 died while running cell 2: exit code 3" in text, text
    assert "Last lines of worker:1's log" in text, text
    assert "  F0000 check failed: what a C++ library says" in text, text
    assert "worker:0 still ran cell 2 when worker:1 died" in text, text
    assert "which no signal interrupts" in text, text
    assert "worker:0 was at line 4 of the cell: time.sleep(60)" in text, text
    assert failed.value.dead == [eng.tasks[1]] and failed.value.stuck == [eng.tasks[0]]
    assert not any(r.running for r in engines_of(rt))
    assert rt.runs[eng.tasks[0]].stacks_written


def test_the_controller_is_private_to_this_user_and_loopback(rt, tmp_path):
    rt.define_cluster(1)
    eng = rt.interactive()
    folder = eng.controller.folder
    keys = list((folder / "profile" / "security").glob("*.json"))  # the client's, the engines'
    assert len(keys) == 2
    for p in keys:  # every message is signed with a key of its own
        info = json.loads(p.read_text())
        assert len(info["key"]) >= 32 and info["signature_scheme"] == "hmac-sha256", info
    for p in [folder, *keys]:  # nobody else may read the key
        assert stat.S_IMODE(p.stat().st_mode) & 0o077 == 0, (p, oct(p.stat().st_mode))
    listening = [c.laddr for pid in controller_pids(eng)
                 for c in psutil.Process(pid).net_connections("tcp") if c.status == "LISTEN"]
    assert listening and all(a.ip == "127.0.0.1" for a in listening), listening
    engine = psutil.Process(rt.runs[eng.tasks[0]].pid)
    assert not any("key" in arg for arg in engine.cmdline())  # the key is not on a command line

    # A client whose key is wrong: the controller and the engine ignore what it signs.
    info = json.loads(eng.controller.client_file.read_text())
    info["key"] = "0" * len(info["key"])
    forged = tmp_path / "forged.json"
    forged.write_text(json.dumps(info))
    marker = tmp_path / "ran"
    intruder = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(f"""
            import ipyparallel as ipp
            try:
                c = ipp.Client({str(forged)!r}, timeout=3)
                c[:].execute("open({str(marker)!r}, 'w').close()", block=True, timeout=3)
                print("EXECUTED")
            except Exception as e:
                print("REFUSED", type(e).__name__)
        """)], capture_output=True, text=True, timeout=60)
    assert "REFUSED" in intruder.stdout, intruder.stdout + intruder.stderr
    time.sleep(0.5)
    assert not marker.exists()
    eng.run("print('still mine')")  # the real client still works

    rt.close()
    assert not folder.exists()  # files and key removed with the cluster


def test_a_controller_killed_alone_takes_its_keys_with_it(tmp_path):
    """Its folder goes though the schedulers it forked outlive it (they hold no pipe to the
    watcher that removes it), and closing it afterwards ends them."""
    from mwhelpers.interactive import Controller

    controller = Controller("127.0.0.1", tmp_path / "controller.log")
    try:
        forked = [p.pid for p in psutil.Process(controller.process.pid).children()]
        assert forked and (controller.folder / "profile" / "security").is_dir()
        os.kill(controller.process.pid, signal.SIGKILL)  # the controller alone: no clean-up runs
        deadline = time.monotonic() + 5
        while controller.folder.exists():
            assert time.monotonic() < deadline, [p for p in forked if pid_alive(p)]
            time.sleep(0.05)
    finally:
        controller.close()
    deadline = time.monotonic() + 5
    while any(pid_alive(p) for p in forked):
        assert time.monotonic() < deadline, [p for p in forked if pid_alive(p)]
        time.sleep(0.05)


def test_the_magics_in_a_kernel_and_a_killed_kernel_leaves_no_engine_and_no_controller(tmp_path):
    kernel = Kernel(tmp_path)
    try:
        status, out = kernel.run("%load_ext mwhelpers\n%cluster 2 --interactive")
        assert status == "ok", out
        assert "2 interactive tasks: worker:0 (engine 0), worker:1 (engine 1)" in out
        views = [d["text/html"] for d in kernel.displays if "mwhelpers-live" in d.get("text/html", "")]
        assert len(views) == 2 and "worker:1" in views[1], kernel.displays  # one live view each
        status, out = kernel.run("%%px\nimport os\nprint('I am', os.environ['MWHELPERS_TASK'])")
        assert status == "ok" and "[worker:0] I am worker:0" in out and "[worker:1] I am worker:1" in out
        # Rich output from a task reaches the notebook as rich output, after its task's label.
        status, out = kernel.run("%%px worker:1\nfrom IPython.display import HTML\n"
                                 "HTML('<b>from worker 1</b>')")
        assert status == "ok" and "[worker:1]" in out, out
        assert any(d.get("text/html") == "<b>from worker 1</b>" for d in kernel.displays), kernel.displays
        status, out = kernel.run("%%px worker:1\nx = 5")
        assert status == "ok", out
        status, out = kernel.run("has_x = %pxget 'x' in globals()\nprint(has_x)\n"
                                 "doubled = %pxget --tasks worker:1 x * 2\nprint(doubled)")
        assert status == "ok" and "worker:0  False" in out and "worker:1  True" in out, out
        assert "worker:1  10" in out and "worker:0  " not in out.split("worker:1  True")[1], out
        status, out = kernel.run("%%px --targets 0\nraise ValueError('only engine 0')")
        assert status == "error" and "worker:0 raised ValueError: only engine 0" in out, out
        status, out = kernel.run("%pxrestart worker:0")
        assert status == "ok" and "restarted worker:0 (engine 2)" in out, out
        msg_id = kernel.kc.execute("%%px\nimport time\ntime.sleep(30)")  # then Ctrl-C
        time.sleep(1.5)
        t = time.monotonic()
        kernel.km.interrupt_kernel()
        reply = kernel.kc.get_shell_msg(timeout=15)
        assert reply["parent_header"]["msg_id"] == msg_id and time.monotonic() - t < 5
        assert reply["content"]["status"] == "error", reply["content"]
        assert reply["content"]["ename"] == "KeyboardInterrupt"  # every task stopped its cell
        # A front end sends the next cell once the kernel says idle: a request that reaches it
        # between the error reply and then is aborted by ipykernel (stop_on_error), by design.
        kernel.wait_idle(msg_id)
        status, out = kernel.run("%%px\nprint('still here')")
        assert status == "ok" and out.count("still here") == 2, out
        status, out = kernel.run(
            "rt = __import__('mwhelpers').runtime(); eng = rt.engines\n"
            "print('PIDS', *[r.pid for r in rt.runs.values()], "
            "*[p.pid for p in eng.controller.process.processes()])")
        pids = [int(p) for p in out.split("PIDS", 1)[1].split()]
        assert status == "ok" and len(pids) >= 3, out
        status, out = kernel.run("print('FOLDER', rt.engines.controller.folder)")
        folder = Path(out.split("FOLDER ", 1)[1].split()[0])
        assert status == "ok" and (folder / "profile" / "security").is_dir(), out  # its keys
        os.kill(kernel.pid, signal.SIGKILL)  # none of the kernel's clean-up runs
        deadline = time.monotonic() + 5
        while any(pid_alive(p) for p in pids) or folder.exists():
            assert time.monotonic() < deadline, ([p for p in pids if pid_alive(p)], folder)
            time.sleep(0.05)
    finally:
        kernel.close()


