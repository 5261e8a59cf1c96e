"""The LayoutMap check (mwhelpers/taskside/keraslayout.py), in real tasks of Keras on JAX: a
model split over two processes of two CPU devices each (tests/programs/jax_model_parallel.py).

A rule that matches no variable is named in the cell, with what it probably meant, before the
first step, and the model is indeed whole on every device; a rule that matches says nothing
and splits the kernels; ``MWHELPERS_LAYOUT_CHECK=0`` turns the check off."""

import json
import os
import subprocess
import sys

from conftest import ROOT, results
from test_jax_model_parallel import PROGRAM, jax_env, pytestmark, run_alone  # noqa: F401

PREFIX = "[mwhelpers] LayoutMap: "


def test_a_rule_that_matches_no_variable_is_named_in_the_cell_before_the_first_step(
        ip, rt, jax_env):  # noqa: F811
    ip.run_line_magic("cluster", "2")
    ip.run_line_magic("worker", f"0 --bg {PROGRAM} d.*kernel")
    ip.run_line_magic("worker", f"1 {PROGRAM} d.*kernel")  # its output streams in the cell
    ip.run_line_magic("waitworkers", "--timeout 150")
    # In the cell (worker:1's) and in each task's log: the rule, why it matched nothing, what
    # it probably meant, and what stays whole on every device.
    rule = ("rule 'd.*kernel' matches no variable or layer output of the model: it matches only "
            "part of sequential/d1/kernel, sequential/d2/kernel, and LayoutMap matches a rule "
            "against a whole path (re.fullmatch, since Keras 3.14: a rule written for 3.13 or "
            "older, which matched part of a path, may match nothing now); '.*(?:d.*kernel)' "
            "matches sequential/d1/kernel, sequential/d2/kernel")
    whole = ("2 variables that no rule matches are replicated on every device (2.5 KiB on each, "
             "95% of the model's variables, before the optimizer's copies): "
             "sequential/d1/kernel [16, 32], sequential/d2/kernel [32, 4]")
    assert f"[worker:1] {PREFIX}{rule}" in rt.echo_lines, rt.echo_lines
    assert f"[worker:1] {PREFIX}{whole}" in rt.echo_lines, rt.echo_lines
    for task in ("worker:0", "worker:1"):
        assert {PREFIX + rule, PREFIX + whole} <= set(rt.runs[rt.cluster.check_task(task)].lines())
    # Before the first step: above the epoch's line in the task's log.
    lines = rt.runs[rt.cluster.check_task("worker:0")].lines()
    first = next(i for i, ln in enumerate(lines) if ln.startswith(PREFIX))
    epoch = next(i for i, ln in enumerate(lines) if "loss:" in ln)
    assert first < epoch, lines
    # What it said is so: the kernels are whole on every device.
    for got in results(rt).values():
        assert got["devices"] == 4 and got["specs"] == {"d1": [None, None], "d2": [None, None]}


def test_a_rule_that_matches_says_nothing_and_the_check_can_be_turned_off(tmp_path):
    out = run_alone(tmp_path, r".*/d\d/kernel")
    assert PREFIX not in out
    assert '"specs": {"d1": [null, "model"], "d2": [null, "model"]}' in out, out
    # The same rule that matches nothing: named, unless the check is off.
    assert PREFIX + "rule 'd.*kernel' matches no variable" in run_alone(tmp_path, "d.*kernel")
    out = run_alone(tmp_path, "d.*kernel", MWHELPERS_LAYOUT_CHECK="0")
    assert PREFIX not in out and '"specs": {"d1": [null, null]' in out, out


def test_a_model_made_in_the_distributions_scope_is_checked_too(tmp_path):
    """keras-hub's way: no distribution set for the process, the model made in its scope and
    trained outside it: the check reads the rules of the ModelParallel that laid it out."""
    out = run_alone(tmp_path, "d.*kernel", "--scope")
    assert PREFIX + "rule 'd.*kernel' matches no variable" in out, out
    assert PREFIX + "2 variables that no rule matches are replicated" in out, out


def test_the_output_paths_checked_are_those_keras_looks_up(tmp_path):
    """A rule for a layer's output matches what Layer.__call__ looks up: a weightless layer of a
    functional model runs under no scope (``fdrop/output``), one nested in a block under the
    block's (``blk/inner_drop/output``); an input layer is never looked up."""
    done = subprocess.run([sys.executable, str(ROOT / "tests" / "programs" /
                                               "layout_output_paths.py")],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stdout + done.stderr
    found = json.loads(next(ln for ln in done.stdout.splitlines() if ln.startswith("RESULT "))[7:])
    for kind, paths in found.items():
        assert paths["check"] == paths["keras"], kind
    assert "fdrop/output" in found["functional"]["keras"]
    assert "blk/inner_drop/output" in found["functional"]["keras"]
