"""Cells that need hosts show, where the hosts are missing, what they printed in a recorded run.

Real kernels execute the notebooks (nbclient), the recording is made from a real executed
copy, and notebook 10's own recording is checked against its cells and replayed by the suite
on a machine without test hosts.

The tests described here that need more than this folder gives are in kernels/test_replay_kernels.py."""

import json
import subprocess
import sys

import nbformat
import pytest
from conftest import ROOT

from mwhelpers.workshop.replay import Recording, RecordingError, stale

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




def test_a_stand_in_shows_the_recorded_cell_or_says_skipped(tmp_path, capsys):
    from mwhelpers.workshop.replay import stand_in

    folder = tmp_path / "recorded"
    folder.mkdir()
    (folder / "nb.json").write_text(json.dumps({"format": 1, "recorded": "2026-11-29", "cells": {
        "hosts": {"source": "", "outputs": [{"stream": "stdout", "text": "ran on node1\n"}]}}}))
    stand_in("nb", start=tmp_path)("hosts", "no hosts here")
    assert "ran on node1" in capsys.readouterr().out
    stand_in("nb", needed=False, start=tmp_path)("hosts", "no hosts here")
    assert capsys.readouterr().out == "SKIPPED: no hosts here\n"
    not_here = stand_in("other", start=tmp_path)
    said = capsys.readouterr().out
    assert said.startswith("no recorded run to show: no recorded/other.json")
    not_here("hosts", "no hosts here")
    assert capsys.readouterr().out == "SKIPPED: no hosts here\n"
