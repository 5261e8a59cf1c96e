"""The tutorials' environment before and after the lock: size, TensorFlow distributions, and the
CPU time of importing TensorFlow in a worker.

    python benchmarks/bench_packaging.py [--before-ref REF] [--runs N] [--keep DIR]

"before" is what 0.1.0's packaging installed: a resolving ``pip install`` of its exact pins with
its constraints file (read from git at REF, default the last 0.1.0 commit), which put the
`tensorflow` distribution (pulled by tf-keras) beside `tensorflow-cpu`. "after" is the lock,
``pip install --no-deps -r requirements/test.txt``. Both are made anew in one run (pip's cache
serves the wheels). Then, interleaved, N times each: the CPU seconds (user + system) of a fresh
``python -c 'import tensorflow, keras'``, as every worker starts (Keras 3; the lock no longer
holds tf_keras). Prints figures and the after/before ratios.
"""

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from mwhelpers.packages import TF_DISTRIBUTIONS  # noqa: E402

LAST_010 = "c7d097c"  # the last commit with 0.1.0's packaging

IMPORT = {"keras3": "import tensorflow, keras"}
PROBE = ("import os, sys; os.environ['TF_CPP_MIN_LOG_LEVEL'] = '0'\n"
         "import tensorflow as tf\n"
         "print(json.dumps({'cuda_build': tf.sysconfig.get_build_info().get('is_cuda_build'),"
         " 'devices': [d.device_type for d in tf.config.list_physical_devices()],"
         " 'modules': sorted(m for m in ('pandas', 'scipy', 'sklearn') if m in sys.modules)}))")


def git_show(ref, path):
    return subprocess.run(["git", "show", f"{ref}:{path}"], cwd=ROOT, capture_output=True, text=True,
                          check=True).stdout


def make(venv, install_cmds):
    shutil.rmtree(venv, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    py = venv / "bin" / "python"
    for cmd in install_cmds:
        done = subprocess.run([str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                               *cmd], cwd=ROOT, capture_output=True, text=True)
        if done.returncode != 0:
            sys.exit(f"pip install into {venv} failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    return py


def size_bytes(folder):
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file() and not f.is_symlink())


def tf_distributions(py):
    out = subprocess.run([str(py), "-m", "pip", "list", "--format=json"], capture_output=True, text=True,
                         check=True).stdout
    return sorted(f"{p['name']} {p['version']}" for p in json.loads(out)
                  if p["name"].lower().replace("_", "-") in TF_DISTRIBUTIONS)


def cpu_of(py, code):
    """CPU seconds (user + system) of a fresh interpreter running ``code``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([str(py), "-c", code], check=True, capture_output=True,
                   env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def probe(py):
    done = subprocess.run([str(py), "-c", "import json\n" + PROBE], capture_output=True, text=True,
                          check=True)
    info = json.loads(done.stdout.strip().splitlines()[-1])
    info["cuInit line"] = "cuInit" in done.stderr
    return info


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--before-ref", default=LAST_010)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--keep", default=None, help="make the environments here and keep them")
    a = p.parse_args()
    work = Path(a.keep) if a.keep else Path(tempfile.mkdtemp(prefix="bench-packaging-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        old = tomllib.loads(git_show(a.before_ref, "pyproject.toml"))["project"]
        constraints = work / "constraints-0.1.0.txt"
        constraints.write_text(git_show(a.before_ref, "constraints.txt"))
        envs = {
            "before": make(work / "before", [["-c", str(constraints), *old["dependencies"],
                                              *old["optional-dependencies"]["test"]]]),
            "after": make(work / "after", [["--no-deps", "-r", "requirements/test.txt"]]),
        }
        facts = {}
        for name, py in envs.items():
            facts[name] = {"size_gb": size_bytes(py.parent.parent) / 1e9, "tf": tf_distributions(py),
                           **probe(py), "cpu": {k: [] for k in IMPORT}}
        for _ in range(a.runs):  # interleaved, so load on the machine hits both alike
            for name, py in envs.items():
                for kind, code in IMPORT.items():
                    facts[name]["cpu"][kind].append(cpu_of(py, code))
        for name, f in facts.items():
            print(f"{name:>6}: {f['size_gb']:.2f} GB; TensorFlow distributions: {', '.join(f['tf'])}; "
                  f"CUDA build: {f['cuda_build']}; cuInit line on device listing: {f['cuInit line']}; "
                  f"imported with TensorFlow: {', '.join(f['modules']) or 'nothing else'}")
            for kind, values in f["cpu"].items():
                print(f"        import tensorflow + {kind}: "
                      + ", ".join(f"{v:.2f}" for v in values) + f" CPU-s (min {min(values):.2f})")
        b, c = facts["before"], facts["after"]
        print(f"ratio after/before: size {c['size_gb'] / b['size_gb']:.2f}; "
              + "; ".join(f"{kind} import CPU {min(c['cpu'][kind]) / min(b['cpu'][kind]):.2f}"
                          for kind in IMPORT))
    finally:
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
