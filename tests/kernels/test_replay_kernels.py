"""Cells that need hosts show, where the hosts are missing, what they printed in a recorded run.

Here: the tests of test_replay that need Jupyter kernels; the module's text and its other tests
are in processes/test_replay.py."""

import subprocess
import sys

import nbformat
import pytest
from conftest import ROOT
from test_replay import HOSTS_CELL, NB10, REC10, execute, notebook

from mwhelpers.workshop.replay import Recording, RecordingError, record


def test_a_recorded_cell_is_shown_where_it_cannot_run(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    ran = notebook(tmp_path / "ran.ipynb", [("x = 1", None), (HOSTS_CELL, "hosts")])
    execute(ran, tmp_path)
    saved = record(ran, tmp_path / "nb" / "recorded" / "demo.json", note="on two test hosts")
    assert saved["cells"]["hosts"]["source"] == HOSTS_CELL
    assert [list(o) for o in saved["cells"]["hosts"]["outputs"]] == [["stream", "text"], ["data"]]

    # A laptop: the kernel starts in the notebook's folder, and the cell shows the recording.
    here = notebook(tmp_path / "nb" / "here.ipynb", [(
        "from mwhelpers.workshop.replay import Recording\n"
        "Recording.find('demo').show('hosts', 'no hosts given')", "hosts")])
    nb = execute(here, tmp_path / "nb")
    shown = nb.cells[0].outputs
    assert shown[0].data["text/plain"].startswith("[not run here: no hosts given. Recorded on ")
    assert shown[0].data["text/plain"].endswith(" on two test hosts:]")
    assert "<i>[not run here" in shown[0].data["text/html"]
    assert shown[1].text == "ran on node1 and node2\n"
    assert shown[2].data["text/html"] == "<b>a table</b>"


def test_record_refuses_what_would_teach_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    skipped = notebook(tmp_path / "skipped.ipynb", [("pass", "hosts")])
    execute(skipped, tmp_path)
    with pytest.raises(RecordingError, match="cell replay:hosts printed nothing .* was it skipped"):
        record(skipped, tmp_path / "r.json")
    failed = nbformat.read(skipped, as_version=4)
    failed.cells[0].outputs = [nbformat.v4.new_output("error", ename="ConnectionError",
                                                      evalue="ssh: no route", traceback=[])]
    nbformat.write(failed, tmp_path / "failed.ipynb")
    with pytest.raises(RecordingError, match=r"replay:hosts failed .*ConnectionError: ssh: no route"):
        record(tmp_path / "failed.ipynb", tmp_path / "r.json")
    with pytest.raises(RecordingError, match="has no cell tagged replay:KEY"):
        record(notebook(tmp_path / "none.ipynb", [("print(1)", None)]), tmp_path / "r.json")
    twice = notebook(tmp_path / "twice.ipynb", [("print(1)", "a"), ("print(2)", "a")])
    with pytest.raises(RecordingError, match="two cells are tagged replay:a"):
        record(twice, tmp_path / "r.json")
    assert not (tmp_path / "r.json").exists()


def test_notebook_10_without_hosts_shows_the_recorded_run(tmp_path):
    # The suite runs the kernel in its output folder, here outside the checkout: the recording is
    # found beside the notebook all the same.
    proc = subprocess.run([sys.executable, "-m", "mwhelpers.workshop.suite", str(NB10), "--output",
                           str(tmp_path), "-p", "ssh_hosts", "", "-p", "use_ray", "False"],
                          capture_output=True, text=True,
                          cwd=tmp_path, timeout=300,
                          env={**__import__("os").environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    nb = nbformat.read(tmp_path / NB10.name, as_version=4)
    shown = {}
    for cell in nb.cells:
        tags = [t for t in cell.metadata.get("tags", []) if t.startswith("replay:")]
        if tags:
            shown[tags[0][7:]] = "".join(o.get("text") or o.get("data", {}).get("text/plain", "")
                                         for o in cell.outputs)
    assert set(shown) == set(Recording.load(REC10).cells)
    for key, text in shown.items():
        assert text.startswith("[not run here: "), (key, text[:200])
        assert "SKIPPED" not in text
    assert "ran on " in shown["ssh-train"] and "submitted batch job" in shown["sbatch"]
    assert "on Ray" in shown["ray-train"]
