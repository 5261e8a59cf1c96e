"""The library declares ranges; the tutorials' lock pins one environment with one TensorFlow.

The environment checked here is the one the tests run in (dev.py installs the lock into it).

The tests described here that need more than this folder gives are in tf/test_packaging_tf.py."""

import importlib.metadata
import re
import subprocess
import sys

import tomllib
from conftest import ROOT
from packaging.requirements import Requirement
from packaging.version import Version

import mwhelpers.packages

TF_DISTRIBUTIONS = set(mwhelpers.packages.TF_DISTRIBUTIONS)
# Installed by the lock without the dependencies they declare (see requirements/tutorials.txt).
WITHOUT_DEPS = {"mlxtend"}


def norm(name):
    return re.sub(r"[-_.]+", "-", name).lower()


def project():
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def lock(name):
    pins = {}
    for line in (ROOT / "requirements" / name).read_text().splitlines():
        if line.strip() and not line.startswith(("#", "-r")):
            pkg, version = line.split("==")
            pins[norm(pkg)] = version.strip()
    return pins


def environment_yml_pins():
    text = (ROOT / "environment.yml").read_text()
    block = text.split("- pip:", 1)[1]
    return {norm(m.group(1)): m.group(2) for m in re.finditer(r"^\s+-\s+([\w.-]+)==(\S+)$", block, re.M)}


def test_the_library_needs_only_what_the_kernel_side_imports_as_ranges():
    reqs = [Requirement(r) for r in project()["dependencies"]]
    # typing-extensions on Python 3.10 only: typing.Unpack for launch's **options
    assert sorted(norm(r.name) for r in reqs) == ["ipython", "numpy", "psutil", "typing-extensions"]
    for r in reqs:
        assert r.specifier and all(s.operator == ">=" for s in r.specifier), f"{r} is not a floor"
    # TensorFlow is the environment's own, in no extra either
    extras = project()["optional-dependencies"]
    named = {norm(Requirement(r).name) for reqs in extras.values() for r in reqs}
    assert not named & TF_DISTRIBUTIONS


def test_the_lock_satisfies_the_library_ranges_and_has_one_tensorflow():
    pins = lock("tutorials.txt")
    for r in map(Requirement, project()["dependencies"]):
        assert Version(pins[norm(r.name)]) in r.specifier, f"lock {pins[norm(r.name)]} outside {r}"
    assert set(pins) & TF_DISTRIBUTIONS == {"tensorflow-cpu"}
    assert "tf-keras" not in pins  # the notebooks run TensorFlow's own Keras 3
    assert not {"scikit-learn", "pandas"} & set(pins)  # mlxtend without its stack
    assert {"jax", "jaxlib", "scipy"} <= set(pins)  # Keras 3 on JAX (SciPy: JAX requires it)
    assert "orbax-checkpoint" in pins  # keras.callbacks.OrbaxCheckpoint, on JAX across processes
    assert not set(pins) & set(lock("test.txt"))


def test_the_installed_environment_is_the_lock_with_one_tensorflow():
    installed = {norm(d.metadata["Name"]): d.version for d in importlib.metadata.distributions()}
    wanted = lock("tutorials.txt") | lock("test.txt")
    differ = {n: (v, installed.get(n)) for n, v in wanted.items() if installed.get(n) != v}
    assert not differ, f"lock vs installed: {differ}"
    assert set(installed) & TF_DISTRIBUTIONS == {"tensorflow-cpu"}, sorted(set(installed) & TF_DISTRIBUTIONS)
    # pip's own view: the only broken requirements are those the lock leaves out on purpose
    out = subprocess.run([sys.executable, "-m", "pip", "check"], capture_output=True, text=True).stdout
    broken = sorted(ln for ln in out.splitlines() if ln.strip())
    assert broken == sorted(
        [f"mlxtend 0.25.0 requires {d}, which is not installed." for d in
         ("joblib", "pandas", "scikit-learn")]), broken


def test_environment_yml_is_the_lock_less_what_needs_no_deps():
    text = (ROOT / "environment.yml").read_text()
    wanted = lock("tutorials.txt") | lock("test.txt")
    assert environment_yml_pins() == {n: v for n, v in wanted.items() if n not in WITHOUT_DEPS}
    apart = " ".join(f"{n}=={wanted[n]}" for n in sorted(WITHOUT_DEPS))
    assert f"pip install --no-deps {apart} -e ." in text
    assert "python=3.11" in text


def test_one_version_source():
    import mwhelpers

    assert project()["dynamic"] == ["version"] and "version" not in project()
    assert importlib.metadata.version("mwhelpers") == mwhelpers.__version__
    changelog = (ROOT / "CHANGELOG.md").read_text()
    assert f"## {mwhelpers.__version__}" in changelog
    assert (ROOT / "LICENSE").read_text().lstrip().startswith("Apache License")
    assert (ROOT / "mwhelpers" / "py.typed").exists()


def test_readme_commands_are_the_ones_ci_runs():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    assert "python3 dev.py suite" in readme and "python3 dev.py test" in readme
    assert "python3 dev.py matrix" in readme
    assert "python3 dev.py test" in ci and "python3 dev.py matrix" in ci


def _collected(*args):
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:xdist",
                          "-p", "no:cacheprovider", *args], cwd=ROOT, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return {line for line in out.stdout.splitlines() if "::" in line}


def test_dev_test_runs_every_ray_test_in_a_round_of_their_own():
    import dev

    assert dev.test_rounds(["-x"]) == [["-m", "not ray", "-x"],
                                       ["-m", "ray", "-n", "1", "--dist", "loadgroup", "-x"]]
    assert dev.test_processes(dev.test_rounds([])[1]) == []  # one test process: nothing added
    assert dev.test_rounds(["-m", "tf"]) == [["-m", "tf"]]  # the caller's markers: one round
    assert dev.test_rounds(dev.fast_selection(["--fast"])) == [["-m", dev.FAST]]
    # What starts Ray nodes is in the Ray round: the module of the cluster's tests, the warm
    # servers' and the backends' Ray cases, notebook 10 (a private head); nothing else is.
    # (A test that takes the Ray cluster's fixture without the marker is refused at collection.)
    ray = _collected("-m", "ray", "tests/hosts", "tests/processes/test_backends.py")
    assert all("ray" in t.split("::")[-1] or t.startswith("tests/hosts/test_ray.py::")
               for t in ray), sorted(ray)
    module = (ROOT / "tests" / "hosts" / "test_ray.py").read_text()
    assert len({t for t in ray if "test_ray.py" in t}) == module.count("\ndef test_")
    assert {t.split("::")[0] for t in ray if "[ray]" in t} == {
        "tests/hosts/test_warmhosts.py", "tests/processes/test_backends.py"}
    assert any("more_machines_notebook" in t for t in ray)

PUBLIC_METHODS = {
    "Runtime": ["__init__", "define_cluster", "launch", "launch_all", "wait", "status", "log",
                "get_run", "kill", "kill_when", "wait_for_line", "end_all", "supervise",
                "results", "timeline", "interactive", "close"],
    "Cluster": ["__init__", "check_task", "port", "address", "host_of", "gpus_of", "cluster_spec",
                "tf_config", "close"],
}


def test_the_public_api_has_type_hints_that_resolve():
    import inspect
    import typing

    import mwhelpers
    from mwhelpers.workshop import load_mnist

    functions = [load_mnist] + [getattr(mwhelpers, name) for name in (
        "runtime", "set_runtime", "parse_task", "avoid_teardown_stall", "register_backend",
        "write_sbatch", "write_kubernetes")]
    for cls, methods in PUBLIC_METHODS.items():
        functions += [getattr(getattr(mwhelpers, cls), m) for m in methods]
    for fn in functions:
        hints = typing.get_type_hints(fn)  # raises if an annotation does not resolve
        params = [n for n in inspect.signature(fn).parameters if n != "self"]
        missing = [n for n in params if n not in hints] + ([] if "return" in hints else ["return"])
        assert not missing, f"{fn.__qualname__} lacks hints for {missing}"


def test_versions_name_the_tensorflow_distribution_without_importing_it():
    # mwhelpers.versions stays the function once the runtime is imported (its module is
    # mwhelpers.packages: importing a submodule of that name would replace it)
    code = ("import sys, mwhelpers, mwhelpers.workers, mwhelpers.magics\n"
            "print(mwhelpers.versions('tensorflow', 'keras', 'no-such-package'))\n"
            "print(mwhelpers.tensorflow_distributions(), 'tensorflow' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=ROOT).stdout.splitlines()
    assert out[0] == "TensorFlow 2.21.0 (tensorflow-cpu) | keras 3.15.1 | no-such-package not installed"
    assert out[1] == "[('tensorflow-cpu', '2.21.0')] False"
