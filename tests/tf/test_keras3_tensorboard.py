"""Keras 3's TensorBoard callback under multi-worker MWMS, mended by mwhelpers
(``mwhelpers/taskside/kerastensorboard.py``, docs/keras-tensorboard.md).

Two real workers through the magics: with the mend only the chief's event files are in the
folder named, and no worker's temporary folder is left; with ``--no-keras-fix`` both
workers' files are there (the program undoes this mend alone: without the fit mend, fit
fails).
"""

import shutil

import pytest
from conftest import ROOT, results

from mwhelpers.taskside import kerasbase

PROGRAM = ROOT / "tests" / "programs" / "keras3_tensorboard.py"
NOTICE = "[mwhelpers] Keras 3.15.1 TensorBoard under multi-worker MWMS"


def event_files(folder):
    """{subfolder: how many event files} under ``folder``."""
    counts: dict[str, int] = {}
    for path in folder.rglob("events.out.tfevents.*"):
        where = str(path.parent.relative_to(folder))
        counts[where] = counts.get(where, 0) + 1
    return counts


@pytest.mark.parametrize("mended", [True, False])
def test_only_the_chief_writes_to_the_log_dir(ip, rt, monkeypatch, tmp_path, mended):
    monkeypatch.delenv("TF_USE_LEGACY_KERAS", raising=False)
    monkeypatch.delenv(kerasbase.KERAS_FIX_ENV, raising=False)
    shutil.copy(PROGRAM, "train.py")
    ip.run_line_magic("cluster", "2")
    ip.run_line_magic("worker", "all --bg train.py logs_tb" + ("" if mended else " plain"))
    ip.run_line_magic("waitworkers", "--timeout 150")
    res = results(rt)
    assert res["worker:0"]["weights_sum"] == res["worker:1"]["weights_sum"]  # trained together
    files = event_files(tmp_path / "logs_tb")
    leftovers = [p.name for p in (tmp_path / "logs_tb").iterdir() if p.name.startswith("workertemp")]
    writers = {int(p.name.split(".")[-3]) for p in (tmp_path / "logs_tb").rglob("events.out.*")}
    print(files, leftovers, writers)
    assert not leftovers  # also after the evaluate and the predict that followed fit
    if mended:
        assert writers == {rt.get_run("worker:0").pid}  # the chief's files only
        # fit's; evaluate's and predict's set_model each write the graph again into train/, and
        # evaluate writes its results into validation/ (Keras's own new writers, bug or not).
        assert files == {"train": 3, "validation": 2}, files
        for run in rt.runs.values():
            assert len([ln for ln in run.lines() if ln.startswith(NOTICE)]) == 1, run.tail(30)
        (other,) = [ln for ln in rt.get_run("worker:1").lines() if ln.startswith(NOTICE)]
        assert "this task writes to " in other and "workertemp_1 and deletes it" in other
    else:
        assert not any(NOTICE in ln for run in rt.runs.values() for ln in run.lines())
        assert writers == {rt.get_run(t).pid for t in ("worker:0", "worker:1")}  # the test can fail
