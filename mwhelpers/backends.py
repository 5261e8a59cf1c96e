"""Backends: the ways of starting a cluster's tasks, found by name.

A backend is a :class:`~mwhelpers.launchers.Launcher` subclass with a ``name``.
``define_cluster(workers=2, backend="ssh", hosts=["node1", "node2"])`` looks the
name up here, makes one instance for that cluster with the remaining keyword
arguments (its ``options``), asks it where each task goes (``place``) and then
has it start every task; the runtime never asks which backend it holds.
Built in: ``local`` (this machine), ``ssh`` (SSH hosts) and ``slurm`` (the
nodes of a Slurm allocation).

Another package adds one in either of two ways:

* an entry point in its ``pyproject.toml``, found without importing it first::

      [project.entry-points."mwhelpers.backends"]
      kube = "mypackage.kube:KubeLauncher"

* or a call, from code that runs before the cluster is defined::

      mwhelpers.register_backend("kube", KubeLauncher)

A name registered by a call wins over an entry point of the same name; a
built-in name cannot be taken.  ``tests/netns_backend.py`` is a whole backend
in one file, registered the second way.
"""

from __future__ import annotations

from importlib.metadata import EntryPoint, entry_points

from .errors import UsageError

ENTRY_POINT_GROUP = "mwhelpers.backends"
BUILT_IN = {name: EntryPoint(name, value, ENTRY_POINT_GROUP) for name, value in (
    ("local", "mwhelpers.launchers:LocalLauncher"), ("ssh", "mwhelpers.remote:SSHLauncher"),
    ("slurm", "mwhelpers.slurm:SlurmLauncher"))}
_REGISTERED = {}  # name -> class, from register_backend


def _entry_points():
    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def register_backend(name: str, cls: type) -> None:
    """Make ``cls`` (a :class:`~mwhelpers.launchers.Launcher` subclass) the backend
    ``name``: ``define_cluster(..., backend=name)`` and ``%cluster --backend name``."""
    from .launchers import Launcher

    if not isinstance(name, str) or not name.isidentifier():
        raise UsageError(f"a backend's name is a word such as 'kube', got {name!r}")
    if name in BUILT_IN:
        raise UsageError(f"{name!r} is a built-in backend; register yours under another name")
    if not (isinstance(cls, type) and issubclass(cls, Launcher)):
        raise UsageError(f"backend {name!r}: {cls!r} is not a subclass of "
                         "mwhelpers.launchers.Launcher")
    _REGISTERED[name] = cls


def available_backends() -> list[str]:
    """Every backend name that can be given: built in, registered, or from entry points."""
    return sorted({*BUILT_IN, *_REGISTERED, *_entry_points()})


def backend_class(name: str) -> type:
    """The backend class registered as ``name``."""
    if name in BUILT_IN:
        return BUILT_IN[name].load()
    if name in _REGISTERED:
        return _REGISTERED[name]
    found = _entry_points().get(name)
    if found is None:
        raise UsageError(f"no backend is called {name!r}; there are: "
                         f"{', '.join(available_backends())}. A package adds one with an entry "
                         f"point in the group {ENTRY_POINT_GROUP!r} or mwhelpers.register_backend")
    try:
        return found.load()
    except Exception as e:  # a broken plugin: say which one, not a traceback from inside it
        raise UsageError(f"backend {name!r} ({found.value}, from an entry point) could not be "
                         f"loaded: {type(e).__name__}: {e}") from None


def create_backend(name: str, options: dict) -> object:
    """A new instance of backend ``name`` for one cluster, with ``options`` checked
    against the ones it declares (``cls.options``: name -> what it means)."""
    cls = backend_class(name)
    given = {k: v for k, v in options.items() if v is not None}
    unknown = sorted(set(given) - set(cls.options))
    if unknown:
        takes = ", ".join(f"{k} ({what})" for k, what in cls.options.items()) or "no options"
        raise UsageError(f"the {name} backend does not take {', '.join(unknown)}; it takes {takes}")
    return cls(**given)
