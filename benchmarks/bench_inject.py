#!/usr/bin/env python
"""How late an injected fault lands: the steps a task logged past its trigger line.

    .venv/bin/python benchmarks/bench_inject.py [--rounds N] [--step-ms MS]

A local task prints ``STEP i`` every ``--step-ms`` milliseconds (3 by default: a small model's
step on a fast machine).  ``Runtime.kill_when(task, "^STEP 200$")`` waits for the line, then
SIGKILLs the task; the last ``STEP`` in its log says how many steps it took past 200 before it
died.  That lag is what notebooks 06 and 07 allow for: their checks hold while it stays under 17
steps.  Three ways, in turns, in one run (medians and their ratios):

- the follower reads a waiting fault's log every ``follow.INTERVAL`` (as any watch, before
  ``follow.URGENT`` existed), and the signal goes out after a scan of every process;
- every ``follow.URGENT``, the same scan first (goal: at most 0.25 of the first);
- every ``follow.URGENT``, the signal to the task's process group first, the scan after
  (``proctree.signal_group``; goal: at most the second's, which grows with the machine's
  processes and load).
"""


import argparse
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mwhelpers import follow  # noqa: E402
from mwhelpers.backends.base import Process  # noqa: E402
from mwhelpers.backends.local import LocalProcess  # noqa: E402
from mwhelpers.workers import Runtime  # noqa: E402

TRIGGER = 200
NOW = LocalProcess.send  # the group first
WAYS = {"read every 50 ms, scan first": (follow.INTERVAL, False),
        "read every 5 ms, scan first": (follow.URGENT, False),
        "read every 5 ms, group first": (follow.URGENT, True)}


def lag(rt: Runtime, script: Path, urgent: float, group_first: bool) -> int:
    """Steps past the trigger of one kill, the follower's urgent interval set to ``urgent``,
    the signal sent to the group first or after the scan."""
    rt.services.follower.urgent = urgent
    LocalProcess.send = NOW if group_first else Process.send  # type: ignore[method-assign]
    run = rt.launch("worker:0", script=str(script), background=True, ready="start")
    rt.kill_when("worker:0", rf"^STEP {TRIGGER}$")
    run.wait(30)
    steps = [int(line.split()[1]) for line in run.lines() if line.startswith("STEP ")]
    return steps[-1] - TRIGGER


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--step-ms", type=float, default=3.0)
    a = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-inject-") as tmp:
        script = Path(tmp) / "steps.py"
        script.write_text("import time\nfor i in range(1_000_000):\n"
                          "    print(f'STEP {i}', flush=True)\n"
                          f"    time.sleep({a.step_ms / 1000!r})\n")
        lags: dict[str, list[int]] = {way: [] for way in WAYS}
        with Runtime(log_dir=Path(tmp) / "logs", echo=lambda line: None) as rt:
            rt.define_cluster(1)
            for _ in range(a.rounds):  # in turns: all see the same machine
                for way, (urgent, group_first) in WAYS.items():
                    lags[way].append(lag(rt, script, urgent, group_first))
        LocalProcess.send = NOW  # type: ignore[method-assign]
    medians = {way: statistics.median(v) for way, v in lags.items()}
    for way, v in lags.items():
        print(f"{way}: steps past the trigger {v}, median {medians[way]:g}")
    first, second, third = medians.values()
    ratio = second / max(first, 1)
    print(f"urgent / interval: {ratio:.2f} (goal at most 0.25): "
          + ("met" if ratio <= 0.25 else "NOT met"))
    ratio = third / max(second, 1)
    print(f"group first / scan first: {ratio:.2f} (goal at most 1): "
          + ("met" if ratio <= 1 else "NOT met"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
