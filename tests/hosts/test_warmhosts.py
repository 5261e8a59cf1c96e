"""Warm servers and spare agents on other hosts (``mwhelpers/backends/warmhosts.py``), on the
session's test hosts: over SSH and Ray, a task whose program imports TensorFlow is forked
from its host's server (under Slurm, from its spare's own, in the spare's job step), keeps
what a fresh start gives (its output, exit code, exit record, end), and a task that cannot be
forked starts afresh and says why.  (Its arguments vary here, not its environment: a variable
the server was not started with sends a task to a fresh start, as it would give a local task a
server of its own.)
"""

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import psutil
import pytest
from conftest import gone_within, task_pids
from test_backends import allocation, ray_helpers  # noqa: F401  (a fixture)
from test_multihost import link_down

from mwhelpers.backends.warmhosts import WarmHosts
from mwhelpers.failures import WorkerFailed
from mwhelpers.workshop.testhosts import missing

REASON = missing(slurm=True)
if REASON and os.environ.get("CI") == "true":
    raise RuntimeError(f"CI must run the multi-host tests, but: {REASON}")
pytestmark = [pytest.mark.skipif(bool(REASON), reason=REASON),
              pytest.mark.xdist_group("testhosts")]

NOTICE = "[mwhelpers] warm start: this task was forked"
PROGRAM = """\
import os, sys
import tensorflow as tf
print("RAN", os.environ["TF_CONFIG"] != "", tf.__version__, flush=True)
what = sys.argv[1] if len(sys.argv) > 1 else "0"
if what == "raise":
    raise ValueError("raised on purpose")
if what == "sleep":
    import time; time.sleep(300)
sys.exit(int(what))
"""


@pytest.fixture
def warm(rt, hosts, monkeypatch, tmp_path):
    """The runtime, on the test hosts, with warm servers on (the other host tests turn them
    off); the program; nothing left on the hosts afterwards."""
    for k, v in hosts.env().items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    monkeypatch.setenv("MWHELPERS_WARM_HOSTS", "1")
    program = tmp_path / "program.py"
    program.write_text(PROGRAM)
    yield rt, program
    rt.close()
    assert gone_within(hosts, 15), f"left behind on the test hosts: {task_pids(hosts)}"


def ready_servers(rt):
    warm = rt.launcher.warm
    assert isinstance(warm, WarmHosts)
    for server in warm.servers.values():
        assert server.ready(180), server.error
    return warm


def check_forked(rt, warm, program, task="worker:0"):
    run = rt.launch(task, script=program, args=["3"], background=True, ready="start")
    assert run.wait(60) == 3
    lines = run.lines()
    assert warm.last_cold_reason is None
    assert any(line.startswith(NOTICE) for line in lines), lines
    assert any(line.startswith("RAN True") for line in lines), lines
    return run


def test_ssh_tasks_fork_from_their_hosts_warm_servers_and_end_as_fresh_ones(warm, hosts):
    rt, program = warm
    rt.define_cluster(2, backend="ssh", hosts=list(hosts.names))
    servers = ready_servers(rt)
    assert len(servers.servers) == 2  # one a host
    for task in ("worker:0", "worker:1"):
        check_forked(rt, servers, program, task)
    # its record and failure, as a fresh start's
    with pytest.raises(WorkerFailed):
        rt.launch("worker:0", script=program, args=["raise"])
    (failed,) = [r for t, r in rt.runs.items() if str(t) == "worker:0"]
    record = failed.exit_record
    assert record is not None and record.summary == "ValueError: raised on purpose"
    # ended by %killworker: the task's whole group, though its parent is the server
    run = rt.launch("worker:1", script=program, args=["sleep"], background=True,
                    ready="start")
    deadline = time.monotonic() + 15
    while run.process.remote_pid is None and time.monotonic() < deadline:  # (its agent's report)
        time.sleep(0.05)
    pid = run.process.remote_pid
    assert pid in task_pids(hosts)
    rt.kill("worker:1")
    assert run.wait(15) is not None
    deadline = time.monotonic() + 10
    while pid in task_pids(hosts) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert pid not in task_pids(hosts)


def test_a_launch_right_after_the_cluster_waits_for_the_import_with_its_spare_alive(
        warm, hosts, monkeypatch):
    """Launched before its host's server has imported TensorFlow, with a heartbeat shorter
    than that import: the spare it will take is still pinged while the launch waits, so the
    task is forked there, not lost with a spare that ended itself."""
    rt, program = warm
    monkeypatch.setenv("MWHELPERS_HEARTBEAT", "2")  # (an import takes 3 CPU-s at least)
    rt.define_cluster(1, backend="ssh", hosts=[hosts.names[0]])
    server = next(iter(rt.launcher.warm.servers.values()))
    assert not server.done.is_set()  # (its import has only begun)
    check_forked(rt, rt.launcher.warm, program)


def test_a_task_that_cannot_fork_starts_afresh_and_says_why(warm, hosts):
    rt, program = warm
    rt.define_cluster(1, backend="ssh", hosts=[hosts.names[0]])
    servers = ready_servers(rt)
    # a program that sets what TensorFlow reads at its import, before it: its own import
    early = program.with_name("early.py")
    early.write_text('import os\nos.environ["TF_ENABLE_ONEDNN_OPTS"] = os.environ["X"]\n'
                     + PROGRAM)
    run = rt.launch("worker:0", script=early, env={"X": "0"}, background=True, ready="start")
    assert run.wait(60) == 0
    assert "sets environment variables (TF_ENABLE_ONEDNN_OPTS)" in (servers.last_cold_reason or "")
    assert not any(line.startswith(NOTICE) for line in run.lines())
    # the server gone (its import process killed): the agent starts the task afresh
    (server,) = servers.servers.values()
    zygotes = [p for p in task_pids(hosts)  # (its title: _forkserver.set_title)
               if b"_bootstrap.py --zygote" in Path(f"/proc/{p}/cmdline").read_bytes().split(b"\0")[0]]
    assert len(zygotes) == 1
    os.kill(zygotes[0], signal.SIGKILL)  # its agent, the server, then ends
    assert server.popen.wait(15) is not None
    run = rt.launch("worker:0", script=program, background=True, ready="start")
    assert run.wait(60) == 0
    assert "warm server is not ready (it ended)" in (servers.last_cold_reason or "")
    assert not any(line.startswith(NOTICE) for line in run.lines())
    assert any(line.startswith("RAN True") for line in run.lines())


# Asks the warm server on the abstract socket argv[1] to fork the bootstrap with argv[2] as its
# program; prints the answer's kind, or "none" (the connection closed without one, maybe
# before the request went).
ASK = """\
import json, os, socket, sys
log = open(os.devnull, "w")
mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
conn.connect("\\0" + sys.argv[1])
request = {"version": int(sys.argv[3]), "kind": "task", "argv": [sys.argv[2]],
           "env": {"PATH": "/usr/bin:/bin"}, "cwd": "/", "pass": []}
try:
    socket.send_fds(conn, [json.dumps(request).encode()], [theirs.fileno(), log.fileno()])
except OSError:  # the server closed the connection first
    print("none", flush=True)
    sys.exit(0)
theirs.close()
mine.settimeout(20)
answer = mine.recv(65536)
print(json.loads(answer)["kind"] if answer else "none", flush=True)
"""


@pytest.mark.parametrize("backend", ["ssh", pytest.param("ray", marks=pytest.mark.ray)])
def test_a_killed_kernel_leaves_no_server_spare_or_forked_task_behind(warm, hosts, tmp_path,
                                                                      request, backend):
    """SIGKILL of the kernel (none of its clean-up runs) while both hosts hold a warm server, a
    spare and a task forked there: the transports' input ends (ssh's, or the Ray relays', which
    are the kernel's children), so every agent ends its task, the servers then leave, and the
    spares too.  The heartbeat is off, so that nothing else could explain it."""
    _, program = warm
    where = ({"backend": "ssh", "hosts": list(hosts.names)} if backend == "ssh" else
             {"backend": "ray", "address": request.getfixturevalue("ray").address})
    kernel = textwrap.dedent(f"""
        import sys, time
        from mwhelpers import Runtime
        rt = Runtime(log_dir={str(tmp_path / "logs")!r}, echo=lambda line: None)
        rt.define_cluster(2, **{where!r})
        for server in rt.launcher.warm.servers.values():
            assert server.ready(180), server.error
        runs = [rt.launch(t, script={str(program)!r}, args=["sleep"], background=True,
                          ready="start") for t in ("worker:0", "worker:1")]
        deadline = time.monotonic() + 60
        while not all(any(l.startswith({NOTICE!r}) for l in r.lines()) for r in runs):
            assert time.monotonic() < deadline, [r.lines() for r in runs]
            time.sleep(0.1)
        print("forked", flush=True)
        time.sleep(300)
    """)
    proc = subprocess.Popen([sys.executable, "-c", kernel], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "MWHELPERS_HEARTBEAT": "0"})
    try:
        said: list[str] = []
        reader = threading.Thread(target=lambda: said.extend(iter(proc.stdout.readline, "")),
                                  daemon=True)
        reader.start()
        deadline = time.monotonic() + 240
        while not any(line.strip() == "forked" for line in said):
            assert time.monotonic() < deadline and proc.poll() is None, "".join(said)
            time.sleep(0.1)
        # on each host (Ray: each node): the server's agent and zygote, the task and its agent
        assert len(task_pids(hosts)) >= 8, task_pids(hosts)
        proc.kill()  # SIGKILL: no clean-up code of the kernel runs
        proc.wait()
        assert gone_within(hosts, 20), f"left behind on the test hosts: {task_pids(hosts)}"
        # here: the kernel's relays (its tasks', servers' and spares'), orphaned
        assert gone_within(hosts, 20, find=lambda _: ray_helpers()), ray_helpers()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_partition_ends_a_hosts_waiting_spare_and_server_and_launches_go_on(warm, hosts,
                                                                           monkeypatch):
    """A spare hears the kernel's pings while it waits: cut off for longer than the heartbeat,
    it ends itself (as its host's server does), so nothing waits there for a TCP timeout;
    once the link is back a launch starts its task afresh, saying why."""
    rt, program = warm
    monkeypatch.setenv("MWHELPERS_HEARTBEAT", "2")
    host = hosts.names[0]
    rt.define_cluster(1, backend="ssh", hosts=[host])
    servers = ready_servers(rt)
    (spare,) = servers.spares[host]
    assert spare.usable(spare.env, 30)
    time.sleep(3)  # past the heartbeat: the pings keep it
    assert spare.popen.poll() is None and servers.servers[host].popen.poll() is None
    with link_down(hosts, host):
        time.sleep(5)
    deadline = time.monotonic() + 20
    while spare.popen.poll() is None or servers.servers[host].popen.poll() is None:
        assert time.monotonic() < deadline, task_pids(hosts)
        time.sleep(0.2)
    assert not task_pids(hosts)
    run = rt.launch("worker:0", script=program, args=["3"], background=True, ready="start")
    assert run.wait(60) == 3
    assert "its host's warm server is not ready" in (servers.last_cold_reason or "")


def test_only_the_clusters_own_user_has_tasks_forked(warm, hosts, tmp_path):
    """The warm server's socket is abstract: no file permissions guard it, and its name is
    listed in /proc/net/unix.  Another user who connects has nothing forked; the same
    request from the cluster's own user is forked (so the check can fail)."""
    from mwhelpers.taskside import wire

    rt, program = warm
    rt.define_cluster(1, backend="ssh", hosts=[hosts.names[0]])
    (server,) = ready_servers(rt).servers.values()
    marker = tmp_path / "forked"
    payload = tmp_path / "payload.py"
    payload.write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    payload.chmod(0o644)
    tmp_path.chmod(0o777)
    ask = ["ip", "netns", "exec", hosts.names[0]]
    nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    words = ["/usr/bin/python3", "-c", ASK, server.name, str(payload), str(wire.VERSION)]
    other = subprocess.run([*ask, *nobody, *words], capture_output=True, text=True, timeout=60)
    assert other.stdout.split() == ["none"], other.stderr
    assert not marker.exists()
    own = subprocess.run([*ask, *words], capture_output=True, text=True, timeout=60)
    assert own.stdout.split() == ["pid"], own.stderr
    deadline = time.monotonic() + 30
    while not marker.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert marker.read_text() == "ran"


def test_slurm_tasks_fork_from_their_spares_own_servers_each_in_its_own_step(warm, hosts, allocation):  # noqa: F811
    """Under Slurm a task forked by a host's server would live in that server's job step, so
    each spare starts a warm server of its own and its task is forked there: the task's
    ancestors are its own step's slurmstepd, not another task's (three tasks on two nodes: with
    a server per node, two would share one)."""
    rt, program = warm
    rt.define_cluster(3, backend="slurm", job=allocation)
    warmhosts = rt.launcher.warm
    assert not warmhosts.servers and all(warmhosts.spares.values())
    runs, steps = {}, {}
    for task in ("worker:0", "worker:1", "worker:2"):
        run = runs[task] = rt.launch(task, script=program, args=["sleep"], background=True,
                                     ready="start")
        deadline = time.monotonic() + 60
        while not any(line.startswith(NOTICE) for line in run.lines()) or (
                run.process.remote_pid is None):  # (its agent reports the pid after the fork)
            assert time.monotonic() < deadline and run.running, run.lines()
            time.sleep(0.1)
        assert warmhosts.last_cold_reason is None
        chain = psutil.Process(run.process.remote_pid).parents()
        stepd = [p for p in chain if p.name() == "slurmstepd"]
        assert stepd, [(p.pid, p.name()) for p in chain]
        steps[task] = stepd[0].pid
    assert len(set(steps.values())) == 3, steps  # a step each
    rt.kill("worker:0")
    assert runs["worker:0"].wait(15) is not None and runs["worker:1"].running
    # a task the spare's server cannot fork (an environment of its own) starts afresh, saying why
    host = rt.cluster.host_of(runs["worker:0"].task)
    deadline = time.monotonic() + 15  # (the spare taken is replaced a second after its launch)
    while not warmhosts.spares.get(host):
        assert time.monotonic() < deadline, warmhosts.spares
        time.sleep(0.1)
    run = rt.launch("worker:0", script=program, args=["3"], env={"EXTRA": "1"},
                    background=True, ready="start")
    assert run.wait(60) == 3
    assert "environment differs" in (warmhosts.last_cold_reason or "")
    assert not any(line.startswith(NOTICE) for line in run.lines())
    assert any(line.startswith("RAN True") for line in run.lines())


def test_a_slurm_spare_whose_own_server_fails_has_its_task_start_afresh(warm, hosts, allocation,  # noqa: F811
                                                                         tmp_path, monkeypatch):
    """A spare's own server that cannot import (here a broken ``tensorflow`` first on the
    path, which srun passes on) says so; its task starts afresh in the same spare, and the
    reason names the spare's server."""
    rt, _ = warm
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "tensorflow.py").write_text("raise ImportError('not this TensorFlow')\n")
    monkeypatch.setenv("PYTHONPATH", str(broken))
    plain = tmp_path / "plain.py"
    plain.write_text("print('PLAIN RAN', flush=True)\n")
    rt.define_cluster(1, backend="slurm", job=allocation)
    (spare,) = [s for ss in rt.launcher.warm.spares.values() for s in ss]
    assert not spare.server.ready(120)
    assert spare.server.error, "no reason was given"
    run = rt.launch("worker:0", script=plain, background=True, ready="start")
    assert run.wait(60) == 0
    why = rt.launcher.warm.last_cold_reason or ""
    assert why.startswith("its spare's own warm server is not ready"), why
    assert any(line.startswith("PLAIN RAN") for line in run.lines()), run.lines()


@pytest.mark.ray
def test_ray_tasks_fork_from_their_nodes_warm_servers(warm, hosts, ray):
    rt, program = warm
    rt.define_cluster(2, backend="ray", address=ray.address)
    servers = ready_servers(rt)
    for task in ("worker:0", "worker:1"):
        check_forked(rt, servers, program, task)
