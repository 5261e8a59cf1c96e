"""mwhelpers inside a real Jupyter kernel: a restart or a shutdown of the kernel ends its workers,
and a failed worker fails the notebook under nbclient and papermill.  (A kernel killed by
SIGKILL, on every backend: test_backends.py.)

Here: the tests of test_kernel that need Jupyter kernels; the module's text and its other tests
are in processes/test_kernel.py."""

import nbformat
import pytest
from test_kernel import failing_notebook, kernel_env


def test_a_failed_worker_fails_the_notebook_under_nbclient(tmp_path, monkeypatch):
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    monkeypatch.setenv("PYTHONPATH", kernel_env()["PYTHONPATH"])
    nb = nbformat.read(failing_notebook(tmp_path / "fail.ipynb"), as_version=4)
    client = NotebookClient(nb, timeout=120, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}})
    with pytest.raises(CellExecutionError) as err:
        client.execute()
    assert "WorkerFailed" in str(err.value) and "worker:1 failed: exit code 3" in str(err.value)
    outputs = nb.cells[1].outputs
    assert any(o.get("text", "").startswith("[worker:1] training...") for o in outputs)
    assert nb.cells[2].get("outputs", []) == []


def test_a_failed_worker_fails_the_notebook_under_papermill(tmp_path, monkeypatch):
    import papermill
    from papermill.exceptions import PapermillExecutionError

    monkeypatch.setenv("PYTHONPATH", kernel_env()["PYTHONPATH"])
    src = failing_notebook(tmp_path / "fail.ipynb")
    with pytest.raises(PapermillExecutionError) as err:
        papermill.execute_notebook(str(src), str(tmp_path / "out.ipynb"), kernel_name="python3",
                                   cwd=str(tmp_path), progress_bar=False)
    assert err.value.ename == "WorkerFailed"
    assert "worker:1 failed: exit code 3" in err.value.evalue
