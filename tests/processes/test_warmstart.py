"""Warm starts: local tasks whose program imports TensorFlow are forked from a server that
imported it once (mwhelpers/warmstart.py, mwhelpers/taskside/_forkserver.py).  Real servers, real
TensorFlow, real tasks: each must look to its program, to ps and to the kernel exactly like a
cold start.

The tests described here that need more than this folder gives are in tf/test_warmstart_tf.py."""

import json
import os
import sys
import textwrap

import pytest
from conftest import ROOT

from mwhelpers import warmstart
from mwhelpers.failures import WorkerFailed

# These tests count, kill and end the servers: each runtime gets its own (conftest's rt).
OWN_WARM_SERVERS = True

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


def test_a_server_with_no_task_left_leaves_at_once_without_pythons_teardown(tmp_path):
    """The server's first import leaves a minute of work for Python's teardown (as TensorFlow
    leaves seconds of it on a loaded machine): closed, the server is gone all the same."""
    (tmp_path / "slow_teardown.py").write_text("import atexit, time\natexit.register(time.sleep, 60)\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    bootstrap = str(ROOT / "mwhelpers" / "taskside" / "_bootstrap.py")
    server = warmstart._Server(sys.executable, bootstrap, env, str(tmp_path), first="slow_teardown")
    try:
        assert server.ready, server.error
        server.close()
        assert server.popen.wait(10) == 0
    finally:
        server.close(kill=True)


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
    ("import os\nos.environ['LD_PRELOAD'] += ' x.so'\nimport tensorflow\n", "(LD_PRELOAD)"),
    # XLA_FLAGS: read when XLA first compiles (test_xla_flags_given_to_one_task_...)
    ("import os\nos.environ['XLA_FLAGS'] += ' --x'\nimport tensorflow\n", None),
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
    # The folder counts only where PYTHONPATH names it: a relative entry, or an empty one.
    assert warmstart.key_of(a, "/d") == warmstart.key_of(a, "/e")
    for path in ("/lib:/more", "lib", "/lib::/more", ""):
        given = {**a, "PYTHONPATH": path}
        counts = warmstart.key_of(given, "/d") != warmstart.key_of(given, "/e")
        assert counts == (path not in ("/lib:/more", "")), path


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
    assert same(server, effects, {**server, "XLA_FLAGS": "--xla_dump_to=d"})  # read later
    assert not same(server, effects, {**server, "TF_ENABLE_ONEDNN_OPTS": "0"})  # at import


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
