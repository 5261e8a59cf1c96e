"""Keras 3's ``optimizer.iterations`` under ParameterServerStrategy, mended by mwhelpers
(``mwhelpers/taskside/keraspss.py``, docs/keras-pss-iterations.md).

A real cluster through the magics (a chief that coordinates, two workers, one ps): with the
mend the optimizer counts every scheduled step; with ``--no-keras-fix`` it loses some (two
workers stepping at once both read N and write N + 1).  The mend's own rules (what it
changes, when it steps aside) without a cluster below.

The tests described here that need more than this folder gives are in tf/test_keras3_pss_tf.py."""

import json
import sys
import types

import pytest
from conftest import ROOT

from mwhelpers.taskside import kerasbase, keraspss

PROGRAM = ROOT / "tests" / "programs" / "keras3_pss_count.py"
NOTICE = "[mwhelpers] Keras 3.15.1 under ParameterServerStrategy: optimizer.iterations counts"
STEPS = 300


def said(run, prefix):
    return [ln for ln in run.lines() if ln.startswith(prefix)]


def chief_result(rt):
    lines = said(rt.get_run("chief:0"), "RESULT ")
    assert lines, "\n".join(rt.get_run("chief:0").tail(40))
    return json.loads(lines[-1][len("RESULT "):])


# -- the rules of the mend, on stand-ins for Keras's modules, without a cluster ----------------

def _modules(folder, monkeypatch, name, increment, assign_add, version="3.15.1"):
    """Stand-ins for keras.src.optimizers.base_optimizer and keras.src.backend.common.variables
    with the given source lines, and a TensorFlow that knows ParameterServerStrategy."""
    monkeypatch.setattr(kerasbase, "_said", set())
    monkeypatch.setitem(sys.modules, "keras.src.version", types.SimpleNamespace(__version__=version))
    monkeypatch.setenv("TF_CONFIG", '{"cluster": {"chief": ["a:1"], "worker": ["b:2", "c:3"], '
                                    '"ps": ["d:4"]}, "task": {"type": "chief", "index": 0}}')

    class ParameterServerStrategy:
        pass

    tf = types.SimpleNamespace(cast=lambda value, dtype: value, distribute=types.SimpleNamespace(
        experimental=types.SimpleNamespace(ParameterServerStrategy=ParameterServerStrategy)))
    monkeypatch.setitem(sys.modules, "tensorflow", tf)
    sources = {
        keraspss.VARIABLES: ("class Variable:\n"
                             "    def __init__(self, value):\n"
                             "        self.value = value\n"
                             "    def assign_add(self, value):\n"
                             f"        {assign_add}\n"),
        name: ("class BaseOptimizer:\n"
               "    def __init__(self, counter):\n"
               "        self._iterations = counter\n"
               "    def apply(self, grads):\n"
               f"        {increment}\n"),
    }
    modules = []
    for module_name, source in sources.items():
        path = folder / f"{module_name.replace('.', '_')}_{name}.py"
        path.write_text(source)
        module = types.ModuleType(module_name)
        module.__file__ = str(path)
        exec(compile(source, str(path), "exec"), module.__dict__)
        monkeypatch.setitem(sys.modules, module_name, module)
        modules.append(module)
    return modules[0].Variable, modules[1], ParameterServerStrategy


class _Inner:
    """A tf.Variable's stand-in: counts its own (atomic) assign_add calls."""

    dtype = "int64"

    def __init__(self, strategy):
        self._distribute_strategy = strategy
        self.added = []

    def assign_add(self, value):
        self.added.append(value)


READ_THEN_WRITE = "return self.assign(self + value)"


def test_the_mend_makes_only_a_parameter_server_counter_atomic(monkeypatch, capsys, tmp_path):
    Variable, module, ps = _modules(tmp_path, monkeypatch, "pss_mended",
                                    "self._iterations.assign_add(1)", READ_THEN_WRITE)
    init = module.BaseOptimizer.__init__
    keraspss.patch(module)
    keraspss.patch(module)  # idempotent: wrapped once
    assert module.BaseOptimizer.__init__.__wrapped__ is init
    assert capsys.readouterr().err == ""  # said with the first step, not at import
    on_ps, alone = _Inner(ps()), _Inner(None)
    mended, unmended = (module.BaseOptimizer(Variable(v)) for v in (on_ps, alone))
    assert "assign_add" in vars(mended._iterations) and "assign_add" not in vars(unmended._iterations)
    mended.apply([])
    mended.apply([])
    assert on_ps.added == [1, 1]  # TensorFlow's own assign_add, on the parameter server
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("[mwhelpers] Keras 3.15.1 under ParameterServerStrategy") and \
        "MWHELPERS_KERAS_FIX=0" in line


@pytest.mark.parametrize("version, increment, assign_add, why", [
    # a Keras variable whose assign_add is one op: neither the bug nor the fix this knows
    ("3.15.1", "self._iterations.assign_add(1)", "return self._value.assign_add(value)",
     "cannot tell whether optimizer.iterations under ParameterServerStrategy "
     "(docs/keras-pss-iterations.md) still needs mending"),
    ("3.15.1", "self._iterations.assign(self._iterations + 1)", READ_THEN_WRITE,
     "count steps otherwise than the releases this was written for"),
    # docs/keras-pss-iterations/optimizer.patch applied
    ("3.16.0", "self.assign_add(self._iterations, 1)", READ_THEN_WRITE,
     "carries the fix of optimizer.iterations under ParameterServerStrategy "
     "(docs/keras-pss-iterations.md): BaseOptimizer.apply counts with the optimizer's assign_add"),
    ("3.17.0", "self._iterations.assign_add(1)", READ_THEN_WRITE,
     "outside the releases it was tested with"),
])
def test_the_mend_steps_aside_where_keras_differs(monkeypatch, capsys, tmp_path, version,
                                                  increment, assign_add, why):
    monkeypatch.delenv(kerasbase.FORCE_ENV, raising=False)
    Variable, module, ps = _modules(tmp_path, monkeypatch,
                                    f"pss_aside_{len(increment)}_{len(assign_add)}", increment,
                                    assign_add, version)
    keraspss.patch(module)
    assert capsys.readouterr().err == ""  # said when it matters: an optimizer under PSS
    alone = module.BaseOptimizer(Variable(_Inner(None)))
    assert capsys.readouterr().err == "" and "assign_add" not in vars(alone._iterations)
    for _ in range(2):
        on_ps = module.BaseOptimizer(Variable(_Inner(ps())))
        assert "assign_add" not in vars(on_ps._iterations)  # Keras's own counting, unchanged
    (line,) = capsys.readouterr().err.splitlines()
    assert why in line and keraspss.ISSUE in line, line
