"""The magics, driven through a real IPython shell."""

import re
import subprocess
import sys
import textwrap
import time

import netns_backend  # noqa: F401  (registers the "netns" backend, whose flags are shown)
import pytest
from conftest import LISTENER, ROOT, TREE, pid_alive

from mwhelpers.errors import UsageError
from mwhelpers.failures import WorkerFailed
from mwhelpers.magicargs import parse_worker_line
from mwhelpers.taskrun import LaunchRequest


def cell(ip, source):
    result = ip.run_cell(source)
    return result


def test_cluster_magic_defines_shows_and_returns(ip, rt, capsys):
    assert cell(ip, "%cluster 3 --chief --ps 1 --evaluator").success
    shown = capsys.readouterr().out  # the cell's result, through IPython's displayhook
    assert rt.cluster.jobs == {"chief": 1, "worker": 3, "ps": 1, "evaluator": 1}
    for task in rt.cluster.tasks:
        assert rt.cluster.tf_config(task) in shown
    assert cell(ip, "%cluster").success
    assert rt.cluster.tf_config("evaluator:0") in capsys.readouterr().out
    # c = %cluster 2 keeps the cluster and shows nothing
    assert cell(ip, "c = %cluster 2").success
    assert ip.user_ns["c"] is rt.cluster and rt.cluster.jobs == {"worker": 2}
    assert capsys.readouterr().out == ""


def test_cluster_magic_bad_arguments(ip, rt):
    with pytest.raises(UsageError, match="invalid int value"):
        ip.run_line_magic("cluster", "two")
    with pytest.raises(UsageError, match="unrecognized arguments: --chef"):
        ip.run_line_magic("cluster", "2 --chef")
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


def test_worker_cell_runs_in_the_foreground_with_prefixed_output(ip, rt):
    result = cell(ip, "%%worker 1 --env GREETING=hi\nimport os\nprint(os.environ['GREETING'], "
                      "os.environ['MWHELPERS_TASK'])\n")
    assert result.success
    assert rt.echo_lines == ["[worker:1] hi worker:1"]


def test_worker_cell_failure_fails_the_cell(ip, rt):
    result = cell(ip, "%%worker\nimport sys\nprint('oops')\nsys.exit(4)\n")
    assert not result.success
    assert isinstance(result.error_in_exec, WorkerFailed)
    assert "worker:0 failed: exit code 4" in str(result.error_in_exec)


def test_worker_line_magic_runs_a_script_with_args(ip, rt, write):
    write("main.py", "import sys\nprint('args', sys.argv[1:])\n")
    ip.run_line_magic("worker", "worker:1 main.py --epochs 2 --bg")
    assert rt.echo_lines == ["[worker:1] args ['--epochs', '2', '--bg']"]


def test_background_worker_waitworkers_workers_and_workerlog(ip, rt, capsys):
    assert cell(ip, "%%worker 0 --bg --env LIFETIME=0.5\n" + LISTENER).success
    run = rt.get_run("worker:0")
    assert run.ready_after is not None and run.running
    assert cell(ip, "table = %workers").success
    assert capsys.readouterr().out == ""
    assert ip.user_ns["table"].rows[0][0] == "worker:0"
    assert cell(ip, "%workers").success
    table = capsys.readouterr().out
    assert "worker:0" in table and "ready" in table
    assert cell(ip, "%%worker 1 --bg --env LIFETIME=0.5\n" + LISTENER).success
    ip.run_line_magic("waitworkers", "--timeout 30")
    out = capsys.readouterr().out
    assert "2 task(s) finished" in out
    ip.run_line_magic("workerlog", "worker:1 -n 1")
    assert capsys.readouterr().out.strip() == "[worker:1] finished"
    ip.run_line_magic("workerlog", "--follow worker:0")
    assert "[worker:0] finished" in rt.echo_lines


def test_worker_all_starts_every_task_at_once_and_waits_for_all(ip, rt):
    rt.define_cluster(workers=1, chief=True)
    assert cell(ip, "%%worker all --bg --env DELAY=1 LIFETIME=0.5\n" + LISTENER).success
    chief, worker = rt.get_run("chief:0"), rt.get_run("worker:0")
    assert chief.ready_after is not None and worker.ready_after is not None
    # started together: the second began before the first had opened its port (1 s after its
    # start), where one launch after the other waits for that
    assert worker.started < chief.started + chief.ready_after
    assert any(line.startswith("[chief:0] ready after") for line in rt.echo_lines)
    ip.run_line_magic("waitworkers", "--timeout 30")
    # in the foreground, the output of both streams into the cell, and a failure raises
    program = "import os, sys\nprint('I am', os.environ['MWHELPERS_TASK'], flush=True)\n" \
              "sys.exit(3 if os.environ['MWHELPERS_TASK'] == 'worker:0' else 0)\n"
    result = cell(ip, "%%worker chief:0,worker:0\n" + program)   # a list of tasks, here all
    assert isinstance(result.error_in_exec, WorkerFailed)
    assert "worker:0 failed: exit code 3" in str(result.error_in_exec)
    assert {"[chief:0] I am chief:0", "[worker:0] I am worker:0"} <= set(rt.echo_lines)
    assert rt.get_run("chief:0").returncode == 0


def test_worker_all_in_the_background_ends_the_others_when_one_fails_first(ip, rt, write):
    write("half.py", "import os, sys\nif os.environ['MWHELPERS_TASK'] == 'worker:1':\n"
                     "    sys.exit('no data here')\n" + LISTENER)
    with pytest.raises(WorkerFailed, match="worker:1 failed: exit code 1"):
        ip.run_line_magic("worker", "all --bg --env DELAY=2 half.py")
    first = rt.get_run("worker:0")
    assert first.wait(10) is not None and not first.running
    assert "a task started with it failed" in first.outcome()
    with pytest.raises(UsageError, match="each task of all writes its own log"):
        ip.run_line_magic("worker", "all --bg --log one.log half.py")
    with pytest.raises(UsageError, match="evaluator:0"):
        rt.launch_all(script="half.py", tasks=["worker:0", "evaluator:0"])
    assert [r.task for r in rt.history].count(first.task) == 1   # nothing more was started


def test_killworker_magic_and_bad_signal(ip, rt, capsys):
    assert cell(ip, "%%worker 0 --bg\n" + LISTENER).success
    run = rt.get_run("worker:0")
    with pytest.raises(UsageError, match="unknown signal 'SIGBOGUS'"):
        ip.run_line_magic("killworker", "worker:0 --signal SIGBOGUS")
    assert run.running
    ip.run_line_magic("killworker", "worker:0")
    assert "sent SIGKILL to worker:0" in capsys.readouterr().out
    assert not pid_alive(run.pid)
    assert run.outcome() == "killed by SIGKILL (SIGKILL sent by %killworker)"


def orphan_of_a_bash_bg_cell(ip):
    """A %%bash --bg cell's `python`, left running by IPython's own %killbgscripts (which
    signals only bash); its pid."""
    import psutil

    script_magics = ip.magics_manager.registry["ScriptMagics"]
    assert cell(ip, f"%%bash --bg\n{sys.executable} -c 'import time; time.sleep(120)'\n").success
    bash = script_magics.bg_processes[-1]
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not psutil.Process(bash.pid).children():
        time.sleep(0.05)
    python_pid = psutil.Process(bash.pid).children()[0].pid
    script_magics.kill_bg_processes()  # IPython's own implementation
    time.sleep(0.3)
    return python_pid


def test_killbgscripts_ends_what_ipython_leaves_behind(ip, rt, capsys):
    """IPython's own %killbgscripts signals bash and leaves `python` running."""
    python_pid = orphan_of_a_bash_bg_cell(ip)
    assert pid_alive(python_pid), "IPython's %killbgscripts now ends the child itself"
    # Ours finds the orphan through the session mark in its environment, and ends a worker's
    # whole tree (a child and a grandchild that ignore SIGTERM like their parent).
    assert cell(ip, "%%worker 0 --bg --ready start\n" + TREE).success
    run = rt.get_run("worker:0")
    deadline = time.monotonic() + 15
    while len([ln for ln in run.lines() if re.fullmatch(r"(grand)?child \d+", ln)]) < 2:
        assert time.monotonic() < deadline, run.lines()
        time.sleep(0.05)
    tree = [run.pid] + [int(ln.split()[1]) for ln in run.lines()
                        if ln.split()[:1] in (["child"], ["grandchild"])]
    ip.run_line_magic("killbgscripts", "")
    out = capsys.readouterr().out
    assert not pid_alive(python_pid) and not any(pid_alive(p) for p in tree)
    assert "Ended 4 process(es)" in out and f"pid {python_pid}" in out
    assert all(f"worker:0: pid {p} " in out for p in tree), out
    ip.run_line_magic("killbgscripts", "")
    assert "No background processes were running." in capsys.readouterr().out


def test_killbgscripts_ends_bash_bg_trees(ip, rt, capsys):
    assert cell(ip, f"%%bash --bg\n{sys.executable} -c 'import time; time.sleep(120)' &\nsleep 120\n").success
    import psutil

    bash = ip.magics_manager.registry["ScriptMagics"].bg_processes[-1]
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and len(psutil.Process(bash.pid).children()) < 2:
        time.sleep(0.05)
    tree = [bash.pid] + [c.pid for c in psutil.Process(bash.pid).children(recursive=True)]
    assert len(tree) == 3
    ip.run_line_magic("killbgscripts", "")
    assert not any(pid_alive(p) for p in tree)
    assert "Ended 3 process(es)" in capsys.readouterr().out


@pytest.mark.parametrize("line, expected", [
    ("", {"task": None, "background": None, "script": None}),
    ("1 --bg", {"task": "1", "background": True}),
    ("chief:0 --timeout 30 --log w.log", {"task": "chief:0", "timeout": "30", "log": "w.log"}),
    ("--env A=1 B=2 --bg", {"env": ["A=1", "B=2"], "background": True}),
    ("--env=A=1", {"env": ["A=1"]}),
    ("--timeout=5 --verbose", {"timeout": "5", "verbose": True}),
    ("worker:1 main.py --bg x", {"task": "worker:1", "script": "main.py", "args": ["--bg", "x"],
                                 "background": None}),
    ("main.py", {"task": None, "script": "main.py"}),
    ("--ready start ps:0", {"task": "ps:0", "ready": "start"}),
    ("0 --bg --no-stall-fix main.py", {"task": "0", "stall_fix": False, "script": "main.py"}),
    ("0 --bg", {"stall_fix": None}),
])
def test_worker_line_parsing(line, expected):
    parsed = parse_worker_line(line)
    for key, value in expected.items():
        assert parsed.get(key) == value, (key, parsed)
    LaunchRequest.parse(parsed.pop("task"), code="print(1)", **{  # every name is an option's
        k: v for k, v in parsed.items() if k not in ("script", "args")})


@pytest.mark.parametrize("line, message", [
    ("--timeout", "--timeout needs a value"),
    ("--env", r"--env needs a value \(K=V\)"),
    ("--bg=1", "--bg takes no value"),
    ("--frobnicate", "unknown option '--frobnicate'"),
    ("'unclosed", "cannot parse"),
])
def test_worker_line_errors(line, message):
    with pytest.raises(UsageError, match=message):
        parse_worker_line(line)


def test_worker_magic_argument_errors(ip, rt):
    with pytest.raises(UsageError, match="needs a SCRIPT"):
        ip.run_line_magic("worker", "worker:1")
    result = cell(ip, "%%worker 1 main.py\nprint(1)\n")
    assert "looks like a script" in str(result.error_in_exec)
    result = cell(ip, "%%worker 1 --env BROKEN\nprint(1)\n")
    assert "--env expects KEY=VALUE, got 'BROKEN'" in str(result.error_in_exec)
    assert rt.history == []


def test_killworker_when_takes_a_quoted_pattern(ip, rt, capsys):
    code = ("import time\nfor i in range(200):\n    print('step', i, 'of 200', flush=True)\n"
            "    time.sleep(0.05)\n")
    assert cell(ip, "%%worker 0 --bg --ready start\n" + code).success
    ip.run_line_magic("killworker", 'worker:0 --when "^step 3 of"')
    assert "worker:0 logged 'step 3 of 200'; sent SIGKILL" in capsys.readouterr().out
    assert rt.get_run("worker:0").outcome().startswith("killed by SIGKILL")
    with pytest.raises(UsageError, match="cannot parse"):
        ip.run_line_magic("killworker", "worker:0 --when 'unclosed")


def test_workerlog_waits_for_a_line_and_says_when_the_task_ended_first(ip, rt, capsys):
    code = ("import time\ntime.sleep(0.5)\nprint('ready to go', flush=True)\n"
            "time.sleep(0.3)\nprint('done', flush=True)\n")
    assert cell(ip, "%%worker 0 --bg --ready start\n" + code).success
    ip.run_line_magic("workerlog", 'worker:0 --wait "^ready to" --grep ready')
    assert capsys.readouterr().out.strip() == "[worker:0] ready to go"   # waited for it, then the grep
    run = rt.get_run("worker:0")
    assert run.running or run.returncode == 0                 # the wait left it running
    ip.run_line_magic("workerlog", 'worker:0 --wait "^ready" -n 1')   # already there: no wait
    assert capsys.readouterr().out.strip() in ("[worker:0] ready to go", "[worker:0] done")
    assert rt.get_run("worker:0").wait(10) == 0
    with pytest.raises(UsageError, match=r"worker:0 ended \(exit code 0\) without logging 'never'"):
        ip.run_line_magic("workerlog", 'worker:0 --wait "never"')
    with pytest.raises(UsageError, match="--wait needs a TASK"):
        ip.run_line_magic("workerlog", '--wait "x"')
    assert cell(ip, "%%worker 1 --bg --ready start\nimport sys; sys.exit(3)\n").success
    with pytest.raises(UsageError, match=r"worker:1 ended \(exit code 3\) (before|without) logging 'ready'"):
        ip.run_line_magic("workerlog", 'worker:1 --wait "ready" --timeout 20')


def test_killbgscripts_leaves_unrelated_background_commands_running(ip, rt, capsys, tmp_path):
    """A user's `!nohup ... &` is re-parented like a worker's orphan, but it is not ours."""
    import psutil

    pidfile = tmp_path / "nohup.pid"
    ip.system(f"nohup {sys.executable} -c 'import time; time.sleep(60)' >/dev/null 2>&1 & "
              f"echo $! > {pidfile}")
    unrelated = int(pidfile.read_text())
    try:
        assert psutil.Process(unrelated).ppid() != psutil.Process().pid  # escaped our tree
        # a %%bash --bg cell's program, orphaned when its bash is killed: ours
        orphan = orphan_of_a_bash_bg_cell(ip)
        assert pid_alive(orphan)
        assert "MWHELPERS_BG" not in __import__("os").environ  # only while the cell ran
        ip.run_line_magic("killbgscripts", "")
        out = capsys.readouterr().out
        assert not pid_alive(orphan) and f"pid {orphan}" in out
        assert pid_alive(unrelated) and f"pid {unrelated}" not in out
    finally:
        psutil.Process(unrelated).kill()


def test_unload_and_reload_keep_running_tasks_and_say_so(ip, rt, capsys):
    assert cell(ip, "%%worker 0 --bg\n" + LISTENER).success
    run = rt.get_run("worker:0")
    ip.run_line_magic("unload_ext", "mwhelpers")
    out = capsys.readouterr().out
    assert "mwhelpers unloaded; 1 task(s) keep running: worker:0" in out
    assert run.running
    line = ip.magics_manager.magics["line"]
    assert "worker" not in ip.magics_manager.magics["cell"] and "cluster" not in line
    # IPython's own %killbgscripts is back
    assert type(line["killbgscripts"].__self__).__name__ == "ScriptMagics"
    events = ip.events.callbacks["pre_run_cell"]
    assert not any(type(getattr(cb, "__self__", None)).__name__ == "_BackgroundCellMark" for cb in events)
    ip.run_line_magic("load_ext", "mwhelpers")
    assert cell(ip, "%workers").success
    assert "worker:0" in capsys.readouterr().out  # the same runtime, the same task
    ip.run_line_magic("reload_ext", "mwhelpers")
    assert run.running and "keep running: worker:0" in capsys.readouterr().out
    ip.run_line_magic("killbgscripts", "")
    assert not pid_alive(run.pid)
    assert sum(type(getattr(cb, "__self__", None)).__name__ == "_BackgroundCellMark"
               for cb in ip.events.callbacks["pre_run_cell"]) == 1


def test_the_worker_magics_help_lists_every_launch_option(ip):
    from mwhelpers.launchoptions import LAUNCH_OPTIONS

    doc = ip.find_cell_magic("worker").__doc__
    for option in LAUNCH_OPTIONS:
        assert re.search(rf"^\s+{re.escape(option.flag)}\b.*{re.escape(option.help[:30])}", doc, re.M)


def test_the_launch_options_table_its_types_and_the_request_name_the_same_options():
    """One list of launch options: the table the magics read, the keywords launch, launch_all
    and supervise are typed with, and what a checked request holds."""
    import dataclasses
    import typing

    from mwhelpers.launchoptions import LAUNCH_OPTIONS, LaunchOptions, TaskOptions
    from mwhelpers.taskrun import LaunchRequest

    names = {o.name for o in LAUNCH_OPTIONS}
    assert set(typing.get_type_hints(LaunchOptions)) == names
    assert set(typing.get_type_hints(TaskOptions)) < names
    assert names < {f.name for f in dataclasses.fields(LaunchRequest)}


def test_loading_the_extension_imports_only_what_registering_the_magics_needs():
    """%load_ext registers the magics without the runtime: the first magic that needs it
    imports it (benchmarks/bench_mwhelpers.py times the load)."""
    code = textwrap.dedent("""
        import sys
        from IPython.core.interactiveshell import InteractiveShell
        ip = InteractiveShell.instance()
        ip.run_line_magic("load_ext", "mwhelpers")
        print(sorted(m for m in sys.modules if m.startswith("mwhelpers")))
        assert not {"tensorflow", "keras", "tf_keras"} & set(sys.modules)
        for name in ("cluster", "worker", "workers", "workerlog", "waitworkers", "killworker",
                     "killbgscripts"):
            assert ip.find_line_magic(name), name
        assert ip.find_cell_magic("worker")
        import mwhelpers.magics, mwhelpers.workers
        assert mwhelpers.magics.BG_ENV == mwhelpers.session.BG_ENV
        print(ip.run_line_magic("cluster", "1").tasks)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         cwd=ROOT)
    assert out.returncode == 0, out.stderr
    first, second = out.stdout.splitlines()[:2]
    # stdlib only, until TF
    assert first == str(["mwhelpers", "mwhelpers.errors", "mwhelpers.launchoptions",
                         "mwhelpers.magicargs", "mwhelpers.magics", "mwhelpers.quietimport"])
    assert second == "[Task('worker', 0)]"
