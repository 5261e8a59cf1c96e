"""The workshop: tools around mwhelpers, apart from the core that runs workers.

Nothing in the core (the runtime, the backends, the magics, the diagnosis)
imports from here; these are for the tutorials, for CI and for trying
several machines on one laptop:

* :mod:`.suite`: run notebooks headless, side by side, with a summary
  (``python -m mwhelpers.workshop.suite NOTEBOOK_OR_FOLDER ...``; the extra
  ``mwhelpers[suite]`` installs papermill for it);
* :mod:`.testhosts`: test hosts on this machine, network namespaces with sshd
  and a one-box Slurm (``sudo python -m mwhelpers.workshop.testhosts up``);
* :mod:`.replay`: what a cell that needs hosts printed in a recorded run,
  shown where it cannot run;
* :mod:`.data`: :func:`load_mnist`, real MNIST digits online or offline;
* :mod:`.backupwatch`: the callback that reports notebook 06's backups.
"""

from typing import Any


def __getattr__(name: str) -> Any:
    if name == "load_mnist":
        from .data import load_mnist

        return load_mnist
    raise AttributeError(f"module 'mwhelpers.workshop' has no attribute {name!r}")
