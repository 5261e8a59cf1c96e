"""Keras 3's TensorBoard callback under multi-worker MultiWorkerMirroredStrategy.

Keras 3's ``TensorBoard`` has no notion of a chief: every worker writes its event files
into the folder the user named (``set_model`` takes ``log_dir`` as it is, in
``keras/src/callbacks/tensorboard.py``), and the chart then mixes the workers' runs.
Under multi-worker MWMS, the chief writes where the user asked and every other worker
writes to ``<log_dir>/workertemp_<task id>/``, removed when its training ends (the same
naming as the checkpointing callbacks' mend).  Each worker still writes what it wrote:
only where its files go changes.

Armed with the ``fit`` mend (:func:`kerasfix.install`), on the same terms.  This file
imports only the standard library and its siblings.
"""

from __future__ import annotations

import os
from types import ModuleType
from typing import TYPE_CHECKING

from .kerasbase import (
    CANNOT_TELL,
    FIXED,
    PATCHED,
    SKIPPED,
    keras_version,
    local_path,
    multi_worker_job,
    remove_tree,
    say_once,
    say_who_writes,
    source_of,
    untested,
    worker_of,
)

TARGET = "keras.src.callbacks.tensorboard"
ISSUE = "docs/keras-tensorboard.md"
# What is mended, whitespace removed, as Keras 3.0 to 3.15 write it: the folder is log_dir.
WRITE_DIR = "self._log_write_dir=self.log_dir"
# A set_model that asks where this process writes (docs/keras-tensorboard/tensorboard.patch, or
# tf.keras's way): Keras carries the fix.
FIX = ("_non_chief_log_dir(", "should_save_summary", "write_dirpath(")

if TYPE_CHECKING:  # (not evaluated: this file also runs under the Python of other hosts)
    from typing import Protocol

    class TensorBoardCallback(Protocol):
        """What the mended methods use of ``self`` (Keras's own attributes)."""

        model: object
        log_dir: str
        _mwhelpers_training: bool
        _writers: dict[str, object]


def _aside(cls: object) -> str | None:
    """The line to say where this Keras's TensorBoard is left alone (an untested release,
    other internals, the fix carried, source it cannot judge), or None to mend it."""
    version = keras_version()
    what = "TensorBoard under multi-worker MWMS"
    why = untested(version)
    if why:
        return SKIPPED.format(issue=ISSUE, why=why)
    needed = ("set_model", "on_train_end")
    if not isinstance(cls, type) or not all(callable(getattr(cls, n, None)) for n in needed):
        return SKIPPED.format(issue=ISSUE, why=f"Keras {version}'s TensorBoard has no "
                                               f"{' or '.join(needed)}")
    text = source_of(getattr(cls, "set_model"))  # noqa: B009 (a class of unknown type)
    if text is None:
        return SKIPPED.format(issue=ISSUE, why=f"Keras {version}'s source cannot be read")
    if any(f in text for f in FIX):
        return FIXED.format(version=version, what=what, issue=ISSUE, how="its set_model sends a "
                            "worker that is not the chief to a folder of its own")
    if WRITE_DIR not in text:
        return CANNOT_TELL.format(version=version, what=what, issue=ISSUE, why="its "
                                  "TensorBoard.set_model no longer writes to log_dir as it is")
    return None


def patch(module: ModuleType) -> None:
    """Make ``keras.src.callbacks.tensorboard.TensorBoard`` chief-aware."""
    cls = getattr(module, "TensorBoard", None)
    aside = _aside(cls)
    if aside:
        if multi_worker_job():
            say_once(f"skipped-{ISSUE}", aside)
        return
    assert isinstance(cls, type)
    if getattr(cls, PATCHED, False):
        return
    set_model, train_end = vars(cls)["set_model"], vars(cls)["on_train_end"]
    train_begin, test_end = vars(cls)["on_train_begin"], vars(cls)["on_test_end"]
    # Callback's own (TensorBoard writes nothing at predict, yet its set_model made writers).
    predict_end = getattr(cls, "on_predict_end")  # noqa: B009 (a class of unknown type)

    def _set_model(self: TensorBoardCallback, model: object) -> object:
        # on_train_begin follows within fit; a fit that raised must not leave it set.
        self._mwhelpers_training = False
        worker = worker_of(model)
        if worker is None or not local_path(self.log_dir):
            return set_model(self, model)
        _, chief, temp_name = worker
        folder = str(self.log_dir)
        temp = os.path.join(folder, temp_name)
        say_who_writes(f"tensorboard-{folder}", "TensorBoard", chief, folder,
                       os.path.join(folder, "workertemp_<id>") if chief else temp, "write",
                       ISSUE + "; ")
        if chief:
            return set_model(self, model)
        # Keras takes its folders from log_dir in set_model: lend it the temporary one.
        self.log_dir = temp
        try:
            return set_model(self, model)
        finally:
            self.log_dir = folder

    def remove_temp(self: TensorBoardCallback) -> None:
        worker = worker_of(self.model)
        if worker is not None and not worker[1] and local_path(self.log_dir):
            remove_tree(os.path.join(str(self.log_dir), worker[2]))

    def on_train_begin(self: TensorBoardCallback, logs: object = None) -> object:
        self._mwhelpers_training = True
        return train_begin(self, logs)

    def on_train_end(self: TensorBoardCallback, logs: object = None) -> object:
        self._mwhelpers_training = False
        result = train_end(self, logs)  # closes the writers
        remove_temp(self)
        return result

    def end_alone(self: TensorBoardCallback) -> None:
        """After an evaluate or predict of its own (not fit's validation), whose set_model
        made new writers: they end here, and so does the temporary folder of a worker that is
        not the chief (the next call makes new ones)."""
        worker = worker_of(self.model)
        if not getattr(self, "_mwhelpers_training", False) and worker is not None and not worker[1]:
            for writer in getattr(self, "_writers", {}).values():
                writer.close()
            self._writers = {}
            remove_temp(self)

    def on_test_end(self: TensorBoardCallback, logs: object = None) -> object:
        result = test_end(self, logs)
        end_alone(self)
        return result

    def on_predict_end(self: TensorBoardCallback, logs: object = None) -> object:
        result = predict_end(self, logs)
        end_alone(self)
        return result

    _set_model.__name__ = "set_model"
    for f, original in ((_set_model, set_model), (on_train_end, train_end),
                        (on_train_begin, train_begin), (on_test_end, test_end),
                        (on_predict_end, predict_end)):
        setattr(f, "__wrapped__", original)  # noqa: B010
        setattr(cls, f.__name__, f)
    setattr(cls, PATCHED, True)
