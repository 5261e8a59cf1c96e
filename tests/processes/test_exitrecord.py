"""How a task's program ended, written by the task itself (mwhelpers/taskside/_bootstrap.py)
beside its log, and read first by the failure, the diagnosis and the timeline
(mwhelpers/exitrecord.py).  Real tasks, locally, forked from a warm-start server, and through
the agent that SSH and Slurm tasks run under.

The tests described here that need more than this folder gives are in tf/test_exitrecord_tf.py."""

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time

import pytest
from conftest import ROOT

from mwhelpers import register_backend
from mwhelpers.backends import AgentLauncher
from mwhelpers.diagnosis import explain_failure
from mwhelpers.errors import InfrastructureError
from mwhelpers.exitrecord import EXIT_RECORD_ENV, ExitRecord, path_for
from mwhelpers.failures import FAULT, PROGRAM_ERROR, WorkerFailed, classify

BOOTSTRAP = ROOT / "mwhelpers" / "taskside" / "_bootstrap.py"


def after_the_traceback(lines):
    """A program that prints ``lines`` once Python has printed its traceback (at exit), as
    TensorFlow's shutdown does with its own: the log's last traceback-like text is not the
    exception that ended it."""
    return ("import atexit\natexit.register(lambda: print(" + repr("\n".join(lines))
            + ", flush=True))\n")


FAKE_PEER_LOST = after_the_traceback([
    "Traceback (most recent call last):", '  File "elsewhere.py", line 1, in <module>',
    "tensorflow.python.framework.errors_impl.UnavailableError: task "
    "/job:worker/replica:0/task:1 stopped sending heartbeats"])


def failed(rt, code, **launch):
    with pytest.raises(WorkerFailed) as err:
        rt.launch("worker:0", code=code, **launch)
    return err.value, rt.get_run("worker:0")


def test_a_task_that_raises_leaves_its_record_and_the_failure_reads_it_not_the_log(rt):
    err, run = failed(rt, FAKE_PEER_LOST + "print('training', flush=True)\n"
                      "raise ValueError('bad shapes\\nsecond line')\n")
    path = path_for(run.log_path)
    assert path == run.log_path.with_name("worker-0.exit.json") and path.exists()
    record = run.exit_record
    assert record == ExitRecord.read(path)
    assert (record.type, record.message, record.exit_code) == ("ValueError",
                                                              "bad shapes\nsecond line", 1)
    assert record.pid == run.pid and run.launched_wall <= record.time <= run.ended_wall
    # The program's frames, as Python prints them; the start-up's own are left out.
    assert record.traceback.startswith("Traceback (most recent call last):\n")
    assert "raise ValueError('bad shapes\\nsecond line')" in record.traceback
    assert "_bootstrap.py" not in record.traceback
    assert record.traceback.endswith("ValueError: bad shapes\nsecond line\n")
    assert record.summary == "ValueError: bad shapes"
    # What the program printed is as it was: its traceback, then the lines printed at exit.
    log = run.lines()
    assert log[0] == "training" and "ValueError: bad shapes" in log
    assert log[-1].startswith("tensorflow.python.framework.errors_impl.UnavailableError")
    # The log alone would call it a lost peer, a fault; the record says what it raised.
    assert classify(1, log)[0] == FAULT
    root = err.root_cause
    assert root.kind == PROGRAM_ERROR and root.exit_record == record
    assert root.reason.startswith("the program raised ValueError: bad shapes: a program error")
    assert str(err).splitlines()[:2] == ["worker:0 failed: exit code 1",
                                         "worker:0 raised ValueError: bad shapes"]
    assert root.to_dict()["exit_record"]["type"] == "ValueError"  # in the root-cause file too
    assert str(rt.timeline()).endswith("exit code 1, raised ValueError: bad shapes")


def test_the_diagnosis_reads_the_record_not_the_log(rt):
    """The task raised TensorFlow's error of an operation run before the strategy, then printed
    another traceback: the finding comes from the record; from the log alone there is none."""
    err, run = failed(rt, after_the_traceback([
        "Traceback (most recent call last):", "ValueError: something unrelated"])
        + "raise RuntimeError('Collective ops must be configured at program startup')\n")
    assert [d["key"] for d in err.diagnosis] == ["op-before-strategy"]
    without = dataclasses.replace(err.root_cause, exit_record=None, diagnosis=[])
    assert explain_failure([without], [run]) == []


def test_a_sigkilled_task_writes_none_and_is_a_fault(rt):
    run = rt.launch("worker:0", background=True, ready="start", code=(
        "import time\nprint('Traceback (most recent call last):', flush=True)\n"
        "print('ValueError: printed, not raised', flush=True)\ntime.sleep(60)\n"))
    deadline = time.monotonic() + 20
    while "printed, not raised" not in "\n".join(run.lines()) and time.monotonic() < deadline:
        time.sleep(0.05)
    os.kill(run.pid, signal.SIGKILL)
    with pytest.raises(WorkerFailed) as err:
        rt.wait(timeout=20)
    assert run.returncode == -signal.SIGKILL and run.exit_record is None
    assert not path_for(run.log_path).exists()
    assert err.value.root_cause.kind == FAULT and err.value.root_cause.exit_record is None
    assert not [ln for ln in str(err.value).splitlines() if ln.startswith("worker:0 raised")]


def test_sys_exit_records_its_code_and_the_report_reads_the_log_as_before(rt):
    err, run = failed(rt, "import sys\nprint('giving up', flush=True)\nsys.exit(3)\n")
    record = run.exit_record
    assert (record.type, record.message, record.exit_code) == ("SystemExit", "3", 3)
    assert record.exited and err.root_cause.exception == ""
    assert err.root_cause.kind == PROGRAM_ERROR
    assert "exited with code 3 without a traceback" in err.root_cause.reason
    assert str(err).splitlines()[1].startswith("Last lines of worker:0's log")


def test_a_task_that_succeeds_leaves_none_and_a_relaunch_drops_the_last_ones(rt, tmp_path):
    log = tmp_path / "mine.log"
    failed(rt, "raise KeyError('first')\n", log=log)
    assert ExitRecord.read(tmp_path / "mine.exit.json").summary == "KeyError: 'first'"
    run = rt.launch("worker:0", code="print('fine')\n", log=log)
    assert run.returncode == 0 and run.exit_record is None
    assert not (tmp_path / "mine.exit.json").exists()  # the earlier run's went with its log


@pytest.mark.parametrize("program, code, kind, message", [
    ("import sys; sys.exit('a message')", 1, "SystemExit", "a message"),
    ("import sys; sys.exit(260)", 4, "SystemExit", "260"),
    ("raise KeyboardInterrupt", -signal.SIGINT, "KeyboardInterrupt", ""),
    ("class Mine(Exception): pass\nraise Mine('x')", 1, "Mine", "x"),
    ("import json; json.loads('{')", 1, "json.decoder.JSONDecodeError",
     "Expecting property name enclosed in double quotes: line 1 column 2 (char 1)"),
])
def test_the_start_up_records_the_exit_code_python_gives(tmp_path, program, code, kind, message):
    """Run by path as every task is: what the program prints and its exit code are those of
    ``python SCRIPT`` with the same program; the record says that code."""
    (tmp_path / "p.py").write_text(program + "\n")
    record = tmp_path / "r.json"
    env = {**os.environ, EXIT_RECORD_ENV: str(record)}
    plain = subprocess.run([sys.executable, "-u", "p.py"], cwd=tmp_path, capture_output=True,
                           text=True, timeout=60)
    ours = subprocess.run([sys.executable, "-u", str(BOOTSTRAP), "p.py"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=60)
    assert ours.returncode == plain.returncode == code
    assert ours.stdout == plain.stdout
    # The same traceback's end (above: the start-up's two frames, the script's path as given)
    assert ours.stderr.splitlines()[-2:] == plain.stderr.splitlines()[-2:]
    got = ExitRecord.read(record)
    assert (got.type, got.message, got.exit_code) == (kind, message, code)
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".part")]


def test_nothing_is_written_where_the_kernel_named_no_file_and_a_bad_file_reads_as_none(tmp_path):
    (tmp_path / "p.py").write_text("import os\nprint(os.environ.get('MWHELPERS_EXIT_RECORD'))\n"
                                   "raise ValueError\n")
    env = {**os.environ, EXIT_RECORD_ENV: str(tmp_path / "r.json")}
    done = subprocess.run([sys.executable, "-u", str(BOOTSTRAP), "p.py"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.stdout == "None\n"  # taken out of the program's environment
    assert ExitRecord.read(tmp_path / "r.json").type == "ValueError"
    env.pop(EXIT_RECORD_ENV)
    (tmp_path / "r.json").unlink()
    subprocess.run([sys.executable, "-u", str(BOOTSTRAP), "p.py"], cwd=tmp_path, env=env,
                   capture_output=True, timeout=60)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.py"]
    (tmp_path / "bad.json").write_text('{"type": "ValueError"}')
    assert ExitRecord.read(tmp_path / "bad.json") is None
    assert ExitRecord.read(tmp_path / "absent.json") is None


class _HereLauncher(AgentLauncher):
    """Tasks on this machine under the agent, as SSH and Slurm tasks run (no transport)."""

    name = "here_agent"

    def transport(self, host, argv):
        return list(argv)

    def address_of(self, host, probe):
        return "127.0.0.1"

    def explain(self, host, code, err):
        return InfrastructureError(f"{host}: {err.strip()}")


def test_a_task_under_the_agent_writes_it_there_and_the_kernel_puts_it_beside_the_log(rt):
    register_backend("here_agent", _HereLauncher)
    rt.define_cluster(1, backend="here_agent", hosts=["here"])
    err, run = failed(rt, FAKE_PEER_LOST + "import os\nprint(os.getpid(), flush=True)\n"
                      "raise ValueError('on the host')\n")
    record = json.loads(path_for(run.log_path).read_text())
    assert record["type"] == "ValueError" and record["message"] == "on the host"
    assert record["pid"] == run.process.remote_pid == int(run.lines()[0]) != run.pid
    assert record["exit_code"] == 1 and "raise ValueError('on the host')" in record["traceback"]
    assert err.root_cause.kind == PROGRAM_ERROR and err.root_cause.exception == (
        "ValueError: on the host")
    # The agent's folder (with the file it wrote there) is gone with the task.
    assert not os.path.exists(f"/proc/{record['pid']}")
    assert not [p for p in run.log_path.parent.iterdir() if p.name.startswith(".")]
