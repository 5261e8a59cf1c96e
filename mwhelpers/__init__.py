"""mwhelpers: run real TensorFlow worker processes from a notebook.

``%load_ext mwhelpers`` adds the magics (%cluster, %%worker, %workers, ...);
the same features are available from Python through :class:`Runtime`
(``mwhelpers.runtime()`` is the kernel's) and :class:`Cluster`.

Importing this package is cheap: TensorFlow is never imported here.
"""

import typing as _typing  # private: dir(mwhelpers) lists the public names only

if _typing.TYPE_CHECKING:
    from IPython.core.interactiveshell import InteractiveShell

__version__ = "0.2.0"

_LAZY = {
    "Cluster": "cluster", "Task": "cluster", "parse_task": "cluster",
    "Runtime": "workers", "runtime": "workers", "set_runtime": "workers", "TaskRun": "workers",
    "avoid_teardown_stall": "taskside.tfdata",
    "fix_keras_multi_worker": "taskside.kerasfix",
    "Failure": "failures", "LaunchRequest": "taskrun",
    "MWHelpersError": "errors", "UsageError": "errors", "WorkerError": "errors",
    "WorkerFailed": "failures", "WorkerTimeout": "errors", "InfrastructureError": "errors",
    "CellFailed": "errors", "TaskValues": "pxoutput",
    "register_backend": "backends", "available_backends": "backends", "Launcher": "backends",
    "AgentLauncher": "backends", "BackendOptions": "backends", "Process": "backends",
    "Placement": "backends", "LaunchSpec": "backends", "write_sbatch": "backends.slurm",
    "write_kubernetes": "backends.kubernetes",
    "versions": "packages", "tensorflow_distributions": "packages",
    "Results": "results", "read_results": "results",
}


# What a type checker sees of the names above: the same objects, imported here only while
# checking (a user's `from mwhelpers import Runtime` is typed, not Any).
if _typing.TYPE_CHECKING:
    from .backends import AgentLauncher as AgentLauncher
    from .backends import BackendOptions as BackendOptions
    from .backends import Launcher as Launcher
    from .backends import LaunchSpec as LaunchSpec
    from .backends import Placement as Placement
    from .backends import Process as Process
    from .backends import available_backends as available_backends
    from .backends import register_backend as register_backend
    from .backends.kubernetes import write_kubernetes as write_kubernetes
    from .backends.slurm import write_sbatch as write_sbatch
    from .cluster import Cluster as Cluster
    from .cluster import Task as Task
    from .cluster import parse_task as parse_task
    from .errors import CellFailed as CellFailed
    from .errors import InfrastructureError as InfrastructureError
    from .errors import MWHelpersError as MWHelpersError
    from .errors import UsageError as UsageError
    from .errors import WorkerError as WorkerError
    from .errors import WorkerTimeout as WorkerTimeout
    from .failures import Failure as Failure
    from .failures import WorkerFailed as WorkerFailed
    from .packages import tensorflow_distributions as tensorflow_distributions
    from .packages import versions as versions
    from .pxoutput import TaskValues as TaskValues
    from .results import Results as Results
    from .results import read_results as read_results
    from .taskrun import LaunchRequest as LaunchRequest
    from .taskside.kerasfix import fix_keras_multi_worker as fix_keras_multi_worker
    from .taskside.tfdata import avoid_teardown_stall as avoid_teardown_stall
    from .workers import Runtime as Runtime
    from .workers import TaskRun as TaskRun
    from .workers import runtime as runtime
    from .workers import set_runtime as set_runtime


def __getattr__(name: str) -> _typing.Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'mwhelpers' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(list(globals()) + list(_LAZY))


def load_ipython_extension(ipython: "InteractiveShell") -> None:
    from .magics import load

    load(ipython)


def unload_ipython_extension(ipython: "InteractiveShell") -> None:
    from .magics import unload

    unload(ipython)
