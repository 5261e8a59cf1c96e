"""The kernel side's decisions, driven in-process by fake tasks (tests/fakes.py): argument
checks, ready and stuck, the root cause, the restart policy, escalation and cleanup.  The real
Runtime, Spawner, Job, Watcher, supervisor, failure records and diagnosis run; only the
processes are stand-ins, so each test takes milliseconds to a second."""

import signal
import time

import fakes
import pytest
from fakes import FakeTask, code, program

from mwhelpers.errors import UsageError, WorkerTimeout
from mwhelpers.failures import FAULT, PROGRAM_ERROR, WorkerFailed


@pytest.fixture
def frt(rt):
    rt.define_cluster(2, backend="fake")
    return rt


def test_a_task_started_twice_or_outside_the_cluster_is_refused_before_anything_starts(frt):
    run = frt.launch("worker:0", code=code("hangs"), background=True)
    with pytest.raises(UsageError, match=rf"worker:0 is already running \(pid {run.pid}, "):
        frt.launch("worker:0", code=code("ok"))
    with pytest.raises(UsageError, match="given more than once"):
        frt.launch_all(code=code("ok"), tasks=["worker:1", "worker:1"])
    with pytest.raises(UsageError, match="worker:5"):
        frt.launch("worker:5", code=code("ok"))
    assert len(frt.history) == 1  # nothing else was started


def test_a_background_task_is_ready_once_its_port_accepts(frt):
    t0 = time.monotonic()
    run = frt.launch("worker:0", code=code("serves"), background=True)
    assert run.ready_after is not None and run.state in ("ready", "done")
    assert any(f"[worker:0] ready after {run.ready_after:.2f} s (port {run.port} is open)" == line
               for line in frt.echo_lines)
    run.wait(5)
    assert run.returncode == 0 and time.monotonic() - t0 < 5
    kinds = [k for _, k, _ in run.events]
    # (its epoch line may be read before the probe finds the port open)
    assert kinds[0] == "launched" and "ready" in kinds and kinds[-1] == "exit", kinds
    assert "epoch" in kinds  # read from its log by the runtime's follower


def test_one_never_ready_has_its_stacks_dumped_then_is_ended(frt):
    with pytest.raises(WorkerTimeout, match="worker:0") as err:
        frt.launch("worker:0", code=code("never-ready"), background=True, timeout=0.5)
    run = frt.get_run("worker:0")
    assert not run.running and run.stacks_written
    assert run.process.signals == [signal.SIGKILL]  # stacks first (no signal), then at once
    assert "did not become ready within 0.5 s" in run.note
    assert "Current thread" in "\n".join(run.lines())
    assert "worker:0" in str(err.value)


def test_a_stack_dump_the_first_way_cannot_reach_is_asked_for_by_signal(frt):
    @program("holds-the-lock")
    def _(t: FakeTask):
        t.holds_lock = True
        t.listen()
        t.sleep(600)

    frt.launch("worker:0", code=code("holds-the-lock"), background=True)
    with pytest.raises(WorkerTimeout):
        frt.wait(0.3)
    run = frt.get_run("worker:0")
    assert run.stacks_written and "in signal" in "\n".join(run.lines())


def test_a_failed_peer_is_the_root_cause_and_the_stuck_one_is_dumped_then_ended(frt):
    stuck = frt.launch("worker:0", code=code("hangs"), background=True)
    failed = frt.launch("worker:1", code=code("raises"), background=True)
    with pytest.raises(WorkerFailed) as err:
        frt.wait(30, grace_after_failure=0.3)
    first = err.value.root_cause
    assert (first.task, first.kind, first.exception) == ("worker:1", PROGRAM_ERROR,
                                                        "ValueError: bad shapes")
    assert failed.exit_record.summary == "ValueError: bad shapes"  # written through wire.py
    assert stuck.stacks_written and "0.3 s after a peer failed" in stuck.note
    assert stuck.process.signals == [signal.SIGKILL]
    assert [f.task for f in err.value.failures] == ["worker:1", "worker:0"]  # order of death


def test_the_first_to_die_is_the_root_cause_whatever_the_launch_order(frt):
    @program("dies-late")
    def _(t: FakeTask):
        t.listen()
        t.sleep(0.3)
        return t.fail(RuntimeError, "later")

    frt.launch("worker:0", code=code("dies-late"), background=True)
    frt.launch("worker:1", code=code("raises"), background=True)
    with pytest.raises(WorkerFailed) as err:
        frt.wait(30, grace_after_failure=5)
    assert [f.task for f in err.value.failures] == ["worker:1", "worker:0"]


@pytest.mark.parametrize("policy, sent, ended_by", [
    ("gentle", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL], "SIGKILL"),
    ("interrupt", [signal.SIGTERM, signal.SIGKILL], "SIGKILL"),
    ("now", [signal.SIGKILL], "SIGKILL"),
])
def test_each_policy_escalates_past_the_signals_a_task_ignores(frt, policy, sent, ended_by):
    run = frt.launch("worker:0", code=code("hangs"), background=True)
    lines = frt.end_all(policy=policy)
    assert run.process.signals == sent and run.process.ended_by == ended_by
    assert f"ended worker:0: pid {run.pid} with {ended_by}" in lines
    with pytest.raises(UsageError, match="policy 'softly': one of now, interrupt, gentle"):
        frt.end_all(policy="softly")  # the user's word is checked at the edge


def test_a_polite_task_ends_at_the_first_signal(frt):
    run = frt.launch("worker:0", code=code("never-ready"), background=True, ready="start")
    frt.end_all()
    assert run.process.signals == [signal.SIGINT] and run.returncode == -signal.SIGINT


def test_supervise_restarts_after_a_fault_and_not_after_a_program_error(frt):
    @program("killed-once")
    def _(t: FakeTask):
        t.listen()
        if t.attempt == 1 and t.task == "worker:1":
            t.sleep(0.05)
            return -signal.SIGKILL  # as a process killed from outside
        t.sleep(0.05)

    attempts = frt.supervise(code=code("killed-once"), max_restarts=2, timeout=30, stream=False)
    assert [(a.attempt, a.restarted) for a in attempts] == [(1, True), (2, False)]
    assert attempts[0].root_cause.kind == FAULT and attempts[0].root_cause.task == "worker:1"
    assert attempts[1].root_cause is None

    before = len(frt.history)
    with pytest.raises(WorkerFailed) as err:
        frt.supervise(code=code("raises"), max_restarts=2, timeout=30, stream=False)
    assert err.value.root_cause.kind == PROGRAM_ERROR
    assert len(frt.history) - before == 2  # one attempt: a program error is not restarted


def test_closing_the_runtime_ends_every_fake_and_leaves_nothing_followed(frt):
    runs = [frt.launch(f"worker:{i}", code=code("hangs"), background=True) for i in range(2)]
    frt.close()
    assert not any(r.running for r in runs)
    assert all(r.process.signals == [signal.SIGKILL] for r in runs)
    assert frt.services.follower.following == 0


def test_the_fake_backend_is_a_real_backend_for_the_package(frt):
    assert "fake" in __import__("mwhelpers").available_backends()
    assert fakes.PROGRAMS["ok"].__name__ == "_ok"
