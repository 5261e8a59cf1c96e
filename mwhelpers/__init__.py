"""mwhelpers: run real TensorFlow worker processes from a notebook.

``%load_ext mwhelpers`` adds the magics (%cluster, %%worker, %workers, ...);
the same features are available from Python through :class:`Runtime`
(``mwhelpers.runtime()`` is the kernel's) and :class:`Cluster`.

Importing this package is cheap: TensorFlow is never imported here.
"""

__version__ = "0.2.0"

_LAZY = {
    "Cluster": "cluster", "Task": "cluster", "parse_task": "cluster",
    "Runtime": "workers", "runtime": "workers", "TaskRun": "workers",
    "avoid_teardown_stall": "tfdata",
    "fix_keras_multi_worker": "kerasfix",
    "Failure": "failures", "LaunchRequest": "taskrun",
    "MWHelpersError": "errors", "UsageError": "errors", "WorkerError": "errors",
    "WorkerFailed": "errors", "WorkerTimeout": "errors", "InfrastructureError": "errors",
    "register_backend": "backends", "available_backends": "backends", "Launcher": "backends",
    "AgentLauncher": "backends", "Option": "backends", "Process": "backends",
    "Placement": "backends", "LaunchSpec": "backends", "write_sbatch": "backends.slurm",
    "versions": "versions", "tensorflow_distributions": "versions",
    "Results": "results", "read_results": "results",
}


def __getattr__(name):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'mwhelpers' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(list(globals()) + list(_LAZY))


def load_ipython_extension(ipython):
    from .magics import load

    load(ipython)


def unload_ipython_extension(ipython):
    from .magics import unload

    unload(ipython)
