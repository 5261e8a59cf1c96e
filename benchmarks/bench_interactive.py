#!/usr/bin/env python
"""Interactive tasks against ipyparallel alone and against plain tasks (a script that prints
figures, not a test).

    .venv/bin/python benchmarks/bench_interactive.py [--rounds N] [--tasks K]

* a cell's round trip on idle tasks: ``Interactive.run("1")`` (what ``%%px`` calls: it
  watches for dead and stuck tasks, streams output labelled by task, records each task's
  activity, returns each task's value) against ipyparallel's own
  ``DirectView.execute("1", block=True)`` on the same engines (``silent=True``, its default:
  no value comes back, the engines skip their display hook), and against what ipyparallel's
  own ``%%px`` sends, ``execute("1", silent=False)`` followed by its output (the value
  included), medians over ``--rounds`` cells, and the ratios;
* the start of a cluster of K local tasks: ``rt.interactive()`` (controller, engines,
  registration, learning which engine is which task) against launching K plain tasks with
  ``ready="start"``, medians over 3 starts each, and their ratio.
"""

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mwhelpers.workers import Runtime  # noqa: E402


def quiet(_line: str) -> None:
    pass


def round_trips(rounds: int, tasks: int) -> tuple[list[float], list[float]]:
    with tempfile.TemporaryDirectory() as logs, Runtime(log_dir=logs, echo=quiet) as rt:
        rt.define_cluster(tasks)
        eng = rt.interactive()
        view = eng.view()
        ours, theirs, valued = [], [], []
        for i in range(rounds + 2):  # two rounds of warm-up each, left out
            t = time.perf_counter()
            eng.run("1", echo=lambda *a: None)
            took = time.perf_counter() - t
            t = time.perf_counter()
            view.execute("1", block=True)
            took_theirs = time.perf_counter() - t
            t = time.perf_counter()
            ar = view.execute("1", silent=False, block=False)  # as ipyparallel's %%px
            ar.get()
            ar.wait_for_output()
            took_valued = time.perf_counter() - t
            if i >= 2:
                ours.append(took)
                theirs.append(took_theirs)
                valued.append(took_valued)
        return ours, theirs, valued


def starts(tasks: int, interactive: bool) -> float:
    with tempfile.TemporaryDirectory() as logs, Runtime(log_dir=logs, echo=quiet) as rt:
        rt.define_cluster(tasks)
        t = time.perf_counter()
        if interactive:
            rt.interactive()
        else:
            for k in range(tasks):
                rt.launch(f"worker:{k}", code="import time; time.sleep(60)", background=True,
                          ready="start")
        return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--tasks", type=int, default=2)
    a = ap.parse_args()
    ours, theirs, valued = round_trips(a.rounds, a.tasks)
    mo, mt, mv = statistics.median(ours), statistics.median(theirs), statistics.median(valued)
    print(f"round trip of a cell on {a.tasks} idle tasks, median of {a.rounds}:")
    print(f"  Interactive.run (%%px):          {mo * 1000:7.1f} ms")
    print(f"  ipyparallel DirectView.execute:  {mt * 1000:7.1f} ms")
    print(f"  ratio:                           {mo / mt:7.2f}")
    print(f"  execute(silent=False) + output:  {mv * 1000:7.1f} ms  (ipyparallel's %%px)")
    print(f"  ratio:                           {mo / mv:7.2f}")
    plain = statistics.median(starts(a.tasks, False) for _ in range(3))
    inter = statistics.median(starts(a.tasks, True) for _ in range(3))
    print(f"start of {a.tasks} local tasks, median of 3:")
    print(f"  plain tasks (ready=start):       {plain:7.2f} s")
    print(f"  interactive (controller+engines):{inter:7.2f} s")
    print(f"  ratio:                           {inter / plain:7.2f}")


if __name__ == "__main__":
    main()
