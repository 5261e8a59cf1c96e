#!/usr/bin/env python
"""What following running tasks costs the kernel (a script that prints figures, not a test).

    .venv/bin/python benchmarks/bench_follow.py [--tasks K] [--seconds S] [--rounds N]

K real local tasks run for S seconds each way, printing a progress line every 0.1 s (as a
Keras fit with ``verbose=2`` or a custom loop does); the kernel's CPU time over those
seconds (``time.process_time``, every thread of the kernel) is measured while they run in
the background, followed only by mwhelpers itself (the timeline's epochs and steps, a live
view's state), and while a cell watches them (``rt.jobs.current().watch(runs, stream=True)``, the way a
foreground ``%%worker`` streams).  It prints the medians over ``--rounds`` in milliseconds of
CPU per second of following, per task.
"""

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TICKS = ("import sys, time\n"
         "end = time.monotonic() + float(sys.argv[1])\n"
         "i = 0\n"
         "while time.monotonic() < end:\n"
         "    i += 1\n"
         "    print(f'step {i} loss={1 / i:.4f}', flush=True)\n"
         "    time.sleep(0.1)\n")


def one_round(tasks: int, seconds: float, watched: bool) -> float:
    from mwhelpers.workers import Runtime

    with tempfile.TemporaryDirectory(prefix="bench-follow-") as d, \
            Runtime(log_dir=Path(d) / "logs", echo=lambda _line: None) as rt:
        rt.define_cluster(tasks)
        code = TICKS.replace("float(sys.argv[1])", repr(seconds))
        runs = [rt.launch(f"worker:{i}", code=code, background=True, ready="start")
                for i in range(tasks)]
        time.sleep(0.5)  # the tasks' start-up is not what is measured
        cpu0, t0 = time.process_time(), time.monotonic()
        if watched:
            rt.jobs.current().watch(runs, seconds + 30, stream=True)
        else:
            for r in runs:
                r.wait(seconds + 30)
        cpu, took = time.process_time() - cpu0, time.monotonic() - t0
        if any(r.returncode != 0 for r in runs):
            sys.exit(f"a task failed: {[r.outcome() for r in runs]}")
        return cpu / took / tasks * 1000


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tasks", type=int, default=4)
    p.add_argument("--seconds", type=float, default=8.0)
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args()
    got: dict[bool, list[float]] = {False: [], True: []}
    for i in range(a.rounds):
        for watched in ((False, True) if i % 2 == 0 else (True, False)):
            got[watched].append(one_round(a.tasks, a.seconds, watched))
    print(f"{a.tasks} tasks printing a line every 0.1 s for {a.seconds:g} s; kernel CPU per second "
          f"of following, per task, median of {a.rounds}:")
    print(f"  in the background: {statistics.median(got[False]):6.2f} ms")
    print(f"  watched (streamed):{statistics.median(got[True]):6.2f} ms")


if __name__ == "__main__":
    main()
