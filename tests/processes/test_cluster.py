import json
import os
import socket
import subprocess
import sys
import textwrap

import pytest

from mwhelpers import ports
from mwhelpers.cluster import Cluster, Task, parse_task
from mwhelpers.errors import UsageError


@pytest.fixture
def cluster():
    c = Cluster(workers=2, chief=True, ps=1, evaluator=True)
    yield c
    c.close()


def test_tf_config_is_the_exact_json_each_task_gets(cluster):
    spec = cluster.cluster_spec()
    assert list(spec) == ["chief", "worker", "ps", "evaluator"]
    assert [len(v) for v in spec.values()] == [1, 2, 1, 1]
    for task in cluster.tasks:
        cfg = json.loads(cluster.tf_config(task))
        assert cfg == {"cluster": spec, "task": {"type": task.type, "index": task.index}}
    w1 = json.loads(cluster.tf_config("worker:1"))
    assert w1["cluster"]["worker"][1] == f"localhost:{cluster.port('worker:1')}"
    assert json.loads(cluster.tf_config("1"))["task"] == {"type": "worker", "index": 1}


def test_ports_are_distinct_free_and_in_range(cluster):
    got = list(cluster.ports.values())
    assert len(set(got)) == len(got) == 5
    low, high = ports.port_range()
    assert high < 32768 and all(low <= p <= high for p in got)
    for p in got:
        assert not ports.port_in_use(p)


def test_reserved_ports_are_skipped_by_another_process(monkeypatch, tmp_path):
    # Four ports in the range: this process reserves two, a second process
    # defining a 2-worker cluster at the same time must get the other two.
    # (Below 20000: tests running beside this one reserve from the default range.)
    monkeypatch.setenv("MWHELPERS_PORT_RANGE", "15600-15603")
    mine = Cluster(workers=2)
    try:
        code = textwrap.dedent("""
            import json, mwhelpers
            c = mwhelpers.Cluster(workers=2)
            print(json.dumps(sorted(c.ports.values())))
        """)
        # The other process has a TMPDIR of its own (as Slurm gives each job): the ports are
        # the machine's all the same.
        other = tmp_path / "their-tmp"
        other.mkdir()
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             check=True, timeout=60, env={**os.environ, "TMPDIR": str(other)}
                             ).stdout
        theirs = set(json.loads(out.strip().splitlines()[-1]))
        assert theirs.isdisjoint(mine.ports.values())
        assert theirs | set(mine.ports.values()) == {15600, 15601, 15602, 15603}
        # With all four taken (ours held, theirs released when it exited)...
        third = Cluster(workers=2)
        try:
            with pytest.raises(UsageError, match="could not find 2 free ports in 15600-15603"):
                Cluster(workers=2)
        finally:
            third.close()
    finally:
        mine.close()
    assert mine.closed


def test_a_released_port_leaves_no_file_behind(monkeypatch):
    # Below the default range, as above.
    # (A process killed while it held one leaves its file: other files of the range may exist.)
    monkeypatch.setenv("MWHELPERS_PORT_RANGE", "15620-15623")
    c = Cluster(workers=2)
    held = [ports.lock_dir() / f"{p}.lock" for p in c.ports.values()]
    assert all(f.exists() for f in held)
    c.close()
    assert not [f for f in held if f.exists()]


def test_a_port_whose_file_was_removed_while_it_was_being_taken_is_skipped(monkeypatch):
    """The race a release's removal opens: a process opens the file, its holder releases (the
    file goes), then the process's lock succeeds on a file no other process can find."""
    holder = ports.PortReservation.try_take(15630)
    assert holder is not None
    flock = ports.fcntl.flock
    third = []

    def release_first(fd, how, and_retake=False):
        monkeypatch.setattr(ports.fcntl, "flock", flock)
        holder.release()   # between the contender's open and its lock
        if and_retake:     # ...and a third process takes the port: a new file at that path
            third.append(ports.PortReservation.try_take(15630))
        return flock(fd, how)

    monkeypatch.setattr(ports.fcntl, "flock", release_first)
    assert ports.PortReservation.try_take(15630) is None   # the path names no file
    again = ports.PortReservation.try_take(15630)   # the file made anew: the port is free
    assert again is not None and again.held
    assert (ports.lock_dir() / "15630.lock").exists()
    holder = again
    monkeypatch.setattr(ports.fcntl, "flock",
                        lambda fd, how: release_first(fd, how, and_retake=True))
    assert ports.PortReservation.try_take(15630) is None   # the path names another file
    assert third[0] is not None and third[0].held
    third[0].release()
    assert not (ports.lock_dir() / "15630.lock").exists()


def test_the_files_of_reservations_nobody_holds_are_removed_and_held_ones_kept(tmp_path):
    """A process killed while it held a port leaves its file; remove_stale removes it (as a
    take and a release), and leaves the file of a port that is held."""
    code = ("import os, signal, sys\nfrom mwhelpers import ports\n"
            "r = ports.PortReservation.try_take(15640)\nassert r is not None\n"
            "os.kill(os.getpid(), signal.SIGKILL)\n")
    killed = subprocess.run([sys.executable, "-c", code], timeout=60)
    assert killed.returncode == -9
    stale = ports.lock_dir() / "15640.lock"
    assert stale.exists()
    held = ports.PortReservation.try_take(15641)
    try:
        assert ports.remove_stale() >= 1
        assert not stale.exists() and (ports.lock_dir() / "15641.lock").exists()
    finally:
        held.release()


def test_ports_in_use_are_never_chosen(monkeypatch):
    # Below the default range (20000 up), from which the other test process's clusters draw
    # their ports.
    busy = socket.socket()
    busy.bind(("", 15610))
    busy.listen()
    try:
        monkeypatch.setenv("MWHELPERS_PORT_RANGE", "15610-15612")
        c = Cluster(workers=2)
        assert sorted(c.ports.values()) == [15611, 15612]
        c.close()
    finally:
        busy.close()


@pytest.mark.parametrize("spec, expected", [
    ("worker:1", Task("worker", 1)), ("1", Task("worker", 1)), (1, Task("worker", 1)),
    ("chief", Task("chief", 0)), ("PS:0", Task("ps", 0)), ("", Task("worker", 0)),
    (None, Task("worker", 0)), ("evaluator:0", Task("evaluator", 0)),
])
def test_task_names(spec, expected):
    assert parse_task(spec) == expected


def test_task_names_print_as_type_colon_index():
    assert str(Task("worker", 1)) == "worker:1" and Task("chief", 0).slug == "chief-0"


@pytest.mark.parametrize("spec, message", [
    ("wrker:1", "unknown task type 'wrker'"),
    ("worker:x", "is not a task name"),
    ("worker:-1", "is not a task name|must be 0 or more"),
    ("main.py", "is not a task name"),
])
def test_bad_task_names_are_explained(spec, message):
    with pytest.raises(UsageError, match=message):
        parse_task(spec)


def test_tasks_outside_the_cluster_are_explained():
    c = Cluster(workers=2)
    try:
        with pytest.raises(UsageError, match=r"worker:2 is outside the cluster: the worker job has 2 tasks"):
            c.check_task("worker:2")
        with pytest.raises(UsageError, match=r"has no chief job .* %cluster N --chief"):
            c.check_task("chief:0")
        with pytest.raises(UsageError, match=r"has no ps job"):
            c.tf_config("ps:0")
    finally:
        c.close()


@pytest.mark.parametrize("kwargs, message", [
    ({"workers": -1}, "whole number"),
    ({"workers": 0}, "at least one worker or a chief"),
    ({"workers": 0, "chief": True, "ps": 1}, "parameter servers need at least one worker"),
    ({"workers": 2.5}, "whole number"),
])
def test_bad_cluster_shapes_are_explained(kwargs, message):
    with pytest.raises(UsageError, match=message):
        Cluster(**kwargs)


def test_display_shows_every_task_and_its_tf_config(cluster):
    text = repr(cluster)
    html = cluster._repr_html_()
    for task in cluster.tasks:
        assert str(task) in text and str(task) in html
        assert cluster.tf_config(task) in text
