"""A worker's Keras import without matplotlib: ``import matplotlib.pyplot`` deferred.

Keras 3 imports matplotlib when it is imported itself, for two functions that draw image
galleries: ``keras/src/visualization/plot_image_gallery.py`` (``import matplotlib.pyplot as
plt``) and ``plot_bounding_box_gallery.py`` (``from matplotlib import patches``), each in a
``try``.  In a worker that draws nothing that is about 0.4 s of CPU at every start
(measured with Keras 3.15 and matplotlib 3.10 on this project's machine: TensorFlow and
Keras imported in 1.65 CPU s instead of 2.1).

While those two Keras modules run, and only if matplotlib is not imported yet, this puts
stand-ins for ``matplotlib``, ``matplotlib.pyplot`` and ``matplotlib.patches`` in
``sys.modules``; the modules keep their ``plt`` and ``patches`` stand-ins, and the
stand-ins leave ``sys.modules`` as soon as each has run.  The first attribute a gallery
function reads from one imports the real module.  The program's own ``import matplotlib``
is untouched and gets the real one.  When Keras no longer has those modules, nothing
happens, and nothing happens where matplotlib is not installed (Keras then sets ``plt`` and
``patches`` to None and says so when a gallery is drawn).  ``MWHELPERS_LAZY_PYPLOT=0`` turns
it off.  The worker's log says so in one line
(cells leave it out, like TensorFlow's informational lines).

Loaded by path in a task's start-up (``_bootstrap.py``): it imports nothing of the
package.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
from collections.abc import Callable, Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType

ENV = "MWHELPERS_LAZY_PYPLOT"
# tfdata.wrapped_spec's type: (finder, fullname, path, target, around) -> spec or None
WrappedSpec = Callable[..., "ModuleSpec | None"]
KERAS_MODULES = ("keras.src.visualization.plot_image_gallery",
                 "keras.src.visualization.plot_bounding_box_gallery")
DEFERRED = ("matplotlib", "matplotlib.pyplot", "matplotlib.patches")
NOTICE = ("[mwhelpers] matplotlib is imported when a plot needs it, not with Keras (a faster "
          "start; keep Keras's own import: MWHELPERS_LAZY_PYPLOT=0)")


class Deferred(ModuleType):
    """A module that imports the real one named like it on the first attribute read that
    it does not hold itself, and answers from it."""

    def __getattr__(self, attr: str) -> object:
        if attr.startswith("__") and attr.endswith("__"):
            raise AttributeError(attr)  # introspection does not import matplotlib
        return getattr(importlib.import_module(self.__name__), attr)


def _installed(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


class Deferral(importlib.abc.MetaPathFinder):
    """Runs each of the modules ``watched`` (once each) with stand-ins in ``sys.modules`` for
    the modules ``deferred`` (``make()`` builds them), which leave as soon as it has run; says
    ``notice`` once, on stderr.  Nothing is deferred where a deferred module is imported
    already or not installed: the watched module's own ``try``/``except ImportError`` must
    see what is really there.  (Also :mod:`lazyjax`'s.)"""

    def __init__(self, wrapped_spec: WrappedSpec, watched: Sequence[str],
                 deferred: Sequence[str], make: Callable[[], dict[str, ModuleType]],
                 notice: str, say: bool = True) -> None:
        self.wrapped_spec = wrapped_spec
        self.say = say  # False: the notice is not written (the kernel's own import)
        self.waiting = set(watched)
        self.deferred = tuple(deferred)
        self.make = make
        self.notice = notice
        self.said = False

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> ModuleSpec | None:
        if fullname not in self.waiting:
            return None
        self.waiting.discard(fullname)
        if not self.waiting:
            sys.meta_path.remove(self)
        return self.wrapped_spec(self, fullname, path, target, self._run)

    def _run(self, run: Callable[[ModuleType], None], module: ModuleType) -> None:
        if any(name in sys.modules for name in self.deferred) \
                or not _installed(self.deferred[0]):
            run(module)
            return
        stand_ins = self.make()
        sys.modules.update(stand_ins)
        try:
            run(module)
        finally:
            for name, stand_in in stand_ins.items():
                if sys.modules.get(name) is stand_in:
                    del sys.modules[name]
        if not self.said and self.say:
            self.said = True
            sys.stderr.write(self.notice + "\n")
            sys.stderr.flush()


def _pyplot_stand_ins() -> dict[str, ModuleType]:
    stand_ins: dict[str, ModuleType] = {name: Deferred(name) for name in DEFERRED}
    for name in DEFERRED[1:]:  # ``from matplotlib import patches`` reads an attribute
        setattr(stand_ins["matplotlib"], name.rsplit(".", 1)[1], stand_ins[name])
    return stand_ins


def install(wrapped_spec: WrappedSpec) -> bool:
    """Defer Keras's matplotlib imports in this process; False when Keras has loaded its
    visualization modules already.  ``wrapped_spec``: :func:`tfdata.wrapped_spec`
    (passed in: in a task's start-up both modules are loaded by path)."""
    if any(name in sys.modules for name in KERAS_MODULES):
        return False
    if not any(isinstance(f, Deferral) and f.notice == NOTICE for f in sys.meta_path):
        sys.meta_path.insert(0, Deferral(wrapped_spec, KERAS_MODULES, DEFERRED,
                                         _pyplot_stand_ins, NOTICE))
    return True
