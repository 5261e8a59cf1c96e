"""Keras 3's BackupAndRestore and ModelCheckpoint under multi-worker MultiWorkerMirroredStrategy.

Keras 3's ``BackupAndRestore`` and ``ModelCheckpoint`` have no notion of a
chief: every worker writes the same files, and two workers writing one HDF5
file fail with h5py's ``unable to lock file``.  Under multi-worker MWMS, the
chief writes where the user asked and every other worker writes the same save
to ``<folder>/workertemp_<task id>/`` and deletes it right after (each worker
still saves, as saving may run collectives).  ``BackupAndRestore`` restores
what Keras 3 saves: the weights, the optimizer's state and the epoch to start
from, never a batch inside an epoch (with an integer ``save_freq`` the epoch
starts again from its first batch, with the weights of the last save).  Keras 3
writes into each backup the epoch it counted itself, from 0 in every new process,
so until a restarted epoch ends its backups would say epoch 0 and a second fault
would run the epochs from 0 again on the latest weights; here the count starts at
the epoch restored.  The
chief's backup is written beside and then moved into place file by file, weights
first: a worker killed while saving never leaves a half-written file, at worst
new weights with the previous epoch's number (that epoch is then run again).

Armed with the ``fit`` mend (:func:`kerasfix.install`).  The chief-aware part acts only on the
Keras releases of :data:`kerasbase.TESTED`, and only where each callback's ``_save_model``
writes the files it redirects (:data:`BACKUP_WRITES`, :data:`CHECKPOINT_WRITES`, as 3.1 to
3.16 write them): a Keras whose ``_save_model`` asks which worker is the chief carries the fix,
one that writes other files it cannot judge; either is said in one line in a multi-worker job
and left alone.  BackupAndRestore's resume (``kerasresume.py``) judges its Keras itself.  This
file imports only the standard library and its siblings.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Mapping
from types import ModuleType
from typing import TYPE_CHECKING

from . import kerasresume
from .kerasbase import (
    CANNOT_TELL,
    FIXED,
    PATCHED,
    SKIPPED,
    keras_version,
    local_path,
    multi_worker_job,
    remove_empty,
    remove_tree,
    say_once,
    say_who_writes,
    source_of,
    untested,
    worker_of,
)

ISSUE = "keras-team/keras#20585"
BACKUP = "keras.src.callbacks.backup_and_restore"
CHECKPOINT = "keras.src.callbacks.model_checkpoint"

if TYPE_CHECKING:  # (not evaluated: this file also runs under the Python of other hosts)
    from typing import Protocol

    class BackupCallback(Protocol):
        """What the mended BackupAndRestore methods use of ``self`` (Keras's own attributes)."""

        model: object
        backup_dir: object
        double_checkpoint: bool
        save_freq: object
        params: dict[str, object]
        _current_epoch: int
        _last_batch_seen: int
        _training_metadata_path: str
        _mwhelpers_done: int
        _mwhelpers_saved: int | None
        _mwhelpers_resume: tuple[int, int]

    class CheckpointCallback(Protocol):
        """What the mended ModelCheckpoint methods use of ``self`` (Keras's own attributes)."""

        model: object
        filepath: object

        def _get_file_path(self, *args: object, **kwargs: object) -> object: ...



# Where Keras asks which worker is the chief (tf.keras's distributed_file_utils does): a Keras
# whose callbacks do carries the fix of this mend.
CHIEF_WORDS = ("should_checkpoint", "workertemp", "write_dirpath", "_in_multi_worker_mode")
# The files each callback's _save_model writes, as its source names them (3.1 to 3.16): the mend
# redirects these and only these.
BACKUP_WRITES = frozenset({"self._weights_path", "self._training_metadata_path"})
CHECKPOINT_WRITES = frozenset({"filepath"})


def _aside(cls: type, writes: frozenset[str]) -> str | None:
    """The line to say where the chief-aware part of this mend leaves ``cls`` (Keras's
    BackupAndRestore or ModelCheckpoint) alone, or None to mend it."""
    version = keras_version()
    what = f"{cls.__name__} under multi-worker MWMS"
    why = untested(version)
    if why:
        return SKIPPED.format(issue=ISSUE, why=why)
    text = source_of(getattr(cls, "_save_model"))  # noqa: B009 (a class of unknown type)
    if text is None:
        return SKIPPED.format(issue=ISSUE, why=f"Keras {version}'s source cannot be read")
    if any(word in text for word in CHIEF_WORDS):
        return FIXED.format(version=version, what=what, issue=ISSUE,
                            how="its _save_model asks which worker is the chief")
    targets = set(re.findall(r"(?:save_weights|save)\((?:filepath=)?([\w.]+)", text))
    targets |= set(re.findall(r'File\(([\w.]+),"w"\)', text))
    if not targets or not targets <= writes:
        return CANNOT_TELL.format(version=version, what=what, issue=ISSUE, why=(
            f"its _save_model writes {', '.join(sorted(targets - writes)) or 'nothing it names'}"
            f", where this knows {', '.join(sorted(writes))}"))
    return None


def _patch_backup(module: ModuleType) -> str | None:
    cls = getattr(module, "BackupAndRestore", None)
    needed = ("_save_model", "on_train_begin", "on_train_end")
    attributes = ("backup_dir", "_weights_path", "_training_metadata_path", "_prev_weights_path",
                  "_prev_training_metadata_path")
    if cls is None or not all(callable(getattr(cls, n, None)) for n in needed):
        return SKIPPED.format(issue=ISSUE, why=f"Keras {keras_version()}'s BackupAndRestore "
                                               f"has no {' or '.join(needed)}")
    if getattr(cls, PATCHED, False):
        return None
    aside = _aside(cls, BACKUP_WRITES)
    # Where the chief-aware part steps aside, the resume's part below still runs.
    chief_of = worker_of if aside is None else (lambda model: None)
    save, train_begin, train_end = cls._save_model, cls.on_train_begin, cls.on_train_end
    epoch_begin, epoch_end, batch_end = cls.on_epoch_begin, cls.on_epoch_end, cls.on_train_batch_end

    def paths(self: BackupCallback, folder: str) -> dict[str, str]:
        names = {a: os.path.basename(str(getattr(self, a))) for a in attributes[1:]
                 if hasattr(self, a)}
        return {"backup_dir": folder, **{a: os.path.join(folder, n) for a, n in names.items()}}

    def save_to(self: BackupCallback, where: Mapping[str, str]) -> None:
        before = {a: getattr(self, a) for a in where}
        try:
            for a, v in where.items():
                setattr(self, a, v)
            save(self)
        finally:
            for a, v in before.items():
                setattr(self, a, v)

    def _save_model(self: BackupCallback) -> object:
        worker = chief_of(self.model)
        done = getattr(self, "_mwhelpers_done", None)  # batches of the epoch done
        self._mwhelpers_saved = done
        if worker is None or not all(hasattr(self, a) for a in attributes[:3]):
            result = save(self)
            kerasresume.mark(str(getattr(self, "_training_metadata_path", "")), done)
            return result
        _, chief, temp_name = worker
        folder = str(self.backup_dir)
        temp = os.path.join(folder, temp_name)
        say_who_writes(f"backup-{folder}", "BackupAndRestore", chief, folder,
                       os.path.join(folder, "workertemp_<id>") if chief else temp, "save")
        if not chief:
            save_to(self, paths(self, temp))
            remove_tree(temp)
            return None
        if not local_path(folder):
            return save(self)
        # The chief's backup: written beside, then moved into place file by file.
        staging = os.path.join(folder, ".mwhelpers-saving")
        os.makedirs(folder, exist_ok=True)
        if getattr(self, "double_checkpoint", False):
            for a in ("_weights_path", "_training_metadata_path"):
                if os.path.exists(getattr(self, a)):
                    shutil.copyfile(getattr(self, a), getattr(self, a) + ".bkp")
        double, self.double_checkpoint = getattr(self, "double_checkpoint", False), False
        try:
            save_to(self, paths(self, staging))
        finally:
            self.double_checkpoint = double
        kerasresume.mark(os.path.join(staging, os.path.basename(self._training_metadata_path)),
                         done)
        for a in ("_weights_path", "_training_metadata_path"):
            os.replace(os.path.join(staging, os.path.basename(getattr(self, a))), getattr(self, a))
        remove_tree(staging)
        return None

    def on_train_begin(self: BackupCallback, logs: object = None) -> object:
        # A callback reused after another fit starts afresh (as the upstream patch has it:
        # Keras alone keeps the last fit's counts and would save them in this one's backups).
        for name in ("_batches_seen_since_last_saving", "_last_batch_seen"):
            if isinstance(getattr(self, name, None), int):
                setattr(self, name, 0)
        self._mwhelpers_done = 0
        for name in ("_mwhelpers_saved", "_mwhelpers_resume"):
            vars(self).pop(name, None)
        result = train_begin(self, logs)
        restored = getattr(self.model, "_initial_epoch", None) or 0
        skip = kerasresume.plan(self, restored)
        steps = self.params.get("steps") if isinstance(getattr(self, "params", None), dict) else None
        if skip is not None and isinstance(steps, int) and skip >= steps:
            restored += 1  # the backup is of the epoch's last batch: the next epoch begins
            self.model._initial_epoch = restored  # type: ignore[attr-defined]
        elif skip is not None:
            self._mwhelpers_resume = (restored, skip)
            self._last_batch_seen = skip - 1  # the next batch counts one toward save_freq
        return result

    def on_epoch_begin(self: BackupCallback, epoch: int, logs: object = None) -> object:
        resume = vars(self).pop("_mwhelpers_resume", None)
        if resume is not None and resume[0] == epoch:
            kerasresume.arm(resume[1])
        # Keras counts finished epochs from 0 in every fit and saves that count: it is the
        # epoch begun, so that a restarted epoch's backups, or a reused callback's, say where
        # they are.
        if isinstance(getattr(self, "_current_epoch", None), int):
            self._current_epoch = epoch
        return epoch_begin(self, epoch, logs)

    def on_train_batch_end(self: BackupCallback, batch: int, logs: object = None) -> object:
        self._mwhelpers_done = batch + 1
        return batch_end(self, batch, logs)

    def on_epoch_end(self: BackupCallback, epoch: int, logs: object = None) -> object:
        ended = getattr(self, "_mwhelpers_done", 0)
        saved = vars(self).pop("_mwhelpers_saved", None)
        self._mwhelpers_done = 0
        kerasresume.disarm()
        result = epoch_end(self, epoch, logs)
        # The newest backup is of this epoch's last batch: it now says that the next epoch
        # begins (where the number of batches is unknown, its restore could not tell). Not
        # where a callback stopped training inside the epoch: it did not end.
        if saved and saved == ended and self.save_freq != "epoch" and \
                not getattr(self.model, "stop_training", False) and \
                kerasresume.resumes(type(self)):
            worker = chief_of(self.model)
            if worker is None or worker[1]:
                kerasresume.mark_epoch_done(str(self._training_metadata_path), epoch + 1)
        return result

    def on_train_end(self: BackupCallback, logs: object = None) -> object:
        worker = chief_of(self.model)
        if worker is None:
            return train_end(self, logs)
        _, chief, temp_name = worker
        folder = str(self.backup_dir)
        if not getattr(self, "delete_checkpoint", True) or not local_path(folder):
            return train_end(self, logs) if chief else None
        # Each removes what it wrote; the folder goes once it is empty, whoever is last.
        if chief:
            for a in attributes[1:]:
                if hasattr(self, a) and os.path.exists(str(getattr(self, a))):
                    os.remove(str(getattr(self, a)))
            remove_tree(os.path.join(folder, ".mwhelpers-saving"))
        else:
            remove_tree(os.path.join(folder, temp_name))
        remove_empty(folder)
        return None

    for f, original in ((_save_model, save), (on_train_begin, train_begin),
                        (on_train_end, train_end), (on_epoch_begin, epoch_begin),
                        (on_epoch_end, epoch_end), (on_train_batch_end, batch_end)):
        f.__wrapped__ = original  # type: ignore[union-attr]
        setattr(cls, f.__name__, f)
    setattr(cls, PATCHED, True)
    return aside


def _patch_checkpoint(module: ModuleType) -> str | None:
    cls = getattr(module, "ModelCheckpoint", None)
    needed = ("_save_model", "_get_file_path")
    if cls is None or not all(callable(getattr(cls, n, None)) for n in needed):
        return SKIPPED.format(issue=ISSUE, why=f"Keras {keras_version()}'s ModelCheckpoint "
                                               f"has no {' or '.join(needed)}")
    if getattr(cls, PATCHED, False):
        return None
    aside = _aside(cls, CHECKPOINT_WRITES)
    if aside:
        return aside
    save, file_path = cls._save_model, cls._get_file_path

    def _get_file_path(self: CheckpointCallback, *args: object, **kwargs: object) -> object:
        path = file_path(self, *args, **kwargs)
        worker = worker_of(self.model)
        if worker is None:
            return path
        folder, name = os.path.split(str(path))
        temp = os.path.join(folder, worker[2] if not worker[1] else "workertemp_<id>", name)
        say_who_writes(f"checkpoint-{self.filepath}", "ModelCheckpoint", worker[1], path, temp,
                       "save")
        return path if worker[1] else temp

    def _save_model(self: CheckpointCallback, *args: object, **kwargs: object) -> object:
        worker = worker_of(self.model)
        if worker is not None:
            # Keras creates a missing folder after checking that it is missing; the others'
            # temporary folders are inside the chief's, so two workers can create it at once and
            # one fails with FileExistsError. Each makes its own folder first, whoever is first.
            own = os.path.dirname(str(self._get_file_path(*args, **kwargs)))
            if own and local_path(own):
                os.makedirs(own, exist_ok=True)
        result = save(self, *args, **kwargs)
        if worker is not None and not worker[1]:
            folder = os.path.dirname(str(file_path(self, *args, **kwargs)))
            remove_tree(os.path.join(folder, worker[2]))
        return result

    for f, original in ((_save_model, save), (_get_file_path, file_path)):
        f.__wrapped__ = original  # type: ignore[attr-defined]
        setattr(cls, f.__name__, f)
    setattr(cls, PATCHED, True)
    return None


def patch_callbacks(module: ModuleType) -> None:
    """Make BackupAndRestore or ModelCheckpoint (whichever ``module`` defines) chief-aware;
    where that part steps aside, say why in one line in a multi-worker job."""
    patch = _patch_backup if module.__name__ == BACKUP else _patch_checkpoint
    aside = patch(module)
    if aside and multi_worker_job():
        say_once(f"skipped-{module.__name__}", aside)


