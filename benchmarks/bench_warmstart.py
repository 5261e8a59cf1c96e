#!/usr/bin/env python
"""Warm starts against cold starts: what a job of two real MultiWorkerMirroredStrategy
workers costs when each worker imports TensorFlow itself (``MWHELPERS_WARM_START=0``) and
when both are forked from the server that imported it once (``mwhelpers/warmstart.py``).
A script that prints figures, not a test.

    .venv/bin/python benchmarks/bench_warmstart.py [--rounds N] [--steps N]

Each mode runs ``--rounds`` jobs, one after the other, in one runtime: the tutorial's
``main.py`` (``tests/programs/tutorial``: the multi-worker Keras tutorial's CNN on real
digits, ``fit`` for one epoch of ``--steps`` steps) on a cluster of two local workers.  For
each mode it prints:

* the first job: from the launch to both workers' end (warm: the server's import included);
* each later job: the median of the same;
* launch to ready: the median time until a worker's port is open (its gRPC server up);
* CPU: user and system time of every process the mode started (the workers, and warm, the
  server), over all its jobs, from ``getrusage(RUSAGE_CHILDREN)`` once the runtime has closed
  and every process was reaped;

then the warm/cold ratios.  The modes run one after the other, in the same process and on
the same machine; run it on an idle machine.
"""

import argparse
import resource
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mwhelpers import warmstart  # noqa: E402
from mwhelpers.workers import Runtime  # noqa: E402


def children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def one_mode(warm: bool, rounds: int, steps: int, folder: Path) -> dict:
    env = {warmstart.ENV: "1" if warm else "0", "PYTHONPATH": str(ROOT)}  # (mnist_setup)
    cpu0 = children_cpu()
    jobs, ready = [], []
    rt = Runtime(log_dir=folder / "logs", echo=lambda *a, **k: None)
    try:
        for _ in range(rounds):
            rt.define_cluster(workers=2)
            t0 = time.monotonic()
            runs = [rt.launch(f"worker:{i}", script=str(folder / "main.py"),
                              args=["1", str(steps)], env=env, background=True, ready="port",
                              timeout=120) for i in (0, 1)]
            ready += [r.process.started + r.ready_after - t0 for r in runs
                      if r.ready_after is not None]
            rt.wait(timeout=300)
            jobs.append(time.monotonic() - t0)
            assert all(r.process.warm == warm for r in runs), "not the mode asked for"
    finally:
        rt.close()
    return {"first": jobs[0], "later": statistics.median(jobs[1:]) if rounds > 1 else None,
            "ready": statistics.median(ready) if ready else None,
            "cpu": children_cpu() - cpu0}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--steps", type=int, default=10)
    a = p.parse_args()
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for name in ("main.py", "mnist_setup.py"):
            shutil.copy(ROOT / "tests" / "programs" / "tutorial" / name, folder / name)
        for mode in ("cold", "warm"):
            results[mode] = one_mode(mode == "warm", a.rounds, a.steps, folder)
    print(f"{a.rounds} jobs per mode, each two workers of tests/programs/tutorial/main.py")
    print(f"{'':28}{'cold':>10}{'warm':>10}{'warm/cold':>11}")
    rows = [("first job, launch to end (s)", "first"), ("later jobs, median (s)", "later"),
            ("launch to port open (s)", "ready"), ("CPU of all processes (s)", "cpu")]
    for label, key in rows:
        c, w = results["cold"][key], results["warm"][key]
        if c is None or w is None:
            continue
        print(f"{label:28}{c:10.2f}{w:10.2f}{w / c:11.2f}")


if __name__ == "__main__":
    main()
