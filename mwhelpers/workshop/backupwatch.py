"""What notebook 06's workers print about their backups, for the notebook to read back.

:class:`Progress` is a Keras callback placed after ``BackupAndRestore`` in ``fit``'s list.  It
prints, as lines the notebook parses:

* ``START {...}``: the step ``fit`` starts at, and the chief's ``training_metadata.json``;
* ``STEP epoch=E batch=B iteration=I loss=L``: after each step;
* ``BACKUP {...}``: after each backup ``BackupAndRestore`` saved, with the folder it went to and
  what ``backup_dir`` held during and after the save.

``BackupAndRestore`` saves the weights with ``model.save_weights``; :class:`Progress` wraps that
method to note where each save went.  It changes nothing in training.
"""

from __future__ import annotations

import json
import os
from typing import Any

import keras


def listing(folder: str) -> list[str]:
    return sorted(os.listdir(folder)) if os.path.isdir(folder) else []


def backed_up(backup_dir: str) -> Any:
    """The chief's ``training_metadata.json`` in ``backup_dir``, or None."""
    path = os.path.join(backup_dir, "training_metadata.json")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


class Progress(keras.callbacks.Callback):  # type: ignore[misc]
    """START, STEP and BACKUP lines (the module's text); ``chief``: whether this worker
    writes ``backup_dir`` itself (its BACKUP lines then say what the backup holds)."""

    def __init__(self, backup_dir: str, chief: bool) -> None:
        super().__init__()
        self.folder, self.chief = backup_dir, chief
        self.saves: list[dict[str, Any]] = []
        self.epoch = 0

    def on_train_begin(self, logs: Any = None) -> None:  # after BackupAndRestore restored
        save_weights = self.model.save_weights

        def watched(filepath: str, **kwargs: Any) -> None:
            save_weights(filepath, **kwargs)
            self.saves.append({"wrote_to": os.path.relpath(os.path.dirname(filepath), self.folder),
                               "during": listing(self.folder)})

        self.model.save_weights = watched
        print("START " + json.dumps({"iteration": int(self.model.optimizer.iterations.numpy()),
                                     "backup": backed_up(self.folder)}), flush=True)

    def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
        self.epoch = epoch

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        it = int(self.model.optimizer.iterations.numpy())
        print(f"STEP epoch={self.epoch} batch={batch} iteration={it} loss={logs['loss']:.4f}",
              flush=True)
        self.on_epoch_end(self.epoch)

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:  # BackupAndRestore's save is over
        for save in self.saves:
            save.update(iteration=int(self.model.optimizer.iterations.numpy()), in_epoch=epoch,
                        after=listing(self.folder),
                        saved=backed_up(self.folder) if self.chief else None)
            print("BACKUP " + json.dumps(save), flush=True)
        self.saves.clear()
