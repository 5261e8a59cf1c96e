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
