"""Each run's log is read once as it grows (``run.feed``, mwhelpers.follow), and what it says is
handed on as lines and parsed events: progress, the task's facts, stack dumps."""

import ast
import re
import time

from conftest import ROOT

from mwhelpers.follow import progress, progress_of

# Keras epochs and steps, a custom loop's step lines, the facts line, a stack dump, and a
# progress bar that rewrites its last line without ending it.
PROGRAM = """\
import faulthandler, sys, time
print("Epoch 1/2", flush=True)
print("1/4 - loss: 0.5", flush=True)
print("step 7 loss=0.1", flush=True)
print("[mwhelpers] this task: TensorFlow 2.21.0 with Keras 3.15.1 (TF_USE_LEGACY_KERAS=unset at import)",
      file=sys.stderr, flush=True)
faulthandler.dump_traceback(all_threads=True)
print("after the dump", flush=True)
print("Epoch 2/2", flush=True)
sys.stdout.write("\\r 2/4 [==>...]\\r 3/4 [===>..]")
sys.stdout.flush()
time.sleep(0.5)
"""


def test_progress_is_read_from_each_kind_of_line():
    assert progress_of("Epoch 2/3") == ("epoch", "2/3")
    assert progress_of("  5/10 [=====>....] - loss: 0.1") == ("batch", "5/10")
    assert progress_of("step 4 loss=0.2") == ("step", "4")
    assert progress_of("STEP epoch=1 batch=2") == ("step", "")
    assert progress_of("w0 step 4") is None and progress_of("steps_per_epoch=3") is None
    assert progress(["Epoch 1/3", "3/10 [==>....]", "Epoch 2/3"]) == "epoch 2/3"
    assert progress(["Epoch 1/3", "3/10 [==>....]"]) == "epoch 1/3, step 3/10"


def test_a_feed_hands_every_line_and_its_events_to_its_subscribers(rt):
    rt.define_cluster(1)
    run = rt.launch("worker:0", code=PROGRAM, background=True, ready="start")
    early, events = [], []
    unsubscribe = run.feed.subscribe(early.extend, events.append, replay=True)
    deadline = time.monotonic() + 20
    while "epoch 2/2, step 3/4" != run.feed.progress() and time.monotonic() < deadline:
        time.sleep(0.02)
    # A progress bar's unfinished line counts, as a terminal shows it.
    assert run.feed.progress() == "epoch 2/2, step 3/4"
    assert run.feed.recent(1) == [" 3/4 [===>..]"]
    run.wait(10)
    deadline = time.monotonic() + 5
    follower = rt.services.follower  # the runtime's own
    while follower.following and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not follower.following  # nothing is followed once nothing runs
    lines = run.lines()
    assert early == lines and lines[-1] == " 3/4 [===>..]"  # every line once, in order
    kinds = [(e.kind, e.text) for e in events]
    facts = next(ln for ln in lines if ln.startswith("[mwhelpers] this task: "))
    assert kinds[:4] == [("epoch", "1/2"), ("batch", "1/4"), ("step", "7"), ("facts", facts)], kinds
    assert [k for k, _ in kinds[4:]] == ["stacks", "stacks-end", "epoch", "batch"], kinds
    assert run.feed.facts == {"tensorflow": "2.21.0", "keras": "Keras 3.15.1", "legacy": "unset"}
    assert run.feed.stack_dumps == 1
    # The run stamped its epochs and its step line for the timeline, no later than its exit.
    marks = [(kind, text) for _, kind, text in run.events if kind in ("epoch", "step")]
    assert marks == [("epoch", "1/2"), ("step", "7"), ("epoch", "2/2")]
    assert all(at <= run.ended_wall for at, kind, _ in run.events if kind in ("epoch", "step"))
    # A late subscriber gets the lines read so far from the file, once; after unsubscribing,
    # nothing more arrives.
    late = []
    run.feed.subscribe(late.extend, replay=True)
    assert late == lines
    unsubscribe()
    with run.log_path.open("a") as log:
        log.write("written after the exit\n")
    run.feed.read()
    assert early == lines and late == lines + ["written after the exit"]


# A regular expression's text for Keras' epoch line, its step count ("\\d+)/(\\d+"), or a
# line that starts with the word step.
PATTERN = r"Epoch .{0,12}\\d|\\d\+\)?/\(?(\?P<\w+>)?\\d|step\)?\\b"


def test_each_progress_pattern_is_written_once_in_the_package():
    """Progress is parsed in mwhelpers/follow.py only: no other module holds a pattern of Keras'
    epoch or step lines."""
    found = {}
    for path in (ROOT / "mwhelpers").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and re.search(
                    PATTERN, node.value, re.IGNORECASE):
                found.setdefault(path.name, []).append(node.value)
    assert set(found) == {"follow.py"}, found


def test_two_runtimes_share_no_follower_limits_or_warm_starter_and_each_ends_its_own(rt, tmp_path):
    from mwhelpers import Runtime
    from mwhelpers.backends.base import BOOTSTRAP

    other = Runtime(log_dir=tmp_path / "other", echo=lambda line: None)
    try:
        assert other.services.follower is not rt.services.follower
        assert other.cell_limits is not rt.cell_limits
        rt.cell_limits.head = 3
        assert other.cell_limits.head == 200  # a change in one runtime is not seen by the other
        python = "/usr/bin/python3"
        assert other.services.warm_starter(python, BOOTSTRAP) is not rt.services.warm_starter(
            python, BOOTSTRAP)
        assert rt.services.warm_starter(python, BOOTSTRAP) is rt.services.warm_starter(
            python, BOOTSTRAP)  # its launchers share one

        rt.define_cluster(1)
        other.define_cluster(1)
        code = "import time\nprint('up', flush=True)\ntime.sleep(30)\n"
        mine = rt.launch("worker:0", code=code, background=True, ready="start")
        theirs = other.launch("worker:0", code=code, background=True, ready="start")
        assert rt.services.follower.following == 1 == other.services.follower.following
        deadline = time.monotonic() + 10
        while not ("up" in mine.lines() and "up" in theirs.lines()) and time.monotonic() < deadline:
            time.sleep(0.02)
        other.close()  # ends its task, its follower and its warm starters; rt's go on
        assert not theirs.running and other.services.follower.following == 0
        assert other.services.closed and other.services.warm_pids == []
        assert mine.running and rt.services.follower.following == 1
        deadline = time.monotonic() + 10
        while "up" not in mine.feed.recent() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert "up" in mine.feed.recent()  # rt's follower still reads its run's log
        assert "up" in theirs.feed.recent()  # the closed one's log was read to its end
    finally:
        other.close()
        rt.end_all(policy="now")
