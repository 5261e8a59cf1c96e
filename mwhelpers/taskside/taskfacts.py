"""Which TensorFlow and which Keras a task really ran, said once in its log.

The worker start-up (``_bootstrap.py``) loads this file by path and, right
after the program imports TensorFlow, writes one line to the task's log::

    [mwhelpers] this task: TensorFlow 2.21.0 with tf_keras 2.21.0 (TF_USE_LEGACY_KERAS=1 at import)

Keras 3 on another backend than TensorFlow says which, with its version ("with Keras
3.15.1 on JAX 0.10.2"): the TensorFlow-only parts of mwhelpers (the stall workaround, the
Keras mends) then change nothing. It is what the program itself saw: a
``TF_USE_LEGACY_KERAS`` set in the program before ``import tensorflow`` counts, one set
later does not (TensorFlow reads it then). The kernel reads these lines back
(:func:`parse`) to tell when the tasks of one job did not run the same TensorFlow or
Keras. Cells do not show the line (:class:`mwhelpers.logs.QuietFilter`); the log keeps it.

Standard library only: the start-up loads it without the mwhelpers package.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping, Sequence

PREFIX = "[mwhelpers] this task: "
LEGACY_ENV = "TF_USE_LEGACY_KERAS"
_LINE = re.compile(r"^\[mwhelpers\] this task: TensorFlow (?P<tensorflow>\S+) with (?P<keras>.+?) "
                   r"\(TF_USE_LEGACY_KERAS=(?P<legacy>\S*) at import\)$")


def legacy_selected(value: str | None) -> bool:
    """True when a ``TF_USE_LEGACY_KERAS`` value selects tf_keras, exactly as TensorFlow reads
    it (``tensorflow/__init__.py`` and ``python/util/lazy_loader.py``: only "true", "True" and
    "1"; "yes" or "TRUE" leave Keras 3 in place)."""
    return value in ("true", "True", "1")


# Where each Keras keeps its version, so that it can be read without importing it.
_VERSION_FILES = {"keras": ("src/version.py", "__init__.py"), "tf_keras": ("__init__.py",)}
_VERSION = re.compile(r"^__version__\s*=\s*[\"']([^\"']+)[\"']", re.M)


def module_version(name: str) -> str | None:
    """The version of the top-level package ``name`` as this Python would import it: from the
    module when it is imported, else read from its files (whichever distribution installed
    it: keras or keras-nightly, tf_keras or tf-keras-nightly), else None."""
    version = getattr(sys.modules.get(name), "__version__", None)
    if version:
        return str(version)
    try:
        import importlib.util

        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    folders = list(spec.submodule_search_locations or []) if spec else []
    for folder in folders:
        for relative in _VERSION_FILES.get(name, ("__init__.py",)):
            try:
                with open(os.path.join(folder, relative), encoding="utf-8") as f:
                    m = _VERSION.search(f.read())
            except OSError:
                continue
            if m:
                return m.group(1)
    return None


def keras_of(tf_version: str | None, legacy_value: str | None) -> str:
    """The Keras that ``tf.keras`` is for this TensorFlow and setting: 'tf_keras 2.21.0',
    'Keras 3.15.1', 'Keras 2.15.0' ('... (not installed)' when missing)."""
    numbers = [int(n) for n in re.findall(r"\d+", tf_version or "")[:2]]
    if numbers and tuple(numbers) < (2, 16):  # tf.keras was Keras 2 (the keras package)
        return f"Keras {module_version('keras') or '(not installed)'}"
    if legacy_selected(legacy_value):
        return f"tf_keras {module_version('tf_keras') or '(not installed)'}"
    return f"Keras {module_version('keras') or '(not installed)'}"


_BACKENDS = {"jax": "JAX", "torch": "PyTorch", "numpy": "NumPy", "openvino": "OpenVINO"}


def keras_backend(environ: Mapping[str, str] = os.environ) -> str:
    """The backend Keras 3 runs on in this process: its configuration's when Keras has loaded
    it, else ``KERAS_BACKEND``, else 'tensorflow' (Keras's default; its keras.json is not
    read)."""
    config = sys.modules.get("keras.src.backend.config")
    try:
        return str(config.backend()) if config is not None else \
            environ.get("KERAS_BACKEND") or "tensorflow"
    except Exception:  # a Keras half loaded
        return environ.get("KERAS_BACKEND") or "tensorflow"


def _on_backend(keras: str, environ: Mapping[str, str]) -> str:
    """``keras`` ('Keras 3.15.1') with its backend when that is not TensorFlow: 'Keras 3.15.1
    on JAX 0.10.2'."""
    backend = keras_backend(environ)
    if not keras.startswith("Keras 3") or backend == "tensorflow":
        return keras
    version = getattr(sys.modules.get(backend), "__version__", None)
    if not version:
        try:
            from importlib.metadata import version as installed

            version = installed(backend)
        except Exception:
            version = "(version unknown)"
    return f"{keras} on {_BACKENDS.get(backend, backend)} {version}"


def line_for(tf_module: object, environ: Mapping[str, str] = os.environ) -> str:
    version = getattr(tf_module, "__version__", None) or "unknown"
    legacy = environ.get(LEGACY_ENV, "unset") or "unset"
    keras = _on_backend(keras_of(version, legacy), environ)
    return f"{PREFIX}TensorFlow {version} with {keras} ({LEGACY_ENV}={legacy} at import)"


def say(tf_module: object) -> None:
    """Write the facts line of a task that has just imported TensorFlow (never raises)."""
    try:
        print(line_for(tf_module), file=sys.stderr, flush=True)
    except Exception:  # a fact is not worth breaking the program for
        pass


def parse(lines: Sequence[str]) -> dict[str, str] | None:
    """``{'tensorflow', 'keras', 'legacy'}`` from the last facts line in ``lines``, or None."""
    for line in reversed(lines):
        m = _LINE.match(line)
        if m:
            return m.groupdict()
    return None
