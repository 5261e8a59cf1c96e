"""Backends: the ways of starting a cluster's tasks, found by name.

A backend is a :class:`Launcher` subclass with a ``name`` and its ``options``: a
frozen dataclass of :class:`BackendOptions` whose fields, made by :func:`option`,
are the options (their types, defaults, converters and help, declared once; see
:mod:`.options`).  ``define_cluster(2, backend="ssh", hosts=["node1", "node2"])``
looks the name up here, makes the backend's options from the other keyword
arguments (checked and converted), makes one instance for that cluster from them
(``SSHLauncher(SSHOptions(hosts=("node1", "node2")))``), asks it where each task
goes (``place``) and then has it start every task; the runtime never asks which
backend it holds.  ``%cluster`` builds its flags and its help from the same
fields (``%cluster --backend ssh --help`` lists them).

Built in, one module each: ``local`` (:mod:`.local`, this machine), ``ssh``
(:mod:`.ssh`, SSH hosts), ``slurm`` (:mod:`.slurm`, the nodes of a Slurm
allocation) and ``ray`` (:mod:`.raynodes`, the nodes of a Ray cluster); the remote ones run
tasks through the agent of :mod:`.agent`,
whose :class:`AgentLauncher` a backend for another transport subclasses.
The interface every backend keeps is in :mod:`.base`.

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

from collections.abc import Mapping
from importlib.metadata import EntryPoint, entry_points
from typing import TYPE_CHECKING, Any

from ..errors import UsageError
from .base import Launcher, LaunchSpec, Lent, Placement, Process
from .options import BackendOptions, OptionSpec, option, seconds, text

if TYPE_CHECKING:
    from .agent import AgentLauncher, AgentOptions

__all__ = ["AgentLauncher", "AgentOptions", "BackendOptions", "LaunchSpec", "Launcher",
           "OptionSpec", "Placement", "Process", "available_backends", "backend_class",
           "create_backend", "option", "options_of", "pick_backend", "register_backend",
           "seconds", "text"]

ENTRY_POINT_GROUP = "mwhelpers.backends"
BUILT_IN = {name: EntryPoint(name, value, ENTRY_POINT_GROUP) for name, value in (
    ("local", "mwhelpers.backends.local:LocalLauncher"), ("ssh", "mwhelpers.backends.ssh:SSHLauncher"),
    ("slurm", "mwhelpers.backends.slurm:SlurmLauncher"),
    ("ray", "mwhelpers.backends.raynodes:RayLauncher"))}
_REGISTERED: dict[str, type[Launcher]] = {}  # name -> class, from register_backend


def __getattr__(name: str) -> Any:
    if name in ("AgentLauncher", "AgentOptions"):  # on demand: the local backend needs neither
        from . import agent

        return getattr(agent, name)
    raise AttributeError(f"module 'mwhelpers.backends' has no attribute {name!r}")


def _entry_points() -> dict[str, EntryPoint]:
    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def register_backend(name: str, cls: type[Launcher]) -> None:
    """Make ``cls`` (a :class:`Launcher` subclass) the backend ``name``:
    ``define_cluster(..., backend=name)`` and ``%cluster --backend name``."""
    if not isinstance(name, str) or not name.isidentifier():
        raise UsageError(f"a backend's name is a word such as 'kube', got {name!r}")
    if name in BUILT_IN:
        raise UsageError(f"{name!r} is a built-in backend; register yours under another name")
    if not (isinstance(cls, type) and issubclass(cls, Launcher)):
        raise UsageError(f"backend {name!r}: {cls!r} is not a subclass of "
                         "mwhelpers.backends.Launcher")
    _options_class(name, cls)  # a bad declaration is refused now, not at its first use
    _REGISTERED[name] = cls


def available_backends() -> list[str]:
    """Every backend name that can be given: built in, registered, or from entry points."""
    return sorted({*BUILT_IN, *_REGISTERED, *_entry_points()})


def backend_class(name: str) -> type[Launcher]:
    """The backend class registered as ``name``."""
    if name in BUILT_IN:
        built_in: type[Launcher] = BUILT_IN[name].load()
        return built_in
    if name in _REGISTERED:
        return _REGISTERED[name]
    found = _entry_points().get(name)
    if found is None:
        raise UsageError(f"no backend is called {name!r}; there are: "
                         f"{', '.join(available_backends())}. A package adds one with an entry "
                         f"point in the group {ENTRY_POINT_GROUP!r} or mwhelpers.register_backend")
    try:
        loaded: type[Launcher] = found.load()  # what the entry point names (not checked here)
        return loaded
    except Exception as e:  # a broken plugin: say which one, not a traceback from inside it
        raise UsageError(f"backend {name!r} ({found.value}, from an entry point) could not be "
                         f"loaded: {type(e).__name__}: {e}") from None


def _options_class(name: str, cls: type[Launcher]) -> type[BackendOptions]:
    """``cls.options``, checked: a UsageError naming the backend when it is not a dataclass
    of :class:`BackendOptions` whose fields are options."""
    given: object = cls.options
    if not (isinstance(given, type) and issubclass(given, BackendOptions)):
        raise UsageError(f"backend {name!r} ({cls.__qualname__}) declares its options as "
                         f"{given!r}; a backend's options are a frozen dataclass subclassing "
                         "mwhelpers.backends.BackendOptions (see mwhelpers.backends.options)")
    try:
        given.declared()
    except TypeError as e:
        raise UsageError(f"backend {name!r} ({cls.__qualname__}): {e}") from None
    return given


def options_of(name: str) -> dict[str, OptionSpec]:
    """The options backend ``name`` declares, by name, in the order of its fields."""
    return _options_class(name, backend_class(name)).declared()


def pick_backend(options: Mapping[str, object]) -> str:
    """The backend that ``define_cluster`` uses when none is named: ``local`` when it takes
    every option given (none given, too); otherwise the one built-in backend that does
    (``hosts=`` means ``ssh``, ``job=`` means ``slurm``, ``address=`` means ``ray``).  A
    backend a package added is only ever used by its name, so that installing one never
    changes what a call means."""
    given = {k for k, v in options.items() if v is not None}
    takers = [name for name in BUILT_IN if given <= set(options_of(name))]
    if "local" in takers:
        return "local"
    if len(takers) == 1:
        return takers[0]
    what = ", ".join(sorted(given))
    if not takers:
        raise UsageError(f"no built-in backend takes all of {what}; name the backend "
                         f"(backend=NAME; there are: {', '.join(available_backends())}); "
                         "%cluster --backend NAME --help lists a backend's options")
    raise UsageError(f"{', '.join(sorted(takers))} all take {what}: name one with backend=NAME")


def create_backend(name: str, options: Mapping[str, object], services: Lent) -> Launcher:
    """A new instance of backend ``name`` for one cluster of the runtime that owns
    ``services``, made from its options: those given in ``options`` (None: not given),
    checked against the ones it declares and converted (:meth:`BackendOptions.from_given`),
    the rest their defaults."""
    cls = backend_class(name)
    return cls.create(_options_class(name, cls).from_given(name, options), services)
