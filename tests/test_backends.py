"""One suite that every backend passes: local, SSH, Slurm, and ``netns``, a backend in one
file outside the package (``netns_backend.py``, registered by importing it).

Each test runs once per backend with the same small programs (no TensorFlow): where a task
is placed and what TF_CONFIG names, the environment it gets, readiness, killing one task,
ending them all, the kernel dying, and supervise restarting after a fault.  The remote
backends run on the test hosts (network namespaces with sshd and a one-box Slurm); under
CI=true they must run, elsewhere they skip with the reason.
"""

import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import netns_backend
import pytest
from conftest import ROOT, STUBBORN, TREE, gone_within, json_line, pid_alive, task_pids

from mwhelpers import available_backends, register_backend
from mwhelpers.errors import UsageError
from mwhelpers.proctree import carrying
from mwhelpers.workshop.testhosts import missing

REMOTE = ("ssh", "slurm", "netns")
REASON = missing(slurm=True)
pytestmark = pytest.mark.xdist_group("testhosts")  # they share the session's test hosts
MARK = "MWH_BACKEND_SUITE"  # set in every task of this suite: finds what is left, anywhere here

# Binds the exact address TF_CONFIG gives it (only the host that owns the address can), then
# reports what it was given.
WHERE = textwrap.dedent("""
    import json, os, socket, sys, time
    cfg = json.loads(os.environ["TF_CONFIG"])
    me = cfg["cluster"][cfg["task"]["type"]][cfg["task"]["index"]]
    addr, port = me.rsplit(":", 1)
    s = socket.socket(); s.bind((addr, int(port))); s.listen()
    print("WHERE " + json.dumps({"bound": me, "task": os.environ["MWHELPERS_TASK"],
          "cfg_task": cfg["task"], "cwd": os.getcwd(), "python": sys.executable,
          "legacy": os.environ.get("TF_USE_LEGACY_KERAS"), "extra": os.environ.get("EXTRA"),
          "attempt": os.environ.get("MWHELPERS_ATTEMPT")}), flush=True)
    time.sleep(float(os.environ.get("LINGER", "0")))
""")

STEPS = textwrap.dedent("""
    import os, time
    attempt = os.environ["MWHELPERS_ATTEMPT"]
    for step in range(4):
        print(f"step {step} of attempt {attempt}", flush=True)
        time.sleep(0.3)
    print(f"finished attempt {attempt}", flush=True)
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


@pytest.fixture(params=["local", *REMOTE])
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
    if name == "slurm":
        kwargs = {"backend": "slurm", "job": request.getfixturevalue("allocation")}
    else:
        kwargs = {"backend": name, "hosts": list(hosts.names)}
    yield name, kwargs, hosts


def leftovers(hosts):
    """What this suite's tasks left running: anything carrying the suite's mark, and on test
    hosts any Python process (agents, tasks, their children)."""
    return sorted({p.pid for p in carrying(MARK, "1")} | set(task_pids(hosts)))


def nothing_left(hosts, within=10):
    return gone_within(hosts, within, find=leftovers)


@pytest.fixture
def brt(rt, backend):
    """The ``rt`` runtime; on teardown, nothing of the suite's tasks may be left."""
    yield rt
    rt.close()
    assert nothing_left(backend[2]), f"left behind: {leftovers(backend[2])}"


def launch(rt, task, code, **kw):
    env = {MARK: "1", **kw.pop("env", {})}
    return rt.launch(task, code=code, env=env, background=True, **kw)


def report(run):
    """The WHERE report of ``run``."""
    return json_line(run, "WHERE")


def test_every_backend_is_found_by_name():
    assert {"local", "ssh", "slurm", "netns"} <= set(available_backends())


def test_placement_and_environment(brt, backend, monkeypatch, tmp_path):
    name, kwargs, hosts = backend
    monkeypatch.setenv("TF_USE_LEGACY_KERAS", "1")  # a variable that matters, forwarded
    cluster = brt.define_cluster(2, chief=True, **kwargs)
    assert cluster.kind == name and cluster.remote == (name != "local")
    if hosts:  # placed in turn over the hosts, TF_CONFIG naming each host's own address
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
        assert w["task"] == str(t) and w["cfg_task"] == {"type": t.type, "index": t.index}
        assert w["cwd"] == str(tmp_path) and w["python"] == sys.executable
        assert w["legacy"] == "1" and w["extra"] == "given at launch" and w["attempt"] == "1"
    label = rf"\d+@{re.escape(cluster.host_of('chief:0'))}" if hosts else r"\d+"
    assert re.search(rf"^chief:0\s+{label}\s+done\s+0", repr(brt.status()), re.M)


def test_readiness_waits_for_the_port(brt, backend):
    name, kwargs, hosts = backend
    cluster = brt.define_cluster(1, **kwargs)
    run = launch(brt, "worker:0", "import time; time.sleep(1.0)\n" + WHERE,
                 env={"LINGER": "30"}, timeout=60)
    assert run.ready_after is not None and run.ready_after >= 1.0, run.ready_after
    assert report(run)["bound"] == cluster.address("worker:0")
    assert run.running and run.state == "ready"


def test_killing_one_task_ends_its_whole_tree_and_only_it(brt, backend):
    name, kwargs, hosts = backend
    brt.define_cluster(2, **kwargs)
    runs = [launch(brt, t, TREE, ready="start") for t in ("worker:0", "worker:1")]
    deadline = time.monotonic() + 15
    while not all(any(ln.startswith("grandchild") for ln in r.lines()) for r in runs):
        assert time.monotonic() < deadline, [r.lines() for r in runs]
        time.sleep(0.05)
    tree = [int(ln.split()[1]) for ln in runs[1].lines() if ln.split()[0] in ("child", "grandchild")]
    brt.kill("worker:1")
    assert runs[1].state == "killed" and runs[1].returncode == -signal.SIGKILL
    deadline = time.monotonic() + 5
    while any(pid_alive(p) for p in tree):  # every process of this machine is visible here
        assert time.monotonic() < deadline, [p for p in tree if pid_alive(p)]
        time.sleep(0.05)
    assert runs[0].running


def test_ending_everything_escalates_and_says_what_ended(brt, backend):
    name, kwargs, hosts = backend
    brt.define_cluster(2, **kwargs)
    runs = [launch(brt, t, STUBBORN, ready="start") for t in ("worker:0", "worker:1")]
    deadline = time.monotonic() + 15
    while not all("waiting for peers" in r.lines() for r in runs):
        assert time.monotonic() < deadline, [r.lines() for r in runs]
        time.sleep(0.05)
    t = time.monotonic()
    lines = brt.end_all(policy="interrupt")
    took = time.monotonic() - t
    for task in ("worker:0", "worker:1"):  # SIGTERM is ignored: SIGKILL ends them
        assert any(re.match(rf"ended {task}: pid \d+ .*with SIGKILL", ln) for ln in lines), lines
    assert all(not r.running and r.state == "killed" for r in runs)
    assert took < 6, f"the two tasks were ended one after the other ({took:.1f} s)"
    assert nothing_left(hosts, 5), leftovers(hosts)


def test_a_killed_kernel_leaves_nothing_behind(backend, tmp_path):
    name, kwargs, hosts = backend
    kernel = textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(ROOT / "tests")!r})
        import netns_backend
        from mwhelpers import Runtime
        rt = Runtime(log_dir={str(tmp_path / "logs")!r})
        rt.define_cluster(2, **{kwargs!r})
        for t in ("worker:0", "worker:1"):
            rt.launch(t, code={STUBBORN!r}, env={{{MARK!r}: "1"}}, background=True, ready="start")
        print("launched", flush=True)
        time.sleep(300)
    """)
    proc = subprocess.Popen([sys.executable, "-c", kernel], cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        said = []
        for line in proc.stdout:  # what the runtime echoed, then our line
            said.append(line)
            if line.strip() == "launched":
                break
        assert said and said[-1].strip() == "launched", "".join(said)
        deadline = time.monotonic() + 15
        while len(carrying(MARK, "1")) < 2:
            assert time.monotonic() < deadline, "the tasks did not start"
            time.sleep(0.05)
        proc.kill()  # SIGKILL: no clean-up code of the kernel runs
        proc.wait()
        assert nothing_left(hosts, 10), leftovers(hosts)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_supervise_restarts_every_task_after_a_fault(brt, backend):
    name, kwargs, hosts = backend
    brt.define_cluster(2, **kwargs)
    attempts = brt.supervise(code=STEPS, env={MARK: "1"}, inject=[("worker:1", r"^step 1 ")],
                             max_restarts=2, timeout=60, stream=False)
    assert [a["restarted"] for a in attempts] == [True, False]
    assert attempts[0]["failed"][0] == ("worker:1", "killed by SIGKILL (fault injected by the supervisor)")
    for r in attempts[1]["runs"]:
        assert r.returncode == 0 and "finished attempt 2" in r.lines()


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
        from mwhelpers.backends.local import LocalLauncher

        class Demo(LocalLauncher):
            '''This machine, with every task told it ran under the demo backend.'''
            name = "demo"
            options = {"greeting": "what each task gets in DEMO"}

            def __init__(self, greeting="hello"):
                super().__init__()
                self.greeting = greeting

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
    with pytest.raises(UsageError, match="no backend takes all of hosts, job"):
        rt.define_cluster(2, hosts=["a"], job=12)
    # values are checked against each option's type before the backend is made
    with pytest.raises(UsageError, match=r"the slurm backend's option job cannot be 'abc' \(a job "
                                         r"id is a number"):
        rt.define_cluster(2, job="abc")
    with pytest.raises(UsageError, match=r"option heartbeat cannot be '0.5' \(1 s or more, or 0"):
        rt.define_cluster(2, backend="ssh", hosts="a", heartbeat="0.5")
    with pytest.raises(UsageError, match=r"the netns backend's option hosts cannot be ''"):
        rt.define_cluster(2, backend="netns", hosts="")
    assert rt.cluster is None


def test_the_cluster_magic_builds_its_flags_from_the_backend(ip, rt, capsys):
    c = ip.run_line_magic("cluster", "1 --backend local --option host=127.0.0.2")
    assert c.kind == "local" and c.address("worker:0").startswith("127.0.0.2:")
    c = ip.run_line_magic("cluster", "1 --host 127.0.0.3")  # the local backend's option, a flag
    assert c.address("worker:0").startswith("127.0.0.3:")
    with pytest.raises(UsageError, match=r"--option takes NAME=VALUE .* got 'host'"):
        ip.run_line_magic("cluster", "1 --option host")
    with pytest.raises(UsageError, match="hosts given twice: as --hosts and --option"):
        ip.run_line_magic("cluster", "1 --backend netns --hosts a --option hosts=a")
    with pytest.raises(UsageError, match=r"unrecognized arguments: --job 5"):
        ip.run_line_magic("cluster", "1 --hosts a --job 5")  # --job is slurm's, not ssh's
    with pytest.raises(UsageError, match="either --hosts .SSH. or --slurm, not both"):
        ip.run_line_magic("cluster", "1 --hosts a --slurm")
    with pytest.raises(UsageError, match=r"option heartbeat cannot be 'soon'"):
        ip.run_line_magic("cluster", "1 --backend netns --hosts a --heartbeat soon")
    capsys.readouterr()
    assert ip.run_line_magic("cluster", "--backend netns --help") is None
    shown = capsys.readouterr().out
    assert "options of the netns backend:" in shown
    assert all(f in shown for f in ("--hosts H1,H2", "--python PATH", "--heartbeat SECONDS"))
    ip.run_line_magic("cluster", "--help")
    shown = capsys.readouterr().out
    assert "options of the local backend:" in shown and "--host ADDRESS" in shown
    ip.run_line_magic("cluster", "--slurm --help")
    assert "--job ID" in capsys.readouterr().out
