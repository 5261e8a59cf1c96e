"""Keras 3's ``optimizer.iterations`` under ParameterServerStrategy, mended by mwhelpers
(``mwhelpers/taskside/keraspss.py``, docs/keras-pss-iterations.md).

Here: the tests of test_keras3_pss that need TensorFlow; the module's text and its other tests
are in inprocess/test_keras3_pss.py."""

import shutil

from test_keras3_pss import NOTICE, PROGRAM, STEPS, chief_result, said

from mwhelpers.taskside import kerasbase


def test_iterations_counts_every_step_of_a_coordinator_loop(ip, rt, monkeypatch):
    monkeypatch.delenv("TF_USE_LEGACY_KERAS", raising=False)
    monkeypatch.delenv(kerasbase.KERAS_FIX_ENV, raising=False)
    shutil.copy(PROGRAM, "count.py")
    ip.run_line_magic("cluster", "2 --chief --ps 1")
    ip.run_line_magic("worker", "ps:0,worker:0,worker:1 --bg count.py")
    ip.run_line_magic("worker", f"chief:0 count.py {STEPS}")
    mended = chief_result(rt)
    assert len(said(rt.get_run("chief:0"), NOTICE)) == 1, rt.get_run("chief:0").tail(40)
    ip.run_line_magic("worker", f"chief:0 --no-keras-fix count.py {STEPS}")
    unmended = chief_result(rt)
    rt.end_all(policy="now")  # the servers serve until ended
    print("mended", mended, "unmended", unmended)
    assert not said(rt.get_run("chief:0"), NOTICE)
    for r in (mended, unmended):
        assert r["counted"] == STEPS, r  # every step ran once
        assert r["device"] == "/job:ps/replica:0/task:0/device:CPU:0"
    assert mended["iterations"] == STEPS, mended
    assert unmended["iterations"] < STEPS, unmended  # the test can fail: Keras alone loses steps
