#!/usr/bin/env python
"""Launch-to-ready on other hosts against local (a script that prints figures, not a test).

    sudo .venv/bin/python benchmarks/bench_multihost.py [--rounds N] [--workers N] [--ray] [--slurm]

Makes two test hosts (network namespaces with sshd, ``mwhelpers/workshop/testhosts.py``; needs
root and openssh-server) and, with ``--ray``, a Ray cluster of three nodes on them
(``tests/raycluster.py``), with ``--slurm``, a Slurm allocation of both, then in interleaved
rounds starts the same cluster of real MultiWorkerMirroredStrategy workers
(``tests/programs/mwms_train.py``) locally, over SSH (and on Ray, under Slurm), each worker in
the background, and times from the first launch until every worker's gRPC port accepts
connections.  Defining the cluster (the probe of each host; on Ray, the placement group too; and
until each host's warm server has imported TensorFlow, ``mwhelpers/backends/warmhosts.py``) is
timed apart (under Slurm: until each spare's own warm server has).  Goal: remote / local ratio
of medians <= 1.3."""

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

TRAIN = ROOT / "tests" / "programs" / "mwms_train.py"


def one_round(rt, workers, **where):
    from mwhelpers.job import end_runs

    t0 = time.perf_counter()
    rt.define_cluster(workers, **where)
    warm = getattr(rt.launcher, "warm", None)  # its hosts' warm servers (backends/warmhosts.py)
    if rt.launcher.remote and warm is not None:  # (Slurm: each spare's own)
        spares = [s.server for ss in warm.spares.values() for s in ss if s.server is not None]
        for server in [*warm.servers.values(), *spares]:
            server.ready(180)
    t1 = time.perf_counter()
    for i in range(workers):
        rt.launch(f"worker:{i}", script=str(TRAIN), background=True, timeout=120)
    t2 = time.perf_counter()
    end_runs([r for r in rt.runs.values() if r.running], "benchmark round over")
    return t1 - t0, t2 - t1


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--ray", action="store_true", help="also on a Ray cluster on the test hosts")
    p.add_argument("--slurm", action="store_true", help="also in a Slurm allocation of them")
    a = p.parse_args()
    from mwhelpers.workshop.testhosts import TestHosts, missing

    why = missing(slurm=a.slurm)
    if why:
        sys.exit(f"cannot make test hosts: {why}")
    os.environ.pop("TF_USE_LEGACY_KERAS", None)  # Keras 3, mended in the workers
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    from mwhelpers.workers import Runtime

    with TestHosts(2, slurm=a.slurm) as hosts, tempfile.TemporaryDirectory() as logs:
        os.environ.update(hosts.env())
        where = {"local": {}, "ssh": {"hosts": hosts.names}}
        ray = job = None
        try:
            if a.slurm:
                out = subprocess.run(["salloc", "-N2", "--no-shell"], capture_output=True,
                                     text=True, timeout=60)
                job = re.search(r"Granted job allocation (\d+)", out.stderr).group(1)
                where["slurm"] = {"backend": "slurm", "job": job}
            if a.ray:
                from raycluster import RayCluster

                ray = RayCluster(hosts).up()
                os.environ.update(ray.client_env())
                where["ray"] = {"backend": "ray", "address": ray.address}
            with Runtime(log_dir=logs, echo=lambda line: None) as rt:
                for kwargs in where.values():  # warm the file cache for every side
                    one_round(rt, a.workers, **kwargs)
                launch = {name: [] for name in where}
                define = {name: [] for name in where}
                for r in range(a.rounds):
                    for name, kwargs in where.items():
                        d, t = one_round(rt, a.workers, **kwargs)
                        define[name].append(d)
                        launch[name].append(t)
                    print(f"round {r + 1}: " + ", ".join(f"{n} {launch[n][-1]:.2f} s" for n in where),
                          flush=True)
        finally:
            if ray is not None:
                ray.down()
            if job is not None:
                subprocess.run(["scancel", job], capture_output=True, timeout=30)
    local = statistics.median(launch["local"])
    print(f"\n{a.workers} workers, launch until every port accepts, {a.rounds} interleaved rounds:")
    for name, times in launch.items():
        m = statistics.median(times)
        ratio = "" if name == "local" else (
            f"; ratio {m / local:.2f} (goal <= 1.3): {'met' if m / local <= 1.3 else 'NOT met'}")
        print(f"  {name:5} median {m:.2f} s (min {min(times):.2f}, max {max(times):.2f}){ratio}")
    print("  defining the cluster: " + ", ".join(
        f"{n} median {statistics.median(d) * 1000:.0f} ms" for n, d in define.items()))

if __name__ == "__main__":
    main()
