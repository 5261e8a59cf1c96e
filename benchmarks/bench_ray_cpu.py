#!/usr/bin/env python
"""What a Ray cluster costs in CPU, against the local backend (a script that prints figures, not a
test; run it on an otherwise idle machine: it reads the machine's CPU counters).

    .venv/bin/python benchmarks/bench_ray_cpu.py [--launches N]

For each backend (local, then Ray on a private head: ``--address local``), defines a cluster of
two tasks, launches a program that only prints N times (both tasks at once, in the foreground),
then closes the cluster.  It prints the machine's CPU seconds (``/proc/stat``, idle and iowait
left out) and the wall time of each phase, and one ``import tensorflow``'s CPU seconds beside
them, since machines differ.  On Ray, the head's start is part of the definition.

Each Ray command (the probe, a warm server's agent, a spare, a task) used to connect a Ray
driver of its own and make an actor of its own; now the cluster's holder is its one driver,
each bundle has one actor, and each command's transport is a small client (``_rayrelay.py``).
On a 2-core machine whose ``import tensorflow`` took 7.4 to 9.5 CPU-s (2026-11-30), defining the
cluster went from 58.6 to 35.5-37.4 CPU-s (most of it the head's start), and a launch of two
tasks from about 30 to 1-7 CPU-s (0.2-0.3 locally).
"""

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench_suite import import_cpu  # noqa: E402  (the suite's measure of this machine's speed)


def machine_cpu() -> float:
    with open("/proc/stat") as f:
        fields = [int(v) for v in f.readline().split()[1:]]
    return (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def phases(rt, launches: int, **where) -> list[tuple[str, float, float]]:
    out = []
    c, t = machine_cpu(), time.monotonic()

    def mark(name: str) -> None:
        nonlocal c, t
        c2, t2 = machine_cpu(), time.monotonic()
        out.append((name, c2 - c, t2 - t))
        c, t = c2, t2

    rt.define_cluster(2, **where)
    mark("define")
    for i in range(1, launches + 1):
        rt.launch_all(code="print('hello')", verbose=False)
        mark(f"launch {i}")
    rt.define_cluster(1)  # a new local cluster: the last one closes
    mark("close")
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--launches", type=int, default=3)
    a = p.parse_args()
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    import mwhelpers

    print(f"one `import tensorflow` here: {import_cpu():.2f} CPU-s")
    rt = mwhelpers.runtime()
    rows = {"local": phases(rt, a.launches), "ray": phases(rt, a.launches, backend="ray",
                                                           address="local")}
    for name, got in rows.items():
        print(name + ": " + " | ".join(f"{p} {c:.1f} CPU-s {w:.1f} s" for p, c, w in got))
    local = sum(c for p, c, _ in rows["local"] if p.startswith("launch")) / a.launches
    ray = sum(c for p, c, _ in rows["ray"] if p.startswith("launch")) / a.launches
    print(f"a launch of 2 tasks: {ray:.1f} CPU-s on Ray, {local:.1f} locally: ratio "
          f"{ray / max(local, 0.01):.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
