"""The ray backend on a real Ray cluster of three nodes (tests/raycluster.py): the head here, on
the test hosts' bridge, with no CPUs of its own, and a node in each test host.

What every backend keeps (placement, readiness, killing a tree, ending with escalation, a
SIGKILLed kernel, supervise) is tested for Ray with the others in
tests/processes/test_backends.py; here is what Ray users come for: Keras 3's ``fit`` on two
Ray nodes (where Ray Train's TensorFlow example fails under Keras 3, ray-project/ray#47464),
a job that survives a kill and a silent partition, and what the errors say.
"""

import os
import signal
import subprocess
import sys
import threading
import time

import psutil
import pytest
from conftest import ROOT, results
from test_multihost import LONG_STEPS, env, link_down, remote_rt, supervise_under_chaos  # noqa: F401  (fixtures)

from mwhelpers.errors import InfrastructureError, UsageError
from mwhelpers.workshop.testhosts import missing

REASON = missing(slurm=True)  # (the session's test hosts come with Slurm)
if REASON and os.environ.get("CI") == "true":
    raise RuntimeError(f"CI must run the multi-host tests, but: {REASON}")
pytestmark = [pytest.mark.skipif(bool(REASON), reason=REASON), pytest.mark.xdist_group("testhosts"),
              pytest.mark.ray]

KERAS3_TRAIN = ROOT / "tests" / "programs" / "keras3_train.py"


def test_keras3_fit_on_two_ray_nodes_trains_as_one_process_through_the_magics(
        ip, remote_rt, env, ray, tmp_path):  # noqa: F811
    """keras3_train.py: Keras 3 ``fit`` (dict inputs, a partial last batch, validation, a
    ModelCheckpoint), ``evaluate`` and ``predict`` under MultiWorkerMirroredStrategy, one task
    per Ray node; each worker also trains alone on the same global batches."""
    cluster = ip.run_line_magic("cluster", f"2 --backend ray --address {ray.address}")
    nodes = {cluster.address(t).rsplit(":", 1)[0] for t in cluster.tasks}
    assert nodes == set(env.addresses.values())  # spread: a node each
    ip.run_line_magic("worker", f"all --bg --timeout 120 {KERAS3_TRAIN} {tmp_path / 'ckpt'} 2")
    ip.run_line_magic("waitworkers", "--timeout 180")
    res = results(remote_rt)
    for r in res.values():
        assert r["replicas"] == 2 and r["loss"][-1] < r["loss"][0] * 0.5
        assert r["weights_sum"] == pytest.approx(r["alone_weights_sum"], rel=1e-5)
        assert r["predict_shape"] == [516, 1]
    assert res["worker:0"]["weights_sum"] == res["worker:1"]["weights_sum"]
    assert res["worker:0"]["saved_weights_sum"] == pytest.approx(res["worker:0"]["weights_sum"])


def test_a_killed_worker_on_a_ray_node_resumes_at_its_backup(remote_rt, env, ray,  # noqa: F811
                                                             tmp_path):
    """supervise, a worker SIGKILLed mid-epoch: every task starts again (in the same bundles)
    and the job resumes at the BackupAndRestore step, ending at exactly epochs x steps."""
    remote_rt.define_cluster(2, backend="ray", address=ray.address)
    supervise_under_chaos(remote_rt, tmp_path, kills=1, seed=3)


def test_a_ray_node_silent_in_a_partition_is_lost_and_the_job_restarts(
        remote_rt, env, ray, monkeypatch):  # noqa: F811
    """A node's link goes down without closing anything: its task is marked lost after the
    heartbeat, supervise ends the other and, once the link is back, runs both again."""
    monkeypatch.setenv("MWHELPERS_HEARTBEAT", "2")
    cluster = remote_rt.define_cluster(2, backend="ray", address=ray.address)
    node = next(name for name, addr in env.addresses.items()  # the test host of worker:0
                if addr == cluster.address("worker:0").rsplit(":", 1)[0])
    cut = []

    def partition():
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            runs = list(dict(remote_rt.runs).values())
            if len(runs) == 2 and all(any(ln.startswith("step 2 ") for ln in r.lines())
                                      for r in runs):
                break
            time.sleep(0.05)
        lost = remote_rt.runs[remote_rt.cluster.check_task("worker:0")]
        with link_down(env, node):
            cut.append(time.monotonic())
            lost.wait(15)
            cut.append(time.monotonic())

    cutter = threading.Thread(target=partition, daemon=True)
    cutter.start()
    attempts = remote_rt.supervise(code=LONG_STEPS, max_restarts=1, timeout=90, stream=False)
    cutter.join(30)
    assert len(cut) == 2 and cut[1] - cut[0] < 6, cut
    first = attempts[0]
    assert first.restarted and str(first.root_cause.task) == "worker:0"
    assert "stopped answering for 2 s" in first.failed[0][1]
    assert [r.returncode for r in attempts[-1].runs] == [0, 0]


def test_ray_errors_say_what_to_do(remote_rt, env, ray, monkeypatch):  # noqa: F811
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    with pytest.raises(UsageError, match=r"needs the Ray cluster's address: --address HOST:PORT"):
        remote_rt.define_cluster(2, backend="ray")
    with pytest.raises(UsageError, match=r"option placement cannot be 'scatter'.*spread, pack"):
        remote_rt.define_cluster(2, backend="ray", address=ray.address,
                                 placement="scatter")
    # more tasks than nodes, a node each: Ray cannot place them, and says what it has
    t = time.monotonic()
    with pytest.raises(InfrastructureError, match=r"did not place this cluster's 3 tasks: Ray "
                       r"could not place 3 bundles .*STRICT_SPREAD.* 3 node\(s\), 4 CPUs"):
        remote_rt.define_cluster(3, backend="ray", address=ray.address,
                                 placement="strict-spread", place_timeout=3)
    assert time.monotonic() - t < 30


def listening(pids):
    """{(address, port)} of the TCP sockets that ``pids`` listen on."""
    found = set()
    for pid in pids:
        try:
            conns = psutil.Process(pid).net_connections(kind="tcp")
        except psutil.Error:
            continue
        found |= {(c.laddr.ip, c.laddr.port) for c in conns if c.status == psutil.CONN_LISTEN}
    return found


def test_a_private_ray_head_listens_on_loopback_only_and_takes_no_code_without_its_token(
        remote_rt, env, tmp_path):  # noqa: F811
    """address="local": a head started for the cluster, its services on loopback (from a test
    host, none of its ports answers at this machine's address), no dashboard, token
    authentication on; a driver without the token is refused.  Closing the cluster ends it."""
    cluster = remote_rt.define_cluster(2, backend="ray", address="local")
    head = remote_rt.launcher.head
    pids = [head.proc.pid, *(p.pid for p in psutil.Process(head.proc.pid).children(recursive=True))]
    sockets = listening(pids)
    assert sockets and {ip for ip, _ in sockets} <= {"127.0.0.1", "::ffff:127.0.0.1"}, sockets
    assert 8265 not in {port for _, port in sockets}  # no dashboard
    assert [cluster.address(t).rsplit(":", 1)[0] for t in cluster.tasks] == ["127.0.0.1"] * 2
    for port in sorted({port for _, port in sockets}):
        probe = env.ssh(env.names[0], "python3", "-c", "import socket, sys; "
                        f"socket.create_connection(('{env.gateway}', {port}), timeout=2)")
        assert probe.returncode != 0, f"port {port} answered a test host"
    remote_rt.launch("worker:0", code="import os; print('ON', os.environ['TF_CONFIG'])",
                     timeout=60)
    assert any(ln.startswith("ON ") for ln in remote_rt.get_run("worker:0").lines())
    # A driver on this machine without the token: the head refuses it (it would retry for 20 s)
    intruder = subprocess.Popen(
        [sys.executable, "-c", f"import ray; ray.init(address={head.address!r})"],
        stderr=subprocess.PIPE, text=True, start_new_session=True,
        env={**{k: v for k, v in os.environ.items() if not k.startswith("RAY_")},
             "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"})
    try:
        said = [intruder.stderr.readline() for _ in range(5)]
        assert any("Unauthenticated: RPC error: InvalidAuthToken" in ln for ln in said), said
    finally:
        os.killpg(intruder.pid, signal.SIGKILL)
        intruder.wait(10)
    folder = head.dir
    remote_rt.close()
    assert not [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"]
    assert not folder.exists()


def test_a_private_ray_head_ends_and_its_folder_goes_when_its_kernel_is_killed(tmp_path):
    """A kernel SIGKILLed with a private head: its lifeline's input ends, so the head ends and
    the lifeline removes the head's folder (close() never ran)."""
    kernel = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\n"
         "from mwhelpers.backends.raynodes import PrivateHead\n"
         "head = PrivateHead()\n"
         "print(head.dir, head.proc.pid, flush=True)\n"
         "time.sleep(300)\n"],
        stdout=subprocess.PIPE, text=True, start_new_session=True,
        env={**{k: v for k, v in os.environ.items() if not k.startswith("RAY_")},
             "PYTHONPATH": str(ROOT)})
    try:
        folder, lifeline = kernel.stdout.readline().split()
        pids = [int(lifeline), *(p.pid for p in psutil.Process(int(lifeline)).children(True))]
        assert len(pids) > 3 and os.path.isdir(folder)
    finally:
        os.killpg(kernel.pid, signal.SIGKILL)
        kernel.wait(10)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and (os.path.exists(folder) or [
            p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"]):
        time.sleep(0.2)
    assert not os.path.exists(folder)
    assert not [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"]


def test_a_bundle_ray_moved_to_another_node_fails_the_launch_and_says_why(
        remote_rt, env, ray):  # noqa: F811
    """Ray reschedules a dead node's bundles elsewhere; TF_CONFIG still names the old node. The
    relay compares the node its actor landed on with the one the cluster was placed on."""
    from mwhelpers.failures import WorkerFailed

    cluster = remote_rt.define_cluster(1, backend="ray", address=ray.address)
    host = cluster.host_of("worker:0")
    remote_rt.launcher.address_at[host] = "10.9.9.9"  # as if the bundle had been there
    with pytest.raises(WorkerFailed) as failed:
        remote_rt.launch("worker:0", code="print('RAN')", timeout=60)
    log = "\n".join(remote_rt.get_run("worker:0").lines())
    assert f"is on node {host} now, not on 10.9.9.9, where the cluster was placed" in log, log
    assert "define the cluster again (%cluster)" in log and "RAN" not in log
    assert "worker:0 failed" in str(failed.value)
