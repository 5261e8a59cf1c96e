"""Keras 3 on JAX, checkpoints of a model split across processes (keras.callbacks.OrbaxCheckpoint)
that survive a killed process: under ``supervise`` every process restarts and resumes from the
newest checkpoint, resharded onto the mesh it runs on (tests/programs/jax_orbax_resume.py)."""

import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import pytest
from conftest import ROOT, results
from test_jax_model_parallel import jax_env  # noqa: F401  (the fixture)

from mwhelpers.failures import WorkerFailed

PROGRAM = ROOT / "tests" / "programs" / "jax_orbax_resume.py"
BOOTSTRAP = ROOT / "mwhelpers" / "taskside" / "_bootstrap.py"
pytestmark = pytest.mark.skipif(
    (importlib.util.find_spec("jax") is None or importlib.util.find_spec("orbax") is None)
    and os.environ.get("CI") != "true",
    reason="jax or orbax-checkpoint is not installed (the tutorials' lock has them)")


def alone(cwd, *args):
    """The program as one process of four devices; its RESULT."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KERAS_DISTRIBUTION_")}
    env.update(KERAS_BACKEND="jax", PYTHONPATH=str(ROOT),
               XLA_FLAGS="--xla_force_host_platform_device_count=4")
    done = subprocess.run([sys.executable, "-u", str(BOOTSTRAP), str(PROGRAM), *map(str, args)],
                          capture_output=True, text=True, timeout=150, cwd=cwd, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    line = next(ln for ln in done.stdout.splitlines() if ln.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


def steps(run):
    return [int(ln.split()[1]) for ln in run.lines() if ln.startswith("STEP ")]


def test_a_killed_process_restarts_the_job_from_the_newest_orbax_checkpoint(rt, jax_env, tmp_path):  # noqa: F811
    """3 epochs of 4 steps, a checkpoint at each epoch's end; process 1 SIGKILLs itself right
    after step 10 (epoch 3): both processes restart from the checkpoint of epoch 2 (step 8),
    train steps 9 to 12 again, and end where an uninterrupted run ends."""
    ckpt, marker = tmp_path / "ckpt", tmp_path / "killed"
    rt.define_cluster(2)
    attempts = rt.supervise(script=str(PROGRAM), max_restarts=1, timeout=240, stream=False,
                            args=[str(ckpt), "--kill-at", "10", "--marker", str(marker)])
    assert len(attempts) == 2 and attempts[0].restarted
    assert str(attempts[0].root_cause.task) == "worker:1"
    for run in attempts[0].runs:
        assert steps(run)[:10] == list(range(1, 11))
    for run in attempts[1].runs:
        assert "RESUME after epoch 1: step 8" in run.lines()
        assert steps(run) == [9, 10, 11, 12]
    res = results(rt)
    assert {r["iterations"] for r in res.values()} == {12}
    assert {r["resumed_after"] for r in res.values()} == {1}
    for r in res.values():  # the kernels are split over the model axis again after the restore
        assert r["specs"] == {"d1": [None, "model"], "d2": [None, "model"]}
        assert r["shards"] == {"d1": [16, 16], "d2": [32, 2]}
    assert res["worker:0"]["weights"] == res["worker:1"]["weights"]
    # An uninterrupted run on the same global batches (one process of four devices) ends at
    # the same weights, to float tolerance: nothing was trained twice or lost.
    straight = alone(tmp_path, tmp_path / "straight")
    for got, want in zip(res["worker:0"]["weights"], straight["weights"], strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)

    # The same checkpoint restored onto another mesh (one process, batch=1, model=4): Orbax
    # reshards each kernel to the new layout, and the weights are those saved.
    moved = alone(tmp_path, ckpt, "--restore-only", "--mesh", "1,4")
    assert moved["resumed_after"] == 2 and moved["iterations"] == 12
    assert moved["shards"] == {"d1": [16, 8], "d2": [32, 1]}
    for got, want in zip(moved["weights"], res["worker:0"]["weights"], strict=True):
        np.testing.assert_allclose(got, want, rtol=0, atol=0)




def test_a_model_split_over_processes_is_saved_by_orbax_and_not_by_backup_and_restore(
        rt, jax_env, tmp_path):  # noqa: F811
    """A mesh (batch=1, model=4) over two processes of two devices: each kernel is split over
    both processes.  Each process's own BackupAndRestore cannot save it (a process sees only
    its half: Keras's save_weights fetches the whole array and JAX refuses); Orbax writes each
    process's shards into one checkpoint."""
    rt.define_cluster(2)
    with pytest.raises(WorkerFailed) as failed:
        rt.supervise(script=str(PROGRAM), max_restarts=1, timeout=240, stream=False,
                     args=[str(tmp_path / "backup"), "--mesh", "1,4", "--epochs", "1",
                           "--backup-and-restore"])
    said = str(failed.value)
    assert "not restarted after attempt 1" in said and "a program error" in said
    assert "Fetching value for `jax.Array` that spans non-addressable" in said
    # The report says what it means and what saves such a model.
    root = failed.value.failures[0]
    assert [d["key"] for d in root.diagnosis][:1] == ["jax-fetch-split"], root.diagnosis
    assert "split over several processes' devices" in said
    assert "keras.callbacks.OrbaxCheckpoint(directory=...)" in said

    rt.define_cluster(2)
    rt.supervise(script=str(PROGRAM), max_restarts=0, timeout=240, stream=False,
                 args=[str(tmp_path / "orbax"), "--mesh", "1,4", "--epochs", "1"])
    res = results(rt)
    assert (tmp_path / "orbax" / "0").is_dir()
    for r in res.values():
        assert r["shards"] == {"d1": [16, 8], "d2": [32, 1]} and r["iterations"] == 4
    assert res["worker:0"]["weights"] == res["worker:1"]["weights"]



def test_a_relative_checkpoint_folder_is_named_before_the_first_save_and_explained_on_load(
        rt, jax_env, tmp_path, monkeypatch):  # noqa: F811
    """Orbax takes absolute paths only.  OrbaxCheckpoint("ckpt") saves in the background by
    default: with one save (one epoch), the save fails there, and the job ends with exit code 0
    and no checkpoint; the task says so before the first step.  load_weights("ckpt") on a
    distribution fails inside Keras with an AttributeError after Orbax's warning; the report
    explains it.  MWHELPERS_ORBAX_CHECK=0 turns the first check off."""
    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=4")
    rt.define_cluster(1)
    run = rt.launch("worker:0", script=str(PROGRAM), args=["ckpt", "--epochs", "1", "--relative"])
    lines = run.lines()
    said = [ln for ln in lines if ln.startswith("[mwhelpers] OrbaxCheckpoint: ")]
    assert said == [f"[mwhelpers] OrbaxCheckpoint: the folder 'ckpt' is relative, and Orbax "
                    f"writes to absolute paths only: every save would fail (Keras saves in the "
                    f"background by default: a job of one save ends with no error and no "
                    f"checkpoint); give '{tmp_path / 'ckpt'}' (os.path.abspath), to "
                    f"OrbaxCheckpoint and to model.load_weights"], lines
    assert lines.index(said[0]) < next(i for i, ln in enumerate(lines) if ln.startswith("STEP "))
    assert run.process.returncode == 0 and not (tmp_path / "ckpt" / "0").exists()  # none kept
    assert any("Checkpoint path should be absolute" in ln for ln in lines)

    run = rt.launch("worker:0", script=str(PROGRAM), args=["ckpt", "--epochs", "1", "--relative"],
                    env={"MWHELPERS_ORBAX_CHECK": "0"})
    assert not [ln for ln in run.lines() if ln.startswith("[mwhelpers] OrbaxCheckpoint: ")]

    rt.launch("worker:0", script=str(PROGRAM), args=["ckpt", "--epochs", "1"])  # absolute: saved
    assert (tmp_path / "ckpt" / "0").is_dir()
    with pytest.raises(WorkerFailed) as loading:
        rt.launch("worker:0", script=str(PROGRAM), args=["ckpt", "--epochs", "2", "--relative"])
    said = str(loading.value)
    assert "AttributeError: 'NoneType' object has no attribute" in said
    root = loading.value.failures[0]
    assert [d["key"] for d in root.diagnosis][:1] == ["orbax-relative-path"], root.diagnosis
    assert "gave Orbax a relative path (ckpt/0/pytree)" in said
    assert "os.path.abspath(folder)" in said
