"""Keras 3 on JAX, a model split across processes (keras.distribution.ModelParallel): two
processes of two CPU devices each, launched through the same magics as DataParallel, train
to the same weights as one process of four devices on the same global batches, each device
holding its shard of the kernels (tests/programs/jax_model_parallel.py)."""

import importlib.util
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest
from conftest import ROOT, results

PROGRAM = ROOT / "tests" / "programs" / "jax_model_parallel.py"
BOOTSTRAP = ROOT / "mwhelpers" / "taskside" / "_bootstrap.py"
RULE = ".*/d[0-9]/kernel"
pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("jax") is None and os.environ.get("CI") != "true",
    reason="jax is not installed (the tutorials' lock, requirements/tutorials.txt, has it)")


@pytest.fixture
def jax_env(monkeypatch):
    monkeypatch.setenv("KERAS_BACKEND", "jax")
    monkeypatch.delenv("TF_USE_LEGACY_KERAS", raising=False)


def run_alone(tmp_path, *args, **env):
    """The program as one task of one process of four devices starts it (the start-up arms
    mwhelpers' checks), with ``env`` added; its whole output (stdout, then stderr)."""
    environ = {**os.environ, "KERAS_BACKEND": "jax", "PYTHONPATH": str(ROOT),
               "XLA_FLAGS": "--xla_force_host_platform_device_count=4", **env}
    for name in ("KERAS_DISTRIBUTION_JOB_ADDRESSES", "KERAS_DISTRIBUTION_NUM_PROCESSES",
                 "KERAS_DISTRIBUTION_PROCESS_ID"):
        environ.pop(name, None)
    done = subprocess.run([sys.executable, "-u", str(BOOTSTRAP), str(PROGRAM), *args],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path, env=environ)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout + done.stderr


def alone(tmp_path, rule=RULE, dump=None):
    """One process of four devices on the two processes' global batches; ``dump``: a folder
    for XLA's compiled programs."""
    flags = "--xla_force_host_platform_device_count=4" + (f" --xla_dump_to={dump}" if dump else "")
    out = run_alone(tmp_path, rule, "--as-two", XLA_FLAGS=flags, MWHELPERS_LAYOUT_CHECK="0")
    line = next(ln for ln in out.splitlines() if ln.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


def test_two_processes_split_the_model_and_train_like_one(ip, rt, jax_env, tmp_path):
    ip.run_line_magic("cluster", "2")
    ip.run_line_magic("worker", f"all --bg {PROGRAM} {RULE}")
    ip.run_line_magic("waitworkers", "--timeout 150")
    got = results(rt)
    one = alone(tmp_path, dump=tmp_path / "split")
    for task, res in got.items():
        # Each kernel split over the model axis: a device holds half its columns.
        assert res["devices"] == 4
        assert res["specs"] == {"d1": [None, "model"], "d2": [None, "model"]}, task
        assert res["shards"] == {"d1": [16, 16], "d2": [32, 2]}, task
        # Of the model's 2,704 bytes, a device holds the kernels' halves and whole biases.
        assert (res["device_bytes"], res["model_bytes"]) == (1424, 2704), task
        for mine, theirs in zip(res["weights"], one["weights"], strict=True):
            np.testing.assert_allclose(mine, theirs, rtol=1e-5, atol=1e-6)
    assert one["specs"] == {"d1": [None, "model"], "d2": [None, "model"]}
    assert not any("[mwhelpers] LayoutMap: " in ln for r in rt.runs.values() for ln in r.lines())

    # What XLA adds to the compiled training step: with the kernels split over the model axis,
    # all-gathers (each device's columns of an activation, and of the updated biases) besides
    # the all-reduces of the gradients over the batch axis; with the model whole on every
    # device (the rule that matches nothing), the one all-reduce of DataParallel.
    assert collectives(tmp_path / "split")["all-gather"] >= 2
    assert collectives(tmp_path / "split")["all-reduce"] >= 1
    whole = alone(tmp_path, "d.*kernel", dump=tmp_path / "whole")
    assert whole["specs"] == {"d1": [None, None], "d2": [None, None]}
    assert collectives(tmp_path / "whole") == {"all-gather": 0, "all-reduce": 1}


def collectives(dump):
    """How many of each collective XLA put in the compiled training step."""
    [step] = dump.glob("*jit_train_step*.cpu_after_optimizations.txt")
    text = step.read_text()
    return {kind: len(re.findall(rf"= .*\b{kind}\(", text))
            for kind in ("all-gather", "all-reduce")}
