"""Cells that need hosts show, where the hosts are missing, what they printed in a recorded run.

Real kernels execute the notebooks (nbclient), the recording is made from a real executed
copy, and notebook 10's own recording is checked against its cells and replayed by the suite
on a machine without test hosts.
"""

import json
import subprocess
import sys

import nbformat
import pytest
from conftest import ROOT

from mwhelpers.workshop.replay import Recording, RecordingError, record, stale

NB10 = ROOT / "notebooks" / "10_more_machines.ipynb"
REC10 = ROOT / "notebooks" / "recorded" / "10_more_machines.json"


def notebook(path, cells):
    """cells: (source, replay key or None)."""
    nb = nbformat.v4.new_notebook()
    for source, key in cells:
        cell = nbformat.v4.new_code_cell(source)
        if key:
            cell.metadata["tags"] = [f"replay:{key}"]
        nb.cells.append(cell)
    nbformat.write(nb, path)
    return path


def execute(path, cwd):
    """Run the notebook at ``path`` in a real kernel started in ``cwd``; keep its outputs."""
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=60, kernel_name="python3",
                   resources={"metadata": {"path": str(cwd)}}).execute()
    nbformat.write(nb, path)
    return nb


HOSTS_CELL = ("from IPython.display import HTML, display\n"
              "print('ran on node1 and node2')\n"
              "display(HTML('<b>a table</b>'))")


@pytest.mark.notebook
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


@pytest.mark.notebook
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


def test_a_missing_broken_or_stale_recording_is_named(tmp_path):
    with pytest.raises(RecordingError, match=r"no recorded/nothing\.json beside this notebook"):
        Recording.find("nothing", start=tmp_path)
    (tmp_path / "broken.json").write_text("{")
    with pytest.raises(RecordingError, match=r"broken\.json is not valid JSON"):
        Recording.load(tmp_path / "broken.json")
    (tmp_path / "other.json").write_text('{"cells": []}')
    with pytest.raises(RecordingError, match="is not a recording"):
        Recording.load(tmp_path / "other.json")
    rec = Recording({"format": 1, "cells": {"a": {"source": "", "outputs": []}}})
    with pytest.raises(RecordingError, match=r"has no cell 'b' \(it has a\)"):
        rec.show("b")

    nb = notebook(tmp_path / "nb.ipynb", [("print(1)", "same"), ("print(2)", "changed"), ("print(3)", "new")])
    (tmp_path / "rec.json").write_text(json.dumps({"format": 1, "cells": {
        "same": {"source": "print(1)", "outputs": []}, "changed": {"source": "print(0)", "outputs": []},
        "gone": {"source": "", "outputs": []}}}))
    assert sorted(stale(nb, tmp_path / "rec.json")) == [
        "changed: the cell changed since it was recorded",
        "gone: recorded, but no cell is tagged replay:gone any more", "new: not recorded"]


def test_the_command_line_says_what_went_wrong(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "mwhelpers.workshop.replay", str(tmp_path / "no.ipynb"),
                           str(tmp_path / "r.json")], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 2 and proc.stderr.startswith("error: ") and "Traceback" not in proc.stderr


def test_notebook_10s_recording_matches_its_cells_and_shows_a_real_run():
    assert stale(NB10, REC10) == [], "re-record it: see the docstring of mwhelpers/workshop/replay.py"
    rec = Recording.load(REC10)
    text = {key: "".join(o.get("text") or o["data"]["text/plain"] for o in cell["outputs"])
            for key, cell in rec.cells.items()}
    assert "Cluster(2 worker) over ssh on " in text["ssh-cluster"]
    assert text["ssh-train"].count(" ran on ") == 2 and "2 task(s) finished" in text["ssh-train"]
    assert "Cluster(2 worker) over slurm on " in text["slurm-cluster"]
    assert "submitted batch job" in text["sbatch"] and text["sbatch"].count("replicas=2") == 2


@pytest.mark.tf
@pytest.mark.notebook
def test_notebook_10_without_hosts_shows_the_recorded_run(tmp_path):
    # The suite runs the kernel in its output folder, here outside the checkout: the recording is
    # found beside the notebook all the same.
    proc = subprocess.run([sys.executable, "-m", "mwhelpers.workshop.suite", str(NB10), "--output",
                           str(tmp_path), "-p", "ssh_hosts", ""], capture_output=True, text=True,
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
