"""The kernel's own ``import tensorflow``, without TensorFlow's start-up records in the cell.

While its shared libraries load, TensorFlow writes records straight to file descriptor 2:
absl's "All log messages before absl::InitializeLog() is called ..." and oneDNN's
"oneDNN custom operations are on", twice, whatever ``TF_CPP_MIN_LOG_LEVEL`` says (measured
with TensorFlow 2.21 at levels 2 and 3).  A notebook shows them as a red block under the cell
that imports TensorFlow, which looks like an error and is not one.

Once the extension is loaded, the kernel's first ``import tensorflow`` runs with descriptor 2
pointed at a temporary file.  Afterwards, every line a worker's cell would show
(:class:`~mwhelpers.logs.QuietFilter`: anything but TensorFlow's informational records and
the CPU-only start-up messages) is written to the cell's stderr; the others are kept in
:data:`hidden`, or written too when ``mwhelpers.runtime().verbose`` is true at that import.
Nothing else changes: the module, its spec and its loader are TensorFlow's own once the
import is done.  Where JAX is installed, that import also arms :mod:`mwhelpers.taskside.lazyjax`
in the kernel (TensorFlow and Keras then import JAX only when it is used).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
import tempfile
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

# The lines left out of the cell at the kernel's import of TensorFlow.
hidden: list[str] = []


class _QuietLoader(importlib.abc.Loader):
    """TensorFlow's own loader, run with descriptor 2 going to a file."""

    def __init__(self, real: Any, verbose: Callable[[], bool]) -> None:
        self.real = real
        self.verbose = verbose

    def __getattr__(self, name: str) -> Any:  # get_resource_reader, is_package, ...
        return getattr(self.real, name)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        module: ModuleType | None = self.real.create_module(spec)
        return module

    def exec_module(self, module: ModuleType) -> None:
        module.__loader__ = self.real  # TensorFlow's own, from here on
        if module.__spec__ is not None:
            module.__spec__.loader = self.real
        sys.stderr.flush()
        with tempfile.TemporaryFile() as caught:
            saved = os.dup(2)
            os.dup2(caught.fileno(), 2)
            try:
                self.real.exec_module(module)
            finally:
                os.dup2(saved, 2)
                os.close(saved)
                caught.seek(0)
                show(caught.read().decode("utf-8", "replace").splitlines(), self.verbose())


def show(lines: Sequence[str], verbose: bool) -> None:
    """Write to stderr the ``lines`` a cell shows (all of them when ``verbose``); keep the
    rest in :data:`hidden`."""
    from .logs import QuietFilter

    quiet = QuietFilter()
    shown = []
    for line in lines:
        if verbose or quiet.keep(line):
            shown.append(line)
        else:
            hidden.append(line)
    if shown:
        sys.stderr.write("\n".join(shown) + "\n")
        sys.stderr.flush()


def _defer_jax() -> None:
    """Where JAX is installed, the kernel's TensorFlow and Keras import it only when it is
    used (:mod:`mwhelpers.taskside.lazyjax`, silently here; ``MWHELPERS_LAZY_JAX=0``: not)."""
    from . import settings

    if settings.LAZY_JAX.read(os.environ):
        from .taskside import lazyjax, tfdata

        lazyjax.install(tfdata.wrapped_spec, say=False)


class _Finder(importlib.abc.MetaPathFinder):
    def __init__(self, verbose: Callable[[], bool]) -> None:
        self.verbose = verbose

    def find_spec(self, name: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if name != "tensorflow":
            return None
        uninstall()  # once: the first import only
        _defer_jax()
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _QuietLoader(spec.loader, self.verbose)
        return spec


def install(verbose: Callable[[], bool]) -> bool:
    """Quiet the kernel's first import of TensorFlow, unless it has happened already;
    ``verbose()`` (asked at that import) shows every line instead.  True if armed."""
    if "tensorflow" in sys.modules or any(isinstance(f, _Finder) for f in sys.meta_path):
        return False
    sys.meta_path.insert(0, _Finder(verbose))
    return True


def uninstall() -> None:
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _Finder)]
