"""A flood of output is bounded in the cell (first lines, last lines, how many were left out,
the log's path) while the log keeps every line; real task processes, no TensorFlow."""

import time

import pytest

from mwhelpers import watcher

LONG = 10_000  # characters of a long line

# N lines "<task> line <i>"; the lines whose number is in LONG_AT carry LONG more characters.
FLOOD = (
    "import os, sys, json\n"
    "task = json.loads(os.environ['TF_CONFIG'])['task']['index']\n"
    "n, long_at = int(os.environ['LINES']), {int(i) for i in os.environ['LONG_AT'].split(',')}\n"
    "out = sys.stdout\n"
    "for i in range(n):\n"
    "    out.write(f'w{task} line {i}' + ('x' * " + str(LONG) + " if i in long_at else '') + '\\n')\n"
    "out.flush()\n"
)


def program(sleep=0.0):
    return FLOOD + (f"import time\ntime.sleep({sleep})\n" if sleep else "")


def expected(task, i, long_at, width):
    line = f"w{task} line {i}" + ("x" * LONG if i in long_at else "")
    if len(line) > width:
        line = f"{line[:width]} ... [{len(line) - width:,} more characters in the log]"
    return f"[worker:{task}] {line}"


def test_two_flooding_tasks_show_their_first_and_last_lines_and_how_many_were_left_out(rt):
    n, long_at = 5000, {3, 1000, 4990}
    limits = rt.cell_limits
    head, tail, width = limits.head, limits.tail, limits.width
    rt.define_cluster(2)
    env = {"LINES": str(n), "LONG_AT": ",".join(map(str, sorted(long_at)))}
    runs = [rt.launch(f"worker:{i}", code=program(), env=env, background=True, ready="start")
            for i in range(2)]
    rt.echo_lines.clear()
    t0 = time.monotonic()
    assert rt.jobs.current().watch(runs, 60, stream=True) == "ended"
    took = time.monotonic() - t0
    for i, run in enumerate(runs):
        shown = [ln for ln in rt.echo_lines if ln.startswith(f"[worker:{i}] ")]
        assert shown[:head] == [expected(i, k, long_at, width) for k in range(head)]
        assert shown[head] == (
            f"[worker:{i}] ... more than {head:,} lines: the rest goes to the log only "
            f"({run.log_path}); its last {tail:,} lines are shown when this watch ends")
        left = n - head - tail
        assert shown[head + 1] == (f"[worker:{i}] ... {left:,} lines left out; "
                                   f"the log has every line: {run.log_path}")
        assert shown[head + 2:] == [expected(i, k, long_at, width) for k in range(n - tail, n)]
        # The log keeps every line, whole.
        logged = [ln for ln in run.log_path.read_text().splitlines() if ln.startswith(f"w{i} line ")]
        assert logged == [f"w{i} line {k}" + ("x" * LONG if k in long_at else "") for k in range(n)]
    shown_bytes = sum(len(ln) + 1 for ln in rt.echo_lines)
    logged_bytes = sum(r.log_path.stat().st_size for r in runs)
    # Two tasks of head + tail lines, two of them cut to the width, and a few notes.
    assert shown_bytes < 2 * ((head + tail) * 40 + 2 * (width + 60) + 400), shown_bytes
    assert logged_bytes > 5 * shown_bytes
    assert took < 30


def test_a_foreground_launch_is_bounded_by_limits_the_user_sets_and_lifts(rt, monkeypatch):
    env = {"LINES": "100", "LONG_AT": "2"}
    monkeypatch.setattr(rt.cell_limits, "head", 10)
    monkeypatch.setattr(rt.cell_limits, "tail", 5)
    monkeypatch.setattr(rt.cell_limits, "width", 30)
    run = rt.launch("worker:0", code=program(), env=env, verbose=True)
    shown = [ln for ln in rt.echo_lines if ln.startswith("[worker:0] ")]
    # verbose=True shows mwhelpers' own start-up line in the log too; the bounds still hold.
    assert len(shown) == 10 + 1 + 1 + 5
    assert f"[worker:0] {'w0 line 2' + 'x' * 21} ... [{LONG - 21:,} more characters in the log]" in shown
    assert shown[11].startswith("[worker:0] ... ") and f"the log has every line: {run.log_path}" in shown[11]
    assert shown[12:] == [f"[worker:0] w0 line {k}" for k in range(95, 100)]

    rt.echo_lines.clear()
    monkeypatch.setattr(rt.cell_limits, "head", None)
    monkeypatch.setattr(rt.cell_limits, "width", None)
    rt.launch("worker:0", code=program(), env=env)
    assert rt.echo_lines == [f"[worker:0] w0 line {k}" + ("x" * LONG if k == 2 else "")
                             for k in range(100)]

    with pytest.raises(ValueError, match=r"cell_limits.tail must be a whole number >= 0, not -1"):
        rt.cell_limits.tail = -1
    with pytest.raises(ValueError, match=r"cell_limits.width must be .* >= 1 or None, not 0"):
        watcher.CellLimits(width=0)


def test_an_interrupted_watch_still_shows_the_last_lines_and_the_count(rt):
    n = 1000
    rt.define_cluster(1)
    run = rt.launch("worker:0", code=program(sleep=60), env={"LINES": str(n), "LONG_AT": "-1"},
                    background=True, ready="start")
    rt.echo_lines.clear()
    seen = []

    def interrupt():
        if len(seen) >= n:
            raise KeyboardInterrupt
        return False

    with pytest.raises(KeyboardInterrupt):
        rt.jobs.current().watch([run], 30, stream=True, until=interrupt,
                 on_line=lambda r, ln: seen.append(ln) if ln.startswith("w0 line ") else None)
    assert not run.running
    head, tail = rt.cell_limits.head, rt.cell_limits.tail
    said = rt.echo_lines
    left = said.index(f"[worker:0] ... {n - head - tail:,} lines left out; "
                      f"the log has every line: {run.log_path}")
    assert said[left + 1:left + 1 + tail] == [f"[worker:0] w0 line {k}" for k in range(n - tail, n)]
    assert said[left + 1 + tail].startswith("interrupted: ended worker:0")
