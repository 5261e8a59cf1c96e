#!/usr/bin/env python
"""What a cell shows of a flood of output, bounded against unbounded (a script that prints
figures, not a test).

    .venv/bin/python benchmarks/bench_flood.py [--rounds N] [--lines N]

Each round starts two real local tasks through ``mwhelpers.Runtime`` (in the background,
then ``rt.jobs.current().watch(runs, stream=True)``, the way a foreground ``%%worker`` streams) that print
``--lines`` lines each (default 200,000), every 1,000th of them 10,000 characters long.  The
echo stands in for the cell: it prints every line it is given into a file, flushed, as the
kernel's default echo prints to the cell.  A round is watched twice, alternately: with
the default bounds (a runtime's ``rt.cell_limits``) and unbounded (``head`` and
``width`` None, every line whole, as before the bounds).  It prints, per mode: the bytes the
cell received, the lines, the time from the launch to the end of the watch, and the
kernel's CPU time during the watch; the bytes the logs hold (everything); and the ratios.
"""

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

LONG = 10_000  # characters of every 1,000th line

FLOOD = (
    "import json, os, sys\n"
    "task = json.loads(os.environ['TF_CONFIG'])['task']['index']\n"
    "out = sys.stdout\n"
    "for i in range(int(os.environ['LINES'])):\n"
    "    out.write(f'w{task} step {i:6d} loss {1 / (i + 1):.6f}'"
    " + ('x' * " + str(LONG) + " if i % 1000 == 0 else '') + '\\n')\n"
    "out.flush()\n"
)


class Cell:
    """The cell's output: every echoed line printed into a file, flushed, and counted."""

    def __init__(self, path):
        self.file = open(path, "w")  # closed by close()
        self.lines = 0

    def __call__(self, line):
        print(line, file=self.file, flush=True)
        self.lines += 1

    def close(self):
        self.file.close()
        return os.path.getsize(self.file.name)


def one_watch(lines, bounded, workdir):
    from mwhelpers.workers import Runtime

    cell = Cell(workdir / "cell.txt")
    with Runtime(log_dir=workdir / "logs", echo=cell) as rt:
        if not bounded:
            rt.cell_limits.head = rt.cell_limits.width = None
        rt.define_cluster(2)
        t0 = time.monotonic()
        runs = [rt.launch(f"worker:{i}", code=FLOOD, env={"LINES": str(lines)},
                          background=True, ready="start") for i in range(2)]
        cell.lines = 0  # the "started in the background" lines are not the flood's
        cpu0 = time.process_time()
        rt.jobs.current().watch(runs, 300, stream=True)
        cpu = time.process_time() - cpu0
        took = time.monotonic() - t0
        logged = sum(r.log_path.stat().st_size for r in runs)
        failed = [f"{r.task}: {r.outcome()}" for r in runs if r.returncode != 0]
    if failed:
        sys.exit(f"a task failed: {failed}")
    shown_lines = cell.lines
    return {"shown": cell.close(), "lines": shown_lines, "time": took, "cpu": cpu,
            "logged": logged}


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--lines", type=int, default=200_000, help="lines per task")
    a = p.parse_args()
    from mwhelpers import watcher

    lim = watcher.CellLimits()
    print(f"2 tasks x {a.lines:,} lines (every 1,000th {LONG:,} characters long); bounds: "
          f"first {lim.head} and last {lim.tail} lines per task, lines cut at {lim.width:,} "
          f"characters", flush=True)
    got = {True: [], False: []}
    for i in range(1, a.rounds + 1):
        for bounded in ((True, False) if i % 2 else (False, True)):
            with tempfile.TemporaryDirectory(prefix="bench-flood-") as d:
                r = one_watch(a.lines, bounded, Path(d))
            got[bounded].append(r)
            print(f"round {i} {'bounded  ' if bounded else 'unbounded'}: cell {r['shown']:>11,} bytes "
                  f"in {r['lines']:>7,} lines; logs {r['logged']:,} bytes; launch to end of watch "
                  f"{r['time']:.2f} s; kernel CPU {r['cpu']:.2f} s", flush=True)

    def med(bounded, key):
        return statistics.median(r[key] for r in got[bounded])

    print(f"\nmedians over {a.rounds} rounds")
    for bounded in (False, True):
        name = "bounded  " if bounded else "unbounded"
        print(f"  {name}: cell {med(bounded, 'shown'):>11,.0f} bytes, {med(bounded, 'lines'):>7,.0f} "
              f"lines; {med(bounded, 'time'):.2f} s; kernel CPU {med(bounded, 'cpu'):.2f} s")
    print(f"  logs (everything, both modes): {med(True, 'logged'):,.0f} bytes")
    print(f"bounded / unbounded: cell bytes {med(True, 'shown') / med(False, 'shown'):.5f} "
          f"({med(False, 'shown') / med(True, 'shown'):,.0f} times less), time "
          f"{med(True, 'time') / med(False, 'time'):.2f}, kernel CPU "
          f"{med(True, 'cpu') / med(False, 'cpu'):.2f}")


if __name__ == "__main__":
    main()
