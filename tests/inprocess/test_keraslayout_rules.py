"""What the LayoutMap check says (mwhelpers/taskside/keraslayout.py), read from rules,
variables and paths alone, and the failure report of a task that ran out of memory after it
said so (mwhelpers/diagnosis.py).  The check in real tasks: tests/tf/test_keraslayout.py."""

import dataclasses
import re
from types import SimpleNamespace

from mwhelpers.diagnosis import explain_failure
from mwhelpers.failures import Failure
from mwhelpers.taskside.keraslayout import (
    PREFIX,
    Variable,
    _how_keras_matches,
    _others,
    _outputs,
    findings,
)

MODEL = [Variable("sequential/d1/kernel", (512, 2048), 4), Variable("sequential/d1/bias", (2048,), 4),
         Variable("sequential/d2/kernel", (2048, 512), 4), Variable("sequential/d2/bias", (512,), 4),
         Variable("sequential/embed/embeddings", (100, 16), 4)]
OUTPUTS = ["sequential/output", "sequential/d1/output", "sequential/d2/output",
           "sequential/embed/output"]
UNMATCHED = "matches no variable or layer output of the model: "


def test_rules_that_match_say_nothing():
    assert findings([r".*/d\d/kernel"], MODEL, OUTPUTS) == []
    assert findings([], MODEL) == []  # no rules: DataParallel's way, nothing to say
    # Rules for outputs (the model's own too) and for the optimizer's variables are used.
    others = ["adam/iteration", "adam/sequential_d1_kernel_momentum"]
    assert findings([r".*/d\d/kernel", ".*/d1/output", "sequential/output", ".*/iteration",
                     ".*_momentum"], MODEL, OUTPUTS, others=others) == []
    assert findings([r".*/d\d/kernel", "d1/output"], MODEL, OUTPUTS)[0].startswith(
        f"rule 'd1/output' {UNMATCHED}")


def test_a_rule_matching_part_of_paths_gets_the_wildcard_it_lacks():
    said = findings(["d.*kernel"], MODEL, OUTPUTS)
    assert said[0] == (
        f"rule 'd.*kernel' {UNMATCHED}it matches only part of sequential/d1/kernel, "
        "sequential/d2/kernel, and LayoutMap matches a rule against a whole path (re.fullmatch, "
        "since Keras 3.14: a rule written for 3.13 or older, which matched part of a path, may "
        "match nothing now); '.*(?:d.*kernel)' matches sequential/d1/kernel, sequential/d2/kernel")
    # What stays whole: every variable of two or more dimensions, the largest first.
    assert said[1] == ("3 variables that no rule matches are replicated on every device (8.0 MiB "
                       "on each, 100% of the model's variables, before the optimizer's copies): "
                       "sequential/d1/kernel [512, 2048], sequential/d2/kernel [2048, 512], "
                       "sequential/embed/embeddings [100, 16]")
    # An alternation keeps both of its branches in the hint.
    said = findings(["d1/kernel|d2/kernel"], MODEL, OUTPUTS)
    assert "'.*(?:d1/kernel|d2/kernel)' matches sequential/d1/kernel, sequential/d2/kernel" \
        in said[0]


def test_many_small_variables_left_whole_are_named_beside_a_sharded_large_one():
    """A large embedding sharded and many smaller kernels left whole (a decoder's), which
    together hold most of the model."""
    model = [Variable("m/embed/embeddings", (256_000, 2048), 2)] + [
        Variable(f"m/block_{i}/ffw/kernel", (2048, 16384), 2) for i in range(36)]
    said = findings([".*embeddings"], model)
    assert len(said) == 1 and said[0].startswith(
        "36 variables that no rule matches are replicated on every device (2.2 GiB on each, 70% "
        "of the model's variables")
    assert "and 30 more" in said[0]
    # Whole but small (under a tenth of the model's bytes): nothing said.
    assert findings([".*embeddings"], model[:2]) == []  # 64 of 1,064 MiB


def test_keras_before_3_14_matches_part_of_a_path_and_the_check_does_too():
    """Keras 3.13 and older looked a path up with re.search: the same rule shards there."""
    assert findings(["d.*kernel"], MODEL, OUTPUTS, how="search") == []
    assert findings(["dense.*"], MODEL, OUTPUTS, how="search")[0].startswith(
        f"rule 'dense.*' {UNMATCHED}no path contains it")


def test_how_keras_matches_is_asked_of_its_layout_map():
    """Each way a LayoutMap may match, as a stand-in (the real one of each Keras release:
    tests/tf/test_keraslayout.py and the matrix's)."""
    def layout_map(how):
        class Stand(dict):
            def __init__(self, mesh):
                super().__init__()

            def __getitem__(self, path):
                return next((v for k, v in self.items() if getattr(re, how)(k, path)), None)
        return Stand

    for how in ("fullmatch", "search", "match"):
        assert _how_keras_matches(layout_map(how)) == how
    assert _how_keras_matches(object) is None  # one that cannot be asked
    # From the start only: a rule naming a path's beginning matches it, one naming its end not.
    assert not findings(["sequential/d1"], MODEL, how="match")[0].startswith("rule ")
    assert findings(["d1/kernel"], MODEL, how="match")[0].startswith("rule 'd1/kernel'")


def test_a_rule_matching_nothing_names_the_paths_it_comes_closest_to():
    said = findings(["dense_1/kernel", r".*/d\d/kernel"], MODEL, OUTPUTS)
    assert said == [f"rule 'dense_1/kernel' {UNMATCHED}no path contains it; the variables' "
                    "paths are like sequential/d1/kernel, sequential/d2/kernel, sequential/d2/bias"]
    assert findings(["x"], [])[0].endswith("the model has no variables yet")


def test_a_rule_that_is_no_regular_expression_is_said():
    said = findings(["d1/[kernel", r".*/d\d/kernel"], MODEL, OUTPUTS)
    assert said == ["rule 'd1/[kernel' is no regular expression (unterminated character set "
                    "at position 3)"]


def test_the_paths_keras_lays_out_besides_the_variables():
    """Outputs: each layer's path, the model's own, a layer without weights under the scope it
    was first called in (none for a functional model's, its block's when nested); no input
    layer's; the optimizer's variables once built, else the names it will give them."""
    dense = SimpleNamespace(path="seq/d1", name="d1")
    dropout = SimpleNamespace(path=None, _parent_path="seq", name="drop")
    nested = SimpleNamespace(path=None, _parent_path="seq/blk", name="inner_drop")
    InputLayer = type("InputLayer", (), {"path": None, "name": "input_layer"})
    model = SimpleNamespace(path=None, _parent_path=None, name="seq", metrics_variables=[],
                            trainable_variables=[SimpleNamespace(path="seq/d1/kernel")])
    model._flatten_layers = lambda include_self, recursive: [model, InputLayer(), dense,
                                                             dropout, nested]
    assert _outputs(model) == ["seq/output", "seq/d1/output", "seq/drop/output",
                               "seq/blk/inner_drop/output"]
    dropout._parent_path = None  # a functional model's layer: called outside its model's scope
    assert _outputs(model)[2] == "drop/output"
    model.optimizer = SimpleNamespace(name="adam", variables=[])
    assert {"adam/iteration", "adam/learning_rate", "adam/seq_d1_kernel_momentum"} <= set(
        _others(model))
    model.optimizer.variables = [SimpleNamespace(path="adam/iteration")]
    assert _others(model) == ["adam/iteration"]


def killed(tmp_path, lines):
    log = tmp_path / "worker-0.log"
    log.write_text("\n".join(lines) + "\n")
    return Failure(task="worker:0", pid=7, returncode=-9, exit="killed by SIGKILL", note="",
                   ended_at=0.0, uptime=3.0, log_path=str(log), tail=list(lines))


def test_a_task_out_of_memory_after_the_check_spoke_is_explained_by_it(tmp_path):
    said = [PREFIX + line for line in findings(["d.*kernel"], MODEL, OUTPUTS)]
    failure = killed(tmp_path, ["starting", *said, "Epoch 1/3"])
    found = explain_failure([failure])
    assert [f.key for f in found] == ["layout-replicated", "foreign-sigkill"]
    assert "worker:0 ran out of memory, most likely, after its LayoutMap left large variables " \
           "whole on every device: 3 variables that no rule matches" in found[0].cause
    assert "re.fullmatch" in found[0].advice and "re.search" in found[0].advice
    # The same death without the check's words, or with only a rule for an output that matched
    # nothing (nothing left whole), is the SIGKILL alone.
    for lines in (["starting", "Epoch 1/3"],
                  ["starting", PREFIX + f"rule 'd1/output' {UNMATCHED}...", "Epoch 1/3"],
                  ["starting", PREFIX + "cannot tell whether its rules match the model"]):
        plain = dataclasses.replace(failure, tail=lines)
        (tmp_path / "worker-0.log").write_text("\n".join(lines) + "\n")
        assert [f.key for f in explain_failure([plain])] == ["foreign-sigkill"], lines
