"""``python -m mwhelpers.workshop.suite`` from an installed copy (no checkout around it): it takes
a notebook folder, and refuses clearly when there is nothing to run.

Here: the tests of test_suite_cli that need neither TensorFlow, kernels nor hosts; the module's
text and its other tests are in kernels/test_suite_cli.py."""

import pytest
from test_suite_cli import installed, suite  # noqa: F401


@pytest.mark.parametrize("args, says", [
    ((), "no notebook folder here: name the notebooks or their folder"),
    (("missing",), "no notebook or folder"),
    (("empty",), "has no notebooks (*.ipynb) to run"),
    (("notes.txt",), "is not a notebook (.ipynb)"),
])
def test_nothing_to_run_is_refused_with_what_to_do(installed, tmp_path, args, says):  # noqa: F811
    (tmp_path / "empty").mkdir()
    (tmp_path / "notes.txt").write_text("hello")
    out = suite(installed, tmp_path, *args)
    assert out.returncode == 2, out.stdout + out.stderr
    assert says in out.stderr and "Traceback" not in out.stderr
