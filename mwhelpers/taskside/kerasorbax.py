"""Keras's ``OrbaxCheckpoint`` given a relative folder: said before the first save.

Orbax writes to absolute paths only ("Checkpoint path should be absolute", in
``orbax/checkpoint/_src/serialization/tensorstore_utils.py``).  ``keras.callbacks.
OrbaxCheckpoint(directory="ckpt")`` takes the folder as given, and each save then fails.  By
default Keras saves in the background (``save_on_background=True``): a save's failure is a
traceback in the task's log while training goes on; the next save raises it out of ``fit``,
and ``on_train_end`` drops what the last save raised (Keras 3.15.1,
``keras/src/callbacks/orbax_checkpoint.py``).  A job of one save (one epoch, or the last save
of a resumed run) ends with exit code 0 and no checkpoint; a restart finds nothing to resume
from.  ``model.load_weights`` of a relative folder fails too, inside Keras or Orbax
(mwhelpers' failure report explains the first: ``orbax-relative-path``).

Here, in a task, an ``OrbaxCheckpoint`` made with a relative local folder says so once in the
task's log (and so in the cell), with the absolute folder to give instead.  A folder with a
scheme (``gs://...``) is left alone.  It changes nothing: a check, not a mend.
``MWHELPERS_ORBAX_CHECK=0`` turns it off.  Where the installed Keras has no
``OrbaxCheckpoint`` (before 3.14), nothing is armed; where its ``__init__`` makes the folder
absolute itself (``absolute_path(directory)``, the change of docs/keras-orbax-relative.md),
the check says so once and steps aside.

Loaded by path in a task's start-up (``_bootstrap.py``): it imports nothing of the package.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from types import ModuleType
from typing import Any

from .kerasbase import CARRIES, PATCHED, keras_version, local_path, safely, say_once, source_of

ENV = "MWHELPERS_ORBAX_CHECK"
TARGET = "keras.src.callbacks.orbax_checkpoint"
PREFIX = "[mwhelpers] OrbaxCheckpoint: "
SKIPPED = "[mwhelpers] the check of OrbaxCheckpoint's folder is not armed ({issue}): {why}"
CARRIED = ("[mwhelpers] Keras {version} " + CARRIES + " the OrbaxCheckpoint folder check (its "
           "OrbaxCheckpoint makes a relative folder absolute itself: docs/keras-orbax-relative.md)"
           ": the check steps aside")


def relative(directory: object) -> str | None:
    """The line to say for ``directory`` when it is a relative local folder, else None."""
    if not isinstance(directory, (str, os.PathLike)):
        return None
    text = os.fspath(directory)
    if not isinstance(text, str) or not local_path(text) or os.path.isabs(text):
        return None
    return (f"{PREFIX}the folder {text!r} is relative, and Orbax writes to absolute paths only: "
            "every save would fail (Keras saves in the background by default: a job of one "
            "save ends with no error and no checkpoint); give "
            f"{os.path.abspath(text)!r} (os.path.abspath), to OrbaxCheckpoint and to "
            "model.load_weights")


def patch(module: ModuleType) -> None:
    cls = module.OrbaxCheckpoint
    init = cls.__init__
    if getattr(init, PATCHED, False):
        return
    if "absolute_path(directory)" in (source_of(init) or ""):  # Keras resolves it itself
        say_once("orbax-carried", CARRIED.format(version=keras_version() or "?"))
        return

    @functools.wraps(init)
    def __init__(self: Any, directory: object, *args: Any, **kwargs: Any) -> None:
        line = relative(directory)
        if line is not None:
            say_once(f"orbax-relative-{directory}", line)
        init(self, directory, *args, **kwargs)

    setattr(__init__, PATCHED, True)
    cls.__init__ = __init__


def install(after_import: Callable[[str, Callable[[ModuleType], object]], None]) -> None:
    """Arm the check once Keras's OrbaxCheckpoint loads (``after_import``:
    :func:`tfdata.after_import`)."""
    after_import(TARGET, safely(patch, "relative folders", SKIPPED))
