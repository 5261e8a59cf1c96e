"""Keras 3's LossScaleOptimizer (``mixed_float16``) under MultiWorkerMirroredStrategy, mended by
mwhelpers (taskside/kerasmixed.py, docs/keras-lossscale.md).

Two real workers through the magics run tests/programs/keras3_mixed.py, where one global
batch overflows float16 on worker 1 only.  Mended, both skip that step and end with the same
weights and loss scale as one process on the same global batches; unmended (--no-keras-fix, a
custom loop, as fit itself needs the fit mend) both hang and the stuck report names it.  The
mend's rules (what it changes, what it leaves alone) and the diagnosis rule's controls run
without workers below.

The tests described here that need more than this folder gives are in tf/test_keras3_mixed_tf.py."""

import shutil
import sys
import types

import pytest
from conftest import ROOT, module_from_source

from mwhelpers import diagnosis
from mwhelpers.taskname import Task
from mwhelpers.taskside import kerasbase, kerasfix, kerasmixed

PROGRAM = ROOT / "tests" / "programs" / "keras3_mixed.py"
NOTICE = "[mwhelpers] Keras 3.15.1: LossScaleOptimizer mended for 2 replicas in sync"
FACTS = "[mwhelpers] this task: TensorFlow 2.21.0 with Keras 3.15.1 (TF_USE_LEGACY_KERAS=unset at import)"


@pytest.fixture
def keras3(monkeypatch):
    monkeypatch.delenv("TF_USE_LEGACY_KERAS", raising=False)
    monkeypatch.delenv(kerasfix.KERAS_FIX_ENV, raising=False)
    shutil.copy(PROGRAM, "mixed.py")


def said(run, prefix):
    return [ln for ln in run.lines() if ln.startswith(prefix)]


# -- the rules of the mend, on stand-ins for Keras's module, without workers ------------------

CHECK = ("tensor_grads = [g for g in grads if g is not None]\n"
         "        finite_grads = [ops.all(ops.isfinite(g)) for g in tensor_grads]\n"
         "        return ops.all(ops.convert_to_tensor(finite_grads))")
# The nightly's (3.16.0.dev2026102704) spelling of the same check.
NIGHTLY_CHECK = ("tensor_grads = [g for g in grads if g is not None]\n"
                 "        finite_grads = [\n"
                 "            backend.ops.numpy.all(backend.ops.numpy.isfinite(g))\n"
                 "            for g in tensor_grads\n"
                 "        ]\n"
                 "        return backend.ops.numpy.all(backend.ops.convert_to_tensor(finite_grads))")
# The check as an earlier version of docs/keras-lossscale/loss_scale_optimizer.patch left it
# (an equivalent fix: its helper below).
PATCHED_CHECK = ("tensor_grads = [g for g in grads if g is not None]\n"
                 "        finite_grads = [ops.all(ops.isfinite(g)) for g in tensor_grads]\n"
                 "        finite = ops.all(ops.convert_to_tensor(finite_grads))\n"
                 "        return self._tf_finite_on_all_replicas(finite)")
HELPER = ("    def _tf_finite_on_all_replicas(self, finite):\n"
          "        total = context.all_reduce(tf.distribute.ReduceOp.SUM, finite)\n"
          "        return total\n")
TF_APPLY = ("finite_per_replica = distribution.extended.call_for_each_replica(\n"
            "            self.check_finite, args=(grads,))\n"
            "        finite = distribution.experimental_local_results(finite_per_replica)[0]")
# tf_keras's way: the gradients all-reduced before the check.
TF_APPLY_REDUCED = ("grads = distribution.extended._replica_ctx_all_reduce('sum', grads)\n"
                    "        finite_per_replica = distribution.extended.call_for_each_replica(\n"
                    "            self.check_finite, args=(grads,))")
COMMON = "finite = self.check_finite(grads)"
# The ways of applying a step as the patch leaves them, and its helper.
PATCHED_TF_APPLY = TF_APPLY.replace("self.check_finite", "self._check_finite_on_all_replicas")
PATCHED_COMMON = "finite = self._check_finite_on_all_replicas(grads)"
ALL_REPLICAS = ("    def _check_finite_on_all_replicas(self, grads):\n"
                "        finite = self.check_finite(grads)\n"
                "        return context.all_reduce(tf.distribute.ReduceOp.SUM, finite)\n")


def _module(folder, name, check=CHECK, tf_apply=TF_APPLY, common=COMMON, extra=""):
    """A stand-in for keras.src.optimizers.loss_scale_optimizer with the given method bodies
    (None: the method is missing); called with ``grads=None`` each answers True at once."""
    source = "class LossScaleOptimizer:\n" + extra
    for method, body in (("check_finite", check), ("_tf_apply", tf_apply),
                         ("_common_apply", common)):
        if body is not None:
            source += (f"    def {method}(self, grads, trainable_variables=None):\n"
                       f"        if grads is None:\n            return True\n"
                       f"        {body}\n")
    return module_from_source(folder, name, source)


@pytest.mark.parametrize("version, kwargs, verdict, said_line", [
    ("3.15.1", {}, "mend", None),  # the notice comes with the first multi-replica step
    ("3.0.5", {}, "mend", None),
    ("3.16.0.dev2026102704", {"check": NIGHTLY_CHECK}, "mend", None),
    ("3.16.0", {"check": PATCHED_CHECK, "extra": HELPER}, "fixed",
     "carries the fix of LossScaleOptimizer's finite check (docs/keras-lossscale.md): "
     "check_finite all-reduces its decision across replicas; nothing to mend"),
    ("3.16.0", {"tf_apply": PATCHED_TF_APPLY, "common": PATCHED_COMMON, "extra": ALL_REPLICAS},
     "fixed", "_check_finite_on_all_replicas all-reduces check_finite's decision across "
     "replicas; nothing to mend"),
    ("3.16.0", {"tf_apply": TF_APPLY_REDUCED}, "fixed",
     "_tf_apply all-reduces the gradients before it checks them; nothing to mend"),
    ("3.16.0", {"check": "return all_reduce_of(local(grads))"}, "fixed", "nothing to mend"),
    ("3.16.0", {"common": "finite = self.all_finite(grads)"}, "unknown",
     "cannot tell whether LossScaleOptimizer's finite check (docs/keras-lossscale.md) still "
     "needs mending: its replica path differ"),
    ("3.16.0", {"check": "return isfinite_all(grads)"}, "unknown", "its check differ"),
    ("3.15.1", {"tf_apply": None}, "unknown", "its LossScaleOptimizer has no _tf_apply"),
    ("3.17.0", {}, "skip", "outside the releases it was tested with"),
    ("2.15.0", {}, "skip", "outside the releases it was tested with"),
])
def test_the_mend_decides_from_the_source(monkeypatch, capsys, tmp_path, version, kwargs,
                                          verdict, said_line):
    monkeypatch.setattr(kerasbase, "_said", set())
    monkeypatch.delenv(kerasbase.FORCE_ENV, raising=False)
    monkeypatch.setitem(sys.modules, "keras.src.version", types.SimpleNamespace(__version__=version))
    name = f"fake_lso_{version.replace('.', '_')}_{'_'.join(kwargs)}_{len(str(kwargs))}"
    module = _module(tmp_path, name, **kwargs)
    before = module.LossScaleOptimizer.check_finite
    assert kerasmixed.plan(module, version)[0] == verdict
    assert kerasmixed.patch(module) is (verdict == "mend")
    after = module.LossScaleOptimizer.check_finite
    assert after is not before and after.__wrapped__ is before  # a mend, or a line when used
    assert kerasmixed.patch(module) is False  # idempotent: wrapped once
    assert module.LossScaleOptimizer.check_finite is after
    assert capsys.readouterr().err == ""  # nothing said before a step is checked
    optimizer = module.LossScaleOptimizer()
    assert optimizer.check_finite(None) is True  # one replica: Keras's own answer, no line
    assert capsys.readouterr().err == ""
    if said_line is None:
        return
    # The first step checked under a strategy with 2 replicas says it, once.
    monkeypatch.setattr(kerasmixed, "_replicas", lambda: (None, 2))
    assert optimizer.check_finite(None) is True and optimizer.check_finite(None) is True
    err = capsys.readouterr().err
    assert said_line in err and len(err.splitlines()) == 1, err
    assert kerasmixed.ISSUE in err and kerasmixed.MENDED not in err


def test_force_mends_what_it_cannot_judge_but_never_a_keras_with_the_fix(monkeypatch, capsys,
                                                                         tmp_path):
    monkeypatch.setattr(kerasbase, "_said", set())
    monkeypatch.setenv(kerasbase.FORCE_ENV, "1")
    monkeypatch.setitem(sys.modules, "keras.src.version", types.SimpleNamespace(__version__="3.99"))
    unknown = _module(tmp_path, "fake_lso_forced", common="finite = self.all_finite(grads)")
    assert kerasmixed.patch(unknown) is True
    err = capsys.readouterr().err
    assert "mended although its replica path differ" in err and \
        "MWHELPERS_KERAS_FIX_FORCE=1 says so" in err, err
    fixed = _module(tmp_path, "fake_lso_forced_fixed", check=PATCHED_CHECK, extra=HELPER)
    assert kerasmixed.patch(fixed) is False


def test_the_mend_is_silent_on_an_untested_keras_in_one_process(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(kerasbase, "_said", set())
    monkeypatch.delenv(kerasbase.FORCE_ENV, raising=False)
    monkeypatch.setitem(sys.modules, "keras.src.version", types.SimpleNamespace(__version__="3.99"))
    module = _module(tmp_path, "fake_lso_alone")
    assert kerasmixed.patch(module) is False
    assert module.LossScaleOptimizer().check_finite(None) is True
    assert capsys.readouterr().err == ""


def test_the_mend_is_armed_with_the_others():
    armed = []
    kerasfix.install(lambda name, callback: armed.append(name))
    assert kerasmixed.TARGET in armed


MIRRORED = ROOT / "tests" / "programs" / "keras3_mixed_mirrored.py"


# -- the diagnosis rule's evidence, on stand-ins for stuck runs --------------------------------

class _Run:
    """What the stuck-job diagnosis reads of a run."""

    def __init__(self, index, script, extra=()):
        self.task = Task("worker", index)
        self.script, self.cell, self.cwd, self.keras_fix, self.returncode = \
            script, False, None, False, None
        site = "/venv/lib/python3.11/site-packages/tensorflow/python/eager/execute.py"
        self._lines = [FACTS, *extra, "step 3",
                       "Current thread 0x00007f828c46bb80 (most recent call first):",
                       f'  File "{site}", line 53 in quick_execute',
                       f'  File "{script}", line 2 in <module>',
                       '  File "/x/mwhelpers/taskside/_bootstrap.py", line 235 in main']

    def lines(self):
        return self._lines


@pytest.mark.parametrize("program, extra, found", [
    ("import keras\nkeras.mixed_precision.set_global_policy('mixed_float16')\n", (), True),
    ("import keras\nopt = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD())\n", (),
     True),
    ("import keras\nmodel.fit(x, y)\n", (), False),  # no loss scaling: not this hang
    ("import keras\nkeras.mixed_precision.set_global_policy('mixed_float16')\n",
     (NOTICE + " (docs/keras-lossscale.md; ...)",), False),  # mended: something else
    ("import keras\nkeras.mixed_precision.set_global_policy('mixed_float16')\n",
     ("[mwhelpers] Keras 3.17.0 carries the fix of LossScaleOptimizer's finite check "
      "(docs/keras-lossscale.md): check_finite all-reduces ...",), False),  # fixed: another hang
    ("import keras\nkeras.mixed_precision.set_global_policy('mixed_float16')\n",
     ("[mwhelpers] Keras 3.16.1: cannot tell whether LossScaleOptimizer's finite check "
      "(docs/keras-lossscale.md) still needs mending: ...",), True),
])
def test_the_stuck_rule_needs_its_evidence(tmp_path, program, extra, found):
    script = tmp_path / "train.py"
    script.write_text(program)
    runs = [_Run(i, str(script), extra) for i in (0, 1)]
    lines, findings = diagnosis.explain_stuck(runs, runs)
    assert len(lines) == 2
    assert [f.key for f in findings] == (["keras3-loss-scale"] if found else [])
    if found and extra:
        assert "mwhelpers' mend of it was not applied: Keras 3.16.1: cannot tell" in \
            findings[0].cause, findings[0]
