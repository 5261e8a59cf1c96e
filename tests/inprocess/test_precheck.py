"""The look at a program before it starts (mwhelpers.precheck): real programs, read not run.

The tutorial-shaped programs must pass without a word (a warning about a right program would
teach people to ignore them); each mistake is seen where it is, also inside a module beside
the program; the warnings reach the cell through the magics once per program.
"""

import importlib.util
import re
import shutil
from pathlib import Path

import pytest
from conftest import ROOT, notebook_programs

from mwhelpers.precheck import check

TUTORIAL = ROOT / "tests" / "programs" / "tutorial"
KERAS3 = {"keras_version": "3.15.1", "tf_version": "2.21.0"}
LEGACY = {"TF_USE_LEGACY_KERAS": "1"}


@pytest.fixture
def tutorial(tmp_path):
    for name in ("main.py", "ctl_main.py", "mnist_setup.py"):
        shutil.copy(TUTORIAL / name, tmp_path / name)
    return tmp_path


def look(folder, name, env=None, **versions):
    path = folder / name
    return check(path.read_text(), path, env or {}, folders=[str(folder)],
                 **(versions or KERAS3))


def test_the_tutorial_programs_get_no_warning(tutorial):
    assert look(tutorial, "main.py") == []  # Keras 3: mwhelpers mends its fit
    assert look(tutorial, "main.py", LEGACY) == []
    assert look(tutorial, "ctl_main.py") == []
    # Keras 2 (TF 2.15) has no such problem with fit.
    assert look(tutorial, "main.py", keras_version="2.15.0", tf_version="2.15.0") == []


def test_fit_under_mwms_with_keras3_and_the_fix_off(tutorial):
    path = tutorial / "main.py"
    (warning,) = check(path.read_text(), path, {}, folders=[str(tutorial)], keras_fix=False,
                       **KERAS3)
    assert warning.startswith("main.py line 25 calls fit under MultiWorkerMirroredStrategy with "
                              "Keras 3.15.1, and mwhelpers' Keras fix is off for this task")
    assert "keras-team/keras#20585" in warning
    # Selected in the program itself, before TensorFlow: no warning.
    text = path.read_text()
    path.write_text('import os\nos.environ["TF_USE_LEGACY_KERAS"] = "1"\n' + text)
    assert check(path.read_text(), path, {}, folders=[str(tutorial)], keras_fix=False,
                 **KERAS3) == []


def test_fit_with_a_keras_the_fix_was_not_tested_with(tutorial):
    (warning,) = look(tutorial, "main.py", keras_version="3.99.0", tf_version="2.30.0")
    assert "was tested with Keras 3.0 to 3.16 and leaves this one unchanged" in warning
    (warning,) = look(tutorial, "main.py", keras_version="3.4.1", tf_version="2.16.2")
    assert "never all-reduces the gradients across workers" in warning


@pytest.mark.parametrize("value, warned", [("2", True), ("steps", True), ("1", False)])
def test_steps_per_execution_above_one_under_mwms(value, warned):
    source = ("import tensorflow as tf, keras\n"
              "strategy = tf.distribute.MultiWorkerMirroredStrategy()\n"
              "steps = 4\n"
              "with strategy.scope():\n"
              "    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])\n"
              f"    model.compile(loss='mse', steps_per_execution={value})\n")
    warnings = check(source, "job.py", {}, **KERAS3)
    if not warned:
        assert warnings == []
        return
    (warning,) = warnings
    assert warning.startswith(f"job.py line 6 compiles with steps_per_execution={value}: ")
    assert "You must feed a value for placeholder tensor" in warning
    # tf_keras is not concerned, and neither is a program without MWMS.
    assert check(source, "job.py", LEGACY, **KERAS3) == []
    assert check(source.replace("MultiWorkerMirroredStrategy", "MirroredStrategy"), "job.py", {},
                 **KERAS3) == []
    # Keras 3.5 and 3.6 train with it (docs/keras-versions.md): no warning there.
    assert check(source, "job.py", {}, keras_version="3.6.0", tf_version="2.16.2") == []
    assert len(check(source, "job.py", {}, keras_version="3.7.0", tf_version="2.16.2")) == 1


def test_an_op_before_the_strategy_even_inside_a_module_beside_it(tutorial):
    text = (tutorial / "main.py").read_text()
    moved = text.replace("multi_worker_dataset = mnist_setup.mnist_dataset(global_batch_size)\n", "")
    moved = moved.replace("strategy = tf.distribute.MultiWorkerMirroredStrategy()\n",
                          "multi_worker_dataset = mnist_setup.mnist_dataset(128)\n"
                          "strategy = tf.distribute.MultiWorkerMirroredStrategy()\n")
    (tutorial / "main.py").write_text(moved)
    (warning,) = look(tutorial, "main.py", LEGACY)
    assert warning.startswith("mnist_setup.py line 13 (called from main.py line 16) runs a "
                              "TensorFlow operation (tf.data.Dataset.from_tensor_slices(")
    assert "before MultiWorkerMirroredStrategy is created (main.py line 17)" in warning


@pytest.mark.parametrize("before, warned", [
    ("x = tf.constant(1.0)", "line 3 of the cell runs a TensorFlow operation (tf.constant(1.0))"),
    ("print(tf.config.list_logical_devices())", "(tf.config.list_logical_devices())"),
    ("model = keras.Sequential([keras.layers.Dense(1)])", "(keras.Sequential("),
    ("def build():\n    return tf.random.uniform([2])\nw = build()",
     "line 4 of the cell (called from line 5 of the cell) runs"),
    # These set up nothing: checked on TF 2.21 to leave the strategy working.
    ("print(tf.config.list_physical_devices('CPU'))", None),
    ("tf.random.set_seed(1); keras.utils.set_random_seed(1)", None),
    ("layer = keras.layers.Dense(1); spec = tf.TensorSpec([None])", None),
    ("options = tf.data.Options()", None),
])
def test_what_counts_as_an_op_before_the_strategy(before, warned):
    source = (f"import tensorflow as tf\nfrom tensorflow import keras\n{before}\n"
              "strategy = tf.distribute.MultiWorkerMirroredStrategy()\n")
    warnings = check(source, "cell.py", LEGACY, cell=True, **KERAS3)
    if warned is None:
        assert warnings == []
    else:
        assert len(warnings) == 1 and warned in warnings[0], warnings


def test_no_strategy_no_op_warning():
    assert check("import tensorflow as tf\nprint(tf.constant(1))\n", "a.py", {}, **KERAS3) == []


def test_a_hard_coded_tf_config(tmp_path):
    source = ('import json, os\nos.environ["TF_CONFIG"] = json.dumps({"cluster": {}})\n'
              "import tensorflow as tf\n")
    (warning,) = check(source, tmp_path / "train.py", {}, **KERAS3)
    assert warning.startswith("train.py line 2 sets TF_CONFIG itself")
    guarded = ('import json, os\nif "TF_CONFIG" not in os.environ:\n'
               '    os.environ["TF_CONFIG"] = json.dumps({"cluster": {}})\n')
    assert check(guarded, tmp_path / "train.py", {}, **KERAS3) == []
    updated = 'import os\nos.environ.update({"TF_CONFIG": "{}"})\n'
    assert check(updated, tmp_path / "t.py", {}, **KERAS3)[0].startswith("t.py line 2 sets")


def test_a_program_that_does_not_parse_is_left_to_python():
    assert check("def broken(:\n", "x.py", {}, **KERAS3) == []


def test_the_warning_reaches_the_cell_once_and_the_task_still_runs(ip, rt, capsys):
    cell = ("import os\n"
            "os.environ['TF_CONFIG'] = os.environ['TF_CONFIG']  # harmless, but a warning\n"
            "print('ran')\n")
    ip.run_cell_magic("worker", "0", cell)
    first = rt.get_run("worker:0")
    ip.run_cell_magic("worker", "0", cell)
    warned = [ln for ln in rt.echo_lines if ln.startswith("[mwhelpers] warning:")]
    warning = ("line 2 of the cell sets TF_CONFIG itself: that "
               "replaces the TF_CONFIG mwhelpers gives each task from the cluster "
               "(%cluster), so the tasks would not be the cluster you defined. Delete "
               "that line, or set it only when TF_CONFIG is not already set.")
    assert warned == ["[mwhelpers] warning: " + warning]
    assert rt.echo_lines.count("[worker:0] ran") == 2
    # Each run keeps what the look said of its program, said in the cell or not.
    assert first.warnings == rt.get_run("worker:0").warnings == [warning]
    ip.run_cell_magic("worker", "0", "print('ran')\n")
    assert rt.get_run("worker:0").warnings == [] and first.warnings == [warning]


def test_legacy_keras_is_selected_by_the_values_tensorflow_reads_and_no_others():
    from mwhelpers.taskside.taskfacts import legacy_selected

    spec = importlib.util.find_spec("tensorflow")
    if spec is None or spec.origin is None:
        pytest.skip("TensorFlow is not installed: its reading of TF_USE_LEGACY_KERAS cannot be compared")
    source = Path(spec.origin).read_text()  # tensorflow/__init__.py, read without importing it
    m = re.search(r'environ\.get\("TF_USE_LEGACY_KERAS", None\) in \(([^)]*)\)', source)
    assert m, "TensorFlow no longer reads TF_USE_LEGACY_KERAS as this test expects"
    tensorflows = {v.strip().strip("\"'") for v in m.group(1).split(",") if v.strip()}
    assert tensorflows == {"true", "True", "1"}
    for value in tensorflows:
        assert legacy_selected(value)
    for value in ("yes", "TRUE", " 1", "0", "false", "", None):
        assert not legacy_selected(value)  # Keras 3, as TensorFlow itself decides


def _programs_in_parts():
    """Each notebook program written by a %%writefile cell and %%writefile -a cells after it:
    (notebook, file name, its parts in order)."""
    return [(notebook.stem, name, parts)
            for notebook in sorted((ROOT / "notebooks").glob("*.ipynb"))
            for name, parts in notebook_programs(notebook).items() if len(parts) > 1]


@pytest.mark.parametrize("notebook,name,parts", _programs_in_parts(),
                         ids=lambda v: v if isinstance(v, str) and not v.endswith(".py") else "")
def test_a_writefile_a_part_that_ran_twice_is_named_and_the_whole_program_is_not(
        notebook, name, parts):
    assert check("".join(parts), name, {}) == []
    for index, part in enumerate(parts[1:], 1):
        # the part run again at once, or after the parts that follow it
        for doubled in ("".join(parts[:index + 1]) + part, "".join(parts) + part):
            said = [w for w in check(doubled, name, {}) if "%%writefile -a" in w]
            assert len(said) == 1 and "runs twice" in said[0], (index, said)


def test_a_function_given_again_differently_is_named_and_repeated_imports_are_not():
    program = "import os\nimport sys\nimport json\ndef f():\n    return 1\n"
    assert check(program + "import os\nimport sys\nimport json\n", "p.py", {}) == []
    (said,) = check(program + "def f():\n    return 2\n", "p.py", {})
    assert "defines f at line 4 and again, differently, at line 6" in said
    assert check(program + "def f():\n    return 2\n", "cell.py", {}, cell=True) == []
