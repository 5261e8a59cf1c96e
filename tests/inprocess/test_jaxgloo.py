"""JAX's gloo collectives on the task's own address (mwhelpers/taskside/jaxgloo.py), without
workers: which host is chosen from the task's environment, and what the wrapper passes on.
Two processes training across hosts with it are tests/hosts/test_multihost.py's."""

import types

import pytest

from mwhelpers.taskside import jaxgloo

BASE = {"JAX_CPU_COLLECTIVES_IMPLEMENTATION": "gloo",
        "KERAS_DISTRIBUTION_JOB_ADDRESSES": "10.0.0.1:2000,node-b:2001,[fd00::3]:2002",
        "KERAS_DISTRIBUTION_NUM_PROCESSES": "3"}


@pytest.mark.parametrize(("extra", "host"), [
    ({"KERAS_DISTRIBUTION_PROCESS_ID": "0"}, "10.0.0.1"),
    ({"KERAS_DISTRIBUTION_PROCESS_ID": "1"}, "node-b"),
    ({"KERAS_DISTRIBUTION_PROCESS_ID": "2"}, "fd00::3"),
    ({"KERAS_DISTRIBUTION_PROCESS_ID": "1", jaxgloo.ENV: "192.168.1.5"}, "192.168.1.5"),
    ({"KERAS_DISTRIBUTION_PROCESS_ID": "1", jaxgloo.ENV: "0"}, None),  # switched off
    ({"KERAS_DISTRIBUTION_PROCESS_ID": "1", "JAX_CPU_COLLECTIVES_IMPLEMENTATION": "mpi"}, None),
    ({"KERAS_DISTRIBUTION_PROCESS_ID": "7"}, None),  # not among the addresses
    ({}, None),  # no process id: not a task mwhelpers placed
])
def test_the_host_is_this_tasks_address_in_the_keras_variables(extra, host):
    assert jaxgloo.gloo_host({**BASE, **extra}) == host


def test_a_gloo_made_without_a_host_is_made_on_the_tasks_address(monkeypatch, capsys):
    made = []

    def make(distributed_client, hostname=None, interface=None):
        made.append((distributed_client, hostname, interface))
        return "collectives"

    bridge = types.SimpleNamespace(_jax=types.SimpleNamespace(make_gloo_tcp_collectives=make))
    for k in (*BASE, "KERAS_DISTRIBUTION_PROCESS_ID", jaxgloo.ENV):
        monkeypatch.delenv(k, raising=False)
    # Patched where JAX is imported: in a warm-start server, before the task's variables.
    jaxgloo._patch(bridge)
    jaxgloo._patch(bridge)  # once only
    wrapped = bridge._jax.make_gloo_tcp_collectives
    assert wrapped.__wrapped__ is make
    wrapped("c")  # no task variables: JAX's own choice
    for k, v in {**BASE, "KERAS_DISTRIBUTION_PROCESS_ID": "1"}.items():
        monkeypatch.setenv(k, v)
    assert wrapped(distributed_client="c") == "collectives"  # as xla_bridge calls it
    wrapped("c", hostname="mine")
    wrapped("c", interface="eth1")
    monkeypatch.setenv(jaxgloo.ENV, "0")
    wrapped("c")
    assert made == [("c", None, None), ("c", "node-b", None), ("c", "mine", None),
                    ("c", None, "eth1"), ("c", None, None)]
    assert capsys.readouterr().err.splitlines() == [jaxgloo.NOTICE.format(host="node-b")]
