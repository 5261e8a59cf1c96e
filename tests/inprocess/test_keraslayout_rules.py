"""What the LayoutMap check says (mwhelpers/taskside/keraslayout.py: ``findings``), read from
rules and variables alone, and the failure report of a task that ran out of memory after it
said so (mwhelpers/diagnosis.py).  The check in real tasks: tests/tf/test_keraslayout.py."""

import dataclasses

from mwhelpers.diagnosis import explain_failure
from mwhelpers.failures import Failure
from mwhelpers.taskside.keraslayout import PREFIX, Variable, findings

MODEL = [Variable("sequential/d1/kernel", (512, 2048), 4), Variable("sequential/d1/bias", (2048,), 4),
         Variable("sequential/d2/kernel", (2048, 512), 4), Variable("sequential/d2/bias", (512,), 4),
         Variable("sequential/embed/embeddings", (100, 16), 4)]


OUTPUTS = ["sequential/d1/output", "sequential/d2/output", "sequential/embed/output"]


def test_rules_that_match_say_nothing():
    assert findings([r".*/d\d/kernel"], MODEL, OUTPUTS) == []
    assert findings([], MODEL) == []  # no rules: DataParallel's way, nothing to say
    # A rule for a layer's output (Keras lays out an output by its path) matches no variable.
    assert findings([r".*/d\d/kernel", ".*/d1/output"], MODEL, OUTPUTS) == []
    assert findings([r".*/d\d/kernel", "d1/output"], MODEL, OUTPUTS)[0].startswith(
        "rule 'd1/output' matches no variable of the model")


def test_a_rule_matching_part_of_paths_gets_the_wildcard_it_lacks():
    said = findings(["d.*kernel"], MODEL)
    assert said[0] == (
        "rule 'd.*kernel' matches no variable of the model: it matches only part of "
        "sequential/d1/kernel, sequential/d2/kernel, and LayoutMap matches a rule against a "
"variable's whole path (re.fullmatch, since Keras 3.14: a rule written for 3.13 or older, "
        "which matched part of a path, may match nothing now); '.*d.*kernel' matches "
        "sequential/d1/kernel, sequential/d2/kernel")
    # What stays whole: both kernels (the embedding is under a tenth of the largest), 8 MiB.
    assert said[1] == ("2 variables that no rule matches are replicated on every device (8.0 MiB "
                       "on each): sequential/d1/kernel [512, 2048], sequential/d2/kernel "
                       "[2048, 512]")


def test_keras_before_3_14_matches_part_of_a_path_and_the_check_does_too():
    """Keras 3.13 and older looked a path up with re.search: the same rule shards there."""
    assert findings(["d.*kernel"], MODEL, OUTPUTS, how="search") == []
    assert findings(["dense.*"], MODEL, OUTPUTS, how="search")[0].startswith(
        "rule 'dense.*' matches no variable of the model: no variable's path contains it")


def test_a_rule_matching_nothing_names_the_paths_it_comes_closest_to():
    said = findings(["dense_1/kernel", r".*/d\d/kernel"], MODEL)
    assert said == ["rule 'dense_1/kernel' matches no variable of the model: no variable's "
                    "path contains it either; the paths are like sequential/d1/kernel, "
                    "sequential/d2/kernel, sequential/d2/bias"]


def test_a_rule_that_is_no_regular_expression_is_said():
    said = findings(["d1/[kernel", r".*/d\d/kernel"], MODEL)
    assert said == ["rule 'd1/[kernel' is no regular expression (unterminated character set "
                    "at position 3)"]


def test_a_task_out_of_memory_after_the_check_spoke_is_explained_by_it(tmp_path):
    log = tmp_path / "worker-0.log"
    said = PREFIX + findings(["d.*kernel"], MODEL)[0]
    log.write_text(f"starting\n{said}\nEpoch 1/3\n")
    killed = Failure(task="worker:0", pid=7, returncode=-9, exit="killed by SIGKILL", note="",
                     ended_at=0.0, uptime=3.0, log_path=str(log), tail=["starting", said, "Epoch 1/3"])
    keys = [f.key for f in explain_failure([killed])]
    assert keys == ["layout-replicated", "foreign-sigkill"]
    found = explain_failure([killed])[0]
    assert "worker:0 ran out of memory, most likely, after its LayoutMap left the model whole on " \
           "every device: rule 'd.*kernel' matches no variable" in found.cause
    assert "re.fullmatch" in found.advice
    # The same death without the check's words is the SIGKILL alone.
    log.write_text("starting\nEpoch 1/3\n")
    plain = dataclasses.replace(killed, tail=["starting", "Epoch 1/3"])
    assert [f.key for f in explain_failure([plain])] == ["foreign-sigkill"]
