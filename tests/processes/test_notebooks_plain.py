"""Every notebook runs headless (nbclient, papermill via the suite) and tells the truth.

Here: the tests of test_notebooks that need neither TensorFlow, kernels nor hosts; the module's
text and its other tests are in kernels/test_notebooks.py."""

import subprocess
import sys
import textwrap

import nbformat
import pytest
from conftest import ROOT
from test_notebooks import NOTEBOOKS, make_nb


def test_there_are_notebooks():
    assert NOTEBOOKS, "notebooks/ has no notebook"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_committed_notebook_is_clean_valid_and_parameterised(path):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, f"{path.name} has outputs"
    tagged = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    assert len(tagged) == 1 and tagged[0].cell_type == "code"
    assert "workdir" in tagged[0].source and "full_size" in tagged[0].source


def test_suite_starts_the_notebooks_that_took_longest_last_time_first(tmp_path):
    from mwhelpers.workshop.suite import longest_first, usual_seconds

    out = tmp_path / "out"
    out.mkdir()
    paths = [make_nb(tmp_path / f"{name}.ipynb", ["print(1)"]) for name in ("a", "b", "c", "d")]
    for name, seconds in (("a", 3.0), ("b", 40.0), ("c", None)):  # c failed; d never ran
        nb = nbformat.read(tmp_path / f"{name}.ipynb", as_version=4)
        nb.metadata["papermill"] = {"duration": seconds}
        nbformat.write(nb, out / f"{name}.ipynb")
    assert [p.stem for p in longest_first(paths, out)] == ["c", "d", "b", "a"]
    # never run, and one of them takes test hosts: that one first
    hosts = tmp_path / "e.ipynb"
    nb = nbformat.read(make_nb(hosts, ["print(1)"]), as_version=4)
    nb.cells[0].source += "\nssh_hosts = ''"
    nbformat.write(nb, hosts)
    assert [p.stem for p in longest_first([*paths, hosts], out)] == ["e", "c", "d", "b", "a"]
    # never run here, but it says how long it usually takes: in its place by that
    nb = nbformat.read(tmp_path / "d.ipynb", as_version=4)
    nb.metadata["mwhelpers"] = {"usual_seconds": 10}
    nbformat.write(nb, tmp_path / "d.ipynb")
    assert [p.stem for p in longest_first(paths, out)] == ["c", "b", "d", "a"]
    # a fresh checkout: no run at all, the suite's own notebooks in their usual order
    ours = sorted((ROOT / "notebooks").glob("*.ipynb"))
    usual = {p.stem: usual_seconds(p) for p in ours}
    assert all(0 < s < float("inf") for s in usual.values()), usual  # bench_suite --record-usual
    first = longest_first(ours, tmp_path / "empty")
    assert [usual[p.stem] for p in first] == sorted(usual.values(), reverse=True)


def test_a_dead_kernel_task_left_by_an_interrupt_is_not_reported_but_other_errors_are():
    # What the suite's notebook processes print when a Ctrl-C ends a kernel under nbclient's
    # feet (seen once in the Ctrl-C test above): asyncio's report of a task nobody awaited.
    program = textwrap.dedent("""
        import asyncio, gc
        from nbclient.exceptions import DeadKernelError
        from mwhelpers.workshop.suite import _no_dead_kernel_reports
        _no_dead_kernel_reports()
        async def dead(): raise DeadKernelError("Kernel died")
        async def other(): raise ValueError("kept")
        async def main():
            asyncio.ensure_future(dead()); asyncio.ensure_future(other()); await asyncio.sleep(0.1)
        asyncio.run(main()); gc.collect()
    """)
    proc = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                          timeout=60, cwd=ROOT, env={**__import__("os").environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr
    assert "ValueError: kept" in proc.stderr and "DeadKernelError" not in proc.stderr
