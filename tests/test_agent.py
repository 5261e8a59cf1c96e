"""The task agent on its own, as ssh or srun would run it: header in, reports out."""

import json
import socket
import subprocess
import sys

from mwhelpers.remote import AGENT_CODE


def run_agent(header, tmp_path, timeout=30):
    """Run the agent with ``header``, keeping its standard input (the lifeline) open until it
    exits, as the launchers do; closing it would mean "stop"."""
    out, err = tmp_path / "agent.out", tmp_path / "agent.err"
    with open(out, "w") as o, open(err, "w") as e:
        proc = subprocess.Popen([sys.executable, "-c", AGENT_CODE], stdin=subprocess.PIPE,
                                stdout=o, stderr=e, text=True)
        proc.stdin.write(json.dumps(header) + "\n")
        proc.stdin.flush()
        try:
            code = proc.wait(timeout)
        finally:
            proc.stdin.close()
    return code, out.read_text(), err.read_text()


def test_closing_the_lifeline_ends_the_task_at_once(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", AGENT_CODE], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    header = {"argv": [sys.executable, "-c", "import time; time.sleep(60)"], "cwd": str(tmp_path)}
    out, err = proc.communicate(json.dumps(header) + "\n", timeout=15)  # EOF right after
    assert "@mwhelpers ended SIGKILL" in err and err.splitlines()[-1] == "@mwhelpers exit -9"


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
