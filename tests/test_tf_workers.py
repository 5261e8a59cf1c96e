"""Two real MultiWorkerMirroredStrategy workers training with Keras 3 (mended by mwhelpers)."""

import json
import shutil
import time

import pytest
from conftest import ROOT

TRAIN = ROOT / "tests" / "programs" / "mwms_train.py"
pytestmark = pytest.mark.tf


def results(rt):
    out = {}
    for run in rt.runs.values():
        lines = [ln for ln in run.tail(0) if ln.startswith("RESULT ")]
        assert lines, f"{run.task} printed no RESULT; log tail:\n" + "\n".join(run.tail(30))
        out[str(run.task)] = json.loads(lines[-1][len("RESULT "):])
    return out


def check_stall_fix_said_once(rt):
    for run in rt.runs.values():
        said = [ln for ln in run.lines() if ln.startswith("[mwhelpers] tf.data autotuning is off")]
        assert len(said) == 1, f"{run.task}: {said}"


def check_trained_together(res, epochs):
    assert set(res) == {"worker:0", "worker:1"}
    for r in res.values():
        assert r["replicas"] == 2
        assert len(r["loss"]) == epochs and r["loss"][-1] < r["loss"][0] * 0.5
    # Synchronous training: both workers hold the same weights at the end.
    assert res["worker:0"]["weights_sum"] == pytest.approx(res["worker:1"]["weights_sum"])
    assert res["worker:0"]["loss"] == pytest.approx(res["worker:1"]["loss"])


@pytest.fixture
def keras3(monkeypatch):
    monkeypatch.delenv("TF_USE_LEGACY_KERAS", raising=False)
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "0")


def test_two_workers_train_through_the_magics(ip, rt, keras3, capsys):
    shutil.copy(TRAIN, "main.py")
    ip.run_line_magic("cluster", "2")
    ip.run_line_magic("worker", "0 --bg main.py --epochs 3")
    w0 = rt.get_run("worker:0")
    assert w0.ready_after is not None and w0.running
    # Worker 0's server is up and it waits for worker 1; its log says so
    # (TF writes the line just after the port opens).
    deadline = time.monotonic() + 10
    while not any("Started server with target" in ln for ln in w0.tail(0)):
        assert time.monotonic() < deadline, "\n".join(w0.tail(0))
        time.sleep(0.05)
    ip.run_line_magic("worker", "1 main.py --epochs 3")  # foreground: streams into the cell
    assert any(ln.startswith("[worker:1] Epoch 3/3") for ln in rt.echo_lines)
    ip.run_line_magic("waitworkers", "--timeout 120")
    check_trained_together(results(rt), epochs=3)
    check_stall_fix_said_once(rt)
