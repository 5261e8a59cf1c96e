"""Keras 3's ``optimizer.iterations`` under ParameterServerStrategy: every step counted.

Keras 3 adds 1 to an optimizer's step counter at the end of every ``apply``
(``self._iterations.assign_add(1)`` in ``keras/src/optimizers/base_optimizer.py``), and a
Keras variable's ``assign_add`` is ``self.assign(self + value)``
(``keras/src/backend/common/variables.py``): a read, then a write.  Under
ParameterServerStrategy the counter lives on a parameter server and the workers of a
``ClusterCoordinator`` step at the same time: two steps read N, both write N + 1, and one
step is lost from the count (the team measured 298 of 400).  Whatever reads the counter sees
fewer steps than ran: a learning-rate schedule, Adam's bias correction, a checkpoint.

Here an optimizer whose counter lives under a ParameterServerStrategy gets, on that one
variable, an ``assign_add`` that is TensorFlow's own: one ``AssignAddVariableOp`` on the
parameter server, which no other step can split.  Nothing else changes: other variables,
other strategies and other backends run Keras's code.  Only while Keras's source still holds
the read-then-write; a Keras whose ``apply`` counts with the optimizer's own ``assign_add``
(the upstream patch, ``docs/keras-pss-iterations/optimizer.patch``) carries the fix, and any
other change it cannot judge: either is said in one line in a job with a ps, and left alone
(``MWHELPERS_KERAS_FIX_FORCE=1`` mends what it cannot judge).

Armed with the ``fit`` mend (:func:`kerasfix.install`), on the same terms.  This file
imports only the standard library and its siblings.
"""

from __future__ import annotations

import json
import os
import sys
from types import ModuleType

from .kerasbase import (
    CANNOT_TELL,
    FIXED,
    FORCED,
    PATCHED,
    SKIPPED,
    forced,
    keras_version,
    say_once,
    source_of,
    untested,
)

TARGET = "keras.src.optimizers.base_optimizer"
ISSUE = "docs/keras-pss-iterations.md"
VARIABLES = "keras.src.backend.common.variables"
STATELESS = "keras.src.backend.common.stateless_scope"
# What is mended, whitespace removed, as Keras 3.0 to 3.15 write it.
INCREMENT = "self._iterations.assign_add(1)"
FIXED_INCREMENT = "self.assign_add(self._iterations,1)"  # docs/keras-pss-iterations/optimizer.patch
WHAT = "optimizer.iterations under ParameterServerStrategy"
READ_THEN_WRITE = "defassign_add(self,value):returnself.assign(self+value)"
NOTICE = ("[mwhelpers] Keras {version} under ParameterServerStrategy: optimizer.iterations "
          "counts every step (one assign_add on the parameter server; Keras reads, then "
          "writes, and loses concurrent steps; " + ISSUE + "; turn off: MWHELPERS_KERAS_FIX=0)")


def _parameter_server_variable(variable: object) -> bool:
    """True when ``variable`` (a ``tf.Variable``) was made under a ParameterServerStrategy."""
    tf = sys.modules.get("tensorflow")
    strategy = getattr(variable, "_distribute_strategy", None)
    try:
        return tf is not None and strategy is not None and isinstance(
            strategy, tf.distribute.experimental.ParameterServerStrategy)
    except AttributeError:
        return False


def _variable_class() -> type | None:
    """Keras's variable class: ``Variable`` (3.6 and later), ``KerasVariable`` (3.0 to 3.5)."""
    variables = sys.modules.get(VARIABLES)
    for name in ("Variable", "KerasVariable"):
        cls = getattr(variables, name, None)
        if isinstance(cls, type):
            return cls
    return None


def _plan(module: ModuleType) -> tuple[str, type | None, str]:
    """(verdict, Keras's BaseOptimizer or None, why): "mend" when this Keras counts steps with
    the read-then-write increment; "fixed" when ``apply`` counts with the optimizer's own
    ``assign_add`` (docs/keras-pss-iterations/optimizer.patch), with how; "unknown" when the
    source is neither, with why; "skip" for an untested release."""
    version = keras_version()
    cls = getattr(module, "BaseOptimizer", None)
    if not isinstance(cls, type) or not callable(getattr(cls, "__init__", None)):
        cls = None
    why = untested(version)
    if why:
        return "skip", cls, why
    apply = getattr(cls, "apply", None)
    add = getattr(_variable_class(), "assign_add", None)
    if not isinstance(cls, type) or not callable(apply) or not callable(add):
        return "unknown", None, "it has no BaseOptimizer.apply or Variable.assign_add"
    # Where a step is counted: apply (3.6 and later), _backend_apply_gradients (3.5).
    counting = [f for f in (apply, getattr(cls, "_backend_apply_gradients", None)) if callable(f)]
    texts = [source_of(f) for f in counting]
    apply_text = None if None in texts else "".join(t or "" for t in texts)
    add_text = source_of(add)
    if apply_text is None or add_text is None:
        return "unknown", None, "its source cannot be read"
    if FIXED_INCREMENT in apply_text:
        return "fixed", cls, "BaseOptimizer.apply counts with the optimizer's assign_add"
    if INCREMENT in apply_text and READ_THEN_WRITE in add_text:
        return "mend", cls, ""
    return "unknown", cls, ("its BaseOptimizer.apply and Variable.assign_add count steps "
                            "otherwise than the releases this was written for (3.0 to 3.16)")


def _atomic_add(variable: object, original: object) -> object:
    """An ``assign_add`` for the Keras variable ``variable``: TensorFlow's own on its value."""
    version = keras_version()

    def assign_add(value: object) -> object:
        stateless = sys.modules.get(STATELESS)
        if stateless is not None and stateless.in_stateless_scope():
            return original(value)  # type: ignore[operator]
        say_once("pss-iterations", NOTICE.format(version=version))
        tf = sys.modules["tensorflow"]
        inner = variable.value  # type: ignore[attr-defined]
        return inner.assign_add(tf.cast(value, inner.dtype))

    assign_add.__wrapped__ = original  # type: ignore[attr-defined]
    return assign_add


def patch(module: ModuleType) -> None:
    """Mend ``keras.src.optimizers.base_optimizer``: each optimizer made after this whose step
    counter lives under a ParameterServerStrategy counts with one atomic ``assign_add``.  Where
    this Keras is left alone, the first such optimizer says why in one line instead."""
    verdict, cls, why = _plan(module)
    version = keras_version()
    forced_line = None
    if verdict == "unknown" and cls is not None and forced():
        forced_line = FORCED.format(version=version, what=WHAT, issue=ISSUE, why=why)
        verdict = "mend"
    aside = None if verdict == "mend" else (
        {"fixed": FIXED.format(version=version, what=WHAT, issue=ISSUE, how=why),
         "unknown": CANNOT_TELL.format(version=version, what=WHAT, issue=ISSUE, why=why)
         }.get(verdict) or SKIPPED.format(issue=ISSUE, why=why))
    if cls is None:
        if aside and _ps_job():
            say_once(f"skipped-{ISSUE}", aside)
        return
    init = vars(cls)["__init__"]
    if getattr(init, PATCHED, False):
        return
    expected = getattr(_variable_class(), "assign_add", None)

    def __init__(self: object, *args: object, **kwargs: object) -> None:
        init(self, *args, **kwargs)
        counter = getattr(self, "_iterations", None)
        if counter is None or not _parameter_server_variable(getattr(counter, "value", None)):
            return
        if aside:
            say_once(f"skipped-{ISSUE}", aside)
            return
        if forced_line:
            say_once(f"forced-{ISSUE}", forced_line)
        add = getattr(type(counter), "assign_add", None)
        text = source_of(add) if callable(add) else None
        if add is not expected and READ_THEN_WRITE not in (text or ""):
            say_once(f"skipped-{ISSUE}", SKIPPED.format(
                issue=ISSUE, why=f"Keras {keras_version()}'s {type(counter).__name__} has an "
                                 "assign_add of its own"))
            return
        counter.assign_add = _atomic_add(counter, counter.assign_add)

    __init__.__wrapped__ = init  # type: ignore[attr-defined]
    setattr(__init__, PATCHED, True)
    setattr(cls, "__init__", __init__)  # noqa: B010 (mypy: assigning to a method)


def _ps_job() -> bool:
    """True when TF_CONFIG names a ps job (where stepping aside is worth a line)."""
    try:
        return bool(json.loads(os.environ.get("TF_CONFIG") or "{}").get("cluster", {}).get("ps"))
    except (ValueError, AttributeError):
        return False
