#!/usr/bin/env python
"""Benchmarks of the notebook suite (a script that prints figures, not a test).

    .venv/bin/python benchmarks/bench_suite.py [--rounds N] [--stall-runs N]
        [--skip-suite | --suite-only] [--jobs N ...]

1. The multi-worker part of notebooks/03 (worker 0 in the background, worker 1 in
   the foreground, wait for both), done the mwhelpers way (the magics, defaults)
   and the upstream tutorial's way (``%%bash --bg`` + ``time.sleep(10)`` + a
   foreground ``%%bash`` worker), each in a fresh Jupyter kernel, with the same
   programs (the notebook's %%writefile cells: a main.py shaped like upstream's, whose
   only addition is mwhelpers.fix_keras_multi_worker() for its Keras 3 fit) and sizes. Goal: ratio <= 0.75.
2. The end-of-run stall with the runtime's workaround off (``stall_fix=False``) and
   on (the default): the seconds from the end of training (``on_train_end``) to the
   return of ``fit`` on each worker, with notebook 03b's job.py at the upstream
   tutorial's length (3 epochs x 70 steps, batch 32 per worker).
3. The whole suite at smoke sizes (``python -m mwhelpers.workshop.suite``), one notebook at a
   time and then with the default ``--jobs`` (or the ``--jobs`` given), with the CPU seconds
   it used. Goal: <= 150 s on the machines it was set on, where one ``import tensorflow`` took
   3.0 CPU s; the wall time is also given scaled by that import, measured in the same run.
   ``--record-usual`` writes each notebook's seconds in the run of one notebook at a time into
   its metadata and its "Before you start" box; they also order a fresh checkout's first run
   (longest first).
"""

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nbformat
from jupyter_client import KernelManager

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
NB03 = ROOT / "notebooks" / "03_multi_worker_keras.ipynb"
NB03B = ROOT / "notebooks" / "03b_under_the_hood.ipynb"


def write_programs(workdir, notebook=NB03):
    """Write the programs of ``notebook``'s %%writefile cells exactly as it does (notebook 03:
    mnist_setup.py and main.py; 03b: job.py, which reports how long fit took to return)."""
    nb = nbformat.read(notebook, as_version=4)
    for cell in nb.cells:
        m = re.match(r"%%writefile (\S+)\n", cell.source)
        if m:
            (workdir / m.group(1)).write_text(cell.source[m.end():] + "\n")


class Kernel:
    def __init__(self, cwd):
        env = dict(os.environ, PYTHONPATH=str(ROOT), CUDA_VISIBLE_DEVICES="",
                   TF_CPP_MIN_LOG_LEVEL="0")
        self.km = KernelManager(kernel_name="python3")
        self.km.start_kernel(cwd=str(cwd), env=env)
        self.kc = self.km.client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=60)

    def run(self, code):
        reply = self.kc.execute_interactive(code, timeout=900, output_hook=lambda msg: None)
        if reply["content"]["status"] != "ok":
            raise RuntimeError(f"cell failed: {code[:80]!r}: {reply['content'].get('evalue')}")

    def close(self):
        self.kc.stop_channels()
        self.km.shutdown_kernel(now=True)


def mwhelpers_way(workdir, args):
    k = Kernel(workdir)
    try:
        k.run("%load_ext mwhelpers\n%cluster 2")
        t0 = time.monotonic()
        k.run(f"%worker 0 --bg main.py {args}")
        k.run(f"%worker 1 main.py {args}")
        k.run("%waitworkers --timeout 600")
        return time.monotonic() - t0
    finally:
        k.close()


def upstream_way(workdir, args):
    from mwhelpers import Cluster

    cluster = Cluster(workers=2)
    spec = json.dumps(cluster.cluster_spec())
    k = Kernel(workdir)
    try:
        k.run("import json, os, time, psutil")
        t0 = time.monotonic()
        k.run(f"os.environ['TF_CONFIG'] = json.dumps({{'cluster': {spec}, "
              "'task': {'type': 'worker', 'index': 0}})")
        k.run(f"%%bash --bg\n{sys.executable} main.py {args} &> job_0.log\n")
        k.run("time.sleep(10)")
        k.run(f"os.environ['TF_CONFIG'] = json.dumps({{'cluster': {spec}, "
              "'task': {'type': 'worker', 'index': 1}})")
        k.run(f"%%bash\n{sys.executable} main.py {args}\n")
        # Same work as %waitworkers: until worker 0 has exited too.
        k.run("def worker_alive():\n"
              "    for p in psutil.Process().children(recursive=True):\n"
              "        try:\n"
              "            if p.status() != psutil.STATUS_ZOMBIE and 'main.py' in ' '.join(p.cmdline()):\n"
              "                return True\n"
              "        except psutil.Error:\n"
              "            pass\n"
              "    return False\n"
              "while worker_alive():\n"
              "    time.sleep(0.05)")
        return time.monotonic() - t0
    finally:
        k.close()
        cluster.close()


SIZES = {"smoke": "32 2 10 2", "upstream": "64 3 70 10"}  # batch per worker, epochs, steps, val steps


def bench_ratio(rounds, sizes="upstream"):
    args = SIZES[sizes]
    ours, theirs = [], []
    for _ in range(rounds):
        for name, fn, out in (("mwhelpers", mwhelpers_way, ours), ("upstream", upstream_way, theirs)):
            workdir = Path(tempfile.mkdtemp(prefix=f"bench-{name}-"))
            write_programs(workdir)
            out.append(fn(workdir, args))
    m_ours, m_theirs = statistics.median(ours), statistics.median(theirs)
    ratio = m_ours / m_theirs
    print(f"notebook 03 multi-worker part, {sizes} sizes ({args}; {rounds} rounds): "
          f"mwhelpers median {m_ours:.1f} s, "
          f"upstream %%bash --bg + sleep(10) median {m_theirs:.1f} s")
    verdict = "met" if ratio <= 0.75 else "NOT met"
    print(f"  ratio mwhelpers / upstream = {ratio:.2f}; goal <= 0.75: {verdict}")
    print(f"  mwhelpers rounds: {', '.join(f'{t:.1f}' for t in ours)}; "
          f"upstream rounds: {', '.join(f'{t:.1f}' for t in theirs)}")


def bench_stall(runs):
    from mwhelpers.workers import Runtime

    env = {"CUDA_VISIBLE_DEVICES": "", "TF_CPP_MIN_LOG_LEVEL": "2"}
    rows = {}
    for label, fix in (("workaround off (stall_fix=False)", False), ("workaround on (default)", True)):
        teardowns, totals = [], []
        for _ in range(runs):
            workdir = Path(tempfile.mkdtemp(prefix="bench-stall-"))
            write_programs(workdir, NB03B)
            with Runtime(log_dir=workdir / "logs", echo=lambda line: None) as rt:
                rt.define_cluster(workers=2)
                t0 = time.monotonic()
                for task in ("worker:0", "worker:1"):
                    rt.launch(task, script=str(workdir / "job.py"), args=["3", "70"],
                              background=True, ready="start", env=env, stall_fix=fix)
                rt.wait(timeout=600)
                totals.append(time.monotonic() - t0)
                teardowns += [r["teardown_seconds"] for r in rt.results().values()]
        rows[label] = (teardowns, totals)
        print(f"end of fit, upstream sizes, {label}: fit returned after training ended in "
              f"{', '.join(f'{t:.2f}' for t in teardowns)} s (max {max(teardowns):.2f}); "
              f"job {statistics.median(totals):.1f} s median")
    return rows


def run_suite(out, jobs):
    """One suite run into ``out``; (wall seconds, CPU seconds of everything it ran, exit, table)."""
    import resource

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "mwhelpers.workshop.suite", "--output", str(out),
                           "--jobs", str(jobs)],
                          cwd=ROOT, capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))
    seconds = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    table = [ln for ln in proc.stdout.splitlines() if ".ipynb " in ln and ("ok" in ln or "FAILED" in ln)]
    return seconds, cpu, proc.returncode, table


# The machines of the first releases: one `import tensorflow` took 2.9 to 3.1 CPU s there, and
# the 150 s goal was set on them.  Machines here differ by up to 2x in speed.  Their lock had no
# JAX; TensorFlow imports JAX where it is installed (about 0.6 to 1.8 CPU s more), so the import
# is measured here with JAX hidden, as it was there.
REFERENCE_IMPORT_CPU = 3.0
IMPORT_TF = "import sys; sys.modules['jax'] = None; import tensorflow"


def import_cpu(times=3):
    """The median CPU seconds of ``import tensorflow`` (JAX hidden: :data:`IMPORT_TF`) in a
    fresh interpreter here, now: this machine's speed, measured in the same run as what it
    scales."""
    import resource

    spent = []
    for _ in range(times):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        subprocess.run([sys.executable, "-c", IMPORT_TF], check=True,
                       capture_output=True, env=dict(os.environ, CUDA_VISIBLE_DEVICES=""))
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        spent.append((after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime))
    return statistics.median(spent)


def record_usual(out, import_cpu):
    """Write each notebook's seconds in the run in ``out`` into its metadata in notebooks/
    (``metadata.mwhelpers.usual_seconds``): a fresh checkout's first suite run starts the
    longest first by them. Its box also gets ``import_cpu``, one ``import tensorflow``'s CPU
    seconds on this machine."""
    import datetime

    import nbformat

    from mwhelpers.workshop.suite import SETUP_TAG, TAKES_ROW, USUAL_SECONDS, takes_row

    section, key = USUAL_SECONDS
    today = datetime.date.today().isoformat()
    for done in sorted(out.glob("*.ipynb")):
        source = ROOT / "notebooks" / done.name
        seconds = nbformat.read(done, as_version=4).metadata.get("papermill", {}).get("duration")
        if not source.exists() or seconds is None:
            continue
        nb = nbformat.read(source, as_version=4)
        nb.metadata.setdefault(section, {})[key] = round(seconds)
        for cell in nb.cells:  # its "Before you start" box says the same
            if SETUP_TAG in cell.metadata.get("tags", []):
                cell.source = TAKES_ROW.sub(takes_row(seconds, os.cpu_count() or 1, import_cpu,
                                                      today),
                                            cell.source)
        nbformat.write(nb, source)
        print(f"  {done.name}: usual_seconds = {round(seconds)}")


def bench_suite(job_counts, record=False):
    """The suite at each ``--jobs`` of ``job_counts`` (1: one notebook at a time, the baseline
    of running side by side), into one output folder so that later runs start the longest
    first; one ``import tensorflow``'s CPU seconds before and after, to scale the wall time to
    the machine the goal was set on."""
    out = Path(tempfile.mkdtemp(prefix="bench-suite-"))
    cores = os.cpu_count()
    runs = {}
    imports = [import_cpu()]
    print(f"one `import tensorflow` (JAX hidden) here: {imports[0]:.2f} CPU s (median of 3; "
          f"{REFERENCE_IMPORT_CPU} s on the machines the goal was set on)")
    failed = False
    for jobs in job_counts:
        seconds, cpu, code, table = run_suite(out, jobs)
        runs[jobs] = seconds
        failed = failed or code != 0
        print(f"whole suite at smoke sizes, --jobs {jobs}: {seconds:.1f} s wall (exit {code}); "
              f"CPU {cpu:.0f} s, {cpu / seconds / cores:.0%} of {cores} cores busy")
        for ln in table:
            print("  " + ln)
        if record and jobs == 1:  # each notebook alone: what a learner waits, and the order
            print("recorded in notebooks/ (their boxes, and a fresh checkout's first order):")
            record_usual(out, imports[0])
    if failed:  # what went wrong is in there
        print(f"a notebook failed: the executed notebooks and their logs are in {out}")
    else:
        shutil.rmtree(out, ignore_errors=True)
    imports.append(import_cpu())
    speed = statistics.mean(imports) / REFERENCE_IMPORT_CPU
    print(f"one `import tensorflow` after: {imports[1]:.2f} CPU s; this machine is "
          f"{speed:.2f}x the reference's time")
    for jobs, seconds in runs.items():
        scaled = seconds / speed
        print(f"--jobs {jobs}: {seconds:.1f} s here = {seconds / statistics.mean(imports):.0f} "
              f"imports' time = {scaled:.0f} s scaled to the reference; goal <= 150 s there: "
              f"{'met' if scaled <= 150 else 'NOT met'}")
    if 1 in runs and len(runs) > 1:
        many = max(runs)
        print(f"--jobs {many} / --jobs 1: {runs[many] / runs[1]:.2f}")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--stall-runs", type=int, default=3)
    p.add_argument("--sizes", choices=sorted(SIZES), default="upstream",
                   help="sizes of the ratio benchmark (default: the upstream tutorial's)")
    p.add_argument("--skip-suite", action="store_true")
    p.add_argument("--suite-only", action="store_true", help="only the whole-suite figures (3.)")
    p.add_argument("--jobs", type=int, nargs="+", default=None,
                   help="the suite's --jobs values to run (default: 1, then the suite's default)")
    p.add_argument("--record-usual", action="store_true",
                   help="write each notebook's seconds in the run of one notebook at a time "
                        "into its metadata and its 'Before you start' box (the time also orders "
                        "a fresh checkout's first run)")
    a = p.parse_args()
    if a.record_usual and a.jobs is not None and 1 not in a.jobs:
        p.error("--record-usual records the run of one notebook at a time: add 1 to --jobs")
    if not a.suite_only:
        bench_ratio(a.rounds, a.sizes)
        if a.stall_runs:
            bench_stall(a.stall_runs)
    if not a.skip_suite:
        from mwhelpers.workshop.suite import default_jobs

        bench_suite(a.jobs or [1, default_jobs()], record=a.record_usual)


if __name__ == "__main__":
    main()
