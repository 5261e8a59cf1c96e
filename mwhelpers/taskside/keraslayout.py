"""Keras 3's ``LayoutMap`` checked against the model before its first step (Keras on JAX).

Under ``keras.distribution.ModelParallel`` each variable gets the layout of the one
``LayoutMap`` rule that matches its path; a variable that no rule matches is replicated on
every device. ``LayoutMap`` matches a rule against the whole path (``re.fullmatch``, in
``LayoutMap.__getitem__`` of ``keras/src/distribution/distribution_lib.py``), and paths carry
the model's name: the rule ``d.*kernel`` matches no variable of layers named ``d1`` and ``d2``
(their paths are ``sequential/d1/kernel``). Keras says nothing then: the job trains with the
whole model on every device (keras-team/keras-hub#2810 left all of a model's expert weights
so), and a step that then runs out of memory says nothing of why; a model too large to be
replicated fails while it is built, before this check. Keras 3.13 and older matched with
``re.search``: a rule that shards there may match nothing on 3.14 and later.

Here, in a task whose Keras runs on JAX, the first ``fit``, ``evaluate`` or ``predict`` under
a ``ModelParallel`` distribution first reads the model's variables against the rules and says,
in the task's log (and so in the cell):

* each rule that matches no variable, no layer's output (``sequential/d1/output``, the path
  by which ``Layer.__call__`` looks up an output's layout, the model's own included) and no
  variable of the optimizer or the metrics, with what it probably meant: a rule that matches
  part of some paths (``re.search``) but no whole one is given the ``.*(?:...)`` it lacks;
  otherwise the paths it comes closest to are named;
* the variables of two or more dimensions that no rule matches, replicated on every device,
  when they hold a tenth of the model's bytes or more.

It runs as ``fit``, ``evaluate`` or ``predict`` begins (before the optimizer makes its copies
of the variables), under the ``ModelParallel`` in effect or, for a model made in ``with
distribution.scope()``, the one that laid out its variables.

It changes no layout and no variable: a check, not a mend.  Nothing is said when every rule
matches and every large variable is sharded.  ``MWHELPERS_LAYOUT_CHECK=0`` turns it off.
Tested on Keras 3.10, 3.12, 3.15 and the 3.16 nightly.  Where the installed Keras keeps its
layout map elsewhere (``ModelParallel._layout_map``), or names its JAX trainer otherwise
(``JAXTrainer``, ``Trainer``), it says it cannot tell and the program runs unchecked; where
Keras warns itself (``JAXTrainer._check_layout_map_coverage``, the change of
docs/keras-layoutmap.md), it steps aside and says so.

Loaded by path in a task's start-up (``_bootstrap.py``): it imports nothing of the package.
"""

from __future__ import annotations

import difflib
import functools
import math
import re
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any, NamedTuple

from .kerasbase import CARRIES, PATCHED, keras_version, safely, say_once

ENV = "MWHELPERS_LAYOUT_CHECK"
ISSUE = "keras-team/keras-hub#2810"
TARGET = "keras.src.backend.jax.trainer"  # JAXTrainer (Trainer in 3.16's development)
DISTRIBUTION = "keras.src.distribution.distribution_lib"
PREFIX = "[mwhelpers] LayoutMap: "  # every line said here starts so (diagnosis reads it)
WORTH_SHARDING = 0.1  # of the model's bytes: what unmatched variables of 2+ dimensions must hold
REPLICATED = "replicated on every device"  # in the line that names them (diagnosis reads it)
# The ModelParallel that laid out each variable, by its id (a model's variables are made under
# ``with distribution.scope()``, and fit may run outside it).
_laid_out_by: dict[int, Any] = {}
_checked: dict[int, Any] = {}  # the distribution each model (by its id) was checked against


class Variable(NamedTuple):
    path: str
    shape: tuple[int, ...]
    itemsize: int

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.size * self.itemsize


def findings(rules: Sequence[str], variables: Sequence[Variable],
             outputs: Sequence[str] = (), how: str = "fullmatch",
             others: Sequence[str] = ()) -> list[str]:
    """What to say of ``rules`` (a LayoutMap's keys) against the model's ``variables``, its
    layers' ``outputs`` (``sequential/d1/output``: Keras looks a layer's output up by that path)
    and the ``others`` Keras lays out too (the optimizer's and the metrics' variables), matched
    as the installed Keras matches them (``how``: ``"fullmatch"`` since Keras 3.14,
    ``"search"`` before, ``"match"``): one line each, without the prefix; empty when there is nothing to
    say."""
    lines = []
    matched: set[str] = set()
    for rule in rules:
        try:
            pattern = re.compile(rule)
        except re.error as e:
            lines.append(f"rule {rule!r} is no regular expression ({e})")
            continue
        match = {"fullmatch": pattern.fullmatch, "match": pattern.match}.get(how, pattern.search)
        whole = [v.path for v in variables if v.path == rule or match(v.path)]
        matched.update(whole)
        if not whole and not any(o == rule or match(o) for o in [*outputs, *others]):
            lines.append(f"rule {rule!r} matches no variable or layer output of the model: "
                         + _meant(rule, pattern, [v.path for v in variables], how))
    left = [v for v in variables if v.path not in matched and len(v.shape) >= 2]
    total = sum(v.nbytes for v in variables)
    held = sum(v.nbytes for v in left)
    if rules and left and held >= WORTH_SHARDING * total:
        left.sort(key=lambda v: -v.nbytes)
        lines.append(
            f"{len(left)} variable{'s' if len(left) > 1 else ''} that no rule matches "
            f"{'are' if len(left) > 1 else 'is'} {REPLICATED} ({_bytes(held)} on "
            f"each, {held / total:.0%} of the model's variables, before the optimizer's copies): "
            + ", ".join(f"{v.path} {list(v.shape)}" for v in left[:6])
            + (f" and {len(left) - 6} more" if len(left) > 6 else ""))
    return lines


def _meant(rule: str, pattern: re.Pattern[str], paths: Sequence[str], how: str) -> str:
    """What ``rule`` was probably meant to be, said for a learner."""
    partial = [p for p in paths if pattern.search(p)]
    if partial and how == "fullmatch":
        widened = f".*(?:{rule})"
        fits = [p for p in paths if re.fullmatch(widened, p)]
        hint = (f"; {widened!r} matches {_some(fits)}" if fits else "")
        return (f"it matches only part of {_some(partial)}, and LayoutMap matches a rule against "
                f"a whole path (re.fullmatch, since Keras 3.14: a rule written for 3.13 or "
                f"older, which matched part of a path, may match nothing now){hint}")
    if not paths:
        return "the model has no variables yet"
    close = difflib.get_close_matches(rule, paths, n=3, cutoff=0.3)
    return "no path contains it; the variables' paths are like " + _some(close or list(paths))


def _some(paths: Sequence[str]) -> str:
    shown = ", ".join(paths[:3])
    return shown + (f" (and {len(paths) - 3} more)" if len(paths) > 3 else "")


def _bytes(n: int) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:g} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]  # (a float from here on)
    return f"{n} bytes"


def _variables(model: Any) -> list[Variable]:
    out = []
    for v in getattr(model, "variables", ()):
        shape = tuple(int(d) for d in v.shape)
        itemsize = int(getattr(getattr(v.value, "dtype", None), "itemsize", 4) or 4)
        out.append(Variable(str(v.path), shape, itemsize))
    return out


def _how_keras_matches(layout_map_class: Any) -> str | None:
    """How the installed ``LayoutMap`` matches a key against a path, found by asking one:
    ``"fullmatch"`` (Keras 3.14 and later), ``"search"`` (3.13 and older), ``"match"`` (from
    the start only), None: it could not be asked."""
    try:
        probe = layout_map_class(None)
        probe["xa"] = (None,)
        if probe["yxa"] is not None:
            return "search"
        return "match" if probe["xab"] is not None else "fullmatch"
    except Exception:  # a LayoutMap made otherwise
        return None


def _outputs(model: Any) -> list[str]:
    """The paths by which Keras looks up a layout for each layer's output, the model's own
    included (``Layer.__call__``: the path the call runs under and ``/output``).  A layer's
    call runs under the scope it was first called in (``Layer._parent_path``) and its name,
    which is its ``path`` once it has weights; an input layer is never called."""
    flatten = getattr(model, "_flatten_layers", None)
    layers = flatten(include_self=True, recursive=True) if callable(flatten) else \
        [model, *getattr(model, "layers", ())]
    out = []
    for layer in layers:
        if type(layer).__name__ == "InputLayer":
            continue
        path = getattr(layer, "path", None) or "/".join(
            part for part in (getattr(layer, "_parent_path", None), getattr(layer, "name", ""))
            if part)
        out.append(f"{path}/output")
    return out


def _others(model: Any) -> list[str]:
    """The paths of the other variables Keras lays out: the optimizer's (its slots, its
    iteration count; once built, else the names it will give them) and the metrics'."""
    paths = [str(v.path) for v in getattr(model, "metrics_variables", ())]
    optimizer = getattr(model, "optimizer", None)
    if optimizer is None:
        return paths
    built = list(getattr(optimizer, "variables", ()))
    if built:
        return paths + [str(v.path) for v in built]
    name = getattr(optimizer, "name", "optimizer")
    paths += [f"{name}/iteration", f"{name}/learning_rate"]
    for v in getattr(model, "trainable_variables", ()):
        slot = str(v.path).replace("/", "_")
        paths += [f"{name}/{slot}_{kind}" for kind in ("momentum", "velocity", "accumulator")]
    return paths


def check(model: Any) -> list[str]:
    """Read ``model``'s variables against the current ``ModelParallel`` distribution's
    LayoutMap (once per distribution and model) and say what :func:`findings` finds; the
    lines said (with the prefix)."""
    distribution_lib = sys.modules.get("keras.src.distribution.distribution_lib")
    if distribution_lib is None:
        return []
    parallel = getattr(distribution_lib, "ModelParallel", None)
    distribution = distribution_lib.distribution()
    if parallel is None:
        return []
    if not isinstance(distribution, parallel):  # a model made in ``with distribution.scope()``
        distribution = next((d for v in getattr(model, "variables", ())
                             if (d := _laid_out_by.get(id(v))) is not None), None)
        if distribution is None:
            return []
    if not list(getattr(model, "variables", ())):
        return []  # not built yet: checked at its first step
    if _checked.get(id(model)) is distribution:
        return []
    _checked[id(model)] = distribution  # checked against this distribution
    layout_map: Any = getattr(distribution, "_layout_map", None)
    mapping: Any = getattr(distribution_lib, "LayoutMap", None)
    if mapping is None or not isinstance(layout_map, mapping):
        say_once("layout-cannot-tell",
                 f"{PREFIX}cannot tell whether its rules match the model: Keras "
                 f"{keras_version()}'s ModelParallel keeps its LayoutMap elsewhere than 3.10 to "
                 f"3.16 did (turn this check off: {ENV}=0)")
        return []
    how = _how_keras_matches(mapping)
    if how is None:
        say_once("layout-cannot-tell",
                 f"{PREFIX}cannot tell whether its rules match the model: Keras "
                 f"{keras_version()}'s LayoutMap could not be asked how it matches its keys "
                 f"(turn this check off: {ENV}=0)")
        return []
    rules = [str(rule) for rule in layout_map]
    lines = [PREFIX + line for line in findings(rules, _variables(model), _outputs(model), how,
                                                 _others(model))]
    for line in lines:
        print(line, file=sys.stderr, flush=True)
    return lines


def _checked_first(make: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(make)
    def run(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            check(self)
        except Exception as e:  # a check never stops the program
            say_once("layout-failed", f"{PREFIX}the check failed ({type(e).__name__}: {e}); "
                                      "the program goes on unchecked")
        return make(self, *args, **kwargs)

    setattr(run, PATCHED, True)
    return run


UPSTREAM = "_check_layout_map_coverage"  # docs/keras-layoutmap.md's method on JAXTrainer
CARRIED = ("[mwhelpers] Keras {version} " + CARRIES + " the LayoutMap check (" + ISSUE +
           "): its JAX trainer warns of a key that matches nothing; not checked twice")


# Where the check runs: as fit, evaluate or predict begins (before the optimizer's variables
# are made), and again before the first step's function is made (a model built only then).
ENTRIES = ("fit", "evaluate", "predict", "train_on_batch", "test_on_batch", "predict_on_batch",
           "make_train_function", "make_test_function", "make_predict_function")


def patch(module: ModuleType) -> None:
    """Check as the JAX trainer begins to fit, evaluate or predict (unless Keras warns
    itself)."""
    trainer = _trainer_class(module)
    if hasattr(trainer, UPSTREAM):
        say_once("layout-carried", CARRIED.format(version=keras_version()))
        return
    for name in ENTRIES:
        current = vars(trainer).get(name)
        if callable(current) and not getattr(current, PATCHED, False):
            setattr(trainer, name, _checked_first(current))


def patch_layouts(module: ModuleType) -> None:
    """Note which ModelParallel lays out each variable (``get_variable_layout``)."""
    parallel = module.ModelParallel
    current = parallel.get_variable_layout
    if getattr(current, PATCHED, False):
        return

    @functools.wraps(current)
    def get_variable_layout(self: Any, variable: Any) -> Any:
        layout = current(self, variable)
        _laid_out_by[id(variable)] = self
        return layout

    setattr(get_variable_layout, PATCHED, True)
    parallel.get_variable_layout = get_variable_layout


def _trainer_class(module: ModuleType) -> type:
    """The JAX trainer: ``JAXTrainer`` (3.14 to 3.15), ``Trainer`` (3.16's development); a
    LookupError where neither is this module's own class with ``make_train_function``."""
    for name in ("JAXTrainer", "Trainer"):
        cls = getattr(module, name, None)
        if (isinstance(cls, type) and cls.__module__ == module.__name__
                and "make_train_function" in vars(cls)):
            return cls
    raise LookupError(f"no JAX trainer class in {module.__name__}")


SKIPPED = ("[mwhelpers] LayoutMap: not checked: {why} (a Keras this check does not know; the "
           "program runs unchecked)")


def install(after_import: Callable[[str, Callable[[ModuleType], object]], None]) -> None:
    """Arm the check once the JAX trainer and keras.distribution load (``after_import``:
    :func:`tfdata.after_import`)."""
    after_import(TARGET, safely(patch, ISSUE, SKIPPED))
    after_import(DISTRIBUTION, safely(patch_layouts, ISSUE, SKIPPED))
