"""The protocol between the kernel and its tasks and agents (mwhelpers/taskside/wire.py): one
declaration that both sides read, with a version that each side checks."""

import ast
import json
import subprocess
import sys

import pytest
from conftest import ROOT

from mwhelpers.backends.agent import AGENT_CODE, LOST_ESCALATION, steps
from mwhelpers.exitrecord import ExitRecord
from mwhelpers.taskside import wire

PACKAGE = ROOT / "mwhelpers"
BOOTSTRAP = PACKAGE / "taskside" / "_bootstrap.py"
NAMES = {v for k, v in vars(wire.Env).items() if k.isupper() and isinstance(v, str)}


def test_each_name_of_the_task_environment_is_spelled_once_in_the_package():
    """No module spells a variable of wire.Env as a string of its own: a rename in wire.py
    reaches every writer and reader (strings inside longer text, docs, do not count)."""
    assert len(NAMES) == 9 and all(n.startswith("MWHELPERS_") for n in NAMES)
    assert wire.Env.PER_TASK <= NAMES and wire.Env.TAKEN_OUT <= NAMES
    spelled = []
    for path in PACKAGE.rglob("*.py"):
        if path.name == "wire.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and node.value in NAMES:
                spelled.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.value}")
            elif isinstance(node, ast.keyword) and node.arg in NAMES:
                spelled.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.arg}=")
    assert not spelled, spelled


def test_the_checker_above_finds_a_spelled_name(tmp_path):
    tree = ast.parse('env["MWHELPERS_DUMP_FD"] = "1"\ndict(MWHELPERS_TASK="w")\n'
                     '"""a text that names MWHELPERS_TASK"""\n')
    found = [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and n.value in NAMES]
    found += [n.arg for n in ast.walk(tree) if isinstance(n, ast.keyword) and n.arg in NAMES]
    assert sorted(found) == ["MWHELPERS_DUMP_FD", "MWHELPERS_TASK"]


def test_commands_reports_and_steps_read_back_as_written():
    for verb in wire.Command:
        assert wire.parse_command(wire.command(verb, 9) + "\n") == (verb, "9")
        assert wire.parse_command(wire.command(verb)) == (verb, "")
    assert wire.parse_command("launch the missiles") is None
    for kind in wire.Report:
        assert wire.parse_report(wire.report(kind, 12, "host")) == (kind, "12 host")
    record = json.dumps({"a": "b c"})
    assert wire.parse_report(wire.report(wire.Report.RECORD, record)) == (wire.Report.RECORD, record)
    assert wire.parse_report("@mwhelpers teleported 3") is None  # a kind it does not know
    assert wire.parse_report("ssh: connect to host x port 22: refused") is None
    assert wire.parse_steps(steps(LOST_ESCALATION)) == [(int(s), float(t)) for s, t in LOST_ESCALATION]
    assert wire.parse_steps("15:3,9:1.5") == [(15, 3.0), (9, 1.5)]
    with pytest.raises(ValueError):
        wire.parse_steps("SIGTERM")


def test_an_exit_record_of_another_version_is_not_read(tmp_path):
    record = ExitRecord("ValueError", "bad\nshapes", "Traceback ...", 1.5, 42, 1)
    text = record.dumps()
    assert json.loads(text)["version"] == wire.VERSION
    assert ExitRecord.loads(text) == record and record.summary == "ValueError: bad"
    other = json.loads(text)
    other["version"] = wire.VERSION + 1
    assert ExitRecord.loads(json.dumps(other)) is None
    del other["version"]
    assert ExitRecord.loads(json.dumps(other)) is None
    assert ExitRecord.loads("[1, 2]") is None and ExitRecord.loads("not json") is None
    long = ExitRecord("E", "m" * 60_000, "t" * 60_000 + "END", 0.0, 1, 1)
    kept = ExitRecord.loads(long.dumps())
    assert kept.message == "m" * wire.RECORD_LIMIT and kept.traceback.endswith("tEND")
    assert len(kept.traceback) == wire.RECORD_LIMIT



@pytest.mark.parametrize("message, traceback", [
    ("short", "Traceback\n" + "  frame\n" * 2000 + "ValueError: short\n"),
    ("é" * 9000, "x\n" * 5000),  # each é is 6 bytes of JSON
    ("m" * 60_000, "t" * 60_000 + "END"),
    ("", ""),
])
def test_a_record_cut_to_a_termination_message_keeps_the_message_start_and_traceback_end(
        message, traceback):
    record = ExitRecord("ValueError", message, traceback, 1.5, 7, 1)
    text = record.dumps_within(4096)
    assert len(text.encode()) <= 4096
    kept = ExitRecord.loads(text)
    assert (kept.type, kept.time, kept.pid, kept.exit_code) == ("ValueError", 1.5, 7, 1)
    assert message.startswith(kept.message) and traceback.endswith(kept.traceback)
    if len(record.dumps().encode()) <= 4096:
        assert text == record.dumps()
    else:
        assert len(text.encode()) > 4000  # as much as fits
        assert len(kept.message) >= min(len(message), 200) and kept.traceback

def test_the_start_up_writes_the_declared_record(tmp_path):
    """Run by path as every task is, with only its folder: the record carries the version."""
    (tmp_path / "p.py").write_text("raise KeyError('first')\n")
    path = tmp_path / "r.json"
    env = {"PATH": "/usr/bin:/bin", wire.Env.EXIT_RECORD: str(path)}
    done = subprocess.run([sys.executable, "-I", "-u", str(BOOTSTRAP), "p.py"], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1, done.stderr
    data = json.loads(path.read_text())
    assert data["version"] == wire.VERSION and data["type"] == "KeyError"
    assert ExitRecord.read(path).summary == "KeyError: 'first'"


def run_agent(header_line, tmp_path):
    """The agent as ssh runs it: ``python -c AGENT_CODE``, here isolated (-I) in a folder
    without mwhelpers, so that it has nothing of the package but what AGENT_CODE carries; its
    input (the lifeline) stays open until it exits.  Returns (exit code, output, reports)."""
    out, err = tmp_path / "agent.out", tmp_path / "agent.err"
    with open(out, "w") as o, open(err, "w") as e:
        proc = subprocess.Popen([sys.executable, "-I", "-c", AGENT_CODE], stdin=subprocess.PIPE,
                                stdout=o, stderr=e, text=True, cwd=tmp_path,
                                env={"PATH": "/usr/bin:/bin"})
        proc.stdin.write(header_line + "\n")
        proc.stdin.flush()
        try:
            code = proc.wait(30)
        finally:
            proc.stdin.close()
    return code, out.read_text(), err.read_text()


def test_the_agent_runs_on_what_agent_code_carries_and_refuses_another_version(tmp_path):
    fields = {"argv": [sys.executable, "-c", "print('ran')"], "cwd": str(tmp_path),
              "escalation": steps(LOST_ESCALATION)}
    code, out, err = run_agent(wire.header(**fields), tmp_path)
    assert (code, out) == (0, "ran\n"), err
    kinds = [wire.parse_report(line)[0] for line in err.splitlines()]
    assert kinds == [wire.Report.STARTED, wire.Report.EXIT], err

    older = json.dumps({**fields, "version": wire.VERSION - 1})
    code, out, err = run_agent(older, tmp_path)
    assert (code, out) == (2, ""), (out, err)  # nothing ran
    kind, why = wire.parse_report(err.splitlines()[0])
    assert kind is wire.Report.BAD_HEADER
    assert f"protocol version {wire.VERSION - 1}; this agent speaks {wire.VERSION}" in why


def test_fork_messages_read_back_as_written_and_another_version_is_refused():
    for kind in wire.Fork:
        assert wire.read_fork_message(wire.fork_message(kind, pid=7)) == (kind, {"pid": 7})
    other = json.dumps({"version": wire.VERSION + 1, "kind": "pid", "pid": 7}).encode()
    for bad, why in [(other, "another protocol version"), (b"", "no message"),
                     (b"[1]", "not a JSON object")]:
        with pytest.raises(ValueError, match=why):
            wire.read_fork_message(bad)
    with pytest.raises(ValueError):
        wire.read_fork_message(json.dumps({"version": wire.VERSION, "kind": "teleport"}).encode())
    with pytest.raises(ValueError, match="another protocol version"):  # True == 1
        wire.read_fork_message(json.dumps({"version": True, "kind": "pid"}).encode())


SERVE = ("import sys\nfrom mwhelpers.taskside._forkserver import Server\n"
         "Server(int(sys.argv[1]), b'', {}, [], sys.argv[0]).serve()\n")


def test_a_warm_start_server_refuses_a_task_of_another_version_and_forks_one_of_its_own(tmp_path):
    """The server's loop (without TensorFlow: what it imported does not matter here) answers
    on the task's own socket: refused, or the task's pid and then its exit."""
    import socket

    from mwhelpers.warmstart import _wait_exit

    ctl, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    server = subprocess.Popen([sys.executable, "-c", SERVE, str(theirs.fileno())],
                              pass_fds=[theirs.fileno()], cwd=ROOT)
    theirs.close()
    log = open(tmp_path / "task.log", "wb")
    try:
        def ask(message):
            mine, status = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            socket.send_fds(ctl, [message], [status.fileno(), log.fileno()])
            status.close()
            mine.settimeout(30)
            return mine

        fields = {"argv": ["p.py"], "env": {"PATH": "/usr/bin:/bin"}, "cwd": str(tmp_path),
                  "pass": []}
        older = json.dumps({"version": wire.VERSION - 1, "kind": "task", **fields}).encode()
        refused = ask(older)
        kind, reply = wire.read_fork_message(refused.recv(1 << 16))
        refused.close()
        assert kind is wire.Fork.REFUSED and "another protocol version" in reply["error"]

        mine = ask(wire.fork_message(wire.Fork.TASK, **fields))
        kind, reply = wire.read_fork_message(mine.recv(1 << 16))
        assert kind is wire.Fork.PID and reply["pid"] != server.pid
        assert _wait_exit(mine, reply["pid"]) == 0  # the forked copy returned from serve()
        assert "warm start: this task was forked" in (tmp_path / "task.log").read_text()
    finally:
        ctl.close()  # the server leaves once it has no task
        log.close()
        server.wait(30)
    assert server.returncode == 0
