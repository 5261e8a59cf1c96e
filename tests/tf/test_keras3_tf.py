"""Keras 3 ``fit`` under MultiWorkerMirroredStrategy, mended by mwhelpers (keras-
team/keras#20585).

Here: the tests of test_keras3 that need TensorFlow; the module's text and its other tests are
in inprocess/test_keras3.py."""

import re
import shutil
import time

import pytest
from conftest import results
from test_keras3 import NOTICE, PROGRAMS, keras3, said  # noqa: F401


def test_two_workers_fit_with_keras3_like_one_process(ip, rt, keras3, tmp_path):  # noqa: F811
    shutil.copy(PROGRAMS / "keras3_train.py", "train.py")
    # ckpt does not exist yet: both workers create it at their first save (the chief's folder,
    # and the other's temporary folder inside it), at the same time.
    ip.run_line_magic("cluster", "2")
    ip.run_line_magic("worker", "0 --bg train.py ckpt")
    ip.run_line_magic("worker", "1 --bg train.py ckpt")
    ip.run_line_magic("waitworkers", "--timeout 150")
    # Nothing warned before the launch: mwhelpers mends this fit.
    assert not [ln for ln in rt.echo_lines if "warning" in ln], rt.echo_lines
    res = results(rt)
    w0, w1 = res["worker:0"], res["worker:1"]
    for r in (w0, w1):
        assert r["replicas"] == 2
        assert r["loss"][-1] < r["loss"][0] * 0.1  # it learns
        # The same weights after training as one process without a strategy reaches on the
        # same global batches (the last one partial: 4 of 32, 2 per worker).
        assert r["weights_sum"] == pytest.approx(r["alone_weights_sum"], rel=1e-5)
        assert r["loss"] == pytest.approx(r["alone_loss"], rel=1e-5)
        assert len(r["val_loss"]) == 3 and r["val_loss"][-1] < r["val_loss"][0]
        assert r["predict_shape"] == [516, 1]  # every sample, gathered from both workers
        assert r["predict_head"] == pytest.approx(r["alone_predict_head"], rel=1e-4, abs=1e-5)
        # ModelCheckpoint: one file, the chief's; the other worker's copy is gone.
        assert r["files"] == ["model.keras"]
    # Synchronous: both workers hold the same weights and report the same numbers.
    for key in ("weights_sum", "loss", "val_loss", "evaluate", "predict_head"):
        assert w0[key] == w1[key], key
    assert w0["saved_weights_sum"] == pytest.approx(w0["weights_sum"])  # the file is whole
    for run in rt.runs.values():
        assert len(said(run, NOTICE)) == 1, run.tail(40)
        assert "keras-team/keras#20585" in said(run, NOTICE)[0]
        (facts,) = said(run, "[mwhelpers] this task: ")
        assert "with Keras 3.15.1 (TF_USE_LEGACY_KERAS=unset at import)" in facts
    (other,) = said(rt.get_run("worker:1"), "[mwhelpers] Keras 3.15.1 ModelCheckpoint")
    assert "this task saves to " in other and "workertemp_1/model.keras and deletes it" in other


def test_the_tutorial_program_with_import_keras_trains_unchanged(ip, rt, keras3, tmp_path):  # noqa: F811
    """The multi-worker Keras tutorial's main.py, unchanged, and its mnist_setup.py with
    ``import keras`` in place of ``tf.keras`` (offline digits), on two workers, the tutorial's
    way: worker 0 in the background (ready once its port opens), worker 1 in the foreground,
    streaming into the cell."""
    tutorial = PROGRAMS / "tutorial"
    shutil.copy(tutorial / "main.py", "main.py")
    setup = (tutorial / "mnist_setup.py").read_text()
    setup = setup.replace("import tensorflow as tf\n", "import keras\nimport tensorflow as tf\n")
    (tmp_path / "mnist_setup.py").write_text(setup.replace("tf.keras.", "keras."))
    assert "tf.keras" not in (tmp_path / "mnist_setup.py").read_text()
    ip.run_line_magic("cluster", "2")
    ip.run_line_magic("worker", "0 --bg main.py 2 10")
    w0 = rt.get_run("worker:0")
    assert w0.ready_after is not None and w0.running
    # Worker 0's server is up and it waits for worker 1; its log says so (TF writes the line
    # just after the port opens).
    deadline = time.monotonic() + 10
    while not any("Started server with target" in ln for ln in w0.tail(0)):
        assert time.monotonic() < deadline, "\n".join(w0.tail(0))
        time.sleep(0.05)
    ip.run_line_magic("worker", "1 main.py 2 10")  # in the foreground, as the tutorial does
    assert any(ln.startswith("[worker:1] Epoch 2/2") for ln in rt.echo_lines)
    ip.run_line_magic("waitworkers", "--timeout 150")
    progress = {}
    for run in rt.runs.values():
        assert run.returncode == 0
        assert len(said(run, NOTICE)) == 1
        assert len(said(run, "[mwhelpers] tf.data autotuning is off")) == 1
        # Keras 3's progress bar, as the log reader shows it: the bar's last state, without its
        # colour codes ("10/10 ━━━━ 1s 50ms/step - accuracy: 0.1 - loss: 2.3").
        progress[str(run.task)] = [ln.split(" - ", 1)[1] for ln in run.lines()
                                   if re.match(r"^10/10 ━+ .* - accuracy: ", ln)]
    # Both workers report the same losses and accuracies, epoch by epoch.
    assert len(progress["worker:0"]) == 2 and progress["worker:0"] == progress["worker:1"]
