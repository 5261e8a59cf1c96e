"""One suite that every backend passes: local, SSH, Slurm, and ``netns``, a backend in one
file outside the package (``netns_backend.py``, registered by importing it).

Each test runs once per backend with the same small programs (no TensorFlow): where a task
is placed and what TF_CONFIG names, the environment it gets, readiness, killing one task,
ending them all, the kernel dying, and supervise restarting after a fault.  These are the
runtime's tests of those behaviours (test_runtime.py has what is the same on every backend),
with the local backend as one of the four.  The remote backends run on the test hosts
(network namespaces with sshd and a one-box Slurm); under CI=true they must run, elsewhere
they skip with the reason.

The tests described here that need more than this folder gives are in tf/test_backends_tf.py."""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import netns_backend
import psutil
import pytest
from conftest import ROOT, TREE, gone_within, json_line, pid_alive, task_pids

from mwhelpers import available_backends, register_backend
from mwhelpers.backends import pick_backend
from mwhelpers.backends.agent import AgentLauncher
from mwhelpers.errors import InfrastructureError, UsageError
from mwhelpers.failures import WorkerFailed
from mwhelpers.proctree import carrying
from mwhelpers.workshop.testhosts import missing

REMOTE = ("ssh", "slurm", "netns", "ray")
REASON = missing(slurm=True)
MARK = "MWH_BACKEND_SUITE"  # set in every task of this suite: finds what is left, anywhere here
ME = str(os.getpid())  # its value: this test process's (others run side by side)

# Binds the exact address TF_CONFIG gives it (only the host that owns the address can), then
# reports what it was given.  SO_REUSEADDR as TF's gRPC server: a connection of an earlier
# test's server on that port may still be in TIME_WAIT, which stops only a bind without it.
WHERE = textwrap.dedent("""
    import json, os, socket, sys, time
    cfg = json.loads(os.environ["TF_CONFIG"])
    me = cfg["cluster"][cfg["task"]["type"]][cfg["task"]["index"]]
    addr, port = me.rsplit(":", 1)
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((addr, int(port))); s.listen()
    print("WHERE " + json.dumps({"bound": me, "task": os.environ["MWHELPERS_TASK"],
          "cfg": cfg, "cwd": os.getcwd(), "python": sys.executable,
          "legacy": os.environ.get("TF_USE_LEGACY_KERAS"), "extra": os.environ.get("EXTRA"),
          "jax": os.environ.get("JAX_COMPILATION_CACHE_DIR"),
          "local_only": os.environ.get("MWH_LOCAL_ONLY"),
          "attempt": os.environ.get("MWHELPERS_ATTEMPT")}), flush=True)
    time.sleep(float(os.environ.get("LINGER", "0")))
""")

# Each start leaves a file in the (shared) working directory.  In attempt 1, worker:1 dies of
# SIGKILL (a fault, not a bug) once worker:0 has started, and worker:0 waits for it for
# ever; later attempts take a few steps and finish.
FAULTY = textwrap.dedent("""
    import os, time
    attempt, task = os.environ["MWHELPERS_ATTEMPT"], os.environ["MWHELPERS_TASK"]
    open(f"started {task} attempt {attempt}", "w").close()
    if attempt == "1":
        if task == "worker:1":
            while not os.path.exists("started worker:0 attempt 1"):
                time.sleep(0.01)
            os.kill(os.getpid(), 9)
        time.sleep(300)
    for step in range(3):
        print(f"step {step} of attempt {attempt}", flush=True)
        time.sleep(0.1)
    print(f"finished attempt {attempt}", flush=True)
""")

# For supervise(standby=True): imports TensorFlow (its facts line starts the standbys), waits
# for its peer to have done so, then, in attempt 1 and once the file "go" exists, says READY
# (where a fault is injected) and waits; later attempts finish.
STANDING_BY = textwrap.dedent("""
    import os, time
    import tensorflow
    attempt, task = os.environ["MWHELPERS_ATTEMPT"], os.environ["MWHELPERS_TASK"]
    open(f"imported {task} attempt {attempt}", "w").close()
    while not all(os.path.exists(f"imported worker:{i} attempt {attempt}") for i in (0, 1)):
        time.sleep(0.02)
    while attempt == "1" and not os.path.exists("go"):
        time.sleep(0.02)
    time.sleep(0.3)
    print("READY", flush=True)
    if attempt == "1":
        time.sleep(300)
    print(f"finished attempt {attempt}", flush=True)
""")

# Ends on SIGINT (Python's KeyboardInterrupt), unlike STUBBORN.
# Dies of SIGINT at once (its default action, in the kernel): no traceback, no interpreter
# shutdown (in full runs on fresh clones, KeyboardInterrupt's way sometimes took over 1 s).
QUITS = ('import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_DFL)\n'
         'print("waiting for peers", flush=True)\ntime.sleep(300)\n')

# Like STUBBORN, but says when each signal came (this host's clock, shared by the test hosts).
STAMPS = textwrap.dedent("""
    import signal, time
    def heard(sig, frame):
        print("got", signal.Signals(sig).name, repr(time.time()), flush=True)
    signal.signal(signal.SIGINT, heard)
    signal.signal(signal.SIGTERM, heard)
    print("waiting for peers", flush=True)
    while True:
        time.sleep(0.1)
""")


@pytest.fixture(scope="module")
def allocation(hosts):
    """One Slurm allocation of both test hosts for the module's Slurm runs."""
    env = {**os.environ, **hosts.env()}
    out = subprocess.run(["salloc", "-N2", "--no-shell"], capture_output=True, text=True,
                         timeout=60, env=env)
    m = re.search(r"Granted job allocation (\d+)", out.stderr + out.stdout)
    assert m, out.stderr
    yield m.group(1)
    subprocess.run(["scancel", m.group(1)], capture_output=True, timeout=30, env=env)


# The runs on test hosts share the session's hosts: one test process runs them all.
ON_HOSTS = (pytest.mark.hosts, pytest.mark.xdist_group("testhosts"))


@pytest.fixture(params=["local", *(pytest.param(name, marks=ON_HOSTS + (pytest.mark.ray,) * (name == "ray"))
                                    for name in REMOTE)])
def backend(request, monkeypatch, tmp_path):
    """(name, define_cluster keyword arguments, test hosts or None) for each backend."""
    name = request.param
    if name == "local":
        yield name, {}, None
        return
    if REASON:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI must run the {name} backend's suite, but: {REASON}")
        pytest.skip(REASON)
    hosts = request.getfixturevalue("hosts")
    for k, v in hosts.env().items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    # Tasks started afresh here: tests/hosts/test_warmhosts.py tests the warm servers.
    monkeypatch.setenv("MWHELPERS_WARM_HOSTS", "0")
    if name == "slurm":
        kwargs = {"backend": "slurm", "job": request.getfixturevalue("allocation")}
    elif name == "ray":  # a node in each test host, the head here (tests/raycluster.py)
        kwargs = {"backend": "ray", "address": request.getfixturevalue("ray").address}
    else:
        kwargs = {"backend": name, "hosts": list(hosts.names)}
    yield name, kwargs, hosts


def leftovers(hosts):
    """What this suite's tasks left running: anything carrying the suite's mark, on test
    hosts any Python process (agents, tasks, their children), and here the Ray backend's
    helpers (a placement group's holder, a task's relay: children of this process, or of a
    kernel that was killed)."""
    return sorted({p.pid for p in carrying(MARK, ME)} | set(task_pids(hosts)) | set(ray_helpers()))


def ray_helpers(holders=False):
    """The Ray backend's helper processes (``_rayrelay.py`` in their command) that this test
    process started, or that a killed kernel left to init (not another test process's): each
    task's relay, and with ``holders`` (or once orphaned) each placement group's holder, which
    lives as long as its cluster is defined."""
    found = []
    for proc in psutil.process_iter(["cmdline", "ppid"]):
        words = proc.info["cmdline"] or ()
        if proc.info["ppid"] in (os.getpid(), 1) and any("_rayrelay.py" in w for w in words):
            if "run" in words or holders or proc.info["ppid"] == 1:
                found.append(proc.pid)
    return found


def described(pids):
    """Each pid with its command line (what a leftover is)."""
    out = []
    for pid in pids:
        try:
            out.append(f"{pid}: {' '.join(psutil.Process(pid).cmdline())[:300]}")
        except psutil.Error:
            out.append(f"{pid}: (gone)")
    return out


def nothing_left(hosts, within=10):
    return gone_within(hosts, within, find=leftovers)


@pytest.fixture
def brt(rt, backend):
    """The ``rt`` runtime; on teardown, nothing of the suite's tasks may be left."""
    yield rt
    rt.close()
    assert nothing_left(backend[2]), f"left behind: {described(leftovers(backend[2]))}"
    assert not ray_helpers(holders=True), described(ray_helpers(holders=True))


def launch(rt, task, code, **kw):
    env = {MARK: ME, **kw.pop("env", {})}
    return rt.launch(task, code=code, env=env, background=True, **kw)


def report(run):
    """The WHERE report of ``run``."""
    return json_line(run, "WHERE")


def test_every_backend_is_found_by_name():
    assert {"local", "ssh", "slurm", "netns", "ray"} <= set(available_backends())


def test_placement_and_environment(brt, backend, monkeypatch, tmp_path):
    name, kwargs, hosts = backend
    monkeypatch.setenv("TF_USE_LEGACY_KERAS", "1")  # variables that matter, forwarded
    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", "jax_cache")
    monkeypatch.setenv("MWH_LOCAL_ONLY", "this machine's")  # one that does not matter
    cluster = brt.define_cluster(2, chief=True, **kwargs)
    assert cluster.kind == name and cluster.remote == (name != "local")
    if hosts and name == "ray":  # spread over the nodes as Ray placed the bundles
        addresses = [cluster.address(t).rsplit(":", 1)[0] for t in cluster.tasks]
        assert set(addresses) == set(hosts.addresses.values())
        assert [cluster.host_of(t).split("#")[0] for t in cluster.tasks] == addresses
    elif hosts:  # placed in turn over the hosts, TF_CONFIG naming each host's own address
        order = [hosts.names[i % 2] for i in range(3)]
        assert [cluster.host_of(t) for t in cluster.tasks] == order
        assert [cluster.address(t).rsplit(":", 1)[0] for t in cluster.tasks] == \
            [hosts.addresses[h] for h in order]
    assert len({cluster.port(t) for t in cluster.tasks}) == 3
    for t in cluster.tasks:
        launch(brt, t, WHERE, env={"EXTRA": "given at launch"}, ready="start")
    brt.wait(timeout=60)
    for t in cluster.tasks:
        w = report(brt.get_run(t))
        assert w["bound"] == cluster.address(t)  # it could bind it: it runs where TF_CONFIG says
        assert w["cfg"] == json.loads(cluster.tf_config(t))  # the whole TF_CONFIG, as shown
        assert w["task"] == str(t) and w["cfg"]["task"] == {"type": t.type, "index": t.index}
        assert w["cwd"] == str(tmp_path)
        if name == "ray":  # the Python that runs Ray on the node: here, this environment's
            assert Path(w["python"]).parent.resolve() == Path(sys.executable).parent.resolve()
        else:
            assert w["python"] == sys.executable
        assert w["legacy"] == "1" and w["extra"] == "given at launch" and w["attempt"] == "1"
        assert w["jax"] == "jax_cache"
        if name == "ssh":  # sshd starts a clean environment: only the forwarded variables arrive
            assert w["local_only"] is None
    label = rf"\d+@{re.escape(cluster.host_of('chief:0'))}" if hosts else r"\d+"
    assert re.search(rf"^chief:0\s+{label}\s+done\s+0", repr(brt.status()), re.M)


def test_readiness_waits_for_the_port(brt, backend):
    name, kwargs, hosts = backend
    cluster = brt.define_cluster(1, **kwargs)
    address = cluster.address("worker:0")
    t = time.monotonic()
    run = launch(brt, "worker:0", "import time; time.sleep(1.0)\n" + WHERE,
                 env={"LINGER": "30"}, timeout=60)
    waited = time.monotonic() - t
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5):  # open as launch returned
        pass
    # not before the port opened, nor at the task's end (it lingers 30 s after binding; a first
    # launch on Ray took 10.1 s on a slow 2-core machine running nothing else)
    assert run.ready_after is not None and 1.0 <= run.ready_after <= waited < 30, \
        (run.ready_after, waited)
    assert report(run)["bound"] == address
    assert run.running and run.state == "ready"
    assert f"[worker:0] ready after {run.ready_after:.2f} s (port {port} is open)" in brt.echo_lines


def test_killing_one_task_ends_its_whole_tree_and_only_it(brt, backend):
    name, kwargs, hosts = backend
    brt.define_cluster(2, **kwargs)
    runs = [launch(brt, t, TREE, ready="start") for t in ("worker:0", "worker:1")]
    deadline = time.monotonic() + 15
    # Both whole lines: a live log can end in half a line ("child" before its pid).
    while not all(len([ln for ln in r.lines() if re.fullmatch(r"(grand)?child \d+", ln)]) == 2
                  for r in runs):
        assert time.monotonic() < deadline, [r.lines() for r in runs]
        time.sleep(0.05)
    tree = [int(ln.split()[1]) for ln in runs[1].lines() if ln.split()[:1] in (["child"], ["grandchild"])]
    tree.append(runs[1].pid)  # the task itself here; elsewhere its transport (ssh, srun, ip)
    if hosts:
        tree.append(runs[1].process.remote_pid)  # the task on its host
    brt.kill("worker:1", "KILL")
    assert runs[1].state == "killed" and runs[1].returncode == -signal.SIGKILL
    assert runs[1].outcome() == "killed by SIGKILL (SIGKILL sent on request)"
    deadline = time.monotonic() + 5
    while any(pid_alive(p) for p in tree):  # every process of this machine is visible here
        assert time.monotonic() < deadline, [p for p in tree if pid_alive(p)]
        time.sleep(0.05)
    assert runs[0].running


def test_ending_everything_escalates_and_says_what_ended(brt, backend):
    """end_all's default escalation (SIGINT, SIGTERM 1 s later, SIGKILL 1 s after that): a
    task that quits on SIGINT ends with it, two that ignore SIGINT and SIGTERM with SIGKILL,
    all three at once: each stubborn task hears SIGINT long before the other gets SIGKILL."""
    name, kwargs, hosts = backend
    cluster = brt.define_cluster(3, **kwargs)
    runs = [launch(brt, t, code, ready="start")
            for t, code in (("worker:0", QUITS), ("worker:1", STAMPS), ("worker:2", STAMPS))]
    deadline = time.monotonic() + 15
    while not all("waiting for peers" in r.lines() for r in runs):
        assert time.monotonic() < deadline, [r.lines() for r in runs]
        time.sleep(0.05)
    lines = brt.end_all()
    for run, sig in zip(runs, ("SIGINT", "SIGKILL", "SIGKILL"), strict=True):
        who = (rf"pid {run.process.remote_pid} on {re.escape(cluster.host_of(run.task))}" if hosts
               else rf"pid {run.pid} \(.+\)")  # here: the task's own command line
        assert [ln for ln in lines if re.fullmatch(rf"ended {run.task}: {who} with {sig}", ln)], \
            "\n".join([f"{run.task} did not end with {sig}:", *lines])
    assert len(lines) == 3, lines
    assert all(not r.running and r.state == "killed" for r in runs)
    heard = {}
    for run in runs[1:]:
        got = [ln.split() for ln in run.lines() if ln.startswith("got ")]
        assert [g[1] for g in got] == ["SIGINT", "SIGTERM"], run.lines()
        heard[run.task] = {g[1]: float(g[2]) for g in got}
    # At once, each hears SIGINT about 1 s before the other hears SIGTERM. One after the other,
    # the second would hear SIGINT only after the first's SIGKILL, 1 s after its SIGTERM and
    # later. Half-way between is the line (a loaded machine's delivery varies).
    a, b = heard.values()
    assert b["SIGINT"] < a["SIGTERM"] + 0.5 and a["SIGINT"] < b["SIGTERM"] + 0.5, \
        f"the tasks were ended one after the other: {heard}"
    assert nothing_left(hosts, 5), described(leftovers(hosts))
    with pytest.raises(WorkerFailed, match="worker:0 failed: killed by SIGINT"):
        brt.wait(timeout=10)


def test_a_killed_kernel_leaves_nothing_behind(backend, tmp_path):
    """SIGKILL of the process that launched the tasks (no clean-up of its own runs): every
    task's whole tree, which ignores SIGTERM, is gone within 2 s here, 5 s on other hosts."""
    name, kwargs, hosts = backend
    kernel = textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(ROOT / "tests")!r})
        import netns_backend
        from mwhelpers import Runtime
        rt = Runtime(log_dir={str(tmp_path / "logs")!r})
        rt.define_cluster(2, **{kwargs!r})
        for t in ("worker:0", "worker:1"):
            rt.launch(t, code={TREE!r}, env={{{MARK!r}: {ME!r}}}, background=True, ready="start")
        print("launched", flush=True)
        time.sleep(300)
    """)
    kernel_tmp = tmp_path / "tmp"  # the kernel's own: what it leaves there is seen
    kernel_tmp.mkdir()
    proc = subprocess.Popen([sys.executable, "-c", kernel], cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "TMPDIR": str(kernel_tmp)})
    try:
        said = []
        for line in proc.stdout:  # what the runtime echoed, then our line
            said.append(line)
            if line.strip() == "launched":
                break
        assert said and said[-1].strip() == "launched", "".join(said)
        deadline = time.monotonic() + 15
        while len(carrying(MARK, ME)) < 6:  # each task with its child and grandchild
            assert time.monotonic() < deadline, "the tasks did not start their trees"
            time.sleep(0.05)
        proc.kill()  # SIGKILL: no clean-up code of the kernel runs
        proc.wait()
        assert nothing_left(hosts, 5 if hosts else 2), leftovers(hosts)
        deadline = time.monotonic() + 15  # the Ray holder's socket folder goes with the holder
        while list(kernel_tmp.glob("mwr*")) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not list(kernel_tmp.glob("mwr*")), sorted(kernel_tmp.iterdir())
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_supervise_restarts_every_task_after_a_fault(brt, backend, tmp_path):
    """A task killed by SIGKILL (a fault: the supervisor did not do it) makes supervise end
    its peer, say why, and start every task again, numbered; the output is streamed."""
    name, kwargs, hosts = backend
    brt.define_cluster(2, **kwargs)
    attempts = brt.supervise(code=FAULTY, env={MARK: ME}, max_restarts=2, timeout=60)
    assert [a.attempt for a in attempts] == [1, 2]
    first, second = attempts
    assert first.failed[0] == ("worker:1", "killed by SIGKILL")
    assert first.restarted and first.why.startswith("restarted: killed by SIGKILL: a fault")
    assert str(first.root_cause.task) == "worker:1" and first.root_cause_file.exists()
    said = [ln for ln in brt.echo_lines if "restarting" in ln]
    assert len(said) == 1 and said[0].startswith("[mwhelpers] attempt 1: worker:1 killed by SIGKILL first")
    assert said[0].endswith("; ended the other tasks; restarting all 2 tasks (restart 1 of 2)")
    assert sorted(p.name for p in tmp_path.glob("started *")) == [  # every task, once an attempt
        "started worker:0 attempt 1", "started worker:0 attempt 2",
        "started worker:1 attempt 1", "started worker:1 attempt 2"]
    assert not second.restarted and second.failed == [] and second.why == "every task finished"
    for r in second.runs:
        assert r.attempt == 2 and r.returncode == 0 and "finished attempt 2" in r.lines()
    assert "[worker:0] finished attempt 2" in brt.echo_lines


class _ChattyLauncher(AgentLauncher):
    """Tasks on this machine through a transport that says something on its standard error
    before the agent starts, as ssh does with its warnings."""

    name = "chatty"

    def transport(self, host, argv):
        return ["sh", "-c", 'echo "Warning: said by the transport" >&2; exec "$@"', "sh", *argv]

    def address_of(self, host, probe):
        return "127.0.0.1"

    def explain(self, host, code, err):
        return InfrastructureError(f"{host}: {err.strip()}")


def test_a_transports_own_words_and_the_tasks_output_share_the_log_intact(rt):
    """The kernel appends the transport's words to the task's log while the transport writes
    the task's output to it: neither may overwrite the other (CI once read an empty line
    where ssh's warning had been half overwritten)."""
    register_backend("chatty", _ChattyLauncher)
    rt.define_cluster(1, backend="chatty", hosts=["here"])
    run = rt.launch(code="import time; time.sleep(0.5)\nprint('the task speaks', flush=True)",
                    env={MARK: ME})
    assert run.returncode == 0
    assert run.lines() == ["[here] Warning: said by the transport", "the task speaks"], run.lines()


# -- finding backends --------------------------------------------------------------------

def test_a_backend_declared_as_an_entry_point_is_found_and_runs_tasks(rt, tmp_path, monkeypatch):
    """What ``pip install`` of a package declaring ``[project.entry-points."mwhelpers.backends"]``
    leaves on sys.path: a module and its dist-info with entry_points.txt."""
    site = tmp_path / "site"
    (site / "mwh_demo-1.0.dist-info").mkdir(parents=True)
    (site / "mwh_demo-1.0.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: mwh-demo\nVersion: 1.0\n")
    (site / "mwh_demo-1.0.dist-info" / "entry_points.txt").write_text(
        "[mwhelpers.backends]\ndemo = mwh_demo:Demo\nbroken = mwh_demo:Missing\n")
    (site / "mwh_demo.py").write_text(textwrap.dedent("""
        from dataclasses import dataclass

        from mwhelpers.backends import BackendOptions, option, text
        from mwhelpers.backends.local import LocalLauncher

        @dataclass(frozen=True)
        class DemoOptions(BackendOptions):
            greeting: str = option(text, "what each task gets in DEMO", default="hello")

        class Demo(LocalLauncher):
            '''This machine, with every task told it ran under the demo backend.'''
            name = "demo"
            options = DemoOptions

            def __init__(self, options=DemoOptions()):
                super().__init__()
                self.greeting = options.greeting

            def task_env(self, environ):
                return {**environ, "DEMO": self.greeting}
    """))
    monkeypatch.syspath_prepend(str(site))
    assert {"demo", "broken"} <= set(available_backends())
    cluster = rt.define_cluster(1, backend="demo", greeting="from an entry point")
    assert cluster.kind == "demo" and not cluster.remote
    run = rt.launch(code="import os; print('DEMO', os.environ['DEMO'])")
    assert "DEMO from an entry point" in run.lines()
    with pytest.raises(UsageError, match=r"the demo backend does not take hosts; it takes greeting"):
        rt.define_cluster(1, backend="demo", hosts=["a"])
    with pytest.raises(UsageError, match=r"backend 'broken' \(mwh_demo:Missing, from an entry point\) "
                                         r"could not be loaded: AttributeError"):
        rt.define_cluster(1, backend="broken")
    assert rt.cluster is cluster  # a refused definition changes nothing


def test_backend_names_and_registrations_are_checked(rt):
    with pytest.raises(UsageError, match=r"no backend is called 'kube'; there are: .*local.*netns"):
        rt.define_cluster(2, backend="kube")
    with pytest.raises(UsageError, match="'ssh' is a built-in backend"):
        register_backend("ssh", netns_backend.NetnsLauncher)
    with pytest.raises(UsageError, match="is not a subclass of mwhelpers.backends.Launcher"):
        register_backend("mine", object)
    with pytest.raises(UsageError, match=r"the local backend does not take python, ssh; it takes "
                                         r"host \(%cluster --backend local --help"):
        rt.define_cluster(2, backend="local", python="/usr/bin/python3", ssh="ssh -F cfg")
    with pytest.raises(UsageError, match="slurm, ssh all take python: name one with backend=NAME"):
        rt.define_cluster(2, python="/usr/bin/python3")
    with pytest.raises(UsageError, match=r"no built-in backend takes all of hosts, job; name the "
                                         r"backend \(backend=NAME; there are: .*netns"):
        rt.define_cluster(2, hosts=["a"], job=12)
    # without a name, only a built-in backend is chosen: netns (registered) takes hosts too
    assert "netns" in available_backends()
    assert [pick_backend(o) for o in ({}, {"host": "127.0.0.2"}, {"hosts": ["a"]}, {"job": 7},
                                      {"hosts": "a", "ssh": "ssh -F c", "heartbeat": 0})] == \
        ["local", "local", "ssh", "slurm", "ssh"]
    # values are checked against each option's type before the backend is made
    with pytest.raises(UsageError, match=r"the slurm backend's option job cannot be 'abc' \(a job "
                                         r"id is a number"):
        rt.define_cluster(2, job="abc")
    with pytest.raises(UsageError, match=r"option heartbeat cannot be '0.5' \(1 s or more, or 0"):
        rt.define_cluster(2, backend="ssh", hosts="a", heartbeat="0.5")
    with pytest.raises(UsageError, match=r"the netns backend's option hosts cannot be ''"):
        rt.define_cluster(2, backend="netns", hosts="")
    assert rt.cluster is None


def test_a_backend_declares_its_options_once_as_a_frozen_dataclass(rt):
    """The constructor gets one instance of the declared dataclass, converted and with its
    defaults; a declaration of another shape is refused when the backend is registered."""
    from dataclasses import dataclass, field

    from mwhelpers.backends import BackendOptions, option, options_of, seconds, text
    from mwhelpers.backends.local import LocalLauncher

    @dataclass(frozen=True)
    class PoliteOptions(BackendOptions):
        greeting: str = option(text, "what each task is told", default="hello", metavar="WORDS")
        pause: float | None = option(seconds, "seconds to wait first", metavar="S")

    got = []

    class Polite(LocalLauncher):
        name = "polite"
        options = PoliteOptions

        def __init__(self, options: PoliteOptions):
            got.append(options)
            super().__init__()

    register_backend("polite", Polite)
    assert [(o.flag, o.metavar, o.default) for o in options_of("polite").values()] == \
        [("--greeting", "WORDS", "hello"), ("--pause", "S", None)]
    rt.define_cluster(1, backend="polite", pause="1.5")
    assert got == [PoliteOptions(greeting="hello", pause=1.5)]
    with pytest.raises(UsageError, match=r"the polite backend's option pause cannot be 'soon' "
                                         r"\(could not convert .*\): it is seconds to wait first"):
        rt.define_cluster(1, backend="polite", pause="soon")

    class Old(LocalLauncher):
        options = {"greeting": "a dict of help, as development versions took"}

    with pytest.raises(UsageError, match=r"backend 'old' \(.*Old\) declares its options as "
                                         r"\{'greeting'.*a frozen dataclass subclassing "
                                         r"mwhelpers.backends.BackendOptions"):
        register_backend("old", Old)

    class NotADataclass(PoliteOptions):
        colour: str = "blue"

    @dataclass(frozen=True)
    class PlainField(BackendOptions):
        colour: str = field(default="blue")

    for bad, why in ((NotADataclass, r"NotADataclass is not a dataclass: decorate it with "
                                     r"@dataclass\(frozen=True\)"),
                     (PlainField, "PlainField.colour is not an option: declare it with "
                                  "mwhelpers.backends.option")):
        Old.options = bad
        with pytest.raises(UsageError, match=rf"backend 'old' \(.*Old\): .*{why}"):
            register_backend("old", Old)
    assert "old" not in available_backends()


@pytest.mark.parametrize("given", [65535, "abc", 80, "-3"])
def test_write_sbatch_refuses_a_port_base_without_room_for_its_tasks(tmp_path, given):
    from mwhelpers.backends.slurm import write_sbatch

    with pytest.raises(UsageError, match=rf"port_base={given!r} cannot give 2 tasks a port each: "
                       "it must be a whole number from 1024 to 65534"):
        write_sbatch(tmp_path / "job.sbatch", tmp_path / "main.py", tasks=2, port_base=given)
    assert not (tmp_path / "job.sbatch").exists()
    script = write_sbatch(tmp_path / "job.sbatch", tmp_path / "main.py", tasks=2, port_base=65534)
    assert "export MWHELPERS_PORT_BASE=65534\n" in script.read_text()
