"""Tasks on other machines: SSH hosts and a Slurm cluster, made real as network namespaces.

The hosts (``mwhelpers/workshop/testhosts.py``, the session's ``hosts`` fixture) are made
once: two namespaces with their own address and sshd, munged, slurmctld and one slurmd per namespace.
Under CI=true they must be made; elsewhere the module skips with the reason.
"""

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time

import pytest
from chaos import Chaos, redone, steps_of
from conftest import (
    ROOT,
    STUBBORN,
    TRAIN,
    gone_within,
    json_line,
    pid_alive,
    results,
    run_notebook,
    task_pids,
)

from mwhelpers.errors import InfrastructureError, UsageError
from mwhelpers.taskside import jaxgloo
from mwhelpers.workshop.testhosts import missing

REASON = missing(slurm=True)
if REASON and os.environ.get("CI") == "true":
    raise RuntimeError(f"CI must run the multi-host tests, but: {REASON}")
# One test process runs them all (pytest-xdist): they share the module's test hosts.
pytestmark = [pytest.mark.skipif(bool(REASON), reason=REASON), pytest.mark.xdist_group("testhosts")]

# Binds the exact address TF_CONFIG gives it: this works only on the host that owns it.  With
# SO_REUSEADDR, as TF's gRPC server binds: an earlier test's server on the same port may have
# left connections in TIME_WAIT there, which stop only a bind without it.
WHERE = textwrap.dedent("""
    import json, os, socket, sys
    cfg = json.loads(os.environ["TF_CONFIG"])
    me = cfg["cluster"][cfg["task"]["type"]][cfg["task"]["index"]]
    addr, port = me.rsplit(":", 1)
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((addr, int(port))); s.listen()
    print("WHERE " + json.dumps({"bound": me, "cwd": os.getcwd(), "python": sys.executable,
          "legacy": os.environ.get("TF_USE_LEGACY_KERAS"), "extra": os.environ.get("EXTRA"),
          "local_only": os.environ.get("MWH_LOCAL_ONLY")}), flush=True)
""")


@pytest.fixture
def env(hosts, monkeypatch):
    for k, v in hosts.env().items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    # Nothing started ahead on the hosts (each test here counts their processes, and each
    # import there costs 3 CPU-s): tests/hosts/test_warmhosts.py tests the warm servers.
    monkeypatch.setenv("MWHELPERS_WARM_HOSTS", "0")
    return hosts


@pytest.fixture
def remote_rt(rt, env):
    yield rt
    rt.close()
    assert gone_within(env, 10), f"left behind on the test hosts: {task_pids(env)}"


@pytest.fixture
def allocation(env, monkeypatch):
    out = subprocess.run(["salloc", "-N2", "--no-shell"], capture_output=True, text=True,
                         timeout=60)
    m = re.search(r"Granted job allocation (\d+)", out.stderr + out.stdout)
    assert m, out.stderr
    job = m.group(1)
    monkeypatch.setenv("SLURM_JOB_ID", job)
    yield job
    subprocess.run(["scancel", job], capture_output=True, timeout=30)


def where(run):
    """The WHERE report of ``run``."""
    return json_line(run, "WHERE")


# -- SSH -------------------------------------------------------------------------------------

def test_two_names_for_one_host_never_share_a_port(remote_rt, env, tmp_path):
    """Two SSH names that reach the same machine (an alias): each probe finds free ports on
    it, and the cluster still gives every task a port of its own."""
    h1 = env.names[0]
    config = tmp_path / "ssh_config"
    text = env.ssh_config.read_text()
    config.write_text(text + text.split(f"Host {h1}\n", 1)[1].split("\nHost ")[0].join(
        ["Host same-as-h1\n", "\n"]))
    cluster = remote_rt.define_cluster(4, backend="ssh", hosts=[h1, "same-as-h1"], ssh=f"ssh -F {config}")
    addrs = [cluster.address(t) for t in cluster.tasks]
    assert {a.split(":")[0] for a in addrs} == {env.addresses[h1]} and len(set(addrs)) == 4
    for t in cluster.tasks:
        remote_rt.launch(t, code=WHERE + "import time; time.sleep(30)\n", background=True)
    assert [where(remote_rt.get_run(t))["bound"] for t in cluster.tasks] == addrs


def test_ssh_errors_say_what_to_do(remote_rt, env, tmp_path):
    h1 = env.names[0]
    cases = [
        (dict(hosts=["no-such-host.invalid"]), "its name does not resolve"),
        (dict(hosts=[f"root@{env.gateway}"]), "nothing accepts SSH connections there"),
        (dict(hosts=[h1], python="/nonexistent/bin/python3"), "no Python at /nonexistent/bin/python3"),
        (dict(hosts=[h1], cwd="/nonexistent/folder"), "the working directory /nonexistent/folder"),
    ]
    nokey = tmp_path / "ssh_config_nokey"
    nokey.write_text(re.sub(r"\n\s*IdentityFile .*", "", env.ssh_config.read_text()))
    cases.append((dict(hosts=[h1], ssh=f"ssh -F {nokey} -o IdentityFile=/dev/null"),
                  "the login was refused"))
    for kwargs, words in cases:
        t = time.monotonic()
        with pytest.raises(InfrastructureError, match=re.escape(words)) as e:
            remote_rt.define_cluster(2, backend="ssh", **kwargs)
        assert not isinstance(e.value, UsageError)  # the host failed, not the input
        assert time.monotonic() - t < 15
    assert remote_rt.cluster is None


@contextlib.contextmanager
def dropping_sshd():
    """A port on loopback that accepts connections and closes them before any greeting,
    as a busy sshd does (MaxStartups); yields the port."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    srv.settimeout(0.2)
    stop = threading.Event()

    def drop():
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except OSError:
                continue
            conn.close()

    thread = threading.Thread(target=drop, daemon=True)
    thread.start()
    try:
        yield srv.getsockname()[1]
    finally:
        stop.set()
        thread.join()
        srv.close()


def test_a_probe_whose_connection_sshd_dropped_is_tried_again(remote_rt, env, tmp_path, monkeypatch):
    # The first DROPS connections reach a server that closes them before its greeting (real
    # ssh, really dropped); the next ones reach the host's sshd.
    wrapper = tmp_path / "ssh"
    wrapper.write_text(
        "#!/bin/sh\n"
        'n=$(cat "$STATE" 2>/dev/null || echo 0); echo $((n + 1)) > "$STATE"\n'
        'if [ "$n" -lt "$DROPS" ]; then exec ssh -o BatchMode=yes -p "$DROP_PORT" 127.0.0.1 true; fi\n'
        f'exec ssh -F {env.ssh_config} "$@"\n')
    wrapper.chmod(0o755)
    with dropping_sshd() as port:
        for drops, tries, ok in ((2, 3, True), (5, 3, False)):
            state = tmp_path / f"calls-{drops}"
            for key, value in (("STATE", state), ("DROPS", drops), ("DROP_PORT", port)):
                monkeypatch.setenv(key, str(value))
            if ok:
                cluster = remote_rt.define_cluster(2, backend="ssh", hosts=[env.names[0]], ssh=str(wrapper))
                assert cluster.host_of("worker:1") == env.names[0]
            else:
                with pytest.raises(InfrastructureError,
                                   match="its sshd closed the connection before greeting, 3 times"):
                    remote_rt.define_cluster(2, backend="ssh", hosts=[env.names[0]], ssh=str(wrapper))
            assert int(state.read_text()) == tries


def test_a_port_this_machine_cannot_reach_is_named(remote_rt, env):
    """A server that listens where the kernel cannot reach it (here: loopback of its host,
    as behind a firewall) fails readiness with the address and what to check."""
    from mwhelpers.errors import WorkerTimeout

    remote_rt.define_cluster(1, backend="ssh", hosts=[env.names[0]])
    hidden = WHERE.replace("s.bind((addr, int(port)))", "s.bind(('127.0.0.1', int(port)))")
    with pytest.raises(WorkerTimeout, match=r"never accepted connections from this machine at "
                       rf"{re.escape(remote_rt.cluster.address('worker:0'))} .*a firewall blocks"):
        remote_rt.launch("worker:0", code=hidden + "import time; time.sleep(60)\n",
                         background=True, timeout=3)
    assert gone_within(env, 5)


def test_a_dropped_connection_ends_the_remote_program(remote_rt, env):
    remote_rt.define_cluster(1, backend="ssh", hosts=[env.names[0]])
    run = remote_rt.launch("worker:0", code=STUBBORN, background=True, ready="start")
    deadline = time.monotonic() + 10
    while run.process.remote_pid is None:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    remote = run.process.remote_pid
    os.kill(run.pid, signal.SIGKILL)  # the ssh client dies: the connection drops
    assert run.wait(10) is not None and run.failed
    t = time.monotonic()
    assert gone_within(env, 5), task_pids(env)
    assert not pid_alive(remote)
    print(f"remote program gone {time.monotonic() - t:.2f} s after the drop was noticed")


def test_a_remote_task_that_raises_leaves_its_exit_record_beside_the_log_here(remote_rt, env):
    """Written on the host by the task's start-up, sent back by its agent, put beside the
    kernel-side log, and read by the failure."""
    from mwhelpers.failures import PROGRAM_ERROR, WorkerFailed

    remote_rt.define_cluster(1, backend="ssh", hosts=[env.names[1]])
    with pytest.raises(WorkerFailed) as err:
        remote_rt.launch("worker:0", code="import os\nwhere = os.readlink('/proc/self/ns/net')\n"
                         "print(where)\nraise ValueError('raised in ' + where)\n")
    run = remote_rt.get_run("worker:0")
    where = run.lines()[0]  # the host's network namespace, not this one
    record = run.exit_record
    assert where != os.readlink("/proc/self/ns/net")
    assert record.summary == f"ValueError: raised in {where}"
    assert record.pid == run.process.remote_pid and record.exit_code == 1
    assert err.value.root_cause.kind == PROGRAM_ERROR
    assert f"worker:0 raised ValueError: raised in {where}" in str(err.value)


@contextlib.contextmanager
def link_down(hosts, name):
    """``name``'s network link taken down from outside, as a pulled cable: nothing is
    closed, no FIN or RST is sent, packets just stop.  Up again afterwards."""
    veth = f"{hosts.prefix}v{hosts.names.index(name) + 1}"
    subprocess.run(["ip", "link", "set", veth, "down"], check=True)
    try:
        yield
    finally:
        subprocess.run(["ip", "link", "set", veth, "up"], check=True)
        deadline = time.monotonic() + 20
        while hosts.ssh(name, "true", timeout=15).returncode != 0:
            assert time.monotonic() < deadline, f"{name} did not answer again after its link came up"
            time.sleep(0.2)


def host_task_pids(hosts, name):
    return [p for p in task_pids(hosts) if p in hosts.netns_pids(name)]


def test_a_silent_partition_ends_the_remote_task_and_the_kernel_marks_it_lost(remote_rt, env):
    from mwhelpers.failures import Failure

    h1, h2 = env.names
    remote_rt.define_cluster(2, backend="ssh", hosts=[h1, h2])
    runs = [remote_rt.launch(t, code=STUBBORN, background=True, ready="start")
            for t in ("worker:0", "worker:1")]
    deadline = time.monotonic() + 15
    while len(host_task_pids(env, h1)) < 2 or any(r.process.remote_pid is None for r in runs):
        assert time.monotonic() < deadline, task_pids(env)
        time.sleep(0.05)
    with link_down(env, h1):
        t0 = time.monotonic()
        while host_task_pids(env, h1) and time.monotonic() - t0 < 20:
            time.sleep(0.2)
        gone_after = time.monotonic() - t0
        assert not host_task_pids(env, h1), "the task outlived a silent partition by 20 s"
        assert runs[0].wait(max(0.1, 20 - gone_after)) is not None
        lost_after = runs[0].ended - t0
    lost = runs[0]
    assert lost.state == "killed" and f"lost: {h1} stopped answering for 10 s" in lost.outcome()
    assert Failure.of(lost).is_fault  # supervise restarts it
    assert any("stopped answering" in ln for ln in lost.lines())
    assert runs[1].running  # the other host's task is untouched
    print(f"kernel marked it lost after {lost_after:.1f} s; gone on {h1} after {gone_after:.1f} s")


LONG_STEPS = textwrap.dedent("""
    import os, time
    attempt = os.environ["MWHELPERS_ATTEMPT"]
    for step in range(30 if attempt == "1" else 3):
        print(f"step {step} of attempt {attempt}", flush=True)
        time.sleep(0.2)
""")


def test_supervise_restarts_a_task_lost_in_a_partition(remote_rt, env, monkeypatch):
    """A host goes silent during a supervised job: its task is marked lost (a fault) after
    the heartbeat, the other host's task is ended, and once the link is back every task is
    started again and finishes."""
    monkeypatch.setenv("MWHELPERS_HEARTBEAT", "2")
    h1, h2 = env.names
    remote_rt.define_cluster(2, backend="ssh", hosts=[h1, h2])
    cut = []

    def partition():
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            runs = list(dict(remote_rt.runs).values())
            if len(runs) == 2 and all(any(ln.startswith("step 2 ") for ln in r.lines()) for r in runs):
                break
            time.sleep(0.05)
        lost = remote_rt.runs[remote_rt.cluster.check_task("worker:0")]
        with link_down(env, h1):
            cut.append(time.monotonic())
            lost.wait(15)  # the kernel gives it up after the heartbeat; then the link comes back
            cut.append(time.monotonic())

    cutter = threading.Thread(target=partition, daemon=True)
    cutter.start()
    attempts = remote_rt.supervise(code=LONG_STEPS, max_restarts=1, timeout=60, stream=False)
    cutter.join(30)
    assert len(cut) == 2 and cut[1] - cut[0] < 6, cut  # noticed within the 2 s heartbeat
    first = attempts[0]
    assert first.restarted and first.root_cause.task == "worker:0"
    assert f"lost: {h1} stopped answering for 2 s" in first.failed[0][1]
    assert [r.returncode for r in attempts[1].runs] == [0, 0]


SAVE_FREQ = 4
CHAOS_ARGS = ["--epochs", "3", "--steps", "15", "--save-freq", str(SAVE_FREQ), "--log-steps",
              "--step-seconds", "0.1"]


def supervise_under_chaos(rt, tmp_path, kills, seed):
    """supervise a 2-worker Keras 3 job with BackupAndRestore (every SAVE_FREQ steps) while
    :class:`chaos.Chaos` SIGKILLs a random worker ``kills`` times; checks what must hold
    and returns the attempts and the kills.  Keras 3 alone would run a restored epoch again
    from its first batch; the workers' mend (mwhelpers/taskside/kerasresume.py) resumes at the
    backup's batch, so the job ends at exactly epochs x steps."""
    monkey = Chaos(rt, kills, low=SAVE_FREQ, high=2 * SAVE_FREQ, seed=seed)
    monkey.start()
    try:
        attempts = rt.supervise(script=str(TRAIN), max_restarts=kills, timeout=120, stream=False,
                                args=[*CHAOS_ARGS, "--backup", str(tmp_path / "bk")])
    finally:
        monkey.stop.set()
        monkey.join(5)
    assert len(monkey.kills) == kills and len(attempts) == kills + 1, (monkey.kills, attempts)
    for record, (attempt, task, _, _) in zip(attempts, monkey.kills, strict=False):
        assert record.attempt == attempt and str(record.root_cause.task) == task
        assert record.restarted, record
    (final,) = {r["iterations"] for r in results(rt).values()}  # the same on both workers
    assert final == 3 * 15, final
    done = {s for a in attempts for r in a.runs for s, _ in steps_of(r)}
    assert done == set(range(1, final + 1))  # no step skipped
    again = redone(attempts)
    assert all(0 <= n <= SAVE_FREQ for n in again), again  # resumed from the newest backup
    for r in results(rt).values():
        assert r["epochs_run"][-1] == 2
    spread = max(max(r.launched_wall for r in a.runs) - min(r.launched_wall for r in a.runs)
                 for a in attempts)
    print(f"{kills} kills {[(k[1], k[3]) for k in monkey.kills]}; steps done twice per restart: "
          f"{again}; the tasks of an attempt were launched within {spread:.3f} s")
    return attempts, monkey.kills


JAX_TRAIN = ROOT / "tests" / "programs" / "jax_train.py"


def check_trained_on_jax(res):
    """Both processes of jax_train.py trained one model with JAX (keras.distribution, gloo):
    ids 0 and 1 in TF_CONFIG's order, one device each, equal losses and weights."""
    assert set(res) == {"worker:0", "worker:1"}, res
    assert [res[t]["process"] for t in ("worker:0", "worker:1")] == [0, 1]
    for r in res.values():
        assert r["processes"] == 2 and r["devices"] == 2 and r["local_devices"] == 1
        assert r["loss"][-1] < r["loss"][0] * 0.5  # it learns
    assert res["worker:0"]["weights"] == res["worker:1"]["weights"]
    assert res["worker:0"]["loss"] == res["worker:1"]["loss"]


def test_keras3_on_jax_trains_across_two_ssh_hosts(ip, remote_rt, env):
    """jax_train.py on two processes on two hosts, through the same magics as locally (only
    %cluster changes): jax.distributed's coordinator on worker:0's port and gloo's own
    connections between the hosts (each task's gloo listens on the address TF_CONFIG names
    for it)."""
    t = time.monotonic()
    cluster = ip.run_line_magic("cluster", "2 --hosts " + ",".join(env.names))
    ip.run_line_magic("worker", f"all --bg --timeout 90 {JAX_TRAIN} --epochs 2 --steps 4")
    ip.run_line_magic("waitworkers", "--timeout 90")
    check_trained_on_jax(results(remote_rt))
    hosts = [cluster.host_of(t) for t in ("worker:0", "worker:1")]
    assert hosts == env.names
    for task, host in zip(("worker:0", "worker:1"), hosts, strict=True):
        # gloo listened on the host's own address (its name resolves to loopback there)
        assert jaxgloo.NOTICE.format(host=env.addresses[host]) in remote_rt.get_run(task).lines()
    print(f"trained on {hosts} in {time.monotonic() - t:.1f} s")


# The two longest tests here (about 40 and 85 s on 2 cores) are a group of their own: another
# test process can take them, with a set of test hosts of its own, instead of one process
# running every multi-host test in a row.
OWN_HOSTS = pytest.mark.xdist_group("testhosts-b")


@OWN_HOSTS
def test_random_kills_of_remote_workers_are_survived_with_backups(remote_rt, env, tmp_path):
    remote_rt.define_cluster(2, backend="ssh", hosts=env.names)
    supervise_under_chaos(remote_rt, tmp_path, kills=2, seed=1)


# -- Slurm -----------------------------------------------------------------------------------

def test_slurm_outside_an_allocation_says_how_to_get_one(remote_rt, env):
    with pytest.raises(InfrastructureError, match=r"not inside a Slurm allocation.*salloc -N 2"):
        remote_rt.define_cluster(2, backend="slurm")


def test_a_killed_slurm_worker_is_restarted_from_its_backup(remote_rt, env, allocation, tmp_path):
    remote_rt.define_cluster(2, backend="slurm")
    supervise_under_chaos(remote_rt, tmp_path, kills=1, seed=2)


def test_keras3_on_jax_trains_across_two_slurm_nodes(ip, remote_rt, env, allocation):
    """jax_train.py as two job steps of the allocation, one per node, through the same magics
    as locally and over SSH (only %cluster changes)."""
    t = time.monotonic()
    cluster = ip.run_line_magic("cluster", "2 --slurm")
    assert [cluster.host_of(t) for t in ("worker:0", "worker:1")] == env.names
    ip.run_line_magic("worker", f"all --bg --timeout 90 {JAX_TRAIN} --epochs 2 --steps 4")
    ip.run_line_magic("waitworkers", "--timeout 90")
    check_trained_on_jax(results(remote_rt))
    for task, host in zip(("worker:0", "worker:1"), env.names, strict=True):
        assert jaxgloo.NOTICE.format(host=env.addresses[host]) in remote_rt.get_run(task).lines()
    print(f"trained on the allocation's nodes in {time.monotonic() - t:.1f} s")


JAX_MODEL_PARALLEL = ROOT / "tests" / "programs" / "jax_model_parallel.py"
LAYOUT = "[mwhelpers] LayoutMap: "


@pytest.mark.parametrize("where", ["ssh", "slurm"])
def test_a_layout_map_rule_that_matches_nothing_is_named_on_the_hosts_too(
        ip, remote_rt, env, request, where):
    """A model split over two hosts' processes (two CPU devices each), with the rule a learner
    writes for layers d1 and d2: each task says, before its first step, that the rule matches
    no variable and what stays whole on every device, as locally (tests/tf/test_keraslayout.py)."""
    if where == "slurm":
        request.getfixturevalue("allocation")
        ip.run_line_magic("cluster", "2 --slurm")
    else:
        ip.run_line_magic("cluster", "2 --hosts " + ",".join(env.names))
    ip.run_line_magic("worker", f"all --bg --timeout 90 {JAX_MODEL_PARALLEL} d.*kernel")
    ip.run_line_magic("waitworkers", "--timeout 90")
    for task, got in results(remote_rt).items():
        lines = remote_rt.get_run(task).lines()
        said = [ln for ln in lines if ln.startswith(LAYOUT)]
        assert len(said) == 2 and "rule 'd.*kernel' matches no variable" in said[0], lines
        assert "replicated on every device" in said[1], lines
        assert got["devices"] == 4 and got["specs"] == {"d1": [None, None], "d2": [None, None]}


JAX_ORBAX = ROOT / "tests" / "programs" / "jax_orbax_resume.py"


@pytest.mark.parametrize("where", ["ssh", "slurm"])
def test_a_model_split_over_hosts_resumes_from_its_orbax_checkpoint_after_a_kill(
        remote_rt, env, request, tmp_path, where):
    """The model split over two hosts' processes (two CPU devices each), an OrbaxCheckpoint at
    each epoch's end into one folder both hosts see; worker:1's process SIGKILLs itself in
    epoch 3: supervise restarts both on their hosts, both resume from the checkpoint of epoch
    2, and the job ends at exactly 12 steps with the kernels split again (as locally,
    tests/tf/test_jax_orbax.py)."""
    if where == "slurm":
        request.getfixturevalue("allocation")
        remote_rt.define_cluster(2, backend="slurm")
    else:
        remote_rt.define_cluster(2, backend="ssh", hosts=env.names)
    attempts = remote_rt.supervise(
        script=str(JAX_ORBAX), max_restarts=1, timeout=150, stream=False,
        args=[str(tmp_path / "ckpt"), "--kill-at", "10", "--marker", str(tmp_path / "killed")])
    assert len(attempts) == 2 and str(attempts[0].root_cause.task) == "worker:1"
    assert [remote_rt.cluster.host_of(t) for t in ("worker:0", "worker:1")] == env.names
    for run in attempts[1].runs:
        lines = run.lines()
        assert "RESUME after epoch 1: step 8" in lines, lines
        assert [ln for ln in lines if ln.startswith("STEP ")] == [f"STEP {s}" for s in range(9, 13)]
    res = results(remote_rt)
    for r in res.values():
        assert r["iterations"] == 12 and r["shards"] == {"d1": [16, 16], "d2": [32, 2]}
    assert res["worker:0"]["weights"] == res["worker:1"]["weights"]


def _squeue(job):
    return subprocess.run(["squeue", "-h", "-j", job, "-o", "%T"], capture_output=True,
                          text=True, timeout=30).stdout.strip()


def _wait_job(job, until, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = _squeue(job)
        if until(state):
            return state
        time.sleep(0.2)
    raise AssertionError(f"job {job} is still {state!r}")


def _run_job(script, tmp_path):
    """Submits ``script``, waits for it to leave the queue; its output."""
    done = subprocess.run(["sbatch", "--parsable", str(script)], capture_output=True, text=True,
                          cwd=tmp_path, timeout=30)
    assert done.returncode == 0, done.stderr
    job = done.stdout.strip().split(";")[0]
    try:
        _wait_job(job, lambda s: s == "", 120)
    finally:
        subprocess.run(["scancel", job], capture_output=True, timeout=30)
    return (tmp_path / f"out-{job}.txt").read_text()


def test_sbatch_script_puts_two_tasks_on_one_node_on_two_ports(env, tmp_path):
    """Both tasks of a batch job on one node: one address, so the ports must differ by task,
    not by node; each task binds the address its TF_CONFIG names, at the same time as the
    other.  (Training through sbatch, on two nodes, is notebook 10's, run on the test hosts
    by test_more_machines_notebook_runs_on_ssh_hosts_slurm_and_ray.)"""
    from mwhelpers.backends.slurm import write_sbatch

    prog = tmp_path / "where.py"
    prog.write_text(WHERE + "import time; time.sleep(1)\n")  # both hold their port a while
    script = write_sbatch(tmp_path / "where.sbatch", prog, tasks=2, nodes=1, cwd=tmp_path,
                          output=str(tmp_path / "out-%j.txt"))
    out = _run_job(script, tmp_path)
    configs = [json.loads(m) for m in re.findall(r"TF_CONFIG=(\{.*\})$", out, re.M)]
    assert len(configs) == 2 and configs[0]["cluster"] == configs[1]["cluster"], out
    workers = configs[0]["cluster"]["worker"]
    assert len({w.split(":")[0] for w in workers}) == 1 and len(set(workers)) == 2
    bound = sorted(json.loads(line[len("WHERE "):])["bound"] for line in out.splitlines()
                   if line.startswith("WHERE "))
    assert bound == sorted(workers), out


# Tries its TF_CONFIG port as TF's server does (SO_REUSEADDR) and says whether it got it.
TRY_PORT = textwrap.dedent("""
    import json, os, socket
    cfg = json.loads(os.environ["TF_CONFIG"])
    me = cfg["cluster"]["worker"][cfg["task"]["index"]]
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind(("", int(me.rsplit(":", 1)[1]))); s.listen(); print("BOUND", me, flush=True)
    except OSError as e:
        print("NOT BOUND", me, e.strerror, flush=True)
""")

# In a test host's namespace: a live listener on PORT, and a connection of a server (with
# SO_REUSEADDR, as gRPC's) on PORT + 1 left in TIME_WAIT; then it waits for its standard input.
OCCUPY = textwrap.dedent("""
    import socket, sys, time
    addr, port = sys.argv[1], int(sys.argv[2])
    def server(p):
        s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("", p)); s.listen()
        return s
    held = server(port)
    gone = server(port + 1)
    client = socket.create_connection((addr, port + 1))
    conn, _ = gone.accept()
    conn.close(); time.sleep(0.1); client.close(); gone.close()  # the server's side closes first
    print("held", flush=True)
    sys.stdin.read()
""")


def test_sbatch_task_whose_port_is_taken_says_so_before_the_program_starts(env, tmp_path):
    """Task 0's port has a listener on the node: the task says so, and how to pick other ports,
    before its program starts (which then cannot bind it, as TF's server could not). Task 1's
    port holds only an earlier server's TIME_WAIT, which stops no bind like TF's: it says
    nothing, and its program binds."""
    from mwhelpers.backends.slurm import write_sbatch

    port = 15620  # below the range of the other tests' ports, and clear of the test Slurm's
    holders = []
    try:
        for n in env.names:  # the job lands on either node
            holders.append(subprocess.Popen(
                ["nsenter", f"--net=/run/netns/{n}", sys.executable, "-c", OCCUPY,
                 env.addresses[n], str(port)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
            line = holders[-1].stdout.readline()
            assert line == "held\n", line + holders[-1].stdout.read()
            waits = subprocess.run(["nsenter", f"--net=/run/netns/{n}", "ss", "-Htan",
                                    "state", "time-wait", "sport", "=", f":{port + 1}"],
                                   capture_output=True, text=True, timeout=30).stdout
            assert waits.strip(), f"no TIME_WAIT on {n}:{port + 1}"
        prog = tmp_path / "try_port.py"
        prog.write_text(TRY_PORT)
        script = write_sbatch(tmp_path / "try.sbatch", prog, tasks=2, nodes=1, cwd=tmp_path,
                              port_base=port, output=str(tmp_path / "out-%j.txt"))
        out = _run_job(script, tmp_path)
    finally:
        for h in holders:
            h.stdin.close()
            h.wait(10)
    said = re.search(rf"^\[\S+ task 0\] Port {port} is in use on this node \(Address already in "
                     r"use\)\. A TensorFlow server here stops with \"Could not start gRPC "
                     r"server\"\. Under keras\.distribution on JAX, only task 0's port must be "
                     rf"free\. This job's tasks use ports {port} to {port + 1}\. To use others, "
                     r"change port_base=N in write_sbatch\(\.\.\.\) \(MWHELPERS_PORT_BASE in the "
                     r"script\) and submit again\.$", out, re.M)
    assert said, out
    assert re.search(rf"^NOT BOUND \S+:{port} Address already in use$", out[said.end():], re.M), out
    assert "task 1] Port" not in out, out
    assert re.search(rf"^BOUND \S+:{port + 1}$", out, re.M), out


def test_sbatch_task_refuses_a_port_base_that_leaves_the_port_range(env, tmp_path):
    """MWHELPERS_PORT_BASE set by hand in the script's environment, too high for the job's
    tasks: each task says what it must be, and the program does not start."""
    from mwhelpers.backends.slurm import write_sbatch

    prog = tmp_path / "try_port.py"
    prog.write_text(TRY_PORT)
    script = write_sbatch(tmp_path / "high.sbatch", prog, tasks=2, nodes=1, cwd=tmp_path,
                          env={"MWHELPERS_PORT_BASE": "65535"},
                          output=str(tmp_path / "out-%j.txt"))
    out = _run_job(script, tmp_path)
    assert re.search(r"^\[\S+ task \d\] MWHELPERS_PORT_BASE='65535' cannot give this job's 2 "
                     r"tasks a port each\. It must be a whole number from 1024 to 65534\.$",
                     out, re.M), out
    assert "BOUND" not in out, out


def test_sbatch_script_trains_keras3_on_jax_across_two_nodes(env, tmp_path):
    """write_sbatch with jax_train.py, one task per node: each task's rule gives it the
    keras.distribution variables and gloo, its start-up gloo's address; the job's output
    holds both processes' results, equal."""
    from mwhelpers.backends.slurm import write_sbatch

    t = time.monotonic()
    script = write_sbatch(tmp_path / "jax.sbatch", JAX_TRAIN, tasks=2, nodes=2, cwd=tmp_path,
                          args=["--epochs", "2", "--steps", "4"],
                          output=str(tmp_path / "out-%j.txt"))
    out = _run_job(script, tmp_path)
    found = [json.loads(ln[len("RESULT "):]) for ln in out.splitlines() if ln.startswith("RESULT ")]
    assert len(found) == 2, out[-5000:]
    res = {f"worker:{r['process']}": r for r in found}
    check_trained_on_jax(res)
    for host in env.names:  # each listened on its node's address
        assert jaxgloo.NOTICE.format(host=env.addresses[host]) in out.splitlines(), out[-5000:]
    assert gone_within(env, 10)
    print(f"the batch job trained in {time.monotonic() - t:.1f} s")


def test_scancel_ends_a_batch_job_whose_workers_ignore_sigterm(env, tmp_path):
    from mwhelpers.backends.slurm import write_sbatch

    prog = tmp_path / "stubborn.py"
    prog.write_text(STUBBORN)
    script = write_sbatch(tmp_path / "stuck.sbatch", prog, tasks=2, cwd=tmp_path,
                          output=str(tmp_path / "out-%j.txt"))
    job = subprocess.run(["sbatch", "--parsable", str(script)], capture_output=True, text=True,
                         cwd=tmp_path, timeout=30).stdout.strip().split(";")[0]
    _wait_job(job, lambda s: s == "RUNNING", 60)
    deadline = time.monotonic() + 20
    out = tmp_path / f"out-{job}.txt"  # slurmd creates it as the batch step starts
    while not out.exists() or "waiting for peers" not in out.read_text():
        assert time.monotonic() < deadline
        time.sleep(0.1)
    subprocess.run(["scancel", job], check=True, timeout=30)
    _wait_job(job, lambda s: s == "", 30)  # KillWait=5 on the test cluster: SIGKILL follows
    assert gone_within(env, 10)


# -- the notebook ------------------------------------------------------------------------------

@OWN_HOSTS
@pytest.mark.ray
def test_more_machines_notebook_runs_on_ssh_hosts_slurm_and_ray(env, tmp_path, monkeypatch):
    import nbformat

    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    nb = nbformat.read(ROOT / "notebooks" / "10_more_machines.ipynb", as_version=4)
    index = next(i for i, c in enumerate(nb.cells) if "parameters" in c.metadata.get("tags", []))
    nb.cells.insert(index + 1, nbformat.v4.new_code_cell(
        f"workdir = {str(tmp_path)!r}; ssh_hosts = {','.join(env.names)!r}; use_slurm = True"))
    run_notebook(nb, timeout=300)
    # One cell's stream outputs joined as they are: a print can reach the notebook in pieces
    # (ipykernel sends what it has every 0.2 s), so no separator goes between them.
    text = "\n".join("".join(o.get("text", "") for o in c.get("outputs", [])) for c in nb.cells)
    assert "SKIPPED" not in text
    for name in env.names:  # the SSH part and the Slurm part ran on the test hosts
        assert f"ran on {name}; TF_CONFIG named it {env.addresses[name]}:" in text
    assert "listening on:      :::" in text or "listening on:      0.0.0.0:" in text
    assert "submitted batch job" in text
    assert re.search(r"^local [\d.]+   on Ray [\d.]+$", text, re.M)  # the Ray part ran here
    assert "RESULT {" not in text  # results are read from the logs (rt.results()), not shown raw
    batch = "".join(o.get("text", "") for c in nb.cells if "replay:sbatch" in c.metadata.get("tags", [])
                    for o in c.get("outputs", []))
    weights = re.findall(r"^worker:\d at [\d.]+:\d+: replicas=2, loss .*, weights (\w+)$", batch, re.M)
    assert len(weights) == 2 and weights[0] == weights[1], batch  # the batch job's two tasks: one model
    assert re.search(r"^in the process with pid (\d+)$", text, re.M)  # a third process's op, in worker 0
    assert "worker:0 killed by SIGSEGV" in text
    assert _squeue_all() == ""  # the notebook gave its allocation back
    assert gone_within(env, 5)


def _squeue_all():
    return subprocess.run(["squeue", "-h"], capture_output=True, text=True, timeout=30).stdout.strip()


# -- GPUs per task, from what each host's probe finds ---------------------------------------------

SEES_GPUS = "import os\nprint('GPUS', os.environ.get('CUDA_VISIBLE_DEVICES'), flush=True)\n"


def test_gpus_per_task_come_from_each_slurm_nodes_probe(remote_rt, env, allocation, monkeypatch):
    # srun passes this to the probe on each node, as Slurm's own GPU allocation would set it
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")
    cluster = remote_rt.define_cluster(3, backend="slurm", gpus_per_task=1)
    assert [cluster.host_of(t) for t in cluster.tasks] == [env.names[0], env.names[1], env.names[0]]
    assert [cluster.gpus_of(t) for t in cluster.tasks] == ["0", "0", "1"]  # per node, in order
    for t in cluster.tasks:
        run = remote_rt.launch(t, code=SEES_GPUS)
        assert f"GPUS {cluster.gpus_of(t)}" in run.lines(), run.lines()
    with pytest.raises(UsageError, match=rf"{env.names[0]} offers GPUs 0, 1, 2, 3 .* need 3 each"):
        remote_rt.define_cluster(3, backend="slurm", gpus_per_task=3)


def test_gpus_per_task_over_ssh_are_refused_where_the_probe_finds_none(remote_rt, env):
    # sshd passes no CUDA_VISIBLE_DEVICES and the test hosts have no nvidia-smi
    with pytest.raises(UsageError, match=rf"{env.names[0]} offers no GPU .* need 1 each"):
        remote_rt.define_cluster(2, backend="ssh", hosts=env.names, gpus_per_task=1)
    assert remote_rt.cluster is None
