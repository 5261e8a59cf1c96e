"""Warm starts: local tasks whose program imports TensorFlow are forked from a server that
imported it once (mwhelpers/warmstart.py, mwhelpers/taskside/_forkserver.py).  Real servers, real
TensorFlow, real tasks: each must look to its program, to ps and to the kernel exactly like a
cold start."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest
from conftest import ROOT, pid_alive, wait_for_line

from mwhelpers import stacks, warmstart
from mwhelpers.failures import WorkerFailed
from mwhelpers.job import dump_stacks

# Prints what a task's program can see of how it was started, after its own import.
LOOK = textwrap.dedent("""\
    import json, os, random, subprocess, sys
    import psutil
    before = "tensorflow" in sys.modules
    os.environ["CUDA_VISIBLE_DEVICES"] = "-1"  # forked all the same: tensorflow-cpu here
    import tensorflow as tf
    import numpy as np
    with open("/proc/self/cmdline", "rb") as f:
        cmdline = f.read().split(b"\\0")[0].decode()
    environ = psutil.Process().environ()
    child = subprocess.run([sys.executable, "-c", "import os; print(os.environ['MWHELPERS_TASK'])"],
                           capture_output=True, text=True).stdout.strip()
    print("LOOK " + json.dumps({
        "pid": os.getpid(), "ppid": os.getppid(), "sid": os.getsid(0), "pgid": os.getpgrp(),
        "argv": sys.argv, "path0": sys.path[0], "cwd": os.getcwd(), "main": __name__,
        "task": json.loads(os.environ["TF_CONFIG"])["task"], "extra": os.environ.get("EXTRA"),
        "tf_added": os.environ.get("TF2_BEHAVIOR"), "imported_before": before,
        "np": float(np.random.random()), "py": random.random(), "cmdline": cmdline,
        "environ": environ, "child": child,
        "tf": tf.__version__, "sum": float(tf.reduce_sum(tf.range(5.0))),
        "gpus": [d.name for d in tf.config.list_physical_devices("GPU")],
        "cuda_visible": os.environ["CUDA_VISIBLE_DEVICES"],
        "tf_random": tf.random.uniform([3]).numpy().tolist(),
        "shuffled": [int(x) for x in tf.data.Dataset.range(10).shuffle(10)]}), flush=True)
    """)


def looked(run):
    (line,) = [ln for ln in run.log_path.read_text().splitlines() if ln.startswith("LOOK ")]
    return json.loads(line[5:])


def servers(rt):
    return rt.launcher.warm.pids


@pytest.mark.tf
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
    # The server stays for the next launch, also of a new cluster, and ends with the runtime.
    rt.define_cluster(workers=1)
    run = rt.launch("worker:0", script="look.py", background=True, ready="start",
                    env={"EXTRA": "given"})
    rt.wait(timeout=60)
    assert looked(run)["ppid"] == server and servers(rt) == [server]
    rt.close()
    assert not pid_alive(server)


@pytest.mark.tf
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


@pytest.mark.tf
def test_a_program_without_tensorflow_starts_cold_and_another_environment_another_server(rt):
    # (which programs start cold, the switch included, is checked without launching below)
    run = rt.launch("worker:0", code="print('no TensorFlow here')\n")
    assert not run.process.warm and servers(rt) == []
    # Another environment: another server, the first one kept for its own tasks.
    assert rt.launch("worker:0", code="import tensorflow\n").process.warm
    assert rt.launch("worker:0", code="import tensorflow\n", env={"OTHER": "1"}).process.warm
    assert len(servers(rt)) == 2


@pytest.mark.tf
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


@pytest.mark.tf
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


@pytest.mark.tf
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


def test_a_server_that_cannot_import_tensorflow_leaves_the_task_to_say_so(rt, tmp_path):
    fake = tmp_path / "fake"
    (fake / "tensorflow").mkdir(parents=True)
    (fake / "tensorflow" / "__init__.py").write_text("raise ImportError('this TensorFlow is "
                                                     "broken on purpose')\n")
    env = {"PYTHONPATH": str(fake)}
    with pytest.raises(WorkerFailed):
        rt.launch("worker:0", code="import tensorflow\n", env=env)
    run = rt.get_run("worker:0")
    assert not run.process.warm and servers(rt) == []
    assert "this TensorFlow is broken on purpose" in run.log_path.read_text()
    assert "could not import TensorFlow" in rt.launcher.warm.last_cold_reason
    with pytest.raises(WorkerFailed):  # the key is remembered: no second try at a server
        rt.launch("worker:0", code="import tensorflow\n", env=env)


@pytest.mark.tf
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


@pytest.mark.parametrize("source, reason", [
    ("import tensorflow as tf\n", None),
    ("from tensorflow import keras\n", None),
    ("import os, keras\n", None),
    ("    import tf_keras  # indented, in a function\n", None),
    ("print('hello')\n", "does not import TensorFlow"),
    ("# import tensorflow\nx = 'import tensorflow'\n", "does not import TensorFlow"),
    # Literal settings above the import, and nothing else but standard imports: the server
    # imports with them (test_literal_settings_above_the_import_are_the_servers_own) ...
    ("import os\nos.environ['TF_USE_LEGACY_KERAS'] = '1'\nimport tensorflow\n", None),
    ("import os\nos.environ.setdefault('X', '1')\nimport tensorflow\n", None),
    ('"""doc"""\nimport os, sys\nos.environ["KERAS_BACKEND"] = "jax"\nimport keras\nimport tensorflow\n',
     None),
    # ... but not a computed value, a call, another module first, or a later write.
    ("import os\nos.environ['X'] = str(1)\nimport tensorflow\n", "(X)"),
    ("import os\nprint(1)\nos.environ['X'] = '1'\nimport tensorflow\n", "(X)"),
    ("import os, numpy\nos.environ['X'] = '1'\nimport tensorflow\n", "(X)"),
    ("import os\nos.environ['X'] = '1'\nimport keras\nos.environ['Y'] = '1'\nimport tensorflow\n",
     "(Y)"),
    ("import os\nos.putenv('X', '1')\nimport tensorflow\n", "sets environment"),
    ("import os, tensorflow\nif os.environ['A'] == '1': pass\n", None),
    ("import os, json\nos.environ['TF_CONFIG'] = json.dumps({})\nimport tensorflow\n", None),
    ("import os\nos.environ[name] = '1'\nimport tensorflow\n", "(some)"),
    ("import os\nos.environ.update(A='1')\nimport tensorflow\n", "(some)"),
    ("import os\nos.environ |= {'TF_CPP_MIN_LOG_LEVEL': '3'}\nimport tensorflow\n", "(some)"),
    ("import os\nos.environ['XLA_FLAGS'] += ' --x'\nimport tensorflow\n", "(XLA_FLAGS)"),
    ("import os\ndel os.environ['TF_ENABLE_ONEDNN_OPTS']\nimport tensorflow\n",
     "(TF_ENABLE_ONEDNN_OPTS)"),
    ("import os\nos.environ.__setitem__('A', '1')\nimport tensorflow\n", "(A)"),
    ("import os\nos.environ.popitem()\nimport tensorflow\n", "(some)"),
    ("import os\nenv = os.environ\nenv['TF_USE_LEGACY_KERAS'] = '1'\nimport tensorflow\n",
     "(some)"),
    ("from dotenv import load_dotenv\nload_dotenv()\nimport tensorflow\n", "(some)"),
    ("import os, tensorflow\n# os.environ['TF_CPP_MIN_LOG_LEVEL'] = '3'\n", None),
    ("import os, tensorflow\nif os.environ.get('A') == os.environ['B']: pass\n", None),
    ("import os, tensorflow\nenv = os.environ.copy()\nenv['A'] = '1'\n", None),
    # Writes below the first top-level TensorFlow import run after it, cold or forked ...
    ("import os\nimport tensorflow as tf\nos.environ['GRPC_FAIL_FAST'] = 'use_caller'\n", None),
    ("import os\nfrom tensorflow import keras\ndef f():\n    os.environ['A'] = '1'\n", None),
    ("import os\nimport tensorflow.compat.v1 as tf\nos.environ.update(A='1')\n", None),
    # ... but not what a function defined above it may write, nor an import that may not run,
    # nor Keras (which imports TensorFlow only on its TensorFlow backend), nor a docstring.
    ("import os\ndef f():\n    os.environ['A'] = '1'\nimport tensorflow\nf()\n", "(A)"),
    ("import os\nif True:\n    import tensorflow\nos.environ['A'] = '1'\n", "(A)"),
    ("import os, keras\nos.environ['A'] = '1'\nimport tensorflow\n", "(A)"),
    ('"""\nimport tensorflow\n"""\nimport os\nos.environ["A"] = f"{1}"\nimport tensorflow\n',
     "(A)"),
    ("import os\nos.environ['A'] = '1'\nimport tensorflow\nx = (\n", "(A)"),  # no parse
])
def test_which_programs_are_forked(source, reason):
    got = warmstart.cold_reason(source, {})
    assert (got is None) if reason is None else (reason in got)
    assert "MWHELPERS_WARM_START=0" in warmstart.cold_reason(source, {warmstart.ENV: "0"})


def test_hiding_the_gpus_before_the_import_is_forked_only_where_tensorflow_has_no_gpus():
    # (a value the server cannot know in advance: with a literal, the server hides them too)
    hides = ("import os, sys\nos.environ.setdefault('CUDA_VISIBLE_DEVICES', sys.argv[1])\n"
             "import tensorflow\n")
    assert "(CUDA_VISIBLE_DEVICES)" in warmstart.cold_reason(hides, {}, gpu_build=True)
    assert warmstart.cold_reason(hides, {}, gpu_build=False) is None
    also = "import os\nos.environ['TF_CPP_MIN_LOG_LEVEL'] = str(3)\n" + hides
    assert "(TF_CPP_MIN_LOG_LEVEL)" in warmstart.cold_reason(also, {}, gpu_build=False)
    literal = "import os\nos.environ.setdefault('CUDA_VISIBLE_DEVICES', '')\nimport tensorflow\n"
    assert warmstart.cold_reason(literal, {}, gpu_build=True) is None


def test_the_servers_environment_has_the_literal_settings_as_a_cold_start_has_them():
    source = ("import os\nos.environ['A'] = '1'\nos.environ.setdefault('B', '2')\n"
              "os.environ.setdefault('C', '3')\nos.environ['A'] = '4'\nimport tensorflow\n"
              "os.environ['D'] = '5'\n")
    assert warmstart.server_env(source, {"C": "given", "E": "e"}) == {
        "A": "4", "B": "2", "C": "given", "E": "e"}
    assert warmstart.server_env("import os\nos.environ['A'] = str(1)\nimport tensorflow\n",
                                {"E": "e"}) == {"E": "e"}


def test_the_key_leaves_out_only_what_differs_between_tasks():
    a = {"TF_CONFIG": "{1}", "MWHELPERS_TASK": "worker:0", "PATH": "/bin", "TF_X": "1"}
    b = {"TF_CONFIG": "{2}", "MWHELPERS_TASK": "worker:1", "PATH": "/bin", "TF_X": "1"}
    assert warmstart.key_of(a, "/d") == warmstart.key_of(b, "/d")
    assert warmstart.key_of(a, "/d") != warmstart.key_of({**b, "TF_X": "2"}, "/d")
    assert warmstart.key_of(a, "/d") != warmstart.key_of(a, "/e")


def test_a_task_differing_only_in_what_the_servers_import_did_imports_the_same():
    server = {"PATH": "/bin", "HDF5_PLUGIN_PATH": "mine", "TF_CONFIG": "{1}"}
    effects = warmstart.ImportEffects({"TF2_BEHAVIOR": "1"}, frozenset({"HDF5_PLUGIN_PATH"}),
                                      jax=False)
    same = warmstart.same_import
    assert same(server, effects, {**server, "TF_CONFIG": "{2}"})
    assert same(server, effects, {**server, "TF2_BEHAVIOR": "1"})  # the kernel imported since
    assert not same(server, effects, {**server, "TF2_BEHAVIOR": "0"})  # set by its program
    without = {k: v for k, v in server.items() if k != "HDF5_PLUGIN_PATH"}
    assert same(server, effects, without)  # the import removes it
    assert not same(server, effects, {**server, "HDF5_PLUGIN_PATH": "other"})
    assert same(server, effects, {**server, "JAX_CPU_COLLECTIVES_IMPLEMENTATION": "gloo"})
    assert not same(server, effects._replace(jax=True),  # JAX read it while it loaded
                    {**server, "JAX_CPU_COLLECTIVES_IMPLEMENTATION": "gloo"})
    assert not same(server, effects, {**server, "PATH": "/usr/bin"})
    assert not same(server, effects, {**server, "XLA_FLAGS": "--xla_dump_to=d"})


def test_the_key_has_the_installed_tensorflow_and_start_up_files():
    """An upgraded TensorFlow (a new __init__.py) or an edited hook gives another key."""
    import importlib.util

    stamps = {path: (size, mtime) for path, size, mtime in warmstart._installed()}
    tf_init = os.path.realpath(importlib.util.find_spec("tensorflow").origin)
    assert tf_init in {os.path.realpath(p) for p in stamps}
    for name in ("_bootstrap", "_forkserver", "tfdata", "kerasfix", "taskfacts", "lazyplot"):
        path = str(ROOT / "mwhelpers" / "taskside" / f"{name}.py")
        st = os.stat(path)
        assert stamps[path] == (st.st_size, st.st_mtime_ns)
