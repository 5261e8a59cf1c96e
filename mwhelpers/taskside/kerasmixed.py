"""Keras 3's ``LossScaleOptimizer`` (``mixed_float16``) under a strategy with several replicas.

Keras 3 decides whether a step's gradients are finite from each replica's own gradients,
before they are all-reduced: ``LossScaleOptimizer.check_finite`` looks at the gradients
that ``_tf_apply`` (``keras/src/optimizers/loss_scale_optimizer.py``) hands it, and the
all-reduce comes later, inside the inner optimizer's ``apply``, in one branch of the
``cond`` that this decision picks.  When the gradients of one replica overflow float16 and
those of another do not:

* under multi-worker MultiWorkerMirroredStrategy, the first worker skips the step and the
  second waits in the step's all-reduce (``cond/.../CollectiveReduceV2``) for it: the job
  hangs;
* under ``MirroredStrategy`` in one process (several GPUs, or logical CPUs), the first
  replica's answer is taken for all (the merge-call path): when that replica's gradients are
  finite, the step applies the all-reduced gradients, which hold the other replica's inf or
  NaN, and every weight becomes NaN, silently.

(tf_keras all-reduced the gradients before it checked them.)

Here, in a replica context of a strategy with more than one replica in sync, ``check_finite``
called while the optimizer applies a step (``_tf_apply``, ``_common_apply``) adds up the count
of replicas whose gradients are not finite (an all-reduce of one number, where Keras calls it)
and says "finite" only when that count is 0, as the upstream patch
(``docs/keras-lossscale/loss_scale_optimizer.patch``, whose ``_check_finite_on_all_replicas``
those two call) does; called from anywhere else, it stays local, as with the patch.  Every
replica then takes the same branch: an overflow on one skips the step on all of them, and all
of them halve the loss scale, so weights and loss scale stay equal and finite.  With one
replica, in the cross-replica context, or on another backend, Keras's own ``check_finite``
runs unchanged.

It decides from Keras's source (:func:`plan`): it mends only where the check reads one
replica's gradients and both ways of applying a step call it before any all-reduce (the lines
of 3.15.1, and the nightly's, which spell the ops ``backend.ops.numpy``); it steps aside where
the check (or a method it calls, or one the ways of applying a step decide with) all-reduces
its decision, or ``_tf_apply`` all-reduces the gradients before the check: Keras carries the
fix; anything else it cannot judge, and says
so, with how to check and how to mend anyway (``MWHELPERS_KERAS_FIX_FORCE=1``).  Each of these
is said in one line, the first time a strategy with several replicas checks a step.  Armed
with the ``fit`` mend (:func:`kerasfix.install`), only for the Keras releases of
:data:`kerasbase.TESTED`; ``MWHELPERS_KERAS_FIX=0`` turns it off.  The upstream write-up:
``docs/keras-lossscale.md``.

This file imports only the standard library and its siblings.
"""

from __future__ import annotations

import re
import sys
import threading
from types import ModuleType

from .kerasbase import (
    CANNOT_TELL,
    FIXED,
    FORCED,
    PATCHED,
    SKIPPED,
    forced,
    keras_version,
    plain,
    say_once,
    source_of,
    untested,
)

TARGET = "keras.src.optimizers.loss_scale_optimizer"
ISSUE = "docs/keras-lossscale.md"
WHAT = "LossScaleOptimizer's finite check"
METHOD = "check_finite"  # the one method replaced, on LossScaleOptimizer
# The lines, in kerasbase.plain's form, as Keras 3.0 to 3.15 and the 3.16 nightlies write them:
# the check looks at one replica's gradients, and both ways of applying a step decide with it
# before any all-reduce (the merge-call path keeps the first local replica's answer).
LOCAL_CHECK = "finite_grads=[all(isfinite(g))forgintensor_grads]"
MERGE_CALL_PATH = "call_for_each_replica(self.check_finite,args=(grads,))"
FIRST_REPLICA = "experimental_local_results(finite_per_replica)[0]"
REPLICA_PATH = "finite=self.check_finite(grads)"

MENDED = "LossScaleOptimizer mended for"  # what the diagnosis looks for
NOTICE = ("[mwhelpers] Keras {version}: " + MENDED + " {replicas} replicas in sync ("
          + ISSUE + "; the replicas decide together whether the gradients are finite, so an "
          "overflow on one skips the step on all); turn off: MWHELPERS_KERAS_FIX=0")


def plan(module: ModuleType, version: str) -> tuple[str, type | None, str]:
    """What to do with this Keras's LossScaleOptimizer, from its source: ("mend", the class,
    ""), ("fixed", the class, how Keras decides together), ("unknown", the class or None, why
    it cannot tell), or ("skip", the class or None, why: an untested release)."""
    cls = getattr(module, "LossScaleOptimizer", None)
    why = untested(version)
    if why:
        return "skip", cls if isinstance(cls, type) and callable(getattr(cls, METHOD, None)) \
            else None, why
    if not isinstance(cls, type):
        return "unknown", None, f"{TARGET} has no LossScaleOptimizer class"
    methods = {name: getattr(cls, name, None) for name in (METHOD, "_tf_apply", "_common_apply")}
    missing = [name for name, f in methods.items() if not callable(f)]
    if METHOD in missing:
        return "unknown", None, f"its LossScaleOptimizer has no {METHOD}"
    texts = {name: source_of(f) for name, f in methods.items() if callable(f)}
    if any(text is None for text in texts.values()):
        return "unknown", cls, "its source cannot be read"
    check, tf_apply, common = (plain(texts.get(n) or "") for n in (METHOD, "_tf_apply",
                                                                   "_common_apply"))
    # The check and the methods of its own class that it calls (a helper of the fix).
    helpers = set(re.findall(r"self\.(\w+)\(", check)) - {METHOD}
    decided = check + "".join(plain(source_of(getattr(cls, h)) or "") for h in sorted(helpers)
                              if callable(getattr(cls, h, None)))
    if "all_reduce" in decided:
        return "fixed", cls, f"{METHOD} all-reduces its decision across replicas"
    # A method of its own that the ways of applying a step decide with instead, which checks
    # and all-reduces the decision (the upstream patch: _check_finite_on_all_replicas).
    for name in sorted(set(re.findall(r"self\.(\w+)", tf_apply + common)) - {METHOD}):
        text = plain(source_of(getattr(cls, name)) or "") if callable(getattr(cls, name, None)) \
            else ""
        if "all_reduce" in text and f"self.{METHOD}(" in text:
            return "fixed", cls, f"{name} all-reduces {METHOD}'s decision across replicas"
    if "all_reduce" in tf_apply.split(MERGE_CALL_PATH)[0] and MERGE_CALL_PATH in tf_apply:
        return "fixed", cls, "_tf_apply all-reduces the gradients before it checks them"
    if missing:
        return "unknown", cls, f"its LossScaleOptimizer has no {' or '.join(missing)}"
    found = {"check": LOCAL_CHECK in check,
             "merge call": MERGE_CALL_PATH in tf_apply and FIRST_REPLICA in tf_apply,
             "replica path": REPLICA_PATH in common}
    if all(found.values()):
        return "mend", cls, ""
    differs = [name for name, ok in found.items() if not ok]
    return "unknown", cls, (f"its {', '.join(differs)} differ from the releases this was "
                            "written for (3.0 to 3.16)")


def _replicas() -> tuple[object, int] | None:
    """(the replica context, replicas in sync) where a step is checked under a strategy with
    several replicas, else None."""
    tf = sys.modules.get("tensorflow")
    context = tf.distribute.get_replica_context() if tf is not None else None
    count = int(getattr(context, "num_replicas_in_sync", 1) or 1)
    return (context, count) if context is not None and count > 1 else None


def patch(module: ModuleType) -> bool:
    """Mend ``keras.src.optimizers.loss_scale_optimizer``; True when the check now decides
    together.  Where it does not, a class it can read gets a check that says why in one line
    the first time several replicas check a step, and otherwise is Keras's own."""
    if getattr(module, PATCHED, False):
        return False
    version = keras_version() or "(version unknown)"
    verdict, cls, why = plan(module, version)
    setattr(module, PATCHED, True)
    if cls is None:
        if verdict == "unknown":
            say_once("lossscale-aside", CANNOT_TELL.format(version=version, what=WHAT,
                                                          issue=ISSUE, why=why))
        return False
    original = getattr(cls, METHOD)
    if verdict == "unknown" and forced():
        line = FORCED.format(version=version, what=WHAT, issue=ISSUE, why=why)
        say_once("lossscale-forced", line)
        verdict = "mend"
    aside = {"skip": SKIPPED.format(issue=ISSUE, why=why),
             "fixed": FIXED.format(version=version, what=WHAT, issue=ISSUE, how=why),
             "unknown": CANNOT_TELL.format(version=version, what=WHAT, issue=ISSUE, why=why)
             }.get(verdict)

    def check_finite(self: object, grads: object, *args: object, **kwargs: object) -> object:
        finite = original(self, grads, *args, **kwargs)
        replicas = _replicas()
        if replicas is None:
            return finite  # one replica, the cross-replica context, no TensorFlow
        if aside is not None:
            say_once("lossscale-aside", aside)
            return finite
        if not getattr(self, APPLYING, 0):
            return finite  # not while a step is applied: the patch leaves such a call local
        context, count = replicas
        say_once("lossscale-notice", NOTICE.format(version=version, replicas=count))
        tf = sys.modules["tensorflow"]
        not_finite = tf.cast(tf.logical_not(finite), tf.float32)
        return tf.equal(context.all_reduce(tf.distribute.ReduceOp.SUM,  # type: ignore[attr-defined]
                                           not_finite), 0.0)

    check_finite.__name__ = METHOD
    check_finite.__wrapped__ = original  # type: ignore[attr-defined]
    setattr(cls, METHOD, check_finite)
    for name in ("_tf_apply", "_common_apply"):
        if callable(getattr(cls, name, None)):
            _count_applying(cls, name)
    return aside is None


APPLYING = "_mwhelpers_applying"  # on an optimizer: how many of its steps are being applied
_applying_lock = threading.Lock()


def _count_applying(cls: type, name: str) -> None:
    """Have ``cls.name`` (a way of applying a step) count itself in :data:`APPLYING` while it
    runs, on the optimizer, not the thread: the replicas of a MirroredStrategy step run in
    threads of their own, and its merge call's ``check_finite`` in others again."""
    original = getattr(cls, name)

    def method(self: object, *args: object, **kwargs: object) -> object:
        with _applying_lock:
            setattr(self, APPLYING, getattr(self, APPLYING, 0) + 1)
        try:
            return original(self, *args, **kwargs)
        finally:
            with _applying_lock:
                setattr(self, APPLYING, getattr(self, APPLYING, 1) - 1)

    method.__name__ = name
    method.__wrapped__ = original  # type: ignore[attr-defined]
    setattr(cls, name, method)
