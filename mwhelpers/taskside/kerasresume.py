"""Keras 3's ``BackupAndRestore(save_freq=N)`` resumes at the saved batch, not at the start of
its epoch (docs/keras-backup-resume.md).

Keras 3 saves a backup every N batches, with the epoch and the batch it was taken at.  On
restore it reads only the epoch: the weights and the optimizer (its step count included) are
those of batch ``b``, yet the epoch runs again from its first batch.  A fault thus redoes up to
a whole epoch, not N batches, and the job ends with more optimizer steps than epochs x steps
(tf_keras resumed at the saved batch).

Here (Keras's TensorFlow trainer; JAX's and PyTorch's too from Keras 3.10):

* every backup also records how many batches of its epoch were done (:data:`POSITION`, a key
  added to Keras's ``training_metadata.json``; Keras reads only ``epoch`` from it);
* on restore, that epoch's training iterator first draws those batches from the input and
  drops them, then trains from the next one, numbered as in the first run.  Nothing is trained
  twice and nothing is skipped: the job ends with exactly epochs x steps optimizer steps;
* a backup taken at the last batch of an epoch resumes at the next epoch.

A Keras that resumes at the saved batch itself (``model._initial_step``, the upstream patch
``docs/keras-backup-resume/backup_and_restore.patch``, or a ``BackupAndRestore`` that reads the
backup's batch) is left alone, said in one line: both acting would skip the restored batches
twice (a backup of an epoch's last batch would skip the whole next epoch).

What the restored epoch reads, by kind of input:

* a finite dataset (one pass per epoch; Keras makes a new iterator each epoch): the batches
  the epoch had left, the same as a run without the fault when the order does not change from
  epoch to epoch (with a ``shuffle`` that reshuffles each iteration, its default, a new
  process draws another order);
* a repeated dataset with ``steps_per_epoch``: Keras keeps one iterator across epochs within a
  process, and a new process starts it from the dataset's first element.  The restored epoch
  drops the first ``done`` batches of that new stream.  When one pass of the dataset is one
  epoch, that is exactly what a run without the fault reads; otherwise it is where the stream
  of a fresh process stands, as with Keras alone;
* a distributed dataset from a function (``distribute_datasets_from_function``): the function
  runs again in the new process; the same drawing applies to what it returns.

Drawing a batch runs the input pipeline, not the model: on the input's cost, not a step's.
The restored epoch's logged loss and metrics cover its remaining batches only.

This file imports only the standard library and its siblings.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from collections.abc import Iterator
from types import ModuleType
from typing import TYPE_CHECKING

from .kerasbase import FIXED, PATCHED, keras_version, local_path, say_once, source_of, untested

ISSUE = "docs/keras-backup-resume.md"
WHAT = "BackupAndRestore's resume"
POSITION = "mwhelpers_batches_done"  # the key each backup's metadata gets
EPOCH_ITERATOR = "keras.src.trainers.epoch_iterator"
RESUMING = ("[mwhelpers] Keras {version} BackupAndRestore: epoch {epoch} resumes after its "
            "first {done} batches, where the backup was taken (Keras 3 alone would run the epoch "
            "again from its first batch; those {done} are drawn from the input, not trained "
            "again; " + ISSUE + "; turn off: MWHELPERS_KERAS_FIX=0)")
NOT_RESUMING = ("[mwhelpers] Keras {version} BackupAndRestore: epoch {epoch} runs again from its "
                "first batch as Keras 3 does, not after the backup's first {done} batches: {why}")
_pending = threading.local()  # .skip: batches the next training epoch draws and drops
_iterator_mended = False  # whether this Keras's epoch iterator honours _pending

if TYPE_CHECKING:  # (not evaluated: this file also runs under the Python of other hosts)
    from typing import Protocol

    class Backup(Protocol):
        """What this file reads of a BackupAndRestore (Keras's own attributes)."""

        model: object
        save_freq: object
        params: dict[str, object]
        _training_metadata_path: str
        _last_batch_seen: int


# -- the record ----------------------------------------------------------------------------

def _update(metadata_path: str, changes: dict[str, int]) -> None:
    """Set ``changes`` in the backup's metadata file, written beside and renamed into place."""
    if not local_path(metadata_path) or not os.path.exists(metadata_path):
        return
    with open(metadata_path) as f:
        metadata = json.load(f)
    metadata.update(changes)
    with open(metadata_path + ".mwhelpers", "w") as f:
        json.dump(metadata, f)
    os.replace(metadata_path + ".mwhelpers", metadata_path)


def mark(metadata_path: str, done: int | None) -> None:
    """Add ``done`` (batches of the epoch done) to the backup's metadata file."""
    if done is not None:
        _update(metadata_path, {POSITION: done})


def mark_epoch_done(metadata_path: str, next_epoch: int) -> None:
    """Make the backup's metadata say that ``next_epoch`` begins, with no batch of it done (a
    backup of the previous epoch's last batch)."""
    _update(metadata_path, {"epoch": next_epoch, POSITION: 0})


def position(metadata_path: object) -> int | None:
    """The batches done in its epoch that a backup records, or None (none recorded)."""
    path = str(metadata_path)
    if not local_path(path) or not os.path.exists(path):
        return None
    try:
        with open(path) as f:
            done = json.load(f).get(POSITION)
    except (OSError, ValueError, AttributeError):
        return None
    return done if isinstance(done, int) and done >= 0 else None


# -- on restore ----------------------------------------------------------------------------

def _restore_source(backup_class: type) -> str | None:
    """The source (whitespace removed) of where this Keras reads the backup: ``_load_model``
    (3.10 and 3.15 have it), else ``on_train_begin`` itself (3.5), Keras's own when mended."""
    begin = getattr(backup_class, "on_train_begin", None)
    load = getattr(backup_class, "_load_model", None) or getattr(begin, "__wrapped__", begin)
    return source_of(load or (lambda: None))


def why_not(backup_class: type) -> str | None:
    """Why this Keras's BackupAndRestore is left resuming as it does, or None."""
    why = untested(keras_version())
    if why:
        return why
    if not _iterator_mended:
        return "its epoch iterator is not one this was written for"
    text = _restore_source(backup_class)
    if text is None or 'training_metadata["epoch"]' not in text:
        return "its BackupAndRestore does not restore the epoch the way this was written for"
    return None


def resumes(backup_class: type) -> bool:
    """Whether this mend resumes this Keras's BackupAndRestore at the saved batch (neither left
    alone nor fixed upstream)."""
    return why_not(backup_class) is None and carries_fix(backup_class) is None


def carries_fix(backup_class: type) -> str | None:
    """How this Keras resumes at the saved batch itself (docs/keras-backup-resume/
    backup_and_restore.patch, or a fix that reads the backup's batch), or None."""
    text = _restore_source(backup_class) or ""
    if "_initial_step" in text:
        return "its BackupAndRestore restores the step inside the epoch (model._initial_step)"
    if 'training_metadata["batch"]' in text or "training_metadata.get(\"batch\"" in text:
        return "its BackupAndRestore reads the backup's batch"
    return None


def plan(backup: Backup, epoch: int) -> int | None:
    """After Keras restored ``backup`` (its epoch: ``epoch``): the batches of that epoch to
    draw and drop, or None to let Keras run the epoch from its start."""
    done = position(backup._training_metadata_path)
    if not done or not isinstance(backup.save_freq, int) or isinstance(backup.save_freq, bool):
        return None
    fixed = carries_fix(type(backup))
    if fixed:
        say_once("resume-fixed", FIXED.format(version=keras_version(), what=WHAT, issue=ISSUE,
                                              how=fixed))
        return None
    why = why_not(type(backup))
    if why:
        say_once("not-resuming", NOT_RESUMING.format(version=keras_version(), epoch=epoch,
                                                     done=done, why=why))
        return None
    say_once("resuming", RESUMING.format(version=keras_version(), epoch=epoch, done=done))
    return done


def arm(skip: int) -> None:
    """The next training epoch's iterator (made right after this epoch's begin) draws and
    drops ``skip`` batches first."""
    _pending.skip = skip


def disarm() -> None:
    _pending.skip = 0


# -- the epoch iterator ----------------------------------------------------------------------

def _skipping(items: Iterator[tuple[object, ...]], skip: int, per_item: int, per_draw: int = 1
              ) -> Iterator[tuple[object, ...]]:
    """``items`` ((step, iterator) or (first step, last step, iterator)), the steps before
    ``skip`` left out after their batches were drawn from their iterator, where one draw
    holds ``per_draw`` batches."""
    tf = sys.modules.get("tensorflow")
    ran_out: tuple[type[BaseException], ...] = (StopIteration,)
    if tf is not None:
        ran_out += (tf.errors.OutOfRangeError,)
    drawing = True
    for item in items:
        first = int(item[0])  # type: ignore[call-overload]  # a step number
        last = int(item[1]) if len(item) == 3 else first + per_item - 1  # type: ignore[call-overload]
        if not drawing or first >= skip:
            yield item
            continue
        try:
            for _ in range(-(-(min(last, skip - 1) - first + 1) // per_draw)):
                next(item[-1])  # type: ignore[call-overload]  # the epoch's data iterator
        except ran_out:
            drawing = False  # the input ran out: Keras sees it at the next step, as it would
        if last >= skip:
            yield item


def _take() -> int:
    skip = getattr(_pending, "skip", 0)
    _pending.skip = 0
    return int(skip)


def _super_batches(epoch_iterator: object) -> bool:
    """Whether each draw from this epoch iterator holds all the batches of one execution (the
    JAX trainer's on Keras master: ``get_jax_iterator(super_batch=...)``)."""
    text = source_of(getattr(type(epoch_iterator), "_get_iterator", None) or (lambda: None))
    return "super_batch" in (text or "")


def _wrap_generator(cls: type, name: str) -> None:
    original = getattr(cls, name)

    def method(self: object, *args: object, **kwargs: object) -> object:
        items = original(self, *args, **kwargs)
        skip = _take()
        if not skip:
            return items
        per_item = int(getattr(self, "steps_per_execution", 1) or 1)
        return _skipping(items, skip, per_item, per_item if _super_batches(self) else 1)

    method.__name__ = name
    method.__wrapped__ = original  # type: ignore[attr-defined]
    setattr(cls, name, method)


def patch_epoch_iterator(module: ModuleType) -> bool:
    """Let Keras's epoch iterators draw and drop a restored epoch's done batches.  ``module``
    is Keras's ``keras.src.trainers.epoch_iterator`` (its ``EpochIterator._enumerate_iterator``,
    what ``__iter__`` makes in Keras 3.10 and later, for every backend) or the TensorFlow
    trainer's module (its ``TFEpochIterator.enumerate_epoch``, Keras 3.5 to 3.9).  True when
    this module has one of them (mended now or before)."""
    global _iterator_mended
    cls = getattr(module, "EpochIterator", None)
    if not isinstance(cls, type) or cls.__module__ != module.__name__:
        cls = getattr(module, "TFEpochIterator", None)
    if not isinstance(cls, type):
        return False
    if getattr(cls, PATCHED + "_resume", False):
        return True
    text = source_of(getattr(cls, "__iter__", None) or (lambda: None)) or ""
    if "_enumerate_iterator" in vars(cls) and \
            "self._epoch_iterator=self._enumerate_iterator()" in text:
        name = "_enumerate_iterator"
    elif callable(vars(cls).get("enumerate_epoch")) and cls.__name__ == "TFEpochIterator":
        name = "enumerate_epoch"  # (the base class's of 3.5 yields batches already drawn)
    else:
        return False
    _wrap_generator(cls, name)
    setattr(cls, PATCHED + "_resume", True)
    _iterator_mended = True
    return True
