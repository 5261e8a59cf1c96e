"""A backend's options, declared once: the fields of a frozen dataclass.

A backend's options are a subclass of :class:`BackendOptions`, decorated with
``@dataclass(frozen=True)``, each option a field made by :func:`option`::

    @dataclass(frozen=True)
    class KubeOptions(BackendOptions):
        namespace: str = option(text, "the namespace the tasks run in", default="default",
                                metavar="NS")
        image: str | None = option(text, "the image (default: the cluster's)", metavar="IMAGE")

    class KubeLauncher(Launcher):
        name = "kube"
        options = KubeOptions

        def __init__(self, options: KubeOptions = KubeOptions()) -> None:
            self.namespace = options.namespace

That one declaration gives everything: the field's annotation is the type the launcher's
constructor sees (and the type checker with it); the converter (``text`` above, a function
of one ``object``) turns whatever a user gives, a Python value to
``define_cluster(..., namespace="ml")`` or the text of the flag ``%cluster --namespace ml``
(underscores as dashes; ``--option NAME=VALUE`` too), into that type, raising ValueError or
TypeError when it cannot; ``help`` and ``metavar`` are what ``%cluster --backend kube --help``
shows.  A default of None (the default) means "not
given": the backend decides, and ``help`` says how.

Public: :class:`BackendOptions` (:meth:`~BackendOptions.declared`,
:meth:`~BackendOptions.from_given`), :func:`option`, :class:`OptionSpec` (one declared
option, as ``declared`` lists it), and the converters :func:`text`, :func:`seconds` and
:func:`quantity`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TypeVar, overload

from ..errors import UsageError

T = TypeVar("T")
OptionsT = TypeVar("OptionsT", bound="BackendOptions")
_KEY = "mwhelpers.option"  # the field metadata that option() writes


def text(value: object) -> str:
    """A non-empty string."""
    if not isinstance(value, str) or not value.strip():
        raise ValueError("a non-empty string")
    return value.strip()


def _not_below_0(value: object, what: str) -> float:
    if isinstance(value, bool):
        raise ValueError(what)
    number = float(value)  # type: ignore[arg-type]  # ValueError/TypeError say why
    if number < 0:
        raise ValueError(f"{what}, not below 0")
    return number


def seconds(value: object) -> float:
    """A number of seconds >= 0, or text that is one."""
    return _not_below_0(value, "a number of seconds")


def quantity(value: object) -> float:
    """A number >= 0, a fraction too (CPUs, GPUs), or text that is one."""
    return _not_below_0(value, "a number")


@dataclass(frozen=True)
class OptionSpec:
    """One option a backend declares: its field's ``name``, its converter, its ``default``
    and the ``help`` and ``metavar`` that ``%cluster``'s help shows."""

    name: str
    convert: Callable[[object], object]
    default: object
    help: str
    metavar: str

    @property
    def flag(self) -> str:
        """The ``%cluster`` flag: ``--`` and the name, underscores as dashes."""
        return "--" + self.name.replace("_", "-")

    def value(self, given: object, backend: str) -> object:
        """``given`` converted, or a UsageError naming the ``backend``, the option and
        what it is."""
        try:
            return self.convert(given)
        except (TypeError, ValueError) as e:
            why = f" ({e})" if str(e) else ""
            raise UsageError(f"the {backend} backend's option {self.name} cannot be {given!r}"
                             f"{why}: it is {self.help}") from None


@overload
def option(convert: Callable[[object], T], help: str, *, metavar: str = "VALUE") -> T | None: ...
@overload
def option(convert: Callable[[object], T], help: str, *, default: T, metavar: str = "VALUE") -> T: ...
def option(convert: Callable[[object], object], help: str, *, default: object = None,
           metavar: str = "VALUE") -> object:
    """A field of a :class:`BackendOptions` dataclass: one option of a backend, which
    ``convert`` makes out of what a user gives, ``help`` (a phrase: "the hosts, a list or
    H1,H2") and ``metavar`` describe, and ``default`` (None: not given) fills in."""
    if not callable(convert):
        raise TypeError(f"option(convert, help, ...): convert must be a function, got {convert!r}")
    return dataclasses.field(default=default,
                             metadata={_KEY: (convert, help, metavar)})


@dataclass(frozen=True)
class BackendOptions:
    """The options of a backend that takes none; every backend's options subclass it (a
    frozen dataclass whose fields are made by :func:`option`, see the module's text).

    :meth:`declared` lists the options; :meth:`from_given` makes an instance from what a
    user gave, checked and converted."""

    @classmethod
    def declared(cls) -> dict[str, OptionSpec]:
        """``{name: OptionSpec}``, in the order of the fields; TypeError for a class that
        is not a dataclass of its own or has a field not made by :func:`option`."""
        if "__dataclass_fields__" not in vars(cls):
            raise TypeError(f"{cls.__qualname__} is not a dataclass: decorate it with "
                            "@dataclass(frozen=True)")
        specs = {}
        for f in dataclasses.fields(cls):
            if _KEY not in f.metadata:
                raise TypeError(f"{cls.__qualname__}.{f.name} is not an option: declare it "
                                "with mwhelpers.backends.option(convert, help, ...)")
            convert, help, metavar = f.metadata[_KEY]
            specs[f.name] = OptionSpec(f.name, convert, f.default, help, metavar)
        return specs

    @classmethod
    def from_given(cls: type[OptionsT], backend: str, given: Mapping[str, object]) -> OptionsT:
        """The options ``given`` by name (None: not given) for ``backend``, each converted;
        a UsageError for a name it does not declare (listing those it does) or a value its
        converter refuses."""
        declared = cls.declared()
        values = {k: v for k, v in given.items() if v is not None}
        unknown = sorted(set(values) - set(declared))
        if unknown:
            takes = ", ".join(declared) or "no options"
            raise UsageError(f"the {backend} backend does not take {', '.join(unknown)}; it "
                             f"takes {takes} (%cluster --backend {backend} --help says what "
                             "each means)")
        converted: dict[str, object] = {k: declared[k].value(v, backend) for k, v in values.items()}
        return cls(**converted)
