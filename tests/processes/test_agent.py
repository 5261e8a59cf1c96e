"""The task agent on its own, as ssh or srun would run it: header in, reports out."""

import contextlib
import os
import re
import socket
import subprocess
import sys
import time

import psutil
import pytest

from mwhelpers.backends.agent import AGENT_CODE, LOST_ESCALATION, steps
from mwhelpers.taskside import wire

LOST = steps(LOST_ESCALATION)  # what the launchers put in every header: SIGKILL, 3 s


def run_agent(header, tmp_path, timeout=30):
    """Run the agent with ``header``, keeping its standard input (the lifeline) open until it
    exits, as the launchers do; closing it would mean "stop"."""
    out, err = tmp_path / "agent.out", tmp_path / "agent.err"
    with open(out, "w") as o, open(err, "w") as e:
        proc = subprocess.Popen([sys.executable, "-c", AGENT_CODE], stdin=subprocess.PIPE,
                                stdout=o, stderr=e, text=True)
        proc.stdin.write(wire.header(**{"escalation": LOST, **header}) + "\n")
        proc.stdin.flush()
        try:
            code = proc.wait(timeout)
        finally:
            proc.stdin.close()
    return code, out.read_text(), err.read_text()


def test_closing_the_lifeline_ends_the_task_at_once(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", AGENT_CODE], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    header = {"argv": [sys.executable, "-c", "import time; time.sleep(60)"], "cwd": str(tmp_path),
              "escalation": LOST}
    out, err = proc.communicate(wire.header(**header) + "\n", timeout=15)  # EOF right after
    assert "@mwhelpers ended SIGKILL" in err and err.splitlines()[-1] == "@mwhelpers exit -9"


def test_the_agent_ends_its_task_through_the_escalation_its_header_gives(tmp_path):
    """The steps come from the kernel (proctree's table), not from the agent: with SIGTERM
    first, a task that exits on SIGTERM ends with it when the lifeline closes."""
    task = "import time; print('up', flush=True); time.sleep(60)"
    proc = subprocess.Popen([sys.executable, "-c", AGENT_CODE], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    header = {"argv": [sys.executable, "-c", task], "cwd": str(tmp_path), "escalation": "15:3,9:3"}
    proc.stdin.write(wire.header(**header) + "\n")
    proc.stdin.flush()
    assert proc.stdout.readline() == "up\n"
    out, err = proc.communicate(timeout=15)  # EOF: the lifeline closed
    assert "@mwhelpers ended SIGTERM" in err and err.splitlines()[-1] == "@mwhelpers exit -15", err


def test_a_header_without_an_escalation_is_refused(tmp_path):
    header = {"argv": [sys.executable, "-c", "print('ran')"], "cwd": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", AGENT_CODE], input=wire.header(**header) + "\n",
                          capture_output=True, text=True, timeout=15)
    assert done.returncode == 2 and done.stdout == "", (done.stdout, done.stderr)
    assert done.stderr.startswith("@mwhelpers bad-header no escalation")


def test_the_agent_runs_the_task_and_reports_its_exit(tmp_path):
    task = "import os; print(os.environ['X']); raise SystemExit(3)"
    code, out, err = run_agent({"argv": [sys.executable, "-c", task],
                                "env": {"X": "from the header"}, "cwd": str(tmp_path)}, tmp_path)
    assert out == "from the header\n", (out, err)
    reports = err.splitlines()
    assert reports[0].startswith("@mwhelpers started ") and reports[-1] == "@mwhelpers exit 3"
    assert code == 3


def test_a_program_missing_on_the_host_is_named(tmp_path):
    code, out, err = run_agent({"argv": [sys.executable, "main.py"], "cwd": str(tmp_path),
                                "script": "main.py"}, tmp_path)
    assert code == 127 and "the program main.py is not on this host" in out
    assert "started" not in err


def test_a_taken_port_is_named(tmp_path):
    with socket.socket() as s:
        s.bind(("", 0))
        s.listen()
        port = s.getsockname()[1]
        code, out, _ = run_agent({"argv": [sys.executable, "-c", "pass"], "cwd": str(tmp_path),
                                  "port": port}, tmp_path)
    assert code == 1 and f"port {port} is already in use on this host" in out


def test_a_missing_interpreter_and_folder_are_named(tmp_path):
    code, out, _ = run_agent({"argv": ["/nonexistent/python3", "x.py"], "cwd": str(tmp_path)}, tmp_path)
    assert code == 127 and "no Python at /nonexistent/python3 on this host" in out
    code, out, _ = run_agent({"argv": [sys.executable, "x.py"], "cwd": "/nonexistent/dir"}, tmp_path)
    assert code == 127 and "the working directory /nonexistent/dir does not exist here" in out


def test_a_silent_kernel_ends_the_task_after_the_heartbeat(tmp_path):
    # The lifeline stays open but nothing comes through it, as when the network goes silent.
    task = "import time; print('up', flush=True); time.sleep(60)"
    code, out, err = run_agent({"argv": [sys.executable, "-c", task], "cwd": str(tmp_path),
                                "heartbeat": 1}, tmp_path, timeout=15)
    assert code == 128 + 9 and "@mwhelpers ended SIGKILL" in err, (out, err)
    assert "no word from the kernel for 1 s" in out and "ending the task here" in out


def test_pings_keep_the_task_alive_and_are_answered(tmp_path):
    task = "import time; time.sleep(2.5); print('done', flush=True)"
    proc = subprocess.Popen([sys.executable, "-c", AGENT_CODE], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    proc.stdin.write(wire.header(**{"argv": [sys.executable, "-c", task], "cwd": str(tmp_path),
                                 "heartbeat": 1, "escalation": LOST}) + "\n")
    proc.stdin.flush()
    sent, deadline = 0, time.monotonic() + 10
    try:
        while proc.poll() is None and time.monotonic() < deadline:  # 4 pings per heartbeat
            try:
                proc.stdin.write("ping\n")
                proc.stdin.flush()
                sent += 1
            except BrokenPipeError:  # the agent ended between the check and the write
                break
            time.sleep(0.25)
        out, err = proc.communicate(timeout=15)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    # 2.5 s of task under a 1 s heartbeat: alive only thanks to the pings, each answered
    assert out == "done\n" and err.splitlines()[-1] == "@mwhelpers exit 0", (out, err)
    assert sent >= 8 and err.count("@mwhelpers pong") >= sent - 1


@contextlib.contextmanager
def spare(tmp_path, heartbeat, serve=None):
    """An agent given a spare's preload (a file, ``heartbeat`` and ``serve``), its private
    folders made under ``tmp_path``; killed afterwards if it still runs."""
    proc = subprocess.Popen([sys.executable, "-c", AGENT_CODE], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "TMPDIR": str(tmp_path)})
    try:
        proc.stdin.write(wire.preload({"note.txt": "preloaded"}, serve=serve,
                                      heartbeat=heartbeat) + "\n")
        proc.stdin.flush()
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def print_the_preloaded_note(proc, tmp_path):
    """Give a spare the header of a task that prints its preloaded file, and check that it
    did; (output, reports) once it has exited (its input, the lifeline, stays open)."""
    task = "import sys; print(open(sys.argv[1]).read(), flush=True)"
    proc.stdin.write(wire.header(argv=[sys.executable, "-c", task, "{dir}/note.txt"],
                                 cwd=str(tmp_path), escalation=LOST) + "\n")
    proc.stdin.flush()
    proc.wait(15)
    out, err = proc.stdout.read(), proc.stderr.read()
    assert out == "preloaded\n" and err.splitlines()[-1] == "@mwhelpers exit 0", (out, err)
    return out, err


def test_a_spare_that_hears_nothing_for_its_heartbeat_ends_itself_and_its_folder(tmp_path):
    with spare(tmp_path, 1.0) as proc:
        deadline = time.monotonic() + 10
        while not list(tmp_path.glob("mwhelpers-task-*/note.txt")):  # its files, written
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.05)
        proc.wait(10)  # (its input stays open: only silence)
        err = proc.stderr.read()
    assert proc.returncode == 0 and "a spare that heard nothing for 1 s ends itself" in err, err
    assert not list(tmp_path.glob("mwhelpers-task-*"))


def test_pings_keep_a_spare_waiting_and_its_task_then_runs_with_its_files(tmp_path):
    with spare(tmp_path, 1.0) as proc:
        for _ in range(12):  # 3 s, past its 1 s heartbeat
            proc.stdin.write("ping\n")
            proc.stdin.flush()
            time.sleep(0.25)
        assert proc.poll() is None
        out, err = print_the_preloaded_note(proc, tmp_path)
    assert "pong" not in err  # (a spare waiting for its header answers no ping)


def test_a_spare_whose_own_server_cannot_start_says_so_and_runs_its_task_afresh(tmp_path):
    """A Slurm spare's own warm server that cannot even start (here its folder is missing):
    the spare reports ``cold`` with the reason, as its kernel's reader expects, and stays."""
    with spare(tmp_path, None, serve={"env": {}, "cwd": str(tmp_path / "missing"),
                                      "first": "tensorflow"}) as proc:
        said = proc.stderr.readline()
        assert said.startswith("@mwhelpers cold FileNotFoundError"), said
        print_the_preloaded_note(proc, tmp_path)


def test_a_bad_heartbeat_setting_is_refused_with_what_to_give(monkeypatch):
    from mwhelpers.backends.ssh import SSHLauncher, SSHOptions
    from mwhelpers.errors import UsageError

    for bad in ("ten", "-1", "0.5"):
        monkeypatch.setenv("MWHELPERS_HEARTBEAT", bad)
        with pytest.raises(UsageError, match=rf"MWHELPERS_HEARTBEAT='{re.escape(bad)}': give the "
                                             "seconds of silence .* 0 turns the heartbeat off"):
            SSHLauncher(SSHOptions(hosts=("node1",)))
    monkeypatch.setenv("MWHELPERS_HEARTBEAT", "0")
    assert SSHLauncher(SSHOptions(hosts=("node1",))).heartbeat == 0
    monkeypatch.delenv("MWHELPERS_HEARTBEAT")
    assert SSHLauncher(SSHOptions(hosts=("node1",))).heartbeat == 10


def test_dump_asks_the_tasks_dump_thread_and_dump_signal_sends_sigusr1(tmp_path):
    from conftest import ROOT

    from mwhelpers import stacks

    (tmp_path / "wait.py").write_text("import time\nprint('up', flush=True)\ntime.sleep(60)\n")
    bootstrap = str(ROOT / "mwhelpers" / "taskside" / "_bootstrap.py")
    proc = subprocess.Popen([sys.executable, "-c", AGENT_CODE], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        proc.stdin.write(wire.header(**{"argv": [sys.executable, "-u", bootstrap, "wait.py"],
                                     "cwd": str(tmp_path), "escalation": LOST}) + "\n")
        proc.stdin.flush()
        assert proc.stdout.readline() == "up\n"
        dumps = {}
        for command in ("dump", "dump-signal"):
            proc.stdin.write(command + "\n")
            proc.stdin.flush()
            lines = []
            while not (lines and lines[-1].strip().endswith("in main")):  # the start-up's main
                lines.append(proc.stdout.readline().rstrip("\n"))
            current = [ln for ln in lines if ln.startswith("Current thread")]
            block = lines[lines.index(current[0]):] if current else []
            dumps[command] = [f.func for f in stacks.dumps(block)[0]] if block else []
            main = stacks.main_stack(lines)
            assert any(f.file.endswith("wait.py") for f in main), lines
        # The dump thread writes it (its own stack is the current one); SIGUSR1's handler runs
        # in the main thread, which it interrupts.
        assert dumps["dump"][0] == "dump", dumps
        assert "<module>" in dumps["dump-signal"], dumps
        assert proc.poll() is None  # still running, after both
    finally:
        proc.stdin.close()
        proc.wait(15)


def test_dump_signal_leaves_a_task_that_replaced_itself_by_exec(tmp_path):
    """SIGUSR1's default action ends a process: the agent sends it only where a handler is."""
    task = "import os; print('up', flush=True); os.execvp('sleep', ['sleep', '60'])"
    proc = subprocess.Popen([sys.executable, "-c", AGENT_CODE], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        proc.stdin.write(wire.header(**{"argv": [sys.executable, "-c", task], "cwd": str(tmp_path),
                                     "escalation": LOST}) + "\n")
        proc.stdin.flush()
        assert proc.stdout.readline() == "up\n"
        started = next(line for line in iter(proc.stderr.readline, "")
                       if line.startswith("@mwhelpers started"))
        pid = int(started.split()[2])
        deadline = time.monotonic() + 10
        while "sleep" not in " ".join(psutil.Process(pid).cmdline()):  # exec'd
            assert time.monotonic() < deadline
            time.sleep(0.05)
        for command in ("dump", "dump-signal"):
            proc.stdin.write(command + "\n")
            proc.stdin.flush()
        time.sleep(0.5)
        assert psutil.Process(pid).status() != psutil.STATUS_ZOMBIE and proc.poll() is None
    finally:
        proc.stdin.close()
        proc.wait(15)
