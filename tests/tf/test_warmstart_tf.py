"""Warm starts: local tasks whose program imports TensorFlow are forked from a server that
imported it once (mwhelpers/warmstart.py, mwhelpers/taskside/_forkserver.py).  Real servers,
real TensorFlow, real tasks: each must look to its program, to ps and to the kernel exactly
like a cold start.

Here: the tests of test_warmstart that need TensorFlow; the module's text and its other tests
are in processes/test_warmstart.py."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest
from conftest import ROOT, pid_alive, wait_for_line
from test_warmstart import LOOK, looked, servers

from mwhelpers import stacks
from mwhelpers.failures import WorkerFailed
from mwhelpers.job import dump_stacks

# These tests count, kill and end the servers: each runtime gets its own (conftest's rt).
OWN_WARM_SERVERS = True


def test_two_tasks_fork_from_one_server_and_each_looks_like_a_cold_start(rt, tmp_path):
    (tmp_path / "look.py").write_text(LOOK)
    rt.define_cluster(workers=2)
    for i in (0, 1):
        rt.launch(f"worker:{i}", script="look.py", args=["--steps", str(i)],
                  env={"EXTRA": "given"}, background=True, ready="start")
        # Found as itself the moment the launch returns: the task says its pid once it is
        # in its own session, with its own command line.
        run = rt.get_run(f"worker:{i}")
        assert os.getsid(run.pid) == run.pid and "look.py" in " ".join(
            psutil.Process(run.pid).cmdline())
    (server,) = servers(rt)
    rt.wait(timeout=60)
    seen = {}
    for i in (0, 1):
        run = rt.get_run(f"worker:{i}")
        assert run.process.warm and run.process.returncode == 0
        s = seen[i] = looked(run)
        # Its own session and group, a child of the one server, not of the kernel.
        assert s["pid"] == run.pid == s["sid"] == s["pgid"] and s["ppid"] == server
        assert s["argv"] == [str(tmp_path / "look.py"), "--steps", str(i)]
        assert s["path0"] == str(tmp_path) and s["cwd"] == str(tmp_path)
        assert s["main"] == "__main__" and s["task"] == {"type": "worker", "index": i}
        assert s["extra"] == "given" and s["tf_added"] == "1"  # what TF's import set stays
        assert s["imported_before"] is True and s["sum"] == 10.0
        assert s["gpus"] == [] and s["cuda_visible"] == "-1"
        assert s["cmdline"] == f"{sys.executable} -u {ROOT}/mwhelpers/taskside/_bootstrap.py " \
                               f"{tmp_path}/look.py --steps {i}"
        # /proc/PID/environ (ps e, psutil) is the server's block, rewritten by nobody: the
        # variables every task of this server shares, none of a task's own; what the task
        # starts gets its own environment.
        shown = s["environ"]
        assert shown["EXTRA"] == "given" and "TF_CONFIG" not in shown
        assert "MWHELPERS_TASK" not in shown and s["child"] == f"worker:{i}"
        log = run.log_path.read_text()
        # What the import wrote is at the top of every task's log, as in a cold start.
        assert log.index("[mwhelpers] this task: TensorFlow") < log.index("[mwhelpers] warm start:")
        assert log.index("[mwhelpers] warm start:") < log.index("LOOK ")
    # Fresh random generators in each task (a fork would otherwise share them).
    assert seen[0]["np"] != seen[1]["np"] and seen[0]["py"] != seen[1]["py"]
    # TensorFlow's own seeds, where a program gives none, also differ (its import draws none).
    assert seen[0]["tf_random"] != seen[1]["tf_random"]
    assert seen[0]["shuffled"] != seen[1]["shuffled"]
    # The server stays for the next launch, also of a new cluster from another folder (%cd),
    # whose task runs there; the server ends with the runtime.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "look.py").write_text(LOOK)
    os.chdir(elsewhere)  # (the rt fixture's monkeypatch.chdir puts the folder back)
    rt.define_cluster(workers=1)
    run = rt.launch("worker:0", script="look.py", background=True, ready="start",
                    env={"EXTRA": "given"})
    rt.wait(timeout=60)
    s = looked(run)
    assert s["ppid"] == server and servers(rt) == [server]
    assert s["path0"] == s["cwd"] == str(elsewhere)
    rt.close()
    assert not pid_alive(server)


def test_exit_codes_and_signals_reach_the_kernel_and_kill_ends_the_task(rt):
    head = "import tensorflow, time, sys\n"
    with pytest.raises(WorkerFailed, match="exit code 3"):
        rt.launch("worker:0", code=head + "print('about to fail')\nsys.exit(3)")
    assert rt.get_run("worker:0").process.warm
    run = rt.launch("worker:0", code=head + "print('up', flush=True)\ntime.sleep(600)",
                    background=True, ready="start")
    assert run.process.warm
    pid = run.pid
    os.kill(pid, signal.SIGKILL)
    assert run.process.wait(10) == -signal.SIGKILL
    run = rt.launch("worker:0", code=head + "print('up', flush=True)\ntime.sleep(600)",
                    background=True, ready="start")
    # Its stacks, asked through the dump pipe the server handed it: written by its dump thread.
    wait_for_line(run, "up")
    dump_stacks([run])
    lines = run.log_path.read_text().splitlines()
    current = next(i for i, ln in enumerate(lines) if ln.startswith("Current thread"))
    assert stacks.dumps(lines[current:])[0][0].func == "dump", lines
    assert any(f.file.endswith("worker-0_cell.py") for f in stacks.main_stack(lines)), lines
    rt.kill("worker:0")
    assert not pid_alive(run.pid) and run.process.returncode is not None


def test_a_program_without_tensorflow_starts_cold_and_another_environment_another_server(rt):
    # (which programs start cold, the switch included, is checked without launching below)
    run = rt.launch("worker:0", code="print('no TensorFlow here')\n")
    assert not run.process.warm and servers(rt) == []
    # Another environment: another server, the first one kept for its own tasks.
    assert rt.launch("worker:0", code="import tensorflow\n").process.warm
    assert rt.launch("worker:0", code="import tensorflow\n", env={"OTHER": "1"}).process.warm
    assert len(servers(rt)) == 2


def test_the_kernels_own_import_since_and_jax_flags_give_no_second_server(rt, monkeypatch):
    """A notebook launches, then imports TensorFlow itself (TensorFlow's import adds
    TF2_BEHAVIOR and more to the kernel's environment), then launches a task that does not train (an
    evaluator: no JAX_CPU_COLLECTIVES_IMPLEMENTATION): one server forks both, as a cold start would
    have them; a variable TensorFlow's import does not set still gets another."""
    seen = ("import os, tensorflow\nprint('SEEN', os.environ.get('TF2_BEHAVIOR'), "
            "os.environ.get('JAX_CPU_COLLECTIVES_IMPLEMENTATION'))\n")
    for name in ("TF2_BEHAVIOR", "ENABLE_RUNTIME_UPTIME_TELEMETRY", "HDF5_PLUGIN_PATH",
                 "TPU_ML_PLATFORM", "TPU_ML_PLATFORM_VERSION"):
        monkeypatch.delenv(name, raising=False)  # as in a kernel before its import
    first = rt.launch("worker:0", code=seen)
    assert first.process.warm and "SEEN 1 gloo" in first.log_path.read_text()
    (server,) = servers(rt)
    # What the kernel's import adds is what the server's added (both arm mwhelpers' lazyjax).
    (effects,) = [s.effects for s in rt.launcher.warm._servers.values()]
    assert effects.env_set.get("TF2_BEHAVIOR") == "1" and not effects.jax
    for name, value in effects.env_set.items():
        monkeypatch.setenv(name, value)
    rt.define_cluster(workers=1, evaluator=True)
    second = rt.launch("evaluator:0", code=seen)
    assert second.process.warm and "SEEN 1 None" in second.log_path.read_text()
    assert servers(rt) == [server]
    third = rt.launch("evaluator:0", code=seen, env={"TF_CPP_MAX_VLOG_LEVEL": "0"})
    assert third.process.warm and len(servers(rt)) == 2


def test_literal_settings_above_the_import_are_the_servers_own(rt):
    """A program that sets KERAS_BACKEND before its import is forked from a server that
    imported with it: Keras runs on JAX there, and JAX computes in the fork; the same program
    on TensorFlow gets another server."""
    pytest.importorskip("jax", reason="JAX is not installed (mwhelpers[jax])")
    program = textwrap.dedent("""\
        import os
        os.environ["KERAS_BACKEND"] = "{backend}"   # before Keras is imported
        import keras
        import tensorflow as tf
        import jax.numpy as jnp
        print("BACKEND", keras.backend.backend(), float(jnp.sum(jnp.arange(4.0))), flush=True)
        """)
    for backend in ("jax", "tensorflow"):
        run = rt.launch("worker:0", code=program.format(backend=backend))
        assert run.process.warm, rt.launcher.warm.last_cold_reason
        assert f"BACKEND {backend} 6.0" in run.log_path.read_text()
    assert len(servers(rt)) == 2


def test_xla_flags_given_to_one_task_are_read_in_its_fork_from_the_shared_server(rt, tmp_path):
    """XLA reads XLA_FLAGS when it first compiles, JAX when it makes its backend: a task given
    its own (notebook 12b's device counts and dump folder) forks from the server the others
    use, and both flags take effect there."""
    pytest.importorskip("jax", reason="JAX is not installed (mwhelpers[jax])")
    program = textwrap.dedent("""\
        import os
        os.environ["KERAS_BACKEND"] = "jax"
        os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=2")
        import keras
        import jax
        jax.jit(lambda x: x + 1)(1.0)
        print("DEVICES", len(jax.devices()), flush=True)
        """)
    plain = rt.launch("worker:0", code=program)
    dump = tmp_path / "dump"
    given = rt.launch("worker:0", code=program, env={
        "XLA_FLAGS": f"--xla_force_host_platform_device_count=4 --xla_dump_to={dump}"})
    assert plain.process.warm and given.process.warm, rt.launcher.warm.last_cold_reason
    assert len(servers(rt)) == 1
    assert "DEVICES 2" in plain.log_path.read_text()
    assert "DEVICES 4" in given.log_path.read_text() and any(dump.iterdir())


def test_a_server_that_died_is_replaced_and_its_orphans_still_end(rt):
    """SIGKILL of the server (by hand, the OOM killer...): its running task goes on and is
    waited for (exit code unknown: 255); the next launch forks from a new server."""
    rt.define_cluster(workers=3)
    sleeper = "import tensorflow, time\ntime.sleep(600)\n"
    orphan = rt.launch("worker:2", code=sleeper, background=True, ready="start")
    (server,) = servers(rt)
    os.kill(server, signal.SIGKILL)
    psutil.Process(server).wait(10)  # (a zombie until the launcher reaps it)
    again = rt.launch("worker:0", code="import os, tensorflow\nprint(os.getppid())\n")
    assert again.process.warm and servers(rt) == [int(again.lines()[-1])] != [server]
    os.kill(orphan.pid, signal.SIGKILL)
    assert orphan.process.wait(10) == 255


def test_server_and_tasks_end_when_the_kernel_dies(tmp_path):
    kernel = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""\
        import sys, time
        sys.path.insert(0, {str(ROOT)!r})
        from mwhelpers.workers import Runtime
        rt = Runtime(log_dir={str(tmp_path / 'logs')!r})
        run = rt.launch("worker:0", code="import tensorflow, time\\ntime.sleep(600)",
                        background=True, ready="start")
        print("PIDS", run.pid, rt.launcher.warm.pids[0], run.process.warm, flush=True)
        time.sleep(600)
        """)], stdout=subprocess.PIPE, text=True, cwd=tmp_path, start_new_session=True)
    try:
        line = ""
        while not line.startswith("PIDS "):
            line = kernel.stdout.readline()
            assert line, "the kernel ended before it said its pids"
        task, server, warm = line.split()[1:]
        assert warm == "True"
        os.killpg(kernel.pid, signal.SIGKILL)
        kernel.wait()
        deadline = time.monotonic() + 10
        while (pid_alive(int(task)) or pid_alive(int(server))) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not pid_alive(int(task)) and not pid_alive(int(server))
    finally:
        for pid in (kernel.pid,):
            try:
                os.killpg(pid, signal.SIGKILL)
            except OSError:
                pass
        kernel.wait()
