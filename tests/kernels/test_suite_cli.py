"""``python -m mwhelpers.workshop.suite`` from an installed copy (no checkout around it): it takes a
notebook folder, and refuses clearly when there is nothing to run.

The tests described here that need more than this folder gives are in processes/test_suite_cli_plain.py."""

import shutil
import subprocess
import sys

import nbformat
import psutil
import pytest
from conftest import ROOT


@pytest.fixture
def installed(tmp_path):
    """mwhelpers copied alone into a site folder, as a wheel installs it."""
    site = tmp_path / "site"
    shutil.copytree(ROOT / "mwhelpers", site / "mwhelpers",
                    ignore=shutil.ignore_patterns("__pycache__"))
    return site


def suite(site, cwd, *args, **env):
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(site), "HOME": str(cwd), **env}
    return subprocess.run([sys.executable, "-m", "mwhelpers.workshop.suite", "-j", "1", *args], cwd=cwd,
                          env=env, capture_output=True, text=True, timeout=180)


def notebook(path, code):
    """A notebook at ``path``: a parameters cell (``n = 2``), then ``code``."""
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("n = 2", metadata={"tags": ["parameters"]}),
                nbformat.v4.new_code_cell(code)]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, path)
    return path


def tiny_notebook(path):
    return notebook(path, "import mwhelpers\nassert n == 3\nprint('ran', mwhelpers.__file__)")


def test_a_folder_of_notebooks_runs_from_an_installed_copy(installed, tmp_path):
    tiny_notebook(tmp_path / "lessons" / "one.ipynb")
    out = suite(installed, tmp_path, "lessons", "-p", "n", "3")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "1 passed, 0 failed" in out.stdout
    executed = nbformat.read(tmp_path / "output" / "one.ipynb", as_version=4)
    text = "".join(o.get("text", "") for o in executed.cells[-1].outputs)
    assert f"ran {installed}" in text  # the kernel imported the installed copy
    # and ./notebooks is the default folder
    tiny_notebook(tmp_path / "notebooks" / "two.ipynb")
    out = suite(installed, tmp_path, "-p", "n", "3")
    assert out.returncode == 0 and "two.ipynb: ok" in out.stdout, out.stdout + out.stderr


def test_a_process_left_running_is_named_and_ended_and_one_on_its_way_out_is_not(installed,
                                                                               tmp_path):
    """What a notebook leaves running after its kernel has exited fails the notebook, named by
    pid and command line, and is ended; a process that ends within the grace is not counted."""
    notebook(tmp_path / "lessons" / "leaks.ipynb",
             "import subprocess\n"
             "stays = subprocess.Popen(['sleep', '97'], start_new_session=True)\n"
             "goes = subprocess.Popen(['sleep', '1'], start_new_session=True)\n"
             "print('pid', stays.pid)")
    out = suite(installed, tmp_path, "lessons")
    assert out.returncode == 1, out.stdout + out.stderr
    executed = nbformat.read(tmp_path / "output" / "leaks.ipynb", as_version=4)
    pid = int("".join(o.get("text", "") for o in executed.cells[-1].outputs).split()[1])
    assert f"left 1 process(es) running after it finished (ended now): pid {pid} sleep 97" \
        in out.stdout, out.stdout
    assert "sleep 1" not in out.stdout
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_what_a_notebook_leaves_in_its_temporary_folder_is_removed(installed, tmp_path):
    """A killed worker leaves its temporary files (TensorFlow's autograph modules among them):
    each notebook runs with a TMPDIR of its own, removed when it is done."""
    notebook(tmp_path / "leaves.ipynb",
             "import subprocess, sys, tempfile\n"
             "subprocess.run([sys.executable, '-c', 'import os, signal, tempfile; "
             "tempfile.mkstemp(); os.kill(os.getpid(), signal.SIGKILL)'])\n"
             "print('tmp', tempfile.gettempdir())")
    base = tmp_path / "tmp"
    base.mkdir()
    out = suite(installed, tmp_path, "leaves.ipynb", TMPDIR=str(base))
    assert out.returncode == 0, out.stdout + out.stderr
    executed = nbformat.read(tmp_path / "output" / "leaves.ipynb", as_version=4)
    seen = "".join(o.get("text", "") for o in executed.cells[-1].outputs).split()[1]
    assert seen.startswith(f"{base}/mws-"), seen  # the kernel had a folder of its own
    assert list(base.iterdir()) == []  # and the file the killed process left went with it
