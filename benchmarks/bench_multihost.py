#!/usr/bin/env python
"""Launch-to-ready over SSH against local (a script that prints figures, not a test).

    sudo .venv/bin/python benchmarks/bench_multihost.py [--rounds N] [--workers N]

Makes two test hosts (network namespaces with sshd, ``mwhelpers/workshop/testhosts.py``; needs
root and openssh-server), then in interleaved rounds starts the same cluster of real
MultiWorkerMirroredStrategy workers (``tests/programs/mwms_train.py``) locally and
over SSH, each worker in the background, and times from the first launch until
every worker's gRPC port accepts connections.  Defining the cluster (the SSH probe
of each host) is timed apart.  Goal: SSH / local ratio of medians <= 1.3.
"""

import argparse
import os
import statistics
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
    a = p.parse_args()
    from mwhelpers.workshop.testhosts import TestHosts, missing

    why = missing()
    if why:
        sys.exit(f"cannot make test hosts: {why}")
    os.environ.pop("TF_USE_LEGACY_KERAS", None)  # Keras 3, mended in the workers
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    from mwhelpers.workers import Runtime

    with TestHosts(2) as hosts, tempfile.TemporaryDirectory() as logs:
        os.environ.update(hosts.env())
        with Runtime(log_dir=logs, echo=lambda line: None) as rt:
            one_round(rt, a.workers)  # warm the file cache for both sides
            one_round(rt, a.workers, hosts=hosts.names)
            local, ssh, probe_local, probe_ssh = [], [], [], []
            for r in range(a.rounds):
                d, t = one_round(rt, a.workers)
                probe_local.append(d)
                local.append(t)
                d, t = one_round(rt, a.workers, hosts=hosts.names)
                probe_ssh.append(d)
                ssh.append(t)
                print(f"round {r + 1}: local {local[-1]:.2f} s, ssh {ssh[-1]:.2f} s", flush=True)
    ml, ms = statistics.median(local), statistics.median(ssh)
    print(f"\n{a.workers} workers, launch until every port accepts, {a.rounds} interleaved rounds:")
    print(f"  local: median {ml:.2f} s (min {min(local):.2f}, max {max(local):.2f})")
    print(f"  ssh:   median {ms:.2f} s (min {min(ssh):.2f}, max {max(ssh):.2f})")
    print(f"  ratio ssh/local {ms / ml:.2f} (goal <= 1.3): {'met' if ms / ml <= 1.3 else 'NOT met'}")
    print(f"  defining the cluster: local median {statistics.median(probe_local) * 1000:.0f} ms, "
          f"ssh (probing {len(hosts.names)} hosts) {statistics.median(probe_ssh) * 1000:.0f} ms")


if __name__ == "__main__":
    main()
