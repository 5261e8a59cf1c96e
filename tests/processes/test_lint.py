"""The code and the notebooks pass ruff, and the package passes mypy, with the project's
configuration (pyproject.toml)."""

import subprocess
import sys

from conftest import ROOT


def test_ruff_finds_nothing():
    done = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--output-format",
                           "concise", str(ROOT)], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


def test_ruff_reads_the_notebooks(tmp_path):
    """A notebook with an unused import fails: notebooks are linted, not skipped."""
    import nbformat

    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("import json\nprint(1)\n")])
    path = tmp_path / "bad.ipynb"
    nbformat.write(nb, path)
    done = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--config",
                           str(ROOT / "pyproject.toml"), str(path)], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 1 and "F401" in done.stdout, done.stdout + done.stderr


def test_mypy_finds_nothing():
    """The type checker, on the package ([tool.mypy]: files, strictness, what is left out).
    Its cache, .mypy_cache in the checkout (which ignores itself in git), makes a second run
    take about a second."""
    done = subprocess.run([sys.executable, "-m", "mypy", "--no-error-summary"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and not done.stdout.strip(), done.stdout + done.stderr


def test_the_plugin_interface_has_hints_that_resolve():
    """What a backend subclasses or calls is annotated in full, and the annotations resolve at
    run time (typing.get_type_hints), as the public API's do (test_packaging.py)."""
    import inspect
    import typing

    from mwhelpers import ending
    from mwhelpers.backends import agent, base, kubernetes, local, options, raynodes, slurm, ssh

    functions = [ending.end, ending.end_local, options.text, options.seconds, options.quantity,
                 options.option, slurm.write_sbatch, kubernetes.write_kubernetes, agent.host_list,
                 agent.forwarded_env]
    for cls in (base.Launcher, base.Process, agent.AgentLauncher, agent.AgentProcess,
                options.OptionSpec, options.BackendOptions):
        for name, f in vars(cls).items():
            f = f.fget if isinstance(f, property) else f
            f = f.__func__ if isinstance(f, classmethod) else f
            if inspect.isfunction(f) and (not name.startswith("_") or name == "__init__"):
                functions.append(f)
    for cls in (base.LaunchSpec, base.Placement, options.OptionSpec, local.LocalOptions,
                agent.AgentOptions, ssh.SSHOptions, slurm.SlurmOptions, raynodes.RayOptions):
        assert typing.get_type_hints(cls)
    for fn in functions:
        hints = typing.get_type_hints(fn)  # raises if an annotation does not resolve
        params = [n for n in inspect.signature(fn).parameters if n not in ("self", "cls")]
        missing = [n for n in params if n not in hints] + ([] if "return" in hints else ["return"])
        assert not missing, f"{fn.__qualname__} lacks hints for {missing}"
