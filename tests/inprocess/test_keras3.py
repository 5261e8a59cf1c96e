"""Keras 3 ``fit`` under MultiWorkerMirroredStrategy, mended by mwhelpers (keras-team/keras#20585).

Two real workers through the magics, with the Keras that TensorFlow ships (no
TF_USE_LEGACY_KERAS): they train together, to the weights one process reaches alone on the
same global batches; validation, evaluate, predict, dict inputs, a partial last batch and
ModelCheckpoint work.  BackupAndRestore surviving a SIGKILL under supervise is notebook 06's
(run by tests/kernels/test_notebooks.py) and the chaos tests' (tests/hosts/test_multihost.py).
The unmended failure is tested with the diagnosis (tests/tf/test_diagnosis.py); the fix's own
rules (what it changes, what it leaves alone) without workers below.

The tests described here that need more than this folder gives are in tf/test_keras3_tf.py."""

import json
import sys
import types

import pytest
from conftest import ROOT, module_from_source

from mwhelpers.taskside import kerasbase, kerascallbacks, kerasfix

PROGRAMS = ROOT / "tests" / "programs"
NOTICE = "[mwhelpers] Keras 3.15.1: fit and evaluate mended for multi-worker"


def said(run, prefix):
    return [ln for ln in run.lines() if ln.startswith(prefix)]


@pytest.fixture
def keras3(monkeypatch):
    monkeypatch.delenv("TF_USE_LEGACY_KERAS", raising=False)
    monkeypatch.delenv(kerasfix.KERAS_FIX_ENV, raising=False)
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "0")  # TF's "Started server" line in the logs


# -- the rules of the fix, on Keras's own module objects, without workers ---------------------

def _module(folder, name, build_line, logs_line, cls="TensorFlowTrainer"):
    """A stand-in for keras.src.backend.tensorflow.trainer with the given source lines (its class
    is TensorFlowTrainer up to Keras 3.15, Trainer in the 3.16 nightlies)."""
    source = (
        f"class {cls}:\n"
        "    def _maybe_symbolic_build(self, iterator=None, data_batch=None):\n"
        f"        {build_line}\n"
        "def reduce_per_replica(values, strategy, reduction):\n"
        f"    {logs_line}\n")
    return module_from_source(folder, name, source)


BUGGY_BUILD = 'data_batch = self.distribute_strategy.reduce("MEAN", batch, axis=None)'
BUGGY_LOGS = 'return strategy.reduce("MEAN", v, axis=0)'


@pytest.mark.parametrize("version, build, logs, changed, said_line", [
    ("3.15.1", BUGGY_BUILD, BUGGY_LOGS, {"_maybe_symbolic_build", "reduce_per_replica"},
     "fit and evaluate mended"),
    # a build with neither the failing line nor a known fix: the logs mended, the build not
    ("3.6.0", "data_batch = batch", BUGGY_LOGS, {"reduce_per_replica"},
     "cannot tell whether fit and evaluate (keras-team/keras#20585) still needs mending: its "
     "_maybe_symbolic_build holds neither the failing line nor the fix this knows"),
    # before 3.5 the workers' gradients are never all-reduced: left alone, said why
    ("3.4.1", "data_batch = batch", BUGGY_LOGS, set(), "never all-reduces the gradients"),
    ("3.1.1", "data_batch = batch", "return v", set(), "never all-reduces the gradients"),
    # docs/keras-20585/trainer.patch applied: Keras carries the fix
    ("3.16.0", "data_batch = tree.map_structure(lambda x: "
     "self.distribute_strategy.experimental_local_results(x)[0], batch)",
     'return strategy.reduce("MEAN", v, axis=None)', set(),
     "carries the fix of fit and evaluate (keras-team/keras#20585)"),
    ("3.16.0", "data_batch = first_local(batch)", 'return strategy.reduce("MEAN", v, axis=None)',
     set(), "cannot tell whether fit and evaluate"),
    ("3.17.0", BUGGY_BUILD, BUGGY_LOGS, set(), "outside the releases it was tested with"),
    ("2.15.0", BUGGY_BUILD, BUGGY_LOGS, set(), "outside the releases it was tested with"),
])
def test_the_fix_changes_only_a_keras_that_has_the_lines(monkeypatch, capsys, tmp_path, version,
                                                         build, logs, changed, said_line):
    monkeypatch.setattr(kerasbase, "_said", set())
    monkeypatch.delenv(kerasbase.FORCE_ENV, raising=False)
    monkeypatch.setitem(sys.modules, "keras.src.version", types.SimpleNamespace(__version__=version))
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": {"worker": ["a:1", "b:2"]},
                                                "task": {"type": "worker", "index": 0}}))
    module = _module(tmp_path, f"fake_trainer_{version.replace('.', '_')}_{len(build)}", build,
                     logs)
    before = {"_maybe_symbolic_build": module.TensorFlowTrainer._maybe_symbolic_build,
              "reduce_per_replica": module.reduce_per_replica}
    kerasfix.patch_trainer(module)
    after = {"_maybe_symbolic_build": module.TensorFlowTrainer._maybe_symbolic_build,
             "reduce_per_replica": module.reduce_per_replica}
    assert {k for k in before if before[k] is not after[k]} == changed
    kerasfix.patch_trainer(module)  # idempotent: wrapped once
    assert all(getattr(after[k], "__wrapped__", before[k]) is before[k] for k in after)
    err = capsys.readouterr().err
    if said_line is None or said_line == "fit and evaluate mended":
        assert err == ""  # the notice comes with the first multi-worker fit, not at import
    else:
        assert said_line in err and len(err.splitlines()) == 1, err


def test_force_arms_the_fix_where_it_cannot_tell(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(kerasbase, "_said", set())
    monkeypatch.setenv(kerasbase.FORCE_ENV, "1")
    monkeypatch.setitem(sys.modules, "keras.src.version", types.SimpleNamespace(__version__="3.99"))
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": {"worker": ["a:1", "b:2"]},
                                                "task": {"type": "worker", "index": 0}}))
    module = _module(tmp_path, "fake_trainer_forced", "data_batch = first_local(batch)",
                     BUGGY_LOGS)
    assert kerasfix.patch_trainer(module)
    assert hasattr(module.TensorFlowTrainer._maybe_symbolic_build, "__wrapped__")
    err = capsys.readouterr().err
    assert "fit and evaluate (keras-team/keras#20585) mended although its _maybe_symbolic_build " \
           "holds neither" in err and "MWHELPERS_KERAS_FIX_FORCE=1 says so" in err, err


def test_the_fix_finds_the_renamed_trainer(monkeypatch, capsys, tmp_path):
    """keras-nightly 3.16.0.dev renamed TensorFlowTrainer to Trainer: both places are mended."""
    monkeypatch.setattr(kerasbase, "_said", set())
    monkeypatch.setitem(sys.modules, "keras.src.version",
                        types.SimpleNamespace(__version__="3.16.0.dev2026102704"))
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": {"worker": ["a:1", "b:2"]},
                                                "task": {"type": "worker", "index": 0}}))
    module = _module(tmp_path, "fake_trainer_renamed", BUGGY_BUILD, BUGGY_LOGS, cls="Trainer")
    build, logs = module.Trainer._maybe_symbolic_build, module.reduce_per_replica
    assert kerasfix.patch_trainer(module)
    assert module.Trainer._maybe_symbolic_build.__wrapped__ is build
    assert module.reduce_per_replica.__wrapped__ is logs
    assert capsys.readouterr().err == ""


def test_the_fix_is_silent_outside_a_multi_worker_job(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(kerasbase, "_said", set())
    monkeypatch.setitem(sys.modules, "keras.src.version", types.SimpleNamespace(__version__="3.99"))
    monkeypatch.delenv("TF_CONFIG", raising=False)
    kerasfix.patch_trainer(_module(tmp_path, "fake_trainer_alone", BUGGY_BUILD, BUGGY_LOGS))
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("value, wanted", [("0", False), ("off", False), ("false", False),
                                           ("1", True), ("", True), (None, True)])
def test_the_switch(value, wanted):
    assert kerasfix.fix_wanted({} if value is None else {kerasfix.KERAS_FIX_ENV: value}) is wanted


def test_keras3_progress_bars_read_as_a_terminal_shows_them(tmp_path):
    """Keras 3 draws its bar with colour codes, backspaces and carriage returns even into a
    file (keras/src/utils/progbar.py counts every POSIX system as a terminal); the log readers
    keep the bar's last state as plain text, whole lines only while it grows."""
    from mwhelpers.logs import LogFollower, tail_lines

    bar = "\x1b[1m{n}/10\x1b[0m \x1b[32m{done}\x1b[0m\x1b[37m{todo}\x1b[0m \x1b[1m1s\x1b[0m 9ms/step"
    log = tmp_path / "worker-0.log"
    follower = LogFollower(log)
    log.write_bytes(b"Epoch 1/2\n\r" + bar.format(n=1, done="━", todo="━━━").encode())
    assert follower.poll() == ["Epoch 1/2"]
    with open(log, "ab") as f:
        f.write(("\x08" * 30 + "\r" + bar.format(n=10, done="━━━━", todo="") + " - loss: 0.25\n")
                .encode())
    shown = "10/10 ━━━━ 1s 9ms/step - loss: 0.25"
    assert follower.poll() == [shown]
    assert tail_lines(log, 0) == ["Epoch 1/2", shown]


def test_the_switch_also_turns_off_the_explicit_call(monkeypatch, capsys):
    """A program that calls fix_keras_multi_worker() itself, launched with --no-keras-fix (or
    MWHELPERS_KERAS_FIX=0): the call arms nothing and says so."""
    monkeypatch.setattr(kerasbase, "_said", set())
    monkeypatch.setenv(kerasfix.KERAS_FIX_ENV, "0")
    armed = [f for f in sys.meta_path if getattr(f, "name", "") == kerasfix.TRAINER]
    assert kerasfix.fix_keras_multi_worker() is False
    assert [f for f in sys.meta_path if getattr(f, "name", "") == kerasfix.TRAINER] == armed
    assert capsys.readouterr().err.strip() == kerasfix.OFF


# -- the checkpointing callbacks' chief-aware part: which Keras it mends ----------------------

BACKUP_SAVE = ("self.model.save_weights(filepath=self._weights_path, overwrite=True)\n"
               "        with file_utils.File(self._training_metadata_path, 'w') as f:\n"
               "            f.write('{}')")
CHECKPOINT_SAVE = ("filepath = self._get_file_path(epoch, batch, logs)\n"
                   "        self.model.save(filepath, overwrite=True)")


def _callbacks_module(folder, name, backup_save, checkpoint_save):
    """Stand-ins for keras.src.callbacks.backup_and_restore and model_checkpoint (one module
    holding both classes) whose _save_model has the given body."""
    hooks = "".join(f"    def {h}(self, *args, **kwargs):\n        pass\n"
                    for h in ("on_train_begin", "on_train_end", "on_epoch_begin", "on_epoch_end",
                              "on_train_batch_end"))
    source = ("class BackupAndRestore:\n" + hooks
              + f"    def _save_model(self):\n        {backup_save}\n"
              "class ModelCheckpoint:\n"
              f"    def _save_model(self, epoch, batch, logs):\n        {checkpoint_save}\n"
              "    def _get_file_path(self, epoch, batch, logs):\n        return 'x'\n")
    return module_from_source(folder, name, source)


@pytest.mark.parametrize("version, backup_save, checkpoint_save, said_line", [
    ("3.15.1", BACKUP_SAVE, CHECKPOINT_SAVE, None),
    # a later Keras that writes one more file into the backup: the chief-aware part cannot
    # tell whether its redirection still covers every file
    ("3.16.0", BACKUP_SAVE + "\n        self.model.optimizer.save(self._optimizer_path)",
     CHECKPOINT_SAVE + "\n        self.model.save(self._best_path)",
     "cannot tell whether {cls} under multi-worker MWMS (keras-team/keras#20585) still needs "
     "mending: its _save_model writes {path}"),
    # a Keras whose callbacks ask which worker is the chief
    ("3.16.0", "if self.model.distribute_strategy.extended.should_checkpoint:\n"
               "            " + BACKUP_SAVE.replace("\n", "\n    "),
     "if self.model.distribute_strategy.extended.should_checkpoint:\n"
     "            " + CHECKPOINT_SAVE.replace("\n", "\n    "),
     "carries the fix of {cls} under multi-worker MWMS (keras-team/keras#20585): its "
     "_save_model asks which worker is the chief"),
    ("3.17.0", BACKUP_SAVE, CHECKPOINT_SAVE, "outside the releases it was tested with"),
])
def test_the_callbacks_mend_only_a_keras_it_can_judge(monkeypatch, capsys, tmp_path, version,
                                                      backup_save, checkpoint_save, said_line):
    monkeypatch.setattr(kerasbase, "_said", set())
    monkeypatch.delenv(kerasbase.FORCE_ENV, raising=False)
    monkeypatch.setitem(sys.modules, "keras.src.version", types.SimpleNamespace(__version__=version))
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": {"worker": ["a:1", "b:2"]},
                                                "task": {"type": "worker", "index": 0}}))
    name = f"fake_callbacks_{version.replace('.', '_')}_{len(backup_save)}"
    for target, cls, path in ((kerascallbacks.BACKUP, "BackupAndRestore", "self._optimizer_path"),
                              (kerascallbacks.CHECKPOINT, "ModelCheckpoint", "self._best_path")):
        module = _callbacks_module(tmp_path, f"{name}_{cls}", backup_save, checkpoint_save)
        module.__name__ = target
        before = getattr(module, cls)._save_model
        kerascallbacks.patch_callbacks(module)
        after = getattr(module, cls)._save_model
        err = capsys.readouterr().err
        if said_line is None:
            assert err == "" and after.__wrapped__ is before
            continue
        assert said_line.format(cls=cls, path=path) in err and len(err.splitlines()) == 1, err
        # BackupAndRestore keeps the resume's part (which judges its own Keras); ModelCheckpoint
        # is left as it is.
        assert (after is not before) is (cls == "BackupAndRestore")


def test_the_version_is_known_while_keras_is_still_being_imported(monkeypatch, tmp_path):
    """A mend runs as soon as its module loads, inside ``import keras``: ``keras`` has no
    ``__version__`` yet, and Keras 3.5 has not loaded ``keras.src.version``.  The version is
    read from that module then (before, 3.5 and 3.10 read as unknown and two mends stood
    aside)."""
    import types

    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "version.py").write_text('__version__ = "3.5.0"\n')
    keras, src = types.ModuleType("keras"), types.ModuleType("keras.src")
    keras.__path__, src.__path__ = [str(tmp_path)], [str(tmp_path / "src")]
    monkeypatch.setitem(sys.modules, "keras", keras)
    monkeypatch.setitem(sys.modules, "keras.src", src)
    monkeypatch.delitem(sys.modules, "keras.src.version", raising=False)
    try:
        assert kerasbase.keras_version() == "3.5.0"
    finally:
        # The stand-in that keras_version() imported leaves with the test: monkeypatch would
        # put it back at the end (it saw it at a delitem), and the test process's next real
        # `import keras` would then fail ("cannot import name 'version'"), as it did in full
        # runs (tf.keras's "Keras cannot be imported" too).
        made = sys.modules.pop("keras.src.version", None)
    assert made is not None and made.__file__.startswith(str(tmp_path))
    monkeypatch.delitem(sys.modules, "keras.src")
    assert kerasbase.keras_version() is None  # Keras not imported at all: nothing imported
    assert "keras.src.version" not in sys.modules
