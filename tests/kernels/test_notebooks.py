"""Every notebook runs headless (nbclient, papermill via the suite) and tells the truth.

The tests described here that need more than this folder gives are in processes/test_notebooks_plain.py."""

import re
import subprocess
import sys

import nbformat
import pytest
from conftest import ROOT, run_notebook

NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
# A run of a tutorial is marked tf and notebook (TensorFlow trains in its kernel and workers);
# the suite's runs of small notebooks, notebook.


def outputs_text(nb):
    return "".join(out.get("text") or out.get("data", {}).get("text/plain", "")
                   for cell in nb.cells for out in cell.get("outputs", []))


@pytest.fixture
def pythonpath(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(ROOT))


def execute(name, tmp_path):
    """Run notebooks/NAME in a fresh kernel with workdir=tmp_path, as papermill would."""
    nb = nbformat.read(ROOT / "notebooks" / name, as_version=4)
    index = next(i for i, c in enumerate(nb.cells) if "parameters" in c.metadata.get("tags", []))
    nb.cells.insert(index + 1, nbformat.v4.new_code_cell(f"workdir = {str(tmp_path)!r}"))
    run_notebook(nb, timeout=300, resources={"metadata": {"path": str(tmp_path)}})
    return nb


def test_strategies_guide_runs_under_nbclient(tmp_path, pythonpath):
    nb = execute("01_strategies_guide.ipynb", tmp_path)
    text = outputs_text(nb)
    assert "logical CPUs: ['/device:CPU:0', '/device:CPU:1']" in text
    assert "replicas in sync: 2" in text and "global batch: 128" in text
    assert "examples per replica in the last step: [64, 64]" in text
    assert re.search(r"^CentralStorageStrategy +tf\.distribute\.experimental$", text, re.M)
    assert re.search(r"^MirroredStrategy +tf\.distribute$", text, re.M)
    assert '"type": "worker",' in text and '"index": 1' in text  # TF_CONFIG shown
    assert "gradient norm, reduce_mean / compute_average_loss = 2.0000 (replicas: 2)" in text
    assert re.search(r"first step, reduce_mean / compute_average_loss: SGD 2\.0000, Adam 1\.0", text)
    assert "Keras 3, model.save('dir'): Invalid filepath extension" in text
    assert "keras_dir holds: ['config.json', 'metadata.json', 'model.weights.h5']" in text
    assert "global batch  64, 63 steps, learning rate 0.05" in text  # the learning-rate runs
    assert "global batch 128, 32 steps, learning rate 0.1" in text
    assert "exported SavedModel serves: (1, 1)" in text
    assert any("image/png" in o.get("data", {}) for c in nb.cells for o in c.get("outputs", []))  # drawn


def test_mirrored_strategy_notebook_runs_under_nbclient(tmp_path, pythonpath):
    text = outputs_text(execute("02_mirrored_strategy_keras.ipynb", tmp_path))
    assert "number of devices: 2" in text
    assert "MirroredStrategy: 2 replica(s), global batch 128" in text
    assert "one device: 1 replica(s), global batch 128" in text
    assert "epoch losses, 2 x 64:" in text  # asserted equal to 1 x 128 in the notebook
    # steps per epoch as the optimizer counted them: 2,000 examples at global batch 128
    assert re.search(r"^MirroredStrategy +2 +[\d.]+ +[\d.]+ +16$", text, re.M)
    assert re.search(r"^one device +1 +[\d.]+ +[\d.]+ +16$", text, re.M)
    assert "restoring ckpt-02.keras" in text and "Epoch 3/4" in text  # the second run resumed
    assert re.search(r"Keras 3\.\d+\.\d+, MirroredStrategy with 2 replicas: .* a MirroredVariable", text)
    assert "cache() in memory" in text and "with prefetch" in text
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == [
        "ckpt-01.keras", "ckpt-02.keras", "ckpt-03.keras", "ckpt-04.keras"]


def test_multi_worker_notebook_runs_under_nbclient(tmp_path, pythonpath):
    nb = execute("03_multi_worker_keras.ipynb", tmp_path)
    text = outputs_text(nb)
    assert re.search(r"\d+\.\d s after the launch: \d+ line\(s\) in job_0\.log, 'Started server' in "
                     r"it: False", text)
    assert "Started server with target" in text and "Waiting for 1/2 tasks to connect" in text
    assert "[worker:1] Epoch 2/2" in text and "val_accuracy" in text
    assert not re.search(r"^\[worker:\d\] RESULT", text, re.MULTILINE)  # results are read, not streamed
    table = [line.split() for line in text.splitlines() if line.startswith("worker:")]
    assert ["worker:0", "True", "2", "64"] in [row[:4] for row in table]
    assert ["worker:1", "False", "2", "64"] in [row[:4] for row in table]
    images = [o for c in nb.cells for o in c.get("outputs", []) if "image/png" in o.get("data", {})]
    assert len(images) == 3  # the cluster, the sleep race, fit's log path (the loss per step is in 03b)
    assert (tmp_path / "main.py").exists() and (tmp_path / "mnist_setup.py").exists()
    # repeated datasets: the placeholder a worker that ran out gets (input_lib._dummy_tensor_fn)
    assert "placeholder for (None, 28, 28): (0, 28, 28) | for an unknown rank: ()" in text
    # Keras 3 under MWMS: the failure live, its two lines read from Keras, the mends' lines in the logs
    assert ("with an unsupported type (<class 'tensorflow.python.distribute.values.PerReplica'>) "
            "to a Tensor.") in text
    assert "ran model.fit under MultiWorkerMirroredStrategy with Keras 3" in text
    assert "TensorFlowTrainer._maybe_symbolic_build, lines" in text and "reduce_per_replica, lines" in text
    assert "a scalar, axis=0): Invalid reduction dimension 0 for input with 0 dimensions" in text
    assert re.search(r"job_1\.log \(%%bash, main\.py\) +fit mend: True +stall workaround: False", text)
    assert re.search(r"worker:1 \(main\.py\) +fit mend: True +stall workaround: True", text)
    assert re.search(r"worker:1 \(unmended\.py, mends off\) +fit mend: False +stall workaround: False",
                     text)
    assert not (tmp_path / "unmended.py").read_text().count("mwhelpers")
    # the Keras 3 details: steps_per_execution > 1 fails under MWMS; keras.distribution needs JAX
    assert "You must feed a value for placeholder tensor" in text
    assert "ran Keras fit with steps_per_execution > 1 under a multi-replica strategy" in text
    assert ("keras.distribution.initialize on TensorFlow: module "
            "'keras.src.backend.tensorflow.distribution_lib' has no attribute 'initialize'") in text
    # lessons apart from checks: every assert sits in a check cell, one per section at most
    checks = [c for c in nb.cells if "check" in c.metadata.get("tags", [])]
    assert checks and all(c.source.startswith("# Check: ") for c in checks)
    assert not [c.source.splitlines()[0] for c in nb.cells if c.cell_type == "code"
                and c not in checks and re.search(r"^\s*assert ", c.source, re.MULTILINE)]
    assert len(nb.cells) <= 54  # two of them the previous/next lines
    # no red block: the kernel's TensorFlow import (after %load_ext) and fit (shuffle=False)
    stderr = [(c.source.splitlines()[0], o["text"]) for c in nb.cells if c.cell_type == "code"
              and not c.source.startswith("%%") for o in c.get("outputs", []) if o.get("name") == "stderr"]
    assert not [s for s in stderr if "import keras" in s[0] or "oneDNN" in s[1] or "shuffle" in s[1]], stderr
    assert next(c for c in nb.cells if c.cell_type == "code").source == "%load_ext mwhelpers"


def assert_lessons_apart_from_checks(nb):
    """Asserts only in check cells (tagged, first line "# Check: "), a reset cell before the
    exercises, and no drawing code in the notebook's cells."""
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        tags = cell.metadata.get("tags", [])
        if "check" in tags:
            assert cell.source.startswith("# Check: "), cell.source[:60]
        else:
            assert not re.search(r"^\s*assert ", cell.source, re.M), cell.source[:60]
        assert "plt." not in cell.source and "matplotlib" not in cell.source, cell.source[:60]
    kinds = [c.metadata.get("tags", []) for c in nb.cells]
    exercises = next(i for i, c in enumerate(nb.cells) if c.source.startswith("## Exercises"))
    assert "reset" in kinds[exercises - 1] and nb.cells[exercises - 1].source.startswith("# Reset: ")


def test_under_the_hood_notebook_runs_under_nbclient(tmp_path, pythonpath):
    nb = execute("03b_under_the_hood.ipynb", tmp_path)
    text = outputs_text(nb)
    assert "after %killbgscripts: {'bash': False, 'worker': True}" in text  # IPython's left the worker
    assert "2 s after SIGTERM, worker alive: True" in text and "after SIGKILL, worker alive: False" in text
    assert "preemption_notifier.cc" in text and "SIGTERM caught at" in text  # TF's own handler
    assert re.search(r"worker:0 \(with the workaround\): fit returned 0\.\d\d s after", text)
    assert re.search(r"worker:1 \(without the workaround\): fit returned \d+\.\d\d s after", text)
    assert "reported after each step of epoch 1: [" in text and "fit's history, epoch 1:" in text
    assert "each step's own loss, epoch 1: [" in text
    assert "custom step sending float16: all-reduces of ['float16', 'float32']" in text  # + the loss
    assert "train_step, mended, optimizer LossScaleOptimizer: all-reduces of ['float32', 'float32']" in text
    assert "worker:0: the late collective ended with DeadlineExceededError" in text
    assert re.search(r"1 worker +input +[\d.]+ ms \| compute +[\d.]+ ms \| all-reduce", text)  # phases
    assert re.search(r"2 workers: worker 1 +input +[\d.]+ ms", text)
    assert "worker:1 job.py" in text and "worker:0 mixed.py" in text  # section 4: each run's lines
    assert "[mwhelpers] Keras 3." in text and "TF_USE_LEGACY_KERAS=unset at import" in text
    assert any("image/png" in o.get("data", {}) for c in nb.cells for o in c.get("outputs", []))
    assert_lessons_apart_from_checks(nb)


def test_interactive_workers_notebook_runs_under_nbclient(tmp_path, pythonpath):
    pytest.importorskip("ipyparallel", reason="ipyparallel is not installed (mwhelpers[interactive])")
    nb = execute("03c_interactive_workers.ipynb", tmp_path)
    text = outputs_text(nb)
    assert_lessons_apart_from_checks(nb)
    assert sum("image/png" in o.get("data", {}) for c in nb.cells for o in c.get("outputs", [])) == 3
    assert "2 interactive tasks: worker:0 (engine 0), worker:1 (engine 1)" in text
    assert "[worker:0] PerReplica -> [[0, 1, 2, 3]]" in text
    assert "[worker:1] PerReplica -> [[4, 5, 6, 7]]" in text
    assert "[worker:0] my part sums to 6 | all parts: 28" in text
    assert "[worker:0] MirroredVariable inside the scope; ResourceVariable outside" in text
    assert re.search(r"\[worker:1\] summed / one process: \[1\.0(, 1\.0){3}\] \(global batch\) "
                     r"\[2\.0(, 2\.0){3}\] \(reduce_mean\) \[1\.0(, 1\.0){3}\] \(Keras's loss\)", text)
    assert "worker:0 did not finish cell 8 within 5 s" in text
    assert "worker:1 finished the cell meanwhile" in text
    assert "in _calculate_replicas_with_values" in text  # worker 0's stack, read from its log
    assert "restarted worker:0 (engine 2), worker:1 (engine 3)" in text
    assert "ended ipyparallel's controller of the interactive tasks" in text


def test_sharding_notebook_runs_under_nbclient(tmp_path, pythonpath):
    nb = execute("04_dataset_sharding.ipynb", tmp_path)
    text = outputs_text(nb)
    assert "files3/FILE, worker 1: [[4, 5], [6, 7], 'scalar 0', 'scalar 0']" in text
    assert "files3/FILE, shape known, worker 1: [[4, 5], [6, 7], [], []]" in text
    assert "files1/AUTO, worker 0: InvalidArgumentError" in text
    assert "files1/AUTO, worker 1: UnavailableError" in text
    assert "which is not enough for the required 2 shards" in text
    assert "seeded:   seen twice [] | never seen []" in text
    assert "worker 0: [[0, 2], [4, 6], [8, 10], [12, 14]]" in text
    assert "worker 0, replicas 0 and 1, step by step: [[[0, 1], [4, 5]], [[8, 9], [12, 13]]]" in text
    assert any("image/png" in o.get("data", {}) for c in nb.cells for o in c.get("outputs", []))
    assert sorted(p.name for p in tmp_path.glob("part-*.tfrecord")) == [
        f"part-{i}.tfrecord" for i in range(4)]


def test_saving_notebook_runs_under_nbclient(tmp_path, pythonpath):
    text = outputs_text(execute("05_saving_multi_worker.ipynb", tmp_path))
    assert "task_type: None | task_id: None | replicas: 1" in text
    assert "left on disk: ['ckpt/checkpoint', 'ckpt/ckpt-1.data-00000-of-00001', " \
           "'ckpt/ckpt-1.index', 'mc/epoch-1.keras', 'mc/epoch-2.keras', 'model/model.keras']" in text
    assert "this task saves to out_workers/mc/workertemp_1/epoch-1.keras and deletes it" in text
    assert re.search(r"worker:0: evaluate -> (\S+) \| predict -> shape \[40, 1\], first rows (.*)\n"
                     r"worker:1: evaluate -> \1 \| predict -> shape \[40, 1\], first rows \2\n", text)
    assert "optimizer steps: 30 = 20 restored + 10 here" in text or "restored + 10 here" in text
    assert "out_chief/model/workertemp_0/model.keras" in text
    assert "worker 1's all-reduce of 1.0 + 1.0 returned" in text
    assert "model.save('model_dir'): Invalid filepath extension for saving" in text
    assert "model_dir: ['config.json', 'metadata.json', 'model.weights.h5']" in text
    assert "'saved_model.pb'" in text
    assert not list(tmp_path.glob("out_*/*/workertemp_*"))  # temporary copies removed


def test_backup_and_restore_notebook_runs_under_nbclient(tmp_path, pythonpath):
    nb = execute("06_backup_and_restore.ipynb", tmp_path)
    text = outputs_text(nb)
    assert re.search(r"worker 0 failed \d+\.\d\d s after worker 1 was killed, noticed by the "
                     r"(heartbeat timeout|closed connections)", text)
    assert "backup on disk: ['latest.weights.h5', 'training_metadata.json']" in text
    assert "backup folder after a successful fit: [] | the folder itself: gone" in text
    assert "restarting all 2 tasks (restart 1 of 2)" in text and "attempt 2: every task finished" in text
    # The workers resume after the backup's batch (Keras 3 alone runs the epoch from batch 0).
    resumed = re.search(r"attempt 2 restored step (\d+), whose backup says \{'epoch': 1, 'batch': "
                        r"(\d+), 'mwhelpers_batches_done': (\d+)\}; its first step: epoch 1, "
                        r"batch (\d+), global step (\d+)", text)
    assert resumed, text
    step, batch, done, first, first_step = map(int, resumed.groups())
    assert done == batch + 1 == first and first_step == step + 1
    assert re.search(r"attempt 2, backup at global step \d+, in epoch 1: saved \{'epoch': 1, ", text)
    assert "Keras on its own: the first fit stopped after step 14; the second fit ran steps 13 to 28" in text
    assert "mended: the first fit stopped after step 14; the second fit ran steps 13 to 24" in text
    assert "worker 1 saved into workertemp_1/; there during the save: True, after it: False" in text
    assert ("OneDeviceStrategy: stopped with ['latest.weights.h5', 'training_metadata.json'] on "
            "disk; the new model trained 1 epoch, 2 steps in all; backup left: False") in text
    assert re.search(r"\d steps done again; the job ended at step 90\n", text)
    # %workers --timeline, the loss of both runs and the step timeline, each shown once
    pictures = [c for c in nb.cells if any("image/png" in o.get("data", {}) for o in c.get("outputs", []))]
    assert len(pictures) == 3 and all(
        sum("image/png" in o.get("data", {}) for o in c.outputs) == 1 for c in pictures)
    checks = [c for c in nb.cells if "check" in c.metadata.get("tags", [])]
    assert checks and all(c.source.startswith("# Check: ") and c.outputs == [] for c in checks)


def test_custom_loop_keras3_notebook_runs_under_nbclient(tmp_path, pythonpath):
    nb = execute("07_custom_loop_keras3.ipynb", tmp_path)
    text = outputs_text(nb)
    assert "| keras 3." in text  # the kernel's versions line (mwhelpers.versions)
    assert "attempt 1: worker:1 killed by SIGKILL (fault injected by the supervisor)" in text
    # The kill is asked for at step 13; on a loaded machine it may land a few steps later, so the
    # restored checkpoint is any periodic one (every 5 steps) from step 10 on.
    restored = re.search(r"attempt 2: both workers restored step (\d+) from ckpt/ckpt-\1;", text)
    assert restored and int(restored[1]) % 5 == 0 and int(restored[1]) >= 10, restored
    assert ("checkpoint folder at the end: "
            "['checkpoint', 'ckpt-30.data-00000-of-00001', 'ckpt-30.index']") in text
    assert "fault injected: sent SIGTERM to worker:1" in text
    assert re.search(r"attempt 1 stopped after step \{'worker:0': (\d+), 'worker:1': \1\}; "
                     r"attempt 2 restored step \1: nothing done twice", text)
    assert "preempted/: ['ckpt', 'workertemp_1']" in text
    # the loss of both attempts and the preemption handshake (the timelines are text here)
    assert sum("image/png" in o.get("data", {}) for c in nb.cells for o in c.get("outputs", [])) >= 2


def test_evaluator_notebook_runs_under_nbclient(tmp_path, pythonpath):
    text = outputs_text(execute("08_evaluator_tensorboard.ipynb", tmp_path))
    assert "Cluster(2 worker, 1 evaluator)" in text
    assert "3 task(s) finished" in text and "checkpoints written: 5 | evaluated: [" in text
    assert "epoch_accuracy" in text and "evaluation_accuracy_vs_iterations" in text  # SidecarEvaluator's
    assert len(list((tmp_path / "tb" / "train").glob("events.out.tfevents.*"))) == 1
    assert len(list((tmp_path / "ckpt").glob("ckpt-*.index"))) == 5


def test_parameter_server_notebook_runs_under_nbclient(tmp_path, pythonpath):
    nb = execute("09_parameter_server.ipynb", tmp_path)
    text = outputs_text(nb)
    images = [o for c in nb.cells for o in c.get("outputs", []) if "image/png" in o.get("data", {})]
    assert len(images) == 3  # the roles drawn, the timeline, the losses
    assert "Cluster(1 chief, 2 worker, 1 ps)" in text
    assert ("fit: ValueError: To use this dataset, you need to pass this dataset to "
            "ClusterCoordinator.create_per_worker_dataset") in text
    assert "tf.keras.utils.experimental.DatasetCreator exists: False" in text
    assert ("the template's model and optimizer live on: "
            "['/job:ps/replica:0/task:0/device:CPU:0']") in text
    assert re.search(r"_momentum +/job:chief/replica:0/task:0/device:CPU:0", text)
    # A keras.Variable's assign_add reads then writes; a tf.Variable's is one op. The mended
    # optimizer.iterations counts every step (the keras.Variable's count depends on timing).
    assert re.search(r"keras\.Variable\.assign_add: \[[^]]*'ReadVariableOp'[^]]*"
                     r"'AssignVariableOp'\]", text), text
    assert re.search(r"tf\.Variable\.assign_add: +\['AssignAddVariableOp'", text), text
    assert re.search(r"60 steps scheduled \| counted by our tf\.Variable: 60 \| by the "
                     r"keras\.Variable: \d+ \| Keras's optimizer\.iterations: 60", text), text
    # Training went on without worker 1; a step it ran when killed may have run twice.
    drill = re.search(r"worker 1 killed [\d.]+ s before round 2 ended; (\d+) steps scheduled, "
                      r"steps run (\d+) ", text)
    assert drill and 0 <= int(drill[2]) - int(drill[1]) <= 1, text


def test_troubleshooting_notebook_runs_under_nbclient(tmp_path, pythonpath):
    nb = execute("11_troubleshooting.ipynb", tmp_path)
    text = outputs_text(nb)
    # Each mistake's report, as the learner reads it in the cells (the cells assert the keys).
    assert "What this means: helpers_of_mine.py is in " in text
    assert "[worker:0] found me" in text  # the fix the report proposed, done
    assert re.search(r"port \d+ of worker:0 is already taken by pid \d+", text)
    assert "early_op.py line 3 runs a TensorFlow operation (tf.constant(2.0))" in text
    assert "preemption_notifier.cc" in text and "SIGTERM caught" in text
    assert "Waiting for 1/2 tasks to connect" in text
    assert "What this means: worker:1 never started" in text
    assert "What this means: worker:0 finished (exit code 0)" in text
    assert "What this means: the tasks did not run the same Keras" in text
    assert "Could not apply FILE based sharding: the dataset only has 1 file(s)" in text
    assert re.search(r"seed    7: seen by both \[\], seen by neither \[\]", text)
    last = "".join(o.get("text", "") for o in [c for c in nb.cells if c.cell_type == "code"][-1].outputs)
    assert "No background processes were running." in last  # every task ended on its own
    assert "after SIGTERM, worker 0 is ready" in text and "the holder exited with -9" in text


def test_keras_on_jax_notebook_runs_under_nbclient(tmp_path, pythonpath):
    nb = execute("12_keras_on_jax.ipynb", tmp_path)
    text = outputs_text(nb)
    assert "KERAS_DISTRIBUTION_JOB_ADDRESSES=localhost:" in text  # what %cluster gives each task
    assert "process 0 against process 1: largest weight difference 0" in text
    assert re.search(r"process 0 against one process: largest weight difference [\d.e-]+", text)
    assert "worker:0 kept: ['0..31', '64..95']" in text and "worker:1 kept: ['32..63', '96..127']" in text
    assert "all-reduces in the compiled training step: 1" in text
    assert "all-reduces before XLA's optimizations: 0" in text
    assert "['p0.keras', 'p1.keras']" in text
    assert "Gloo all-reduce failed" in text and "(ended by the supervisor)" in text
    assert "attempt 2: every task finished" in text
    assert re.search(r"MWMS \(TensorFlow\) +[\d.]+ +[\d.]+ +[\d.]+", text)
    assert re.search(r"JAX \(keras.distribution\) +[\d.]+ +[\d.]+ +[\d.]+", text)
    assert "ref_obj = Optimizer(1.0)" in text and "multihost_utils.assert_equal(" in text
    assert any("image/png" in o.get("data", {}) for c in nb.cells for o in c.get("outputs", []))
    assert (tmp_path / "ckpt" / "p0.keras").exists() and (tmp_path / "ckpt" / "p1.keras").exists()


def test_model_parallel_notebook_runs_under_nbclient(tmp_path, pythonpath):
    nb = execute("12b_model_parallel_jax.ipynb", tmp_path)
    text = outputs_text(nb)
    assert re.search(r"two processes against one: largest weight difference \d", text)
    assert "all-reduce over [2,2]<=[4]: f32[32,10]" in text
    assert "all-reduce over mesh['axis_0'=2,'axis_1'=2] {'axis_0'}: (f32[], f32[128,784]" in text
    assert "[worker:0] [mwhelpers] LayoutMap: rule 'd1/kernel' matches no variable" in text
    assert "bytes on one device: {'split': 1222784, 'trap': 2442368}" in text
    assert "fault injected: killed worker:1 after it logged 'STEP 25'" in text
    assert "attempt 2, worker:1: RESUMED after step 20; steps 21 to 30" in text
    assert "jax-fetch-split | save with keras.callbacks.OrbaxCheckpoint" in text
    assert "a piece of each kernel now: {'d1': '784x64', 'd2': '64x10'}" in text
    assert re.search(r"4 x 1 +2\.44 MB a device", text)
    assert "if re.fullmatch(pattern, key)" in text
    assert sum("image/png" in o.get("data", {}) for c in nb.cells for o in c.get("outputs", [])) == 2
    assert (tmp_path / "ckpt" / "2").is_dir() and (tmp_path / "ckpt_1x4" / "0").is_dir()


OWNER_ENV = "MWTEST_OWNER"  # inherited by a suite's kernels and workers: whose test started them


def run_suite(*args, pythonpath=str(ROOT), owner=None):
    env = {**__import__("os").environ, "PYTHONPATH": pythonpath}
    if owner is not None:
        env[OWNER_ENV] = str(owner)
    return subprocess.run([sys.executable, "-m", "mwhelpers.workshop.suite", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=600, env=env)


def test_suite_runs_a_notebook_with_papermill_and_writes_outputs(tmp_path):
    out = tmp_path / "out"
    proc = run_suite(str(ROOT / "notebooks" / "13_mwhelpers_tour.ipynb"), "--output", str(out),
                     "-p", "full_size", "False")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "13_mwhelpers_tour.ipynb  ok" in proc.stdout
    assert "1 passed, 0 failed" in proc.stdout
    assert (out / "13_mwhelpers_tour.html").stat().st_size > 10_000
    assert (out / "work" / "13_mwhelpers_tour" / "main.py").exists()  # its own working dir
    # What the tour shows (the other tutorials run under nbclient below; this one, papermill).
    text = outputs_text(nbformat.read(out / "13_mwhelpers_tour.ipynb", as_version=4))
    assert "[worker:1] CUDA_VISIBLE_DEVICES = ''" in text  # environment inheritance shown
    assert "[worker:1] [mwhelpers] Keras 3." in text and "fit and evaluate mended" in text
    assert "[worker:0] ready after" in text  # --bg waited for the port
    assert "[worker:1] Epoch 2/2" in text  # worker 1 streamed into its cell
    assert "2 task(s) finished" in text
    assert "Ended" in text or "No background processes" in text
    assert not re.search(r"^\[worker:\d\] RESULT", text, re.MULTILINE)  # the log keeps it, cells don't
    # rt.results(): 2 replicas on each worker, and one fingerprint: the same weights
    rows = dict(re.findall(r"^(worker:[01]) +2 +([0-9a-f]{16}) ", text, re.MULTILINE))
    assert len(rows) == 2 and rows["worker:0"] == rows["worker:1"], rows
    # the reference part: a fault, its report, a supervised restart that resumes, GPUs refused
    assert "worker:1 logged 'STEP 3'; sent SIGKILL to its process tree" in text
    assert "worker:1 failed: killed by SIGKILL (SIGKILL sent when its log matched '^STEP 3$')" in text
    assert "attempt 2: every task finished" in text
    assert "this machine offers no GPU (this process's CUDA_VISIBLE_DEVICES is '')" in text


# a cell that starts worker 0 in the background, doing nothing for 5 minutes
SLEEPING_WORKER = "%%worker 0 --bg --ready start\nimport time\ntime.sleep(300)"


def suite_workers(owner):
    """Workers started by a suite that the test ``owner`` (its tmp_path) ran.

    Tests run side by side, so another test's suite may have workers running now.
    """
    import psutil

    found = []
    for p in psutil.process_iter(["pid"]):
        try:
            env = p.environ()
            # a task (or a warm-start server, whose environment its forked tasks show): each
            # runs the worker start-up, _bootstrap.py
            if (env.get("MWHELPERS_SUITE_RUN") and env.get(OWNER_ENV) == str(owner)
                    and "_bootstrap.py" in " ".join(p.cmdline())):
                found.append(p)
        except psutil.Error:
            pass
    return found


def make_nb(path, cells, params=True):
    nb = nbformat.v4.new_notebook()
    if params:
        nb.cells.append(nbformat.v4.new_code_cell("workdir = None\nfull_size = False",
                                                  metadata={"tags": ["parameters"]}))
    nb.cells += [nbformat.v4.new_code_cell(c) for c in cells]
    nbformat.write(nb, path)
    return path


def test_suite_refuses_missing_parameters_cell_and_unknown_parameters(tmp_path):
    bare = make_nb(tmp_path / "bare.ipynb", ["print(1)"], params=False)
    good = make_nb(tmp_path / "good.ipynb", ["print(1)"])
    out = tmp_path / "out"
    out.mkdir()
    for stale in ("good.ipynb", "good.html"):  # a run before this one
        (out / stale).write_text("{}")
    proc = run_suite(str(bare), str(good), "--output", str(out), "-p", "epochs", "3")
    assert proc.returncode == 1
    assert "bare.ipynb has no cell tagged 'parameters'" in proc.stdout
    assert "good.ipynb does not declare the parameter(s) epochs" in proc.stdout
    assert "0 passed, 2 failed" in proc.stdout
    assert sorted(p.name for p in out.iterdir() if p.suffix in (".ipynb", ".html")) == [], \
        "the last run's executed copy is left, as if it were this run's"


def test_suite_keeps_kernel_stderr_out_of_the_console(tmp_path):
    nb = make_nb(tmp_path / "noisy.ipynb", ["import os\nos.write(2, b'KERNEL-FD2-MARKER\\n')"])
    proc = run_suite(str(nb), "--output", str(tmp_path / "out"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "KERNEL-FD2-MARKER" not in proc.stderr + proc.stdout
    assert "KERNEL-FD2-MARKER" in (tmp_path / "out" / "noisy.stderr.log").read_text()


def test_suite_reports_the_failing_cell_and_leaves_no_worker(tmp_path):
    nb = make_nb(tmp_path / "fails.ipynb", [
        "%load_ext mwhelpers",
        SLEEPING_WORKER,
        "%%worker 1\nraise SystemExit(6)",
    ])
    proc = run_suite(str(nb), "--output", str(tmp_path / "out"), owner=tmp_path)
    assert proc.returncode == 1
    assert "WorkerFailed: worker:1 failed: exit code 6" in proc.stdout
    assert "fails.ipynb: FAILED" in proc.stdout
    assert suite_workers(tmp_path) == [], "a suite's worker was left running"


def test_suite_runs_notebooks_side_by_side_and_ends_only_the_failed_ones_workers(tmp_path):
    fails = make_nb(tmp_path / "a_fails.ipynb", [
        "%load_ext mwhelpers",
        SLEEPING_WORKER,
        "raise SystemExit('a_fails gives up with its worker running')",
    ])
    # b's worker must outlive a's failure: a's leftovers are ended while b still runs
    lives = make_nb(tmp_path / "b_lives.ipynb", [
        "%load_ext mwhelpers",
        SLEEPING_WORKER,
        "import time, mwhelpers\nrun = mwhelpers.runtime().get_run('worker:0')\ntime.sleep(8)\n"
        "assert run.running, 'my worker was ended by the other notebook'\n"
        "mwhelpers.runtime().kill('worker:0')",
    ])
    proc = run_suite(str(fails), str(lives), "--output", str(tmp_path / "out"), "--jobs", "2",
                     owner=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "running 2 notebooks, 2 at a time" in proc.stdout
    assert "a_fails.ipynb: FAILED" in proc.stdout and "b_lives.ipynb: ok" in proc.stdout
    assert "1 passed, 1 failed" in proc.stdout
    spans = []
    for name in ("a_fails", "b_lives"):
        meta = nbformat.read(tmp_path / "out" / f"{name}.ipynb", as_version=4).metadata.papermill
        spans.append((meta.start_time, meta.end_time))
        assert (tmp_path / "out" / f"{name}.stderr.log").exists()
        assert name in (tmp_path / "out" / f"{name}.html").read_text()  # rendered by the suite
    assert max(s for s, _ in spans) < min(e for _, e in spans), f"not side by side: {spans}"
    assert suite_workers(tmp_path) == [], "a suite's worker was left running"


def test_ctrl_c_stops_the_suite_and_ends_every_notebooks_workers(tmp_path):
    import os
    import signal
    import time

    cells = ["%load_ext mwhelpers",
             SLEEPING_WORKER,
             "import time\ntime.sleep(300)"]
    nbs = [str(make_nb(tmp_path / f"{name}.ipynb", cells)) for name in ("one", "two")]
    proc = subprocess.Popen(  # Ctrl-C in a terminal: SIGINT to the suite's process group
        [sys.executable, "-m", "mwhelpers.workshop.suite", *nbs, "--output", str(tmp_path / "out"),
         "-j", "2"],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT), OWNER_ENV: str(tmp_path)},
        start_new_session=True,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 120
        while len(suite_workers(tmp_path)) < 2:  # both notebooks have their worker running
            assert time.monotonic() < deadline and proc.poll() is None, proc.stdout.read()
            time.sleep(0.2)
        os.killpg(proc.pid, signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130, out
    assert "interrupted after 0 of 2 notebook(s)" in out and "Traceback" not in out
    assert suite_workers(tmp_path) == []


def test_suite_puts_the_checkout_first_on_a_pythonpath_that_was_already_set(tmp_path):
    other = tmp_path / "site"
    other.mkdir()
    (other / "usermod.py").write_text("WHO = 'user module'\n")
    nb = make_nb(tmp_path / "path.ipynb", [
        "import os, usermod, mwhelpers\nprint(os.environ['PYTHONPATH'])\nprint(usermod.WHO)\n"
        "print(mwhelpers.__file__)"])
    proc = run_suite(str(nb), "--output", str(tmp_path / "out"), pythonpath=str(other))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    text = outputs_text(nbformat.read(tmp_path / "out" / "path.ipynb", as_version=4))
    path_line, who, where = text.splitlines()[:3]
    assert path_line.split(":") == [str(ROOT), str(other)]
    assert who == "user module" and where.startswith(str(ROOT / "mwhelpers"))


