#!/usr/bin/env python
"""Benchmarks of mwhelpers (a script that prints figures, not a test).

    .venv/bin/python benchmarks/bench_mwhelpers.py [--rounds N]

1. ``%load_ext mwhelpers`` in a fresh Jupyter kernel, timed inside the
   kernel; goal 30 ms or less, and neither TensorFlow nor the runtime
   (the package's other modules) may be imported by it.
2. Launch-to-ready of a real TF worker (MultiWorkerMirroredStrategy, up to
   "server listening"): ``Runtime.launch(background=True)`` against a raw
   ``subprocess.Popen`` of the same program plus a port poll, interleaved
   rounds on the same machine; goal: ratio of medians <= 1.05.
"""

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TRAIN = ROOT / "tests" / "programs" / "mwms_train.py"


def bench_load_ext(rounds):
    from jupyter_client import KernelManager

    times, tf_loaded, modules = [], [], []
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    code = (
        "import sys, time\n"
        "t = time.perf_counter()\n"
        "get_ipython().run_line_magic('load_ext', 'mwhelpers')\n"
        "dt = time.perf_counter() - t\n"
        "mods = sorted(m for m in sys.modules if m.startswith('mwhelpers'))\n"
        "print(dt, 'tensorflow' in sys.modules, len(mods))\n"
    )
    for _ in range(rounds):
        km = KernelManager(kernel_name="python3")
        km.start_kernel(env=env, cwd=tempfile.mkdtemp(prefix="mwbench-"))
        kc = km.client()
        kc.start_channels()
        try:
            kc.wait_for_ready(timeout=60)
            out = []
            def keep_stream(m, out=out):
                if m["msg_type"] == "stream":
                    out.append(m["content"].get("text", ""))

            kc.execute_interactive(code, timeout=60, output_hook=keep_stream)
            dt, loaded, count = "".join(out).split()
            times.append(float(dt))
            tf_loaded.append(loaded == "True")
            modules.append(int(count))
        finally:
            kc.stop_channels()
            km.shutdown_kernel(now=True)
    med = statistics.median(times) * 1000
    print(f"%load_ext mwhelpers in a fresh kernel: median {med:.1f} ms over {rounds} kernels "
          f"(min {min(times) * 1000:.1f}, max {max(times) * 1000:.1f}); goal <= 30 ms: "
          f"{'met' if med <= 30 else 'NOT met'}; TensorFlow imported: {any(tf_loaded)}; "
          f"mwhelpers modules loaded: {max(modules)}")
    return med


def raw_launch(cluster, workdir):
    """The baseline: what a careful user would write by hand."""
    from mwhelpers.workers import port_accepts

    env = dict(os.environ, TF_CONFIG=cluster.tf_config("worker:0"), PYTHONUNBUFFERED="1")
    port = cluster.port("worker:0")
    with open(workdir / "raw.log", "wb") as log:
        t0 = time.monotonic()
        p = subprocess.Popen([sys.executable, "-u", str(TRAIN)], stdout=log,
                             stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                             start_new_session=True)
    while not port_accepts(port):
        if p.poll() is not None:
            raise RuntimeError(f"raw worker exited {p.returncode}: see {workdir / 'raw.log'}")
        time.sleep(0.01)
    dt = time.monotonic() - t0
    os.killpg(p.pid, signal.SIGKILL)  # it waits for peers and ignores SIGTERM
    p.wait()
    return dt


def mw_launch(rt):
    t0 = time.monotonic()
    rt.launch("worker:0", script=str(TRAIN), background=True, timeout=120)
    dt = time.monotonic() - t0
    rt.kill("worker:0")
    return dt


def bench_launch(rounds):
    from mwhelpers.workers import Runtime

    os.environ.pop("TF_USE_LEGACY_KERAS", None)  # Keras 3, mended in the workers
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
    workdir = Path(tempfile.mkdtemp(prefix="mwbench-"))
    with Runtime(log_dir=workdir / "logs", echo=lambda line: None) as rt:
        return _bench_launch(rt, workdir, rounds)


def _bench_launch(rt, workdir, rounds):
    cluster = rt.define_cluster(workers=2)
    raw_launch(cluster, workdir)  # warm the file cache for both
    mw_launch(rt)
    raw, mw = [], []
    for i in range(rounds):
        if i % 2:
            raw.append(raw_launch(cluster, workdir))
            mw.append(mw_launch(rt))
        else:
            mw.append(mw_launch(rt))
            raw.append(raw_launch(cluster, workdir))
    m_raw, m_mw = statistics.median(raw), statistics.median(mw)
    ratio = m_mw / m_raw
    print(f"launch to ready (TF worker, port open): raw Popen + port poll median {m_raw:.3f} s, "
          f"mwhelpers --bg median {m_mw:.3f} s over {rounds} interleaved rounds")
    print(f"  ratio mwhelpers / raw = {ratio:.3f}; goal <= 1.05: {'met' if ratio <= 1.05 else 'NOT met'}")
    print(f"  raw rounds: {', '.join(f'{t:.2f}' for t in raw)}")
    print(f"  mw  rounds: {', '.join(f'{t:.2f}' for t in mw)}")
    return ratio


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--load-ext-only", action="store_true", help="only time %%load_ext")
    a = p.parse_args()
    bench_load_ext(max(3, a.rounds // 2))
    if not a.load_ext_only:
        bench_launch(a.rounds)


if __name__ == "__main__":
    main()
