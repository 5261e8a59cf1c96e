"""Keras 3's LossScaleOptimizer (``mixed_float16``) under MultiWorkerMirroredStrategy, mended by
mwhelpers (taskside/kerasmixed.py, docs/keras-lossscale.md).

Here: the tests of test_keras3_mixed that need TensorFlow; the module's text and its other
tests are in inprocess/test_keras3_mixed.py."""

import json
import os
import subprocess
import sys
import time

import pytest
from conftest import ROOT, results
from test_keras3_mixed import MIRRORED, NOTICE, keras3, said  # noqa: F401

from mwhelpers.errors import WorkerTimeout
from mwhelpers.taskside import kerasbase, kerasmixed


@pytest.mark.parametrize("how", ["fit", "loop"])
def test_an_overflow_on_one_worker_skips_the_step_on_every_worker(ip, rt, keras3, how):  # noqa: F811
    ip.run_line_magic("cluster", "2")
    ip.run_line_magic("worker", f"0 --bg mixed.py {how} 4")
    ip.run_line_magic("worker", f"1 --bg mixed.py {how} 4")
    ip.run_line_magic("waitworkers", "--timeout 60")
    res = results(rt)
    w0, w1 = res["worker:0"], res["worker:1"]
    for r in (w0, w1):
        # 12 steps, the 5th skipped (the inner optimizer counts 11) and the scale halved once,
        # as one process does on the same global batches.
        assert (r["iterations"], r["loss_scale"]) == (11, 512.0)
        assert (r["alone"]["iterations"], r["alone"]["loss_scale"]) == (11, 512.0)
        assert r["weights_sum"] == pytest.approx(r["alone"]["weights_sum"], rel=1e-5)
    assert w0["weights_sum"] == w1["weights_sum"]  # the same weights on both, bit for bit
    for run in rt.runs.values():
        assert len(said(run, NOTICE)) == 1, run.tail(40)
        assert kerasmixed.ISSUE in said(run, NOTICE)[0]
        assert len(said(run, "step ")) == 12


def test_unmended_both_hang_and_the_stuck_report_names_it(ip, rt, keras3):  # noqa: F811
    ip.run_line_magic("cluster", "2")
    for i in (0, 1):
        ip.run_line_magic("worker", f"{i} --bg --no-keras-fix mixed.py loop 4")
    deadline = time.monotonic() + 60  # both log step 3, then stop in step 4
    while not all(said(r, "step 3") for r in rt.runs.values()):
        assert time.monotonic() < deadline, [r.tail(20) for r in rt.runs.values()]
        time.sleep(0.1)
    with pytest.raises(WorkerTimeout) as err:
        ip.run_line_magic("waitworkers", "--timeout 4")
    text = str(err.value)
    assert [d["key"] for d in err.value.diagnosis] == ["keras3-loss-scale"]
    assert "  worker:1 was inside TensorFlow, called from mixed.py line 72, in loop: " \
           "train(batch)" in text
    assert ("What this means: worker:0 and worker:1 waited inside TensorFlow, training with "
            "mixed_float16 (LossScaleOptimizer) and Keras 3.15.1 unmended") in text
    assert "mwhelpers' Keras mends were turned off (MWHELPERS_KERAS_FIX=0 or --no-keras-fix)" \
        in text
    assert "What to do: leave mwhelpers' Keras fix on" in text
    for run in rt.runs.values():
        assert not said(run, "step 4") and not said(run, NOTICE)


def test_the_installed_keras_has_the_lines_and_one_process_runs_it_unchanged(monkeypatch):
    """The real Keras 3.15.1 module is mended; in one process (no strategy) the mended check is
    Keras's own, without a collective."""
    import numpy as np
    from keras.src.optimizers import loss_scale_optimizer as module

    assert kerasmixed.plan(module, kerasbase.keras_version() or "") == \
        ("mend", module.LossScaleOptimizer, "")
    import keras

    optimizer = keras.mixed_precision.LossScaleOptimizer(keras.optimizers.SGD())
    monkeypatch.setattr(module.LossScaleOptimizer, "check_finite",
                        module.LossScaleOptimizer.check_finite)  # both undone after the test
    monkeypatch.setattr(module, kerasbase.PATCHED, False, raising=False)
    kerasmixed.patch(module)
    assert hasattr(module.LossScaleOptimizer.check_finite, "__wrapped__")
    assert bool(optimizer.check_finite([np.ones(2, "float32")]))
    assert not bool(optimizer.check_finite([np.array([1.0, np.inf], "float32")]))


def test_one_replica_overflowing_under_mirrored_strategy_leaves_finite_equal_weights(tmp_path):
    """MirroredStrategy in one process, two logical CPUs: Keras alone takes the first replica's
    answer, applies replica 1's inf and ends with NaN weights, silently; mended, the step is
    skipped on both replicas, as one device does on the same global batches."""
    def run(*args):
        done = subprocess.run([sys.executable, str(MIRRORED), *args], capture_output=True,
                              text=True, timeout=240, cwd=tmp_path,
                              env={**os.environ, "PYTHONPATH": str(ROOT),
                                   "TF_CPP_MIN_LOG_LEVEL": "2", kerasbase.KERAS_FIX_ENV: "1"})
        line = next((ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")), None)
        assert done.returncode == 0 and line, done.stdout + done.stderr[-3000:]
        return json.loads(line[len("RESULT "):]), done.stderr

    plain, err = run()
    assert plain["replicas"] == 2 and not plain["finite"] and plain["iterations"] < 11
    assert kerasmixed.MENDED not in err
    mended, err = run("--mend")
    assert mended["finite"] and mended["replicas_equal"]
    assert (mended["iterations"], mended["loss_scale"]) == \
        (mended["alone"]["iterations"], mended["alone"]["loss_scale"]) == (11, 16384.0)
    assert mended["weights_sum"] == pytest.approx(mended["alone"]["weights_sum"], rel=1e-4)
    notice = [ln for ln in err.splitlines() if kerasmixed.MENDED in ln]
    assert len(notice) == 1 and "mended for 2 replicas in sync" in notice[0], err[-3000:]
