import contextlib
import json
import os
import re
import socket
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# The tests live in folders by what they need; the folder gives the marker that
# ``python3 dev.py test --fast`` and ``-m`` select on (pyproject.toml declares them):
#   inprocess/    the kernel side in this process: fakes, rules, files (no marker)
#   processes/    small real processes, no TensorFlow (no marker)
#   tf/           TensorFlow, Keras or JAX in this process or in the tasks it starts: tf
#   kernels/      notebooks in Jupyter kernels, the suite, JupyterLab in a browser: notebook
#   hosts/        the test hosts (sshd and a one-box Slurm in network namespaces): hosts
#   reproducers/  Keras's own tests and the write-ups' reproducers (docs/keras-*): tf, upstream
# A test of processes/ parametrised over the backends is the exception: its ssh and slurm
# cases carry ``hosts`` themselves (tests/processes/test_backends.py, ``backend``).
FOLDER_MARKS = {"inprocess": (), "processes": (), "tf": ("tf",), "kernels": ("notebook",),
                "hosts": ("hosts",), "reproducers": ("tf", "upstream")}
HERE = Path(__file__).resolve().parent
# A test module imports what it shares with another by its name (from test_backends import
# backend), wherever that one lives.
for _folder in FOLDER_MARKS:
    sys.path.insert(1, str(HERE / _folder))

import mwhelpers.workers as rt_mod  # noqa: E402
from mwhelpers.warmstart import WarmStarter  # noqa: E402
from mwhelpers.workers import Runtime  # noqa: E402


def _release(text):
    return tuple(int(part) for part in re.findall(r"\d+", text)[:3])


def pytest_configure(config):
    """The processes the tests start write their temporary files (TensorFlow's autograph
    modules, one per traced function, which a killed worker never removes) into a folder of
    this test process's own, removed when it ends: the tests leave nothing in /tmp.  This
    process keeps the usual folder (its own paths, the test hosts' sockets among them, stay
    as short as they were).

    Tests marked ``xdist_group`` share something (the multi-host tests: a set of test
    hosts per group) and must run in one worker process.  pytest-xdist 3.8 groups them by adding
    ``@group`` to their node ids, which pytest 9.2 silently ignores (pytest-xdist#1386):
    they would be spread over the workers and fight over the hosts.  Refuse that pair."""
    import shutil
    import tempfile

    # This process (and pytest-xdist's workers, which inherit the variables): as before.
    tempfile.tempdir = os.environ.setdefault("MWHELPERS_TESTS_TMPDIR", tempfile.gettempdir())
    folder = tempfile.mkdtemp(prefix="mwt-")
    os.environ["TMPDIR"] = folder
    config.add_cleanup(lambda: shutil.rmtree(folder, ignore_errors=True))
    if not hasattr(config, "workerinput"):  # the run's own process, once every test has ended
        from mwhelpers import ports

        # The port reservations of the processes that tests killed (their files stay).
        config.add_cleanup(ports.remove_stale)
    if config.getoption("dist", "no") != "loadgroup" or hasattr(config, "workerinput"):
        return
    from importlib.metadata import version

    if _release(pytest.__version__) >= (9, 2) and _release(version("pytest-xdist")) <= (3, 8, 0):
        raise pytest.UsageError(
            f"pytest {pytest.__version__} with pytest-xdist {version('pytest-xdist')} does not keep "
            "--dist loadgroup's groups together (pytest-xdist#1386). Install the locked versions: "
            "pip install --no-deps -r requirements/test.txt")


# A test that starts Ray nodes without the ray marker would run beside the notebooks.
RAY_UNMARKED = ("{} uses the Ray cluster but has no ray marker: mark it @pytest.mark.ray, so "
                "that dev.py test runs it with the other Ray tests")


def pytest_collection_modifyitems(config, items):
    """Each test gets its folder's markers (see FOLDER_MARKS above); a test module outside
    those folders is refused, as it would run in no lane."""
    for item in items:
        path = item.path.resolve()
        rel = path.relative_to(HERE) if path.is_relative_to(HERE) else None
        if rel is None or len(rel.parts) != 2 or rel.parts[0] not in FOLDER_MARKS:
            raise pytest.UsageError(f"{item.path}: a test module belongs in one of the folders "
                                    f"{', '.join(FOLDER_MARKS)} of tests/ (by what it needs)")
        for mark in FOLDER_MARKS[rel.parts[0]]:
            item.add_marker(mark)
        uses_ray = {"ray", "ray_cluster"} & set(getattr(item, "fixturenames", ()))
        if uses_ray and item.get_closest_marker("ray") is None:
            raise pytest.UsageError(RAY_UNMARKED.format(item.nodeid))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """A failing test that used test hosts carries their daemons' logs in its report
    (sshd's and Slurm's say why a connection was dropped; they are removed with the hosts)."""
    report = yield
    hosts = getattr(item, "funcargs", {}).get("hosts")
    if report.failed and hasattr(hosts, "log_tails"):
        report.sections.append(("test hosts' daemon logs", hosts.log_tails()))
    return report


def _cpu_seconds():
    import resource

    own, children = (resource.getrusage(w) for w in (resource.RUSAGE_SELF,
                                                     resource.RUSAGE_CHILDREN))
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """With MWHELPERS_TEST_CPU=FOLDER, each test's CPU seconds (the test process's own, and its
    ended children's, which counts the workers it started) go to FOLDER/cpu-<pid>.tsv: where
    the full run's cost goes (``--durations`` gives wall seconds, which other tests inflate)."""
    folder = os.environ.get("MWHELPERS_TEST_CPU")
    if not folder:
        return (yield)
    before = _cpu_seconds()
    try:
        return (yield)
    finally:
        own, children = (b - a for a, b in zip(before, _cpu_seconds(), strict=True))
        Path(folder).mkdir(parents=True, exist_ok=True)
        with open(Path(folder) / f"cpu-{os.getpid()}.tsv", "a") as f:
            f.write(f"{own:.2f}\t{children:.2f}\t{item.nodeid}\n")


# Small worker programs (no TensorFlow): they read their port from TF_CONFIG
# the way a TF server would, so readiness and cluster logic are exercised
# with real processes in milliseconds.
PORT_OF_TASK = textwrap.dedent("""
    import json, os, socket, sys, time
    cfg = json.loads(os.environ["TF_CONFIG"])
    task = cfg["task"]
    port = int(cfg["cluster"][task["type"]][task["index"]].rsplit(":", 1)[1])
""")

LISTENER = PORT_OF_TASK + textwrap.dedent("""
    time.sleep(float(os.environ.get("DELAY", "0")))
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("", port)); srv.listen()
    print("listening on", port, flush=True)
    time.sleep(float(os.environ.get("LIFETIME", "60")))
    print("finished", flush=True)
    sys.exit(int(os.environ.get("EXIT", "0")))
""")

# Ignores SIGINT and SIGTERM like a TF worker waiting for its peers.
def wait_for_line(run, text, timeout=30.0):
    """Wait until ``text`` is in the run's log (it must keep running meanwhile)."""
    deadline = time.monotonic() + timeout
    while text not in run.log_path.read_text():
        assert run.running and time.monotonic() < deadline, run.log_path.read_text()[-2000:]
        time.sleep(0.05)


STUBBORN = textwrap.dedent("""
    import signal, time
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    print("waiting for peers", flush=True)
    while True:
        time.sleep(0.1)
""")


# A worker that starts a child and a grandchild, all but the grandchild ignoring SIGTERM,
# and prints their pids ("child N", "grandchild N", each line in one write, as both processes
# share the output): the tree a TF worker with a helper process makes.
TREE = textwrap.dedent('''
    import signal, subprocess, sys, time
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    child = subprocess.Popen([sys.executable, "-c", """
    import signal, subprocess, sys, time
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    g = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'])
    sys.stdout.write(f'grandchild {g.pid}\\\\n')   # one write: a whole line, never split
    sys.stdout.flush()
    time.sleep(300)
    """])
    sys.stdout.write(f"child {child.pid}\\n")  # one write: the child's never lands inside it
    sys.stdout.flush()
    time.sleep(300)
''')


def run_notebook(nb, **kwargs):
    """``NotebookClient(nb, kernel_name="python3", **kwargs).execute()``; a cell that raises
    fails the test with the error's name, value and cell first, on the line that pytest's
    summary shows (nbclient's own message starts with the cell's source)."""
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    try:
        NotebookClient(nb, kernel_name="python3", **kwargs).execute()
    except CellExecutionError as e:
        cell = next((i for i, c in enumerate(nb.cells) if c.get("cell_type") == "code"
                     and any(o.get("output_type") == "error" for o in c.get("outputs", []))), "?")
        first = " ".join(f"cell {cell}: {e.ename}: {e.evalue}".split())[:400]
        raise AssertionError(f"{first}\n{e}") from None


@contextlib.contextmanager
def squatting(port):
    """Another process's listener on ``port`` (here: this test process)."""
    sock = socket.socket()
    sock.bind(("", port))
    sock.listen()
    try:
        yield sock
    finally:
        sock.close()


class Echo(list):
    def __call__(self, line):
        self.append(line)

    @property
    def text(self):
        return "\n".join(self)


def pid_alive(pid):
    try:
        p = psutil.Process(pid)
        return p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def task_pids(hosts):
    """Python processes inside the test hosts: agents, tasks and their children (the
    hosts' own daemons, sshd and slurmd, are not Python, nor are Ray's nodes where they run:
    ``ray_cluster``); none without hosts."""
    found = []
    for name in (hosts.names if hosts else []):
        for pid in hosts.netns_pids(name):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    argv = f.read().split(b"\0")
            except OSError:
                continue
            if len(argv) <= 2:  # one title of its own: a task forked by a warm server
                argv = argv[0].split(b" ")
            argv0 = argv[0].decode(errors="replace")
            if os.path.basename(argv0).startswith("python") and not RAY_OWN.search(
                    b" ".join(argv[1:3]).decode(errors="replace")):
                found.append(pid)
    return found


# A Python process of a Ray node's own (its workers, agents and monitors), not a task's
RAY_OWN = re.compile(r"/site-packages/ray/|^-m ray\.|(^|/)ray start( |$)")


def json_line(run, word, timeout=15):
    """The JSON after ``word`` on the first line of ``run``'s log that starts with it,
    waiting for it (a port may open before the line has crossed ssh or srun)."""
    deadline = time.monotonic() + timeout
    while True:
        found = [ln for ln in run.lines() if ln.startswith(word + " ")]
        if found:
            return json.loads(found[0][len(word) + 1:])
        assert time.monotonic() < deadline, run.lines()
        time.sleep(0.05)


def gone_within(hosts, seconds, find=task_pids):
    """Whether ``find(hosts)`` (default: the Python processes on the test hosts) is empty
    within ``seconds``."""
    deadline = time.monotonic() + seconds
    while find(hosts):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


class SharedStarter(WarmStarter):
    """A warm starter lent to the runtimes of many tests: pytest names the test it runs in
    ``PYTEST_CURRENT_TEST``, which each task would carry into its environment, so that every
    test's tasks would have a key of their own.  Their tasks do without it (nothing of
    TensorFlow, Keras, JAX or mwhelpers reads it)."""

    def start(self, script, argv, env, cwd, log_fd, passed, source=None):
        env = {k: v for k, v in env.items() if k != "PYTEST_CURRENT_TEST"}
        return super().start(script, argv, env, cwd, log_fd, passed, source)


@pytest.fixture(scope="session")
def shared_warm_starters():
    """Warm-start servers (mwhelpers.warmstart) lent to every test's runtime in this test
    process, by interpreter and bootstrap: a test's tasks fork from a server that imported
    TensorFlow for an earlier test whose tasks had the same environment (the same key), and
    only a new environment imports again.  Each of them would otherwise import TensorFlow
    once more for its own runtime (about 4 CPU s: 43 servers in a run of tests/tf).  A
    server only imports and forks, so what a task does is the same either way.  The servers
    end with this test process; none may outlive it."""
    starters = {}
    yield starters
    pids = [pid for starter in starters.values() for pid in starter.pids]
    for starter in starters.values():
        starter.close()
    assert not [pid for pid in pids if pid_alive(pid)], f"warm-start servers left: {pids}"


@pytest.fixture
def rt(tmp_path, monkeypatch, request, shared_warm_starters):
    """A fresh Runtime (also the one the magics use) with logs in tmp_path.

    Its local launchers fork from the test process's shared warm-start servers
    (``shared_warm_starters``), unless the test's module sets ``OWN_WARM_SERVERS = True``
    (the tests of the servers themselves: how many there are, when they end).
    On teardown every process it started must already be gone or end; a
    test that leaves one behind fails.
    """
    monkeypatch.chdir(tmp_path)
    echo = Echo()
    runtime = Runtime(log_dir=tmp_path / "logs", echo=echo)
    runtime.echo_lines = echo
    if not getattr(request.module, "OWN_WARM_SERVERS", False):
        def lend(python, bootstrap, shared=shared_warm_starters):
            if (python, bootstrap) not in shared:
                shared[python, bootstrap] = SharedStarter(python, bootstrap)
            return shared[python, bootstrap]
        monkeypatch.setattr(runtime.services, "warm_starter", lend)
    previous = rt_mod.set_runtime(runtime)
    yield runtime
    rt_mod.set_runtime(previous)
    leftovers = [p.pid for r in runtime.history for p in r.process.processes() if pid_alive(p.pid)]
    # The warm-start servers (mwhelpers.warmstart) of its local launchers end with it.
    servers = runtime.services.warm_pids
    runtime.end_all(policy="now")
    runtime.close()
    assert not leftovers, f"test left worker processes running: {leftovers}"
    assert not [pid for pid in servers if pid_alive(pid)], f"warm-start servers left: {servers}"


@pytest.fixture(scope="session")
def ray_cluster(hosts):
    """A Ray cluster of three nodes on the session's test hosts (``tests/raycluster.py``): the
    head here, on the hosts' bridge, and a node in each host; made at its first use."""
    from raycluster import RayCluster

    cluster = RayCluster(hosts)
    try:
        yield cluster.up()
    finally:
        cluster.down()


@pytest.fixture
def ray(request, ray_cluster, monkeypatch):
    """``ray_cluster``, with what a driver needs to connect (its token) in this environment."""
    if request.node.get_closest_marker("ray") is None:  # reached through getfixturevalue
        pytest.fail(RAY_UNMARKED.format(request.node.nodeid))
    for k, v in ray_cluster.client_env().items():
        monkeypatch.setenv(k, v)
    return ray_cluster


@pytest.fixture(scope="session")
def hosts(tmp_path_factory):
    """Two test hosts with sshd and a one-box Slurm (``mwhelpers/workshop/testhosts.py``), made
    once for each test process that runs tests marked ``xdist_group("testhosts")`` or
    ``xdist_group("testhosts-b")`` (each group runs in one process; two processes make two
    sets, which can be up at once)."""
    from mwhelpers.workshop.testhosts import TestHosts

    with TestHosts(2, slurm=True, workdir=tmp_path_factory.mktemp("hosts")) as h:
        yield h


@pytest.fixture
def ip(rt):
    """An IPython shell with the extension loaded, driving the ``rt`` runtime."""
    from IPython.testing import globalipapp

    globalipapp.start_ipython()  # once per test session; later calls return None
    shell = globalipapp.get_ipython()
    shell.run_line_magic("load_ext", "mwhelpers")
    rt_mod.set_runtime(rt)
    yield shell


@pytest.fixture
def write(tmp_path):
    def _write(name, text):
        path = tmp_path / name
        path.write_text(textwrap.dedent(text))
        return path

    return _write


# -- the training program the tests share (tests/programs/mwms_train.py) ---------------------
TRAIN = ROOT / "tests" / "programs" / "mwms_train.py"


def results(rt):
    """{task: the dict of its last ``RESULT {...}`` line} for every task of ``rt``."""
    out = {}
    for run in rt.runs.values():
        lines = [ln for ln in run.lines() if ln.startswith("RESULT ")]
        assert lines, f"{run.task} printed no RESULT; log tail:\n" + "\n".join(run.tail(40))
        out[str(run.task)] = json.loads(lines[-1][len("RESULT "):])
    return out


def check_trained_together(res, epochs):
    """Two workers of mwms_train.py trained one model: the loss fell, and both hold the same
    weights and report the same losses."""
    assert set(res) == {"worker:0", "worker:1"}
    for r in res.values():
        assert r["replicas"] == 2
        assert len(r["loss"]) == epochs and r["loss"][-1] < r["loss"][0] * 0.5
    assert res["worker:0"]["weights_sum"] == pytest.approx(res["worker:1"]["weights_sum"])
    assert res["worker:0"]["loss"] == pytest.approx(res["worker:1"]["loss"])


def module_from_source(folder, name, source):
    """A module ``name`` made of ``source``, written to ``folder`` so that ``inspect`` reads its
    source (as the Keras mends do), and put in ``sys.modules``: a stand-in for one of Keras's."""
    import types

    path = folder / f"{name}.py"
    path.write_text(source)
    module = types.ModuleType(name)
    module.__file__ = str(path)
    sys.modules[name] = module
    exec(compile(source, str(path), "exec"), module.__dict__)
    return module


def notebook_programs(notebook):
    """{file name: its parts in order} of what ``notebook``'s %%writefile cells write (a part
    per cell: the first, then each %%writefile -a one); ``"".join(parts)`` is the file."""
    programs: dict[str, list[str]] = {}
    for cell in json.loads(Path(notebook).read_text())["cells"]:
        text = "".join(cell["source"])
        if cell["cell_type"] == "code" and text.startswith("%%writefile"):
            head, _, body = text.partition("\n")
            name = head.split()[-1]
            programs[name] = [*programs.get(name, []), body] if " -a " in head else [body]
    return programs
