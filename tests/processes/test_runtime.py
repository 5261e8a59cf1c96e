"""The worker runtime with real processes (no TensorFlow: fast)."""

import os
import signal
import textwrap
import threading
import time

import psutil
import pytest
from conftest import LISTENER, STUBBORN, pid_alive, squatting, wait_for_line

from mwhelpers import stacks
from mwhelpers.errors import UsageError, WorkerTimeout
from mwhelpers.failures import WorkerFailed
from mwhelpers.session import escaped_orphans


def test_foreground_streams_prefixed_output_with_tf_config_and_the_kernel_env(rt, monkeypatch):
    monkeypatch.setenv("TF_USE_LEGACY_KERAS", "1")
    code = (
        "import json, os, sys\n"
        "print('task', json.dumps(json.loads(os.environ['TF_CONFIG'])['task']))\n"
        "print('legacy', os.environ['TF_USE_LEGACY_KERAS'], 'extra', os.environ['EXTRA'])\n"
        "print('to stderr', file=sys.stderr)\n"
    )
    run = rt.launch("worker:1", code=code, env=["EXTRA=yes"])
    assert run.returncode == 0 and run.state == "done"
    assert rt.echo_lines == [
        '[worker:1] task {"type": "worker", "index": 1}',
        "[worker:1] legacy 1 extra yes",
        "[worker:1] to stderr",
    ]
    assert rt.cluster is not None and rt.cluster.jobs == {"worker": 2}  # made on demand
    assert "to stderr" in run.log_path.read_text()


def test_tasks_get_a_short_first_grpc_reconnect_back_off(rt, monkeypatch):
    """TensorFlow reads TF_GRPC_DEFAULT_OPTIONS (name=value pairs) for its channels: the first
    back-off is added to what the task is given, never over a value it names itself."""
    show = "import os; print(os.environ.get('TF_GRPC_DEFAULT_OPTIONS'))"
    assert rt.launch(code=show).lines() == ["grpc.initial_reconnect_backoff_ms=50"]
    keep = "TF_GRPC_DEFAULT_OPTIONS=grpc.keepalive_time_ms=60000"
    assert rt.launch(code=show, env=[keep]).lines() == [
        "grpc.keepalive_time_ms=60000,grpc.initial_reconnect_backoff_ms=50"]
    monkeypatch.setenv("TF_GRPC_DEFAULT_OPTIONS", "grpc.initial_reconnect_backoff_ms=300")
    assert rt.launch(code=show).lines() == ["grpc.initial_reconnect_backoff_ms=300"]
    monkeypatch.delenv("TF_GRPC_DEFAULT_OPTIONS")
    rt.defaults.reconnect_ms = 0  # MWHELPERS_RECONNECT_MS=0: gRPC's own
    assert rt.launch(code=show).lines() == ["None"]


def test_a_failing_worker_raises_with_task_exit_code_and_log_tail(rt):
    with pytest.raises(WorkerFailed) as err:
        rt.launch("worker:0", code="print('about to fail')\nraise SystemExit(3)")
    msg = str(err.value)
    assert msg.startswith("worker:0 failed: exit code 3")
    assert "about to fail" in msg
    assert err.value.root_cause.task == "worker:0" and err.value.root_cause.returncode == 3
    assert rt.get_run("worker:0").state == "failed"


def test_an_uncaught_exception_shows_the_worker_traceback(rt):
    with pytest.raises(WorkerFailed, match=r"exit code 1") as err:
        rt.launch("worker:0", code="def f():\n    raise ValueError('bad shapes')\nf()\n")
    assert "ValueError: bad shapes" in str(err.value)
    assert "worker-0_cell.py" in str(err.value)  # the cell's code has a real file name


def test_script_runs_as_main_with_its_args_and_own_folder_on_sys_path(rt, write):
    write("helper_mod.py", "VALUE = 42\n")
    script = write("main.py", """
        import sys, helper_mod
        if __name__ == "__main__":
            print("argv", sys.argv[1:], helper_mod.VALUE, __file__.endswith("main.py"))
    """)
    rt.launch("worker:0", script=str(script), args=["--epochs", "3"])
    assert rt.echo_lines == ["[worker:0] argv ['--epochs', '3'] 42 True"]


def test_background_task_that_fails_before_ready_raises_at_once(rt):
    t0 = time.monotonic()
    with pytest.raises(WorkerFailed, match=r"worker:0 failed: exit code 2[\s\S]*broken config"):
        rt.launch("worker:0", code="print('broken config')\nraise SystemExit(2)", background=True,
                  timeout=60)
    assert time.monotonic() - t0 < 10


def test_background_task_that_never_becomes_ready_times_out_with_its_stacks(rt):
    with pytest.raises(WorkerTimeout) as err:
        rt.launch("worker:0", code=STUBBORN, background=True, timeout=1.5)
    run = rt.get_run("worker:0")
    assert not pid_alive(run.pid)
    assert err.value.not_ready == [("worker", 0)]
    assert f"port {run.port} never accepted connections" in str(err.value)
    assert "Its Python stacks were written to its log before it was ended" in str(err.value)
    log = run.log_path.read_text()
    assert "most recent call first" in log and "worker-0_cell.py" in log  # the Python stacks
    assert run.state == "killed" and "did not become ready" in run.note


# Threads start and end all the time, as in a thread pool; the main thread waits on them.
CHURN = textwrap.dedent("""
    import threading
    def short():
        sum(range(100))
    print("churning", flush=True)
    while True:
        threads = [threading.Thread(target=short) for _ in range(20)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
""")


def test_stack_dumps_leave_a_task_whose_threads_come_and_go_running(rt):
    """faulthandler's SIGUSR1 handler reads the thread list without Python's lock: a thread
    that ends meanwhile crashed such a task (SIGSEGV) in a dump before it was ended."""
    run = rt.launch("worker:0", code=CHURN, background=True, ready="start")
    wait_for_line(run, "churning")
    for _ in range(300):
        run.process.dump_stacks()
        time.sleep(0.005)
    time.sleep(0.5)
    assert run.running, run.outcome()
    frames = stacks.main_stack(run.log_path.read_text().splitlines())
    assert any(f.file.endswith("worker-0_cell.py") for f in frames), frames
    rt.kill("worker:0")


def test_a_task_whose_thread_holds_pythons_lock_still_writes_its_stacks(rt):
    from mwhelpers.job import dump_stacks

    # The regular expression engine keeps Python's lock for as long as it matches (hours).
    run = rt.launch("worker:0", code="import re\nprint('matching', flush=True)\n"
                                     "re.match(r'(a+)+$', 'a' * 40 + 'b')\n",
                    background=True, ready="start")
    wait_for_line(run, "matching")
    t0 = time.monotonic()
    dump_stacks([run])  # its dump thread cannot run: after a second, by signal
    assert time.monotonic() - t0 >= 1.0
    frames = stacks.main_stack(run.log_path.read_text().splitlines())
    assert any(f.file.endswith("worker-0_cell.py") for f in frames), frames
    run.process.send(signal.SIGKILL)
    assert run.process.wait(10) == -signal.SIGKILL


def test_a_stack_dump_leaves_a_task_that_replaced_itself_by_exec_running(rt):
    """Its pipe has no reader and SIGUSR1 would end it (no handler): it is left alone, and
    said to have written no stacks."""
    from mwhelpers.job import dump_stacks

    run = rt.launch("worker:0", code="import os\nprint('exec', flush=True)\n"
                                     "os.execvp('sleep', ['sleep', '600'])\n",
                    background=True, ready="start")
    wait_for_line(run, "exec")
    deadline = time.monotonic() + 10
    while "sleep" not in " ".join(psutil.Process(run.pid).cmdline()):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    dump_stacks([run])  # the pipe, then, a second later, the signal: not sent
    time.sleep(0.5)
    assert run.running and not run.stacks_written, run.outcome()
    run.process.send(signal.SIGKILL)
    assert run.process.wait(10) == -signal.SIGKILL


def test_waiting_for_a_peer_that_never_starts_times_out_naming_it(rt):
    rt.launch("worker:0", code=LISTENER, background=True)
    with pytest.raises(WorkerTimeout) as err:
        rt.wait(timeout=1.0)
    assert err.value.not_ready == [("worker", 1)]
    assert "worker:1 (never launched)" in str(err.value)
    assert not rt.get_run("worker:0").running
    assert "most recent call first" in rt.get_run("worker:0").log_path.read_text()


def test_a_stuck_task_that_wrote_no_stacks_is_not_said_to_have(rt):
    # Its standard error closed: neither its dump thread nor SIGUSR1's handler can write.
    rt.launch("worker:0", code="import os\nos.close(2)\n" + LISTENER, background=True)
    with pytest.raises(WorkerTimeout) as err:
        rt.wait(timeout=1.0)
    assert ("was ended; it wrote no Python stacks to its log (asked twice) before ending"
            in str(err.value)), str(err.value)
    assert not rt.get_run("worker:0").running


def test_foreground_timeout_names_the_peers_that_never_became_ready(rt):
    with pytest.raises(WorkerTimeout, match=r"worker:1 did not finish within 1 s") as err:
        rt.launch("worker:1", code=LISTENER, timeout=1)
    assert "worker:0 (never launched)" in str(err.value)


def test_wait_ends_survivors_some_time_after_a_peer_failed(rt):
    rt.launch("worker:0", code=STUBBORN, background=True, ready="start")
    rt.launch("worker:1", code="raise SystemExit(5)", background=True, ready="start")
    t0 = time.monotonic()
    with pytest.raises(WorkerFailed, match=r"^worker:1 failed: exit code 5"):
        rt.wait(timeout=30, grace_after_failure=1.0)
    assert time.monotonic() - t0 < 10
    w0 = rt.get_run("worker:0")
    assert not w0.running and "after a peer failed" in w0.note


def test_wait_succeeds_and_ignores_parameter_servers(rt):
    rt.define_cluster(workers=1, ps=1)
    rt.launch("ps:0", code=LISTENER, background=True)
    rt.launch("worker:0", code=LISTENER, env={"LIFETIME": "0.3"}, background=True)
    runs = rt.wait(timeout=30)
    assert [str(r.task) for r in runs] == ["worker:0"] and runs[0].returncode == 0
    assert rt.get_run("ps:0").running
    rt.kill("ps:0")


def _pids_from_log(run, *names):
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        found = {}
        for ln in run.tail(0):
            parts = ln.split()
            if len(parts) == 2 and parts[0] in names:
                found[parts[0]] = int(parts[1])
        if len(found) == len(names):
            return found
        time.sleep(0.05)
    raise AssertionError(f"{names} never appeared in {run.log_path}")


def test_kill_with_another_signal_reaches_the_task(rt):
    run = rt.launch("worker:0", code=LISTENER, background=True)
    rt.kill("worker:0", "term")
    run.wait(timeout=10)
    assert run.outcome().startswith("killed by SIGTERM")


# Counts the SIGUSR1s it gets, and starts two children that count theirs: one in its process
# group, one in a session of its own (out of the group, still in its tree).
COUNTS_USR1 = """
import os, signal, subprocess, sys, time
got = []
signal.signal(signal.SIGUSR1, lambda *_: got.append(1))
if len(sys.argv) < 2:
    kids = [subprocess.Popen([sys.executable, __file__, name], start_new_session=name == "own")
            for name in ("group", "own")]
print("ready", os.getpid(), flush=True)
deadline = time.time() + 60
while not got and time.time() < deadline:
    time.sleep(0.01)
time.sleep(0.5)  # a second signal would come now
print("USR1", sys.argv[1] if len(sys.argv) > 1 else "task", len(got), flush=True)
if len(sys.argv) < 2:
    for k in kids:
        k.wait()
"""


def test_a_signal_reaches_the_group_at_once_and_each_process_once(rt, tmp_path):
    script = tmp_path / "counts.py"
    script.write_text(COUNTS_USR1)
    run = rt.launch("worker:0", script=str(script), background=True, ready="start")
    wait_for_line(run, "ready", timeout=30)
    deadline = time.monotonic() + 30
    while len([ln for ln in run.lines() if ln.startswith("ready")]) < 3:
        assert time.monotonic() < deadline, run.lines()
        time.sleep(0.05)
    rt.kill("worker:0", "usr1")
    assert run.wait(60) == 0, run.lines()
    counts = sorted(ln for ln in run.lines() if ln.startswith("USR1"))
    assert counts == ["USR1 group 1", "USR1 own 1", "USR1 task 1"]  # all, and no one twice


def test_kill_when_waits_for_the_log_line(rt):
    code = "import time\nfor i in range(100):\n    print('step', i, flush=True)\n    time.sleep(0.05)\n"
    rt.launch("worker:0", code=code, background=True, ready="start")
    line = rt.kill_when("worker:0", r"step 5\b", timeout=30)
    assert line == "step 5"
    run = rt.get_run("worker:0")
    assert run.outcome() == r"killed by SIGKILL (SIGKILL sent when its log matched 'step 5\\b')"
    steps = [ln for ln in run.tail(0) if ln.startswith("step")]
    assert "step 5" in steps and len(steps) < 20  # killed soon after, not at the end


def test_end_all_finds_orphans_that_escaped_the_tree(rt):
    # A task that starts a daemon in its own session (double fork) and exits:
    # the daemon is neither in the tree nor in the task's process group.
    code = (
        "import os, subprocess, sys\n"
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'],"
        " start_new_session=True)\n"
        "print('daemon', p.pid, flush=True)\n"
    )
    run = rt.launch("worker:0", code=code)
    daemon = int(run.tail(1)[0].split()[1])
    assert pid_alive(daemon)
    assert daemon in [p.pid for p in escaped_orphans(rt.session)]
    report = rt.end_all()
    assert not pid_alive(daemon)
    assert any(str(daemon) in ln for ln in report)


def test_interrupting_a_foreground_worker_ends_it(rt):
    # Ctrl-C's own handler, whatever this process inherited: a shell that starts a command
    # in the background without job control has it ignore SIGINT (the interrupt would never
    # come), and the timeout makes a lost one fail the test instead of hanging it.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        timer = threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGINT))
        timer.start()
        with pytest.raises(KeyboardInterrupt):
            rt.launch("worker:0", code=STUBBORN, timeout=60)
    finally:
        signal.signal(signal.SIGINT, previous)
    run = rt.get_run("worker:0")
    assert not pid_alive(run.pid) and run.note == "ended by mwhelpers on interrupt"


# -- bad input: a clear error, nothing changed ---------------------------------------------

def _snapshot(rt):
    return (dict(rt.cluster.ports) if rt.cluster else None, list(rt.history))


def test_bad_task_type_changes_nothing(rt):
    with pytest.raises(UsageError, match="unknown task type 'wroker'"):
        rt.launch("wroker:0", code="print(1)")
    assert rt.cluster is None and rt.history == []


def test_task_outside_the_cluster_changes_nothing(rt):
    rt.define_cluster(2)
    before = _snapshot(rt)
    with pytest.raises(UsageError, match="worker:5 is outside the cluster"):
        rt.launch("worker:5", code="print(1)")
    assert _snapshot(rt) == before


def test_malformed_env_changes_nothing(rt):
    for bad, message in [(["NOEQUALS"], "--env expects KEY=VALUE, got 'NOEQUALS'"),
                         (["1BAD=x"], "'1BAD' is not a valid environment variable name"),
                         (["TF_CONFIG={}"], "TF_CONFIG is set by mwhelpers")]:
        with pytest.raises(UsageError, match=message):
            rt.launch("worker:0", code="print(1)", env=bad)
    assert rt.cluster is None and rt.history == []


def test_missing_script_changes_nothing(rt):
    with pytest.raises(UsageError, match=r"script 'nope.py' does not exist .* %%writefile"):
        rt.launch("worker:0", script="nope.py")
    assert rt.history == []


def test_port_already_taken_is_explained(rt):
    rt.define_cluster(2)
    port = rt.cluster.port("worker:1")
    with squatting(port), pytest.raises(
            UsageError, match=rf"port {port} of worker:1 is already taken by pid {os.getpid()}"):
        rt.launch("worker:1", code="print(1)")
    assert rt.history == []


def test_a_port_holder_started_with_a_program_of_several_lines_is_named_on_one_line():
    # (notebook 11's holder is `python -c` with a program of several lines)
    import subprocess
    import sys

    from mwhelpers.ports import holder_of

    program = ("import socket, sys, time\ns = socket.socket()\ns.bind(('127.0.0.1', 0))\n"
               "s.listen()\nprint(s.getsockname()[1], flush=True)\n"
               + "# padding that makes the command line long\n" * 3 + "time.sleep(60)\n")
    holder = subprocess.Popen([sys.executable, "-c", program], stdout=subprocess.PIPE, text=True)
    try:
        port = int(holder.stdout.readline())
        said = holder_of(port)
        assert said.startswith(f"pid {holder.pid} ({sys.executable} -c import socket, sys, time s = ")
        assert "\n" not in said and said.endswith("...)") and len(said) <= len(f"pid {holder.pid} ()") + 80
    finally:
        holder.kill()
        holder.wait()


def test_second_launch_of_a_running_task_is_refused(rt):
    run = rt.launch("worker:0", code=LISTENER, background=True)
    with pytest.raises(UsageError, match=rf"worker:0 is already running \(pid {run.pid}"):
        rt.launch("worker:0", code=LISTENER, background=True)
    assert len(rt.history) == 1
    rt.kill("worker:0")


def test_bad_signal_names_are_refused(rt):
    run = rt.launch("worker:0", code=LISTENER, background=True)
    for bad in ("SIGFOO", "kil", "999"):
        with pytest.raises(UsageError, match="signal"):
            rt.kill("worker:0", bad)
    assert run.running and run.note == ""
    rt.kill("worker:0")


def test_bad_timeout_and_ready_values_are_refused(rt):
    with pytest.raises(UsageError, match="timeout must be a number"):
        rt.launch("worker:0", code="print(1)", timeout="soon")
    with pytest.raises(UsageError, match="more than 0"):
        rt.launch("worker:0", code="print(1)", timeout=0)
    with pytest.raises(UsageError, match="ready must be"):
        rt.launch("worker:0", code="print(1)", ready="whenever")
    assert rt.history == []


def test_redefining_the_cluster_while_tasks_run_is_refused(rt):
    rt.launch("worker:0", code=LISTENER, background=True)
    ports_before = dict(rt.cluster.ports)
    with pytest.raises(UsageError, match=r"still running \(worker:0\)"):
        rt.define_cluster(3)
    assert rt.cluster.ports == ports_before
    rt.kill("worker:0")


# -- status and logs --------------------------------------------------------------------

def test_status_table_and_logs(rt):
    rt.define_cluster(3)
    rt.launch("worker:1", code="print('alpha')\nprint('omega')")
    rt.launch("worker:0", code=LISTENER, background=True)
    table = rt.status()
    text = repr(table)
    header, *rows = text.splitlines()
    assert header.split() == ["task", "pid", "state", "exit", "uptime", "port", "log", "last",
                              "log", "line"]
    assert rows[0].split()[:4] == ["worker:1", str(rt.get_run("worker:1").pid), "done", "0"]
    assert rows[0].endswith("omega")
    assert rows[1].split()[2] == "ready" and "listening on" in rows[1]
    assert "<table>" in table._repr_html_() and "omega" in table._repr_html_()
    assert rt.log("worker:1", 1) == ["[worker:1] omega"]
    assert rt.log(None, 5)[:2] == ["[worker:1] alpha", "[worker:1] omega"]
    with pytest.raises(UsageError, match="has not been launched"):
        rt.log("worker:2")
    rt.kill("worker:0")


def test_relaunching_a_task_keeps_the_previous_log(rt):
    first = rt.launch("worker:0", code="print('first run')")
    second = rt.launch("worker:0", code="print('second run')")
    assert first.log_path != second.log_path
    assert "first run" in first.log_path.read_text() and "second run" in second.log_path.read_text()
    assert second.log_path.name == "worker-0.run2.log"


# -- supervised restart -------------------------------------------------------------------

def test_supervise_injects_faults_and_gives_up_after_max_restarts(rt, tmp_path):
    # long enough in attempt 1 for the fault; attempt 2 (no fault injected) exits 9 soon
    code = ("import os, time\nfor i in range(200 if os.environ['MWHELPERS_ATTEMPT'] == '1' else 8):\n"
            "    print('step', i, flush=True)\n    time.sleep(0.05)\nraise SystemExit(9)\n")
    with pytest.raises(WorkerFailed, match="exit code 9"):
        rt.supervise(code=code, max_restarts=1, inject=[("worker:1", r"step 3\b")], timeout=60,
                     stream=False)
    assert any("fault injected: killed worker:1 after it logged 'step 3'" in ln
               for ln in rt.echo_lines)
    assert sum("restarting all 2 tasks" in ln for ln in rt.echo_lines) == 1


def test_a_fault_whose_line_never_came_is_said_and_recorded(rt):
    # worker 1 finishes before it logs 'step 9': the job ends in one attempt, and says why
    code = "for i in range(3):\n    print('step', i, flush=True)\n"
    attempts = rt.supervise(code=code, max_restarts=1, inject=[("worker:1", r"step 9\b")],
                            timeout=60, stream=False)
    said = "fault not injected: worker:1 never logged a line matching 'step 9\\\\b' while it ran"
    assert len(attempts) == 1 and attempts[0].events == [said]
    assert f"[mwhelpers] {said}" in rt.echo_lines


def test_supervise_injects_a_sigterm_preemption_and_restarts_on_its_exit_code(rt, tmp_path):
    """A preemption drill: SIGTERM (not SIGKILL) to worker 1; the program saves and exits 42, as
    TensorFlow's PreemptionCheckpointHandler does, and 42 is declared restartable."""
    code = ("import os, signal, sys, time\n"
            "def saved(*_):\n    print('saved on SIGTERM', flush=True)\n    sys.exit(42)\n"
            "signal.signal(signal.SIGTERM, saved)\n"
            "for i in range(200 if os.environ['MWHELPERS_ATTEMPT'] == '1' else 5):\n"
            "    print('step', i, flush=True)\n    time.sleep(0.05)\n")
    attempts = rt.supervise(code=code, max_restarts=1, restartable_exit_codes=(42,), timeout=60,
                            inject=[("worker:1", r"step 3\b", "TERM")], stream=False,
                            peer_grace=0.5)  # worker 0 here never exits by itself
    assert any("fault injected: sent SIGTERM to worker:1 after it logged 'step 3'" in ln
               for ln in rt.echo_lines)
    assert attempts[0].failed[0] == ("worker:1", "exit code 42 (fault injected by the supervisor)")
    assert "saved on SIGTERM" in attempts[0].runs[1].lines()
    assert attempts[0].restarted and attempts[1].failed == []


def test_supervise_reads_the_logs_urgently_only_while_a_fault_waits(rt, monkeypatch):
    """While a fault waits for its line, the attempt's logs are read every follow.URGENT (a kill
    lands within a step or two of its line, also where a step takes milliseconds); the restart,
    with no fault to inject, is read as any watch is."""
    from mwhelpers import follow

    asked = []
    real = follow.LogFeed.subscribe

    def spy(self, *args, **kwargs):
        asked.append((self.path.name, kwargs.get("urgent", False)))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(follow.LogFeed, "subscribe", spy)
    code = ("import os, time\n"
            "for i in range(200 if os.environ['MWHELPERS_ATTEMPT'] == '1' else 2):\n"
            "    print('step', i, flush=True)\n    time.sleep(0.02)\n")
    attempts = rt.supervise(code=code, max_restarts=1, inject=[("worker:1", r"step 3\b")],
                            timeout=60, stream=False)
    assert attempts[0].restarted and attempts[1].failed == []
    first = {r.log_path.name for r in attempts[0].runs}
    second = {r.log_path.name for r in attempts[1].runs}
    assert {name for name, urgent in asked if urgent} == first, asked
    assert second and second.isdisjoint(first)
    assert {name for name, urgent in asked if not urgent} >= second


def test_supervise_lets_the_peers_of_a_preempted_task_finish_their_save(rt):
    """PreemptionCheckpointHandler makes every worker save and exit 42, not only the one
    that got SIGTERM. Here worker 0 learns of the preemption from a file worker 1 writes and
    needs 1.5 s to "save": the supervisor waits for it instead of ending it."""
    code = ("import os, signal, sys, time\n"
            "def preempted(*_):\n    open('preempted', 'w').close()\n    sys.exit(42)\n"
            "signal.signal(signal.SIGTERM, preempted)\n"
            "for i in range(400 if os.environ['MWHELPERS_ATTEMPT'] == '1' else 3):\n"
            "    if os.path.exists('preempted') and os.environ['MWHELPERS_ATTEMPT'] == '1':\n"
            "        time.sleep(1.5)\n        print('saved', flush=True)\n        sys.exit(42)\n"
            "    print('step', i, flush=True)\n    time.sleep(0.05)\n")
    attempts = rt.supervise(code=code, max_restarts=1, restartable_exit_codes=(42,), timeout=60,
                            inject=[("worker:1", r"step 3\b", "TERM")], stream=False)
    assert attempts[0].failed == [("worker:1", "exit code 42 (fault injected by the supervisor)"),
                                     ("worker:0", "exit code 42")]
    assert "saved" in attempts[0].runs[0].lines()
    assert any("the other tasks had exited by themselves; restarting all 2 tasks" in ln
               for ln in rt.echo_lines)
    assert attempts[0].restarted and attempts[1].failed == []


def test_supervise_rejects_bad_arguments(rt):
    with pytest.raises(UsageError, match="max_restarts"):
        rt.supervise(code="print(1)", max_restarts=-1)
    with pytest.raises(UsageError, match=r"\(task, regex\) or \(task, regex, signal\)"):
        rt.supervise(code="print(1)", inject=["worker:1"])
    with pytest.raises(UsageError, match="signal"):
        rt.supervise(code="print(1)", inject=[("worker:1", "x", "NOPE")])
    with pytest.raises(UsageError, match="outside the cluster"):
        rt.supervise(code="print(1)", tasks=["worker:4"])
    with pytest.raises(UsageError, match="peer_grace"):
        rt.supervise(code="print(1)", peer_grace=-1)
    assert rt.history == []


def test_a_child_process_takes_its_own_session_mark(rt):
    """A kernel started by a process that uses mwhelpers must not share its mark,
    or its %killbgscripts would end the parent's other processes."""
    code = ("import os\nprint('inherited', os.environ['MWHELPERS_SESSION'])\n"
            "from mwhelpers.session import claim_session\nprint('own', claim_session())\n")
    run = rt.launch("worker:0", code=code)
    inherited, own = (ln.split()[1] for ln in run.tail(2))
    assert inherited == rt.session
    assert own != rt.session and own.startswith(f"{run.pid}-")


# -- regressions of the runtime v2 issue ----------------------------------------------------

def test_a_cell_program_imports_modules_from_the_working_directory(rt, write):
    """The upstream pattern: %%writefile mnist_setup.py, then a program that imports it."""
    write("mnist_setup.py", "def batch_size():\n    return 64\n")
    run = rt.launch("worker:0", code="import sys, mnist_setup\n"
                                     "print('batch', mnist_setup.batch_size(), repr(sys.path[0]))\n")
    assert rt.echo_lines == ["[worker:0] batch 64 ''"]  # sys.path[0] as python -c sets it
    assert run.state == "done"


def test_tail_0_is_the_whole_log_however_long(rt):
    code = "for i in range(40000):\n    print('line %06d %s' % (i, 'x' * 20))\n"
    run = rt.launch("worker:0", code=code, log="big.log")
    assert run.log_path.stat().st_size > 1024 * 1024
    lines = run.tail(0)
    assert len(lines) == 40000 and lines[0].startswith("line 000000")
    assert rt.get_run("worker:0").lines() == lines and run.lines() == lines
    assert run.tail(3)[-1].startswith("line 039999")


def test_close_ends_tasks_and_releases_the_guard_pipe_and_ports(tmp_path):
    from mwhelpers.workers import Runtime

    with Runtime(log_dir=tmp_path / "logs", echo=lambda line: None) as rt:
        run = rt.launch("worker:0", code=LISTENER, background=True)
        fds = (rt.launcher._guard_r, rt.launcher._guard_w)
        cluster = rt.cluster
    assert rt.launcher is None and not run.running and not pid_alive(run.pid)
    assert run.outcome() == "killed by SIGKILL (ended when the runtime was closed)"
    assert cluster.closed
    for fd in fds:
        with pytest.raises(OSError):
            os.fstat(fd)
    rt.close()  # twice is harmless


def test_an_unused_runtime_is_collected_and_its_guard_pipe_closed(tmp_path):
    import gc
    import weakref

    from mwhelpers.workers import Runtime

    rt = Runtime(log_dir=tmp_path / "logs")
    rt.define_cluster(1)  # its backend holds the guard pipe
    launcher = rt.launcher
    ref = weakref.ref(rt)
    del rt
    gc.collect()
    assert ref() is None, "something (atexit?) keeps every Runtime alive"
    assert launcher.closed


def test_readiness_probes_the_host_the_cluster_names(rt):
    """A server that listens only on the cluster's host (127.0.0.2 here) is ready."""
    rt.define_cluster(workers=1, host="127.0.0.2")
    code = LISTENER.replace('srv.bind(("", port))', 'srv.bind(("127.0.0.2", port))')
    run = rt.launch("worker:0", code=code, background=True, timeout=10)
    assert run.state == "ready" and run.address == f"127.0.0.2:{run.port}"
    rt.kill("worker:0")


@pytest.mark.parametrize("holder", [
    "import builtins\nbuiltins._kept = Cluster(workers=2)",
    "class H: pass\nh = H(); h.me = h; h.c = Cluster(workers=2)",
    "from IPython.testing.globalipapp import start_ipython\nip = start_ipython()\n"
    "ip.run_line_magic('load_ext', 'mwhelpers'); ip.run_line_magic('cluster', '2')",
])
def test_port_reservations_say_nothing_at_interpreter_exit(holder):
    import subprocess
    import sys

    from conftest import ROOT

    code = f"import sys\nsys.path.insert(0, {str(ROOT)!r})\nfrom mwhelpers import Cluster\n{holder}\n"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr


def test_each_launch_is_checked_and_looked_at_once(rt, monkeypatch):
    """A launch goes one way: the job that starts it checks it once and looks at its program
    once (the look before launch, precheck.Lookout), whether one task is launched, all at
    once (one program for every task), or under the supervisor (its restarts start what it
    looked at already)."""
    from mwhelpers.precheck import Lookout
    from mwhelpers.spawner import Spawner

    looked, checked = [], []
    look, check = Lookout.look, Spawner.check
    monkeypatch.setattr(Lookout, "look", lambda self, request, *a: looked.append(
        request.code) or look(self, request, *a))
    monkeypatch.setattr(Spawner, "check", lambda self, requests, *a: checked.append(
        len(requests)) or check(self, requests, *a))
    rt.define_cluster(2)
    rt.launch("worker:1", code="print('one')")
    assert (looked, checked) == (["print('one')"], [1])
    rt.launch_all(code="print('all')")
    assert (looked[1:], checked[1:]) == (["print('all')"], [2])
    rt.launch_all(code="print('env')", env={"A": "1"})
    assert (looked[2:], checked[2:]) == (["print('env')"], [2])
    flaky = ("import os, signal\n"
             "if os.environ['MWHELPERS_ATTEMPT'] == '1' and os.environ['MWHELPERS_TASK'] == "
             "'worker:1':\n    os.kill(os.getpid(), signal.SIGKILL)\n")
    attempts = rt.supervise(code=flaky, max_restarts=1, stream=False)
    assert [a.restarted for a in attempts] == [True, False]
    assert (looked[3:], checked[3:]) == ([flaky], [2, 2])
