"""A task's TensorFlow import without JAX: TensorFlow Lite's ``import jax`` deferred.

``import tensorflow`` runs ``tensorflow/lite/python/util.py``, which does ``from jax import
jit as _jit`` in a ``try``, for one converter (``TFLiteConverter.experimental_from_jax``), and
``import keras`` runs ``keras/src/callbacks/orbax_checkpoint.py``, which imports JAX in a
``try`` to give old JAX releases ``jax.monitoring.record_scalar``.  Where JAX is installed
(the tutorials' lock holds it, for Keras on JAX), that imports all of JAX in every TensorFlow
process: about 3 s of CPU at every start on this project's machine (``import tensorflow`` took
8.5 CPU s instead of 5.4 with JAX 0.10.2 and TensorFlow 2.21).

While those modules run, and only if JAX is installed and not imported yet, a stand-in takes
``jax``'s place in ``sys.modules``.  Its ``jit`` and ``monitoring.record_scalar`` import the
real JAX when they are called; any other attribute read imports it at once.
The stand-in leaves ``sys.modules`` as soon as the module has run, so the program's own
``import jax`` (Keras on JAX, for one) gets the real one.  Where TensorFlow no longer imports
JAX there, nothing happens.  ``MWHELPERS_LAZY_JAX=0`` turns it off; the task's log says so
in one line.  ``%load_ext mwhelpers`` arms the same in the kernel, silently, for the kernel's
own ``import tensorflow``.

Loaded by path in a task's start-up (``_bootstrap.py``): it imports nothing of the package.
"""

from __future__ import annotations

import importlib
import sys
from types import ModuleType

from .lazyplot import Deferral, Deferred, WrappedSpec

ENV = "MWHELPERS_LAZY_JAX"
TF_MODULES = ("tensorflow.lite.python.util", "keras.src.callbacks.orbax_checkpoint")
NOTICE = ("[mwhelpers] JAX is imported when it is used, not with TensorFlow's tf.lite (a "
          "faster start; keep TensorFlow's own import: MWHELPERS_LAZY_JAX=0)")


def jit(*args: object, **kwargs: object) -> object:
    """``jax.jit``, JAX imported at the first call."""
    return importlib.import_module("jax").jit(*args, **kwargs)


def record_scalar(*args: object, **kwargs: object) -> object:
    """``jax.monitoring.record_scalar``, JAX imported at the first call."""
    return importlib.import_module("jax.monitoring").record_scalar(*args, **kwargs)


def _stand_ins() -> dict[str, ModuleType]:
    jax, monitoring = Deferred("jax"), Deferred("jax.monitoring")
    jax.jit = jit  # type: ignore[attr-defined]  # ``from jax import jit`` reads it
    monitoring.record_scalar = record_scalar  # type: ignore[attr-defined]  # Keras checks it
    jax.monitoring = monitoring  # type: ignore[attr-defined]
    return {"jax": jax, "jax.monitoring": monitoring}


def install(wrapped_spec: WrappedSpec, say: bool = True) -> bool:
    """Defer TensorFlow Lite's and Keras's JAX imports in this process; False when both
    modules have loaded already.  ``wrapped_spec``: :func:`tfdata.wrapped_spec`.  ``say``:
    write the notice once (a task's log; the kernel, where ``%load_ext mwhelpers`` arms it,
    says nothing)."""
    if all(name in sys.modules for name in TF_MODULES):
        return False
    if not any(isinstance(f, Deferral) and f.notice == NOTICE for f in sys.meta_path):
        sys.meta_path.insert(0, Deferral(wrapped_spec, TF_MODULES, ("jax",), _stand_ins, NOTICE,
                                         say))
    return True


def uninstall() -> None:
    sys.meta_path[:] = [f for f in sys.meta_path
                        if not (isinstance(f, Deferral) and f.notice == NOTICE)]
