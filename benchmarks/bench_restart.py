#!/usr/bin/env python
"""Kill-to-resumed against a cold start (a script that prints figures, not a test).

    .venv/bin/python benchmarks/bench_restart.py [--rounds N] [--ssh]

Each round supervises one job of two real MultiWorkerMirroredStrategy workers
(``tests/programs/mwms_train.py`` with BackupAndRestore every 4 steps, each step
logged with the time it ended) and SIGKILLs worker 1 once its attempt has done 6
steps.  From that one run it reads:

* cold start: from the launch of the first attempt to the cluster's first step
  (the latest of the workers' first ``STEP`` lines: a step ends on every worker
  together);
* kill-to-resumed: from the SIGKILL to the restarted attempt's first step, which
  covers noticing the death, ending the peer, starting both tasks again, importing
  TensorFlow, forming the cluster and restoring the backup.

It prints both per round, their medians and the ratio of medians.  ``--ssh`` runs
the cluster on two test hosts (``mwhelpers/testhosts.py``: root and openssh-server).
"""

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

TRAIN = ROOT / "tests" / "programs" / "mwms_train.py"
ARGS = ["--epochs", "2", "--steps", "10", "--save-freq", "4", "--log-steps", "--step-seconds", "0.05"]
KILL_AFTER = 6  # steps of the first attempt


def one_round(rt, workdir, **where):
    from chaos import Chaos, steps_of

    rt.define_cluster(2, **where)
    monkey = Chaos(rt, 1, low=KILL_AFTER, high=KILL_AFTER)
    monkey.start()
    attempts = rt.supervise(script=str(TRAIN), args=[*ARGS, "--backup", str(workdir / "bk")],
                            max_restarts=1, timeout=180, stream=False)
    monkey.join(5)
    first, second = attempts[0]["runs"], attempts[1]["runs"]
    launched = min(r.launched_wall for r in first)
    cold = max(steps_of(r)[0][1] for r in first) - launched
    killed_at = monkey.kills[0][2]
    resumed = max(steps_of(r)[0][1] for r in second) - killed_at
    resumed_step = min(steps_of(r)[0][0] for r in second)
    return cold, resumed, resumed_step


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--ssh", action="store_true", help="on two test hosts over SSH")
    a = p.parse_args()
    os.environ.pop("TF_USE_LEGACY_KERAS", None)  # Keras 3, mended in the workers
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from mwhelpers.workers import Runtime

    hosts = None
    if a.ssh:
        from mwhelpers.testhosts import TestHosts, missing

        why = missing()
        if why:
            sys.exit(f"cannot make test hosts: {why}")
        hosts = TestHosts(2).__enter__()
        os.environ.update(hosts.env())
    colds, resumes = [], []
    try:
        for i in range(1, a.rounds + 1):
            with tempfile.TemporaryDirectory(prefix="bench-restart-") as d:
                os.chdir(d)
                with Runtime(log_dir=Path(d) / "logs", echo=lambda line: None) as rt:
                    where = {"hosts": hosts.names} if hosts else {}
                    cold, resumed, step = one_round(rt, Path(d), **where)
                os.chdir(ROOT)
            colds.append(cold)
            resumes.append(resumed)
            print(f"round {i}: cold start to first step {cold:.2f} s; SIGKILL to the first step "
                  f"of the restarted attempt {resumed:.2f} s (it resumed at step {step})", flush=True)
    finally:
        if hosts is not None:
            hosts.__exit__(None, None, None)
    cold, resumed = statistics.median(colds), statistics.median(resumes)
    where = "two SSH test hosts" if hosts else "this machine"
    print(f"\n{len(colds)} rounds on {where}, 2 workers: median cold start {cold:.2f} s, "
          f"median kill-to-resumed {resumed:.2f} s; ratio kill-to-resumed / cold = "
          f"{resumed / cold:.2f}")


if __name__ == "__main__":
    main()
