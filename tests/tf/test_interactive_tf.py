"""Interactive tasks (``mwhelpers.interactive``): every task of the cluster an ipyparallel engine
with its own TF_CONFIG, started and guarded as any task, and cells run on all of them.

Here: the tests of test_interactive that need TensorFlow; the module's text and its other tests
are in processes/test_interactive.py."""

import textwrap
import time

import pytest
from conftest import pid_alive
from test_backends import allocation, backend  # noqa: F401 (fixtures used here)
from test_interactive import SKIP_ONE, STEP, STRATEGY, controller_pids, engines_of

from mwhelpers.errors import CellFailed


def test_a_step_on_every_task_agrees_and_a_raise_while_the_peer_waits_fails_within_seconds(rt):
    rt.define_cluster(2)
    eng = rt.interactive()
    assert [str(t) for t in eng.tasks] == ["worker:0", "worker:1"]
    assert [eng.engine_of[t] for t in eng.tasks] == [0, 1]  # engine order = task order
    eng.run(STRATEGY)
    assert eng.pull("strategy.num_replicas_in_sync") == dict.fromkeys(eng.tasks, 2)
    eng.run(STEP)
    losses = eng.pull("loss")
    assert losses[eng.tasks[0]] != losses[eng.tasks[1]]  # different batches...
    weights = eng.pull("[w.tolist() for w in model.get_weights()]")
    assert weights.same(), weights  # ...and the same weights after the all-reduce

    t = time.monotonic()
    with pytest.raises(CellFailed) as failed:
        eng.run(SKIP_ONE, grace=1)
    took = time.monotonic() - t
    assert took < 10, took  # not a hang: the peer was ended
    e = failed.value
    message = str(e).splitlines()
    assert message[0] == "worker:1 raised RuntimeError: worker 1 skips this step"  # root cause
    assert [str(t) for t in e.stuck] == ["worker:0"]
    assert any("worker:0 was inside TensorFlow, called from line 3 of the cell: "
               "loss = float(step(x, tf.ones((8, 1))))" in ln for ln in message), message
    w0, w1 = engines_of(rt)
    assert w0.state == "killed" and w1.running  # the raiser is fine; its peer was stuck
    assert w0.activity == "cell 3 ended" and w1.activity == "cell 3 raised"  # %workers shows it
    with pytest.raises(CellFailed, match=r"worker:0 ended before this cell: killed by SIGKILL"):
        eng.run("1")  # reported at once, before anything runs

    eng.restart()  # fresh processes, the same TF_CONFIG: the strategy can be made again
    assert [eng.engine_of[t] for t in eng.tasks] == [2, 3]
    assert not any(r.running for r in (w0, w1))
    eng.run(STRATEGY + STEP)
    assert eng.pull("[w.tolist() for w in model.get_weights()]").same()
    status = repr(rt.status())
    assert status.count("idle after cell 4") == 2, status

    # One task skips a step: its peer waits inside the graph's all-reduce, where SIGINT does
    # not reach, so the timeout ends it; its stack dump goes to its log, not to the cell.
    heard = []
    with pytest.raises(CellFailed) as failed:
        eng.run("if task == 0:\n    loss = float(step(x, tf.ones((8, 1))))", timeout=1,
                echo=lambda t, stream, text: heard.append(text))
    text = str(failed.value)
    assert "worker:0 did not finish cell 5 within 1 s" in text, text
    assert "worker:0 did not stop within 2 s: stuck where Python cannot interrupt" in text, text
    assert "worker:1 finished the cell meanwhile" in text, text
    assert "Ended now: worker:0" in text, text
    assert not any("most recent call first" in ln for ln in heard), heard
    w0 = rt.runs[eng.tasks[0]]
    assert not w0.running and "Current thread" in w0.log_path.read_text()
    pids = controller_pids(eng) + [r.pid for r in engines_of(rt)]
    rt.close()
    assert not any(pid_alive(p) for p in pids)


def test_chief_ps_and_evaluator_are_engines_too_and_the_chief_drives_a_parameter_server(rt):
    """Every kind of task gets an engine with its own TF_CONFIG, numbered in task order; the
    worker and the ps start their servers from a cell, and the chief's ClusterCoordinator
    runs functions on the worker against a variable on the ps."""
    who = "import json, os\nme = json.loads(os.environ['TF_CONFIG'])['task']\nf\"{me['type']}:{me['index']}\""
    rt.define_cluster(1, evaluator=True)
    eng = rt.interactive()
    assert {str(t): v for t, v in eng.run(who).items()} == {
        "worker:0": "'worker:0'", "evaluator:0": "'evaluator:0'"}
    first = eng.controller.process.pid

    rt.define_cluster(1, chief=True, ps=1)  # a new cluster ends the old one's engines
    eng = rt.interactive()
    assert not pid_alive(first)
    names = ["chief:0", "worker:0", "ps:0"]
    assert [(str(t), eng.engine_of[t]) for t in eng.tasks] == [(n, i) for i, n in enumerate(names)]
    assert {str(t): v for t, v in eng.run(who).items()} == {n: repr(n) for n in names}
    eng.run("import tensorflow as tf\n"
            "resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()\n"
            "server = tf.distribute.Server(resolver.cluster_spec(), job_name=me['type'],\n"
            "                              task_index=me['index'], protocol='grpc', start=True)",
            targets=["worker:0", "ps:0"])
    eng.run(textwrap.dedent("""
        import tensorflow as tf
        resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
        strategy = tf.distribute.experimental.ParameterServerStrategy(resolver)
        coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
        with strategy.scope():
            v = tf.Variable(0.0)

        @tf.function
        def add():
            v.assign_add(1.0)

        for _ in range(3):
            coordinator.schedule(add)
        coordinator.join()
    """), targets="chief:0", timeout=120)
    got = eng.pull("(float(v.numpy()), v.device)", "chief:0")
    assert got["chief:0"] == (3.0, "/job:ps/replica:0/task:0/device:CPU:0"), got
    rt.close()
