"""Keras 3's ``LossScaleOptimizer`` (``mixed_float16``) under multi-worker MultiWorkerMirroredStrategy.

Keras 3 decides whether a step's gradients are finite from each replica's own gradients,
before they are all-reduced: ``LossScaleOptimizer.check_finite`` looks at the gradients
that ``_tf_apply`` (``keras/src/optimizers/loss_scale_optimizer.py``) hands it, and the
all-reduce comes later, inside the inner optimizer's ``apply``, in one branch of the
``cond`` that this decision picks.  When the gradients of one worker overflow float16 and
those of another do not, the first skips the step and the second waits in the step's
all-reduce (``cond/.../CollectiveReduceV2``) for it: the job hangs.  (tf_keras all-reduced
the gradients before it checked them.)

Here, under multi-worker MWMS only, ``check_finite`` adds up the count of replicas whose
gradients are not finite (an all-reduce of one number, in the replica context where Keras
calls it) and says "finite" only when that count is 0.  Every replica then takes the same
branch: an overflow on one worker skips the step on all of them, and all of them halve the
loss scale, so weights and loss scale stay equal.  Elsewhere (one process, another
strategy, the cross-replica context) Keras's own ``check_finite`` runs unchanged.

Armed with the ``fit`` mend (:func:`kerasfix.install`), on the same terms: only the Keras
releases of :data:`kerasbase.TESTED`, only while Keras's source still holds the lines that
decide from the local gradients, one line said on first use, one line when it steps aside;
``MWHELPERS_KERAS_FIX=0`` turns it off.  The upstream write-up: ``docs/keras-lossscale.md``.

This file imports only the standard library and its siblings.
"""

from __future__ import annotations

import sys
from types import ModuleType

from .kerasbase import (
    PATCHED,
    SKIPPED,
    is_multi_worker,
    keras_version,
    multi_worker_job,
    say_once,
    source_of,
    untested,
)

TARGET = "keras.src.optimizers.loss_scale_optimizer"
ISSUE = "docs/keras-lossscale.md"
METHOD = "check_finite"  # the one method replaced, on LossScaleOptimizer
# The lines, whitespace removed, as Keras 3.15 writes them: the check looks at one replica's
# gradients, and both ways of applying a step decide with it before any all-reduce.
LOCAL_CHECK = "finite_grads=[ops.all(ops.isfinite(g))forgintensor_grads]"
MERGE_CALL_PATH = "call_for_each_replica(self.check_finite,args=(grads,))"
REPLICA_PATH = "finite=self.check_finite(grads)"

MENDED = "LossScaleOptimizer mended for multi-worker"  # what the diagnosis looks for
NOTICE = ("[mwhelpers] Keras {version}: " + MENDED + " "
          "MultiWorkerMirroredStrategy (" + ISSUE + "; the workers decide together whether the "
          "gradients are finite, so an overflow on one skips the step on all); turn off: "
          "MWHELPERS_KERAS_FIX=0")
NOTHING_TO_MEND = ("[mwhelpers] Keras {version}'s LossScaleOptimizer does not decide from one "
                   "replica's gradients the way 3.15 does (" + ISSUE + "): nothing to mend, "
                   "Keras runs unchanged")


def plan(module: ModuleType, version: str) -> tuple[type | None, str | None]:
    """(the class to mend, None), (None, why it is left alone), or (None, None) when its
    source no longer holds the lines: nothing to mend."""
    why = untested(version)
    if why:
        return None, why
    cls = getattr(module, "LossScaleOptimizer", None)
    if not isinstance(cls, type):
        return None, f"Keras {version} has no LossScaleOptimizer class in {TARGET}"
    methods = {name: getattr(cls, name, None) for name in ("check_finite", "_tf_apply",
                                                           "_common_apply")}
    missing = [name for name, f in methods.items() if not callable(f)]
    if missing:
        return None, f"Keras {version}'s LossScaleOptimizer has no {' or '.join(missing)}"
    texts = {name: source_of(f) for name, f in methods.items() if f is not None}
    if any(text is None for text in texts.values()):
        return None, f"Keras {version}'s source cannot be read"
    check, tf_apply, common = (texts[n] or "" for n in ("check_finite", "_tf_apply",
                                                        "_common_apply"))
    if LOCAL_CHECK in check and "all_reduce" not in check and MERGE_CALL_PATH in tf_apply \
            and REPLICA_PATH in common:
        return cls, None
    return None, None


def patch(module: ModuleType) -> bool:
    """Mend ``keras.src.optimizers.loss_scale_optimizer``; True when something was changed."""
    if getattr(module, PATCHED, False):
        return False
    version = keras_version() or "(version unknown)"
    cls, why = plan(module, version)
    if why:
        if multi_worker_job():
            say_once("lossscale-skipped", SKIPPED.format(issue=ISSUE, why=why))
        return False
    if cls is None:
        if multi_worker_job():
            say_once("lossscale-upstream", NOTHING_TO_MEND.format(version=version))
        setattr(module, PATCHED, True)
        return False
    original = getattr(cls, METHOD)

    def check_finite(self: object, grads: object) -> object:
        finite = original(self, grads)
        tf = sys.modules.get("tensorflow")
        context = tf.distribute.get_replica_context() if tf is not None else None
        if tf is None or context is None or not is_multi_worker(context.strategy):
            return finite  # the cross-replica context, one process, another strategy
        say_once("lossscale-notice", NOTICE.format(version=version))
        not_finite = tf.cast(tf.logical_not(finite), tf.float32)
        return tf.equal(context.all_reduce(tf.distribute.ReduceOp.SUM, not_finite), 0.0)

    check_finite.__name__ = METHOD
    check_finite.__wrapped__ = original  # type: ignore[attr-defined]
    setattr(cls, METHOD, check_finite)
    setattr(module, PATCHED, True)
    return True
