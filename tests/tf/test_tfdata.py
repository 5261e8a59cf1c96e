"""avoid_teardown_stall really reaches the strategy's per-device iterators (real TF)."""

import json
import subprocess
import sys
import textwrap

import pytest
from conftest import ROOT

PROBE = textwrap.dedent("""
    import json, os, sys
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
    import tensorflow as tf
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    from mwhelpers import avoid_teardown_stall
    from tensorflow.python.data.ops import multi_device_iterator_ops as mdi
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])


    def look(ds):
        it = iter(strategy.experimental_distribute_dataset(ds))
        values = [sorted(int(v) for t in strategy.experimental_local_results(b) for v in t.numpy())
                  for b in it]
        device_its = it._iterators[0]._iterator._device_iterators
        return {"per_device_autotune": [d._dataset.options().autotune.enabled for d in device_its],
                "dataset_autotune": ds.options().autotune.enabled, "values": values}


    out = {"plain": look(tf.data.Dataset.range(16).batch(4))}   # before the fix, in this process
    ds = avoid_teardown_stall(tf.data.Dataset.range(16).batch(4))
    first = mdi._create_device_dataset
    avoid_teardown_stall()
    out["idempotent"] = (mdi._create_device_dataset is first
                         and first.__wrapped__.__name__ == "_create_device_dataset")
    out["fix"] = look(ds)
    print(json.dumps(out))
""")


@pytest.fixture(scope="module")
def probed():
    """One process: a strategy's iterators before the fix, then after it."""
    proc = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                          timeout=120, cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_without_the_fix_the_strategy_iterators_autotune(probed):
    out = probed["plain"]
    assert out["per_device_autotune"] == [None, None]  # None: TF's default, autotuning on
    assert out["dataset_autotune"] is None


def test_the_fix_turns_autotune_off_for_both_iterators_and_keeps_the_data(probed):
    out = probed["fix"]
    assert out["per_device_autotune"] == [False, False]
    assert out["dataset_autotune"] is False
    assert probed["idempotent"] is True
    assert out["values"] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14, 15]]
    assert probed["plain"]["values"] == out["values"]


# -- the automatic fix in every MWMS worker the runtime starts ------------------------------

STALL_PROBE = ROOT / "tests" / "programs" / "stall_probe.py"
NOTICE = "[mwhelpers] tf.data autotuning is off for this MultiWorkerMirroredStrategy input pipeline"


def probe_run(rt, **kw):
    run = rt.launch("worker:0", script=str(STALL_PROBE), timeout=120, **kw)
    line = [ln for ln in run.lines() if ln.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT "):]), run.lines()


def test_the_runtime_switches_autotune_off_in_every_mwms_worker(rt, monkeypatch):
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "2")
    rt.define_cluster(workers=1)
    result, lines = probe_run(rt)
    assert result == {"user": [False], "per_device": [False], "from_function": [False]}
    assert sum(ln.startswith(NOTICE) for ln in lines) == 1  # said once, in the log


@pytest.mark.parametrize("how", ["per launch", "per kernel"])
def test_the_stall_fix_can_be_turned_off(rt, monkeypatch, how):
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "2")
    rt.define_cluster(workers=1)
    if how == "per launch":
        result, lines = probe_run(rt, stall_fix=False)
    else:
        rt.defaults.stall_fix = False
        result, lines = probe_run(rt)
    assert result == {"user": [None], "per_device": [None], "from_function": [None]}
    assert not any(ln.startswith(NOTICE) for ln in lines)
