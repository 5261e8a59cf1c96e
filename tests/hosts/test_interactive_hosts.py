"""Interactive tasks (``mwhelpers.interactive``): every task of the cluster an ipyparallel engine
with its own TF_CONFIG, started and guarded as any task, and cells run on all of them.

Here: the tests of test_interactive that need the test hosts; the module's text and its other
tests are in processes/test_interactive.py."""

import pytest
from conftest import gone_within, task_pids
from test_backends import allocation, backend  # noqa: F401 (fixtures used here)
from test_interactive import SKIP_ONE, STEP, STRATEGY

from mwhelpers.errors import CellFailed


# test_backends' own fixtures: the test hosts' environment, and one Slurm allocation
@pytest.mark.xdist_group("testhosts")
@pytest.mark.parametrize("backend", ["ssh", "slurm"], indirect=True)
def test_on_the_test_hosts_a_step_agrees_a_raise_ends_the_peer_and_nothing_is_left(rt, backend):  # noqa: F811
    _, kwargs, hosts = backend
    cluster = rt.define_cluster(2, **kwargs)
    eng = rt.interactive()
    assert eng.controller.ip != "127.0.0.1"  # where the hosts reach this machine
    eng.run("import json, os, socket\ncfg = json.loads(os.environ['TF_CONFIG'])\n"
            "me = cfg['cluster']['worker'][cfg['task']['index']].rsplit(':', 1)[0]\n"
            "socket.socket().bind((me, 0))")  # only the host that owns the address can
    assert eng.pull("me") == {t: cluster.address(t).rsplit(":", 1)[0] for t in eng.tasks}
    eng.run(STRATEGY + STEP)
    assert eng.pull("[w.tolist() for w in model.get_weights()]").same()
    with pytest.raises(CellFailed) as failed:
        eng.run(SKIP_ONE, grace=1)
    assert str(failed.value).startswith("worker:1 raised RuntimeError: worker 1 skips this step")
    assert [str(t) for t in failed.value.stuck] == ["worker:0"]
    rt.close()
    assert gone_within(hosts, 10), task_pids(hosts)
