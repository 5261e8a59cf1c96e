"""One suite that every backend passes: local, SSH, Slurm, and ``netns``, a backend in one file
outside the package (``netns_backend.py``, registered by importing it).

Here: the tests of test_backends that need TensorFlow; the module's text and its other tests
are in processes/test_backends.py."""

import time

import pytest
from test_backends import MARK, ME, ON_HOSTS, STANDING_BY, backend, brt  # noqa: F401

from mwhelpers.proctree import carrying

# brt holds that nothing carrying the suite's mark outlives the runtime, warm-start servers
# included: each runtime gets its own (conftest's rt).
OWN_WARM_SERVERS = True


@pytest.mark.parametrize("backend", [pytest.param("ssh", marks=ON_HOSTS)], indirect=True)
def test_a_restart_releases_the_standbys_and_unused_ones_are_ended(brt, backend, tmp_path):  # noqa: F811
    """supervise(standby=True): once both tasks imported TensorFlow, the next attempt's
    processes start ahead; the restart after a fault releases them (no new processes), and
    the standbys for a third attempt that no fault needed are ended, their logs removed.
    Through the agent (ssh; slurm and netns carry the same agent's commands)."""
    name, kwargs, hosts = backend
    brt.define_cluster(2, **kwargs)
    (tmp_path / "go").touch()
    attempts = brt.supervise(code=STANDING_BY, env={MARK: ME}, max_restarts=2, timeout=120,
                             stream=False, standby=True, inject=[("worker:1", "^READY")])
    assert [a.attempt for a in attempts] == [1, 2] and attempts[1].why == "every task finished"
    said = "\n".join(brt.echo_lines)
    assert "[mwhelpers] standby: attempt 2's processes started ahead (worker:0, worker:1)" in said
    assert "[mwhelpers] standby: attempt 3's processes started ahead" in said  # then ended
    for r in attempts[1].runs:
        assert r.process.standby_since is not None and r.process.standby_since < r.started
        assert r.lines()[-1] == "finished attempt 2"
        assert any("started ahead as a standby" in ln for ln in r.lines()), r.lines()
        assert f"[{r.task}] released from its standby" in said
    # Nothing of attempt 3 is left: no process (brt checks), no log, no launch number used.
    assert sorted(p.name for p in brt.log_dir.glob("worker-*.log")) == [
        "worker-0.log", "worker-0.run2.log", "worker-1.log", "worker-1.run2.log"]
    run = brt.launch("worker:0", code="print('after')", env={MARK: ME})
    assert run.log_path.name == "worker-0.run3.log" and run.lines() == ["after"]


@pytest.mark.parametrize("backend", [pytest.param("ssh", marks=ON_HOSTS)], indirect=True)
def test_a_standby_that_died_is_replaced_by_a_cold_start(brt, backend, tmp_path):  # noqa: F811
    """A restart whose standby for one task died meanwhile starts that task as usual, under
    the same log name; the other task's standby is released.  (The test hosts are network
    namespaces of this machine: the standby is found and killed here.)"""
    import threading

    rt = brt
    rt.define_cluster(2, **backend[1])

    def kill_worker0s_standby():
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            for p in carrying(MARK, ME, where=lambda env: env.get("MWHELPERS_ATTEMPT") == "2"
                              and env.get("MWHELPERS_TASK") == "worker:0"):
                p.kill()
                p.wait(5)
                (tmp_path / "go").touch()  # now attempt 1 may fail
                return
            time.sleep(0.05)

    killer = threading.Thread(target=kill_worker0s_standby, daemon=True)
    killer.start()
    attempts = rt.supervise(code=STANDING_BY, env={MARK: ME}, max_restarts=1, timeout=120,
                            stream=False, standby=True, inject=[("worker:1", "^READY")])
    killer.join(5)
    w0, w1 = attempts[1].runs
    assert w0.process.standby_since is None and w1.process.standby_since is not None
    assert w0.log_path.name == "worker-0.run2.log" and w0.lines()[-1] == "finished attempt 2"
    assert w1.lines()[-1] == "finished attempt 2"
    assert "[worker:0] started in the background" in "\n".join(rt.echo_lines)


@pytest.mark.parametrize("backend", ["local"], indirect=True)
def test_the_local_backend_restarts_warm_instead_of_from_standbys(brt, backend, tmp_path):  # noqa: F811
    """supervise(standby=True) on the local backend says in one line that its warm starts
    skip TensorFlow's import at a restart instead, and the restart is forked warm."""
    brt.define_cluster(2)
    (tmp_path / "go").touch()
    attempts = brt.supervise(code=STANDING_BY, env={MARK: ME}, max_restarts=1, timeout=120,
                             stream=False, standby=True, inject=[("worker:1", "^READY")])
    assert [a.attempt for a in attempts] == [1, 2] and attempts[1].why == "every task finished"
    said = [ln for ln in brt.echo_lines if ln.startswith("[mwhelpers] standby:")]
    assert said == ["[mwhelpers] standby: the local backend starts no processes ahead; its warm "
                    "starts skip TensorFlow's import at a restart instead"], said
    for r in attempts[1].runs:
        assert r.process.standby_since is None and r.process.warm, r.lines()
        assert r.lines()[-1] == "finished attempt 2"
