"""Root causes, failure records and supervised restarts decided by the failure (real processes)."""

import json
import os
import time

import pytest
from conftest import LISTENER, pid_alive, squatting

from mwhelpers.errors import UsageError
from mwhelpers.failures import FAULT, PROGRAM_ERROR, WorkerFailed, classify, last_exception

EXIT_AFTER = ("import os, sys, time\ntime.sleep(float(os.environ['AFTER']))\n"
              "sys.exit(int(os.environ['CODE']))\n")


@pytest.mark.parametrize("looks_at", [0.0, 2.5], ids=["while-they-run", "after-both-died"])
def test_the_first_task_to_die_is_the_root_cause_whenever_wait_is_called(rt, looks_at):
    """worker:1 dies at 0.2 s, worker:0 at 1.5 s; wait() is called at once (worker:0 then exits
    by itself within the grace after its peer's failure) or only at 2.5 s: the root cause is
    worker:1, by when each died, not by launch order or noticing."""
    rt.launch("worker:0", code=EXIT_AFTER, env={"AFTER": "1.5", "CODE": "40"}, background=True,
              ready="start")
    rt.launch("worker:1", code=EXIT_AFTER, env={"AFTER": "0.2", "CODE": "41"}, background=True,
              ready="start")
    time.sleep(looks_at)
    with pytest.raises(WorkerFailed) as err:
        rt.wait(timeout=30)
    assert str(err.value).startswith("worker:1 failed: exit code 41; then worker:0 (exit code 40)")
    assert [f.task for f in err.value.failures] == ["worker:1", "worker:0"]  # in the order they died
    w0, w1 = rt.get_run("worker:0"), rt.get_run("worker:1")
    assert w1.ended < w0.ended
    # Uptimes stop at the real exit, not when the runtime looked (a start takes over a second
    # on a loaded machine: no upper bound from the sleeps).
    assert 0.2 <= w1.uptime < w0.uptime and 1.5 <= w0.uptime
    frozen = (w0.uptime, w1.uptime)
    time.sleep(0.3)
    assert (w0.uptime, w1.uptime) == frozen
    root = err.value.root_cause
    assert (root.task, root.returncode, root.pid) == ("worker:1", 41, w1.pid)
    assert root.log_path == str(w1.log_path) and abs(root.ended_at - time.time()) < 10


def test_status_shows_frozen_uptime_of_an_ended_task(rt):
    run = rt.launch("worker:0", code="print('quick')")
    first = run.uptime
    time.sleep(0.3)
    assert run.uptime == first and run.state == "done"


@pytest.mark.parametrize("code, lines, note, kind, words", [
    (-9, [], "fault injected by the supervisor", FAULT, "killed by SIGKILL (fault injected"),
    (137, [], "", FAULT, "exit code 137 (128 + SIGKILL)"),
    (143, [], "", FAULT, "128 + SIGTERM"),  # TF's PreemptionCheckpointHandler exits 143
    (1, ["Traceback (most recent call last):", '  File "main.py", line 3, in <module>',
         "ValueError: bad shapes"], "", PROGRAM_ERROR, "raised ValueError: bad shapes"),
    (1, ["Traceback (most recent call last):", '  File "main.py", line 9, in <module>',
         "tensorflow.python.framework.errors_impl.UnavailableError: Collective ops is aborted "
         "by: task /job:worker/replica:0/task:1 stopped sending heartbeats"], "", FAULT,
     "lost a peer"),
    (7, ["training..."], "", PROGRAM_ERROR, "exited with code 7 without a traceback"),
])
def test_classify_by_signal_exit_code_and_log(code, lines, note, kind, words):
    got_kind, reason = classify(code, lines, note)
    assert got_kind == kind and words in reason


def test_last_exception_of_a_chained_traceback():
    lines = ["Traceback (most recent call last):", "  x", "KeyError: 'a'", "",
             "During handling of the above exception, another exception occurred:", "",
             "Traceback (most recent call last):", "  y", "RuntimeError: wrapped", "later noise"]
    assert last_exception(lines) == "RuntimeError: wrapped"
    assert last_exception(["no traceback here"]) == ""


BUGGY = """
import json, os, sys
task = json.loads(os.environ["TF_CONFIG"])["task"]
with open(os.path.join(os.environ["MARKER_DIR"], "starts"), "a") as f:
    f.write("%s attempt=%s\\n" % (task["index"], os.environ["MWHELPERS_ATTEMPT"]))
import time
if task["index"] == 1:
    while "0 attempt" not in open(os.path.join(os.environ["MARKER_DIR"], "starts")).read():
        time.sleep(0.01)  # once worker 0 runs: a slow start must not look like no start
    raise ValueError("bad shapes")
time.sleep(60)
"""


def test_supervise_does_not_restart_a_program_error(rt, tmp_path):
    t0 = time.monotonic()
    with pytest.raises(WorkerFailed) as err:
        rt.supervise(code=BUGGY, env={"MARKER_DIR": str(tmp_path)}, max_restarts=3, timeout=60,
                     stream=False)
    assert time.monotonic() - t0 < 20
    starts = (tmp_path / "starts").read_text().split("\n")
    assert sorted(filter(None, starts)) == ["0 attempt=1", "1 attempt=1"]  # started once
    msg = str(err.value)
    assert msg.startswith("not restarted after attempt 1: the program raised ValueError: bad shapes")
    assert "worker:1 failed: exit code 1" in msg and "ValueError: bad shapes" in msg
    assert err.value.root_cause.kind == PROGRAM_ERROR
    assert any("not restarting" in ln and "ValueError" in ln for ln in rt.echo_lines)
    record = json.loads((rt.log_dir / "attempt-1.root-cause.json").read_text())
    assert record["task"] == "worker:1" and record["exit"] == "exit code 1"
    assert record["attempt"] == 1 and record["kind"] == PROGRAM_ERROR
    assert "ValueError: bad shapes" in record["tail"][-1] and record["ended_at_iso"]
    assert not any(r.running for r in rt.history)


def test_an_attempt_is_checked_whole_before_any_task_starts(rt):
    rt.define_cluster(2)
    port = rt.cluster.port("worker:1")
    with squatting(port), pytest.raises(UsageError, match=rf"port {port} of worker:1 is already taken"):
        rt.supervise(code=LISTENER, max_restarts=1, timeout=30, stream=False)
    assert rt.history == []  # worker:0 was not started either


def test_a_half_started_attempt_ends_the_tasks_it_started(rt):
    rt.define_cluster(2)
    (rt.log_dir / "worker-1_cell.py").mkdir()  # worker:1's program cannot be written there
    with pytest.raises(IsADirectoryError):
        rt.supervise(code=LISTENER, max_restarts=1, timeout=30, stream=False)
    [w0] = rt.history
    assert str(w0.task) == "worker:0" and not w0.running and not pid_alive(w0.pid)
    assert "could not start every task" in w0.note


def test_supervise_rejects_bad_restartable_codes_and_patterns(rt):
    with pytest.raises(UsageError, match="restartable_exit_codes"):
        rt.supervise(code="print(1)", restartable_exit_codes=("x",))
    with pytest.raises(UsageError, match="not a valid regular expression"):
        rt.supervise(code="print(1)", inject=[("worker:1", "(")])
    assert rt.history == []
    assert os.environ.get("MWHELPERS_ATTEMPT") is None
