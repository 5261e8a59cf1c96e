"""Keras 3 BackupAndRestore(save_freq=N) resumes at the saved batch in every worker mwhelpers
starts (mwhelpers/taskside/kerasresume.py; docs/keras-backup-resume.md).

Two workers train under ``supervise``; worker 1 is SIGKILLed once right after a step between
two backups.  The restart must redo at most N steps, skip none, end with exactly epochs x steps
optimizer steps and the very weights of a run without the fault, for each kind of input: a
finite dataset, a repeated one, and a distributed dataset from a function.

The tests described here that need more than this folder gives are in tf/test_keras3_resume_tf.py."""

import json

import pytest
from conftest import ROOT, module_from_source, results

from mwhelpers.taskside import kerasresume

PROGRAM = ROOT / "tests" / "programs" / "resume_train.py"
EPOCHS, STEPS, SAVE_FREQ = 3, 8, 3
KILL_AT = 13  # epoch 1's 5th batch: the newest backup is of step 12 (epoch 1's 4th)


def weights(rt):
    res = results(rt)
    (iterations,) = {r["iterations"] for r in res.values()}
    first, second = (res[t]["weights"] for t in ("worker:0", "worker:1"))
    assert first == second  # one model on both workers
    return iterations, first


def close(a, b):
    flat = lambda w: [v for row in w for v in (row if isinstance(row, list) else [row])]  # noqa: E731
    return all(abs(p - q) <= 1e-5 for p, q in zip(
        (v for layer in a for v in flat(layer)), (v for layer in b for v in flat(layer)), strict=True))


def test_the_backup_records_its_position_and_reads_it_back(tmp_path):
    meta = tmp_path / "training_metadata.json"
    meta.write_text(json.dumps({"epoch": 1, "batch": 3}))
    kerasresume.mark(str(meta), 4)
    assert json.loads(meta.read_text()) == {"epoch": 1, "batch": 3, kerasresume.POSITION: 4}
    assert kerasresume.position(meta) == 4
    assert kerasresume.position(tmp_path / "none.json") is None
    meta.write_text("{not json")
    assert kerasresume.position(meta) is None


def _batches(n):
    return iter(range(n))


@pytest.mark.parametrize("shape", ["pairs", "triples"])
def test_the_restored_epoch_draws_the_done_batches_and_goes_on(shape):
    """(step, iterator) as Keras 3.5 to 3.14 yield them, (first, last, iterator) as 3.15 does;
    with steps_per_execution 2, 8 batches and 4 done: 4 drawn, steps 4 and 6 left."""
    data = _batches(8)
    items = [(s, data) if shape == "pairs" else (s, s + 1, data) for s in range(0, 8, 2)]
    left = list(kerasresume._skipping(iter(items), 4, 2))
    assert [item[0] for item in left] == [4, 6]
    assert next(data) == 4  # the next step trains on batch 4


def test_an_input_that_runs_out_while_drawn_is_left_to_keras():
    data = _batches(3)
    items = [(s, data) for s in range(8)]
    left = list(kerasresume._skipping(iter(items), 5, 1))
    # Drawing stops at step 3 (the input is empty); the steps after it go to Keras, whose first
    # step finds the input empty and ends the epoch, as without the mend.
    assert [item[0] for item in left] == [4, 5, 6, 7]


READS = '''
import json


class Backup35:
    def on_train_begin(self, logs=None):
        training_metadata = json.loads("{}")
        epoch = training_metadata["epoch"]
        self.model._initial_epoch = epoch


class Backup315:
    def on_train_begin(self, logs=None):
        self._load_model()

    def _load_model(self):
        training_metadata = json.loads("{}")
        epoch = training_metadata["epoch"]
        self.model._initial_epoch = epoch


class FixedUpstream(Backup315):
    def _load_model(self):
        training_metadata = json.loads("{}")
        self.model._initial_epoch = training_metadata["epoch"]
        self.model._initial_step = training_metadata["batch"]


class ReadsTheBatch(Backup315):
    def _load_model(self):
        training_metadata = json.loads("{}")
        epoch = training_metadata["epoch"]
        self.model._initial_epoch = epoch
        self._resume_at = training_metadata.get("batch", 0)
'''


def test_the_resume_reads_where_each_keras_restores_the_epoch(tmp_path, monkeypatch):
    """Keras 3.5 restores in on_train_begin, 3.10 and later in _load_model; one that reads the
    batch itself has fixed it upstream and is left alone."""
    import sys
    import types

    module = module_from_source(tmp_path, "fake_backups", READS)
    monkeypatch.setitem(sys.modules, "keras.src.version", types.SimpleNamespace(__version__="3.15.1"))
    monkeypatch.setattr(kerasresume, "_iterator_mended", True)
    assert kerasresume.why_not(module.Backup35) is None
    assert kerasresume.why_not(module.Backup315) is None
    for cls in (module.Backup35, module.Backup315):
        assert kerasresume.carries_fix(cls) is None
    assert "restores the step inside the epoch" in kerasresume.carries_fix(module.FixedUpstream)
    assert "reads the backup's batch" in kerasresume.carries_fix(module.ReadsTheBatch)
    monkeypatch.setattr(kerasresume, "_iterator_mended", False)
    assert "epoch iterator" in kerasresume.why_not(module.Backup315)
    monkeypatch.setitem(sys.modules, "keras.src.version", types.SimpleNamespace(__version__="3.17.0"))
    assert "outside the releases" in kerasresume.why_not(module.Backup315)


def test_an_iterator_of_super_batches_is_drawn_once_per_execution():
    """Keras master's JAX epoch iterator hands the trainer one draw per execution, holding all
    of its batches: with steps_per_execution 2 and 4 batches done, 2 draws, not 4."""
    data = iter([(0, 1), (2, 3), (4, 5), (6, 7)])  # super-batches of 2
    items = [(s, s + 1, data) for s in range(0, 8, 2)]
    left = list(kerasresume._skipping(iter(items), 4, 2, per_draw=2))
    assert [item[0] for item in left] == [4, 6]
    assert next(data) == (4, 5)


def test_only_a_super_batch_iterator_is_read_as_one():
    class Plain:
        def _get_iterator(self):
            return iter(self.data_adapter.get_jax_iterator())

    class Master:
        def _get_iterator(self):
            super_batch = self.steps_per_execution
            return iter(self.data_adapter.get_jax_iterator(super_batch=super_batch))

    assert not kerasresume._super_batches(Plain())
    assert kerasresume._super_batches(Master())
