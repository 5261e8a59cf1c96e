#!/usr/bin/env python
"""Kill-to-resumed against a cold start, and where a restart's time goes (a script that
prints figures, not a test).

    .venv/bin/python benchmarks/bench_restart.py [--rounds N] [--ssh] [--no-probe] [--profile]
                                                 [--standby] [--worker-env K=V ...]

Each round supervises one job of two real MultiWorkerMirroredStrategy workers
(``tests/programs/mwms_train.py`` with BackupAndRestore every 4 steps, each step
logged with the time it ended) and SIGKILLs one worker once its attempt has done 6
steps.  From that one run it reads:

* cold start: from the launch of the first attempt to the cluster's first step
  (the latest of the workers' first ``STEP`` lines: a step ends on every worker
  together);
* kill-to-resumed: from the SIGKILL (the moment the signal is sent to the victim's tree;
  before, from ``rt.kill`` returning, once the victim was gone, some 30 ms later) to the
  restarted attempt's first step, which covers noticing the death, ending the peer,
  starting both tasks again, importing TensorFlow, forming the cluster and restoring
  the backup.

It prints both per round, their medians and the ratio of medians, then each part of a
restart (medians over the rounds, in ms):

(a) the SIGKILL to the victim's exit stamp (the launcher's wait thread), and that
    stamp to the supervisor noticing it (its ``Watcher.watch`` returning);
(b) ending the peer (``Job.end``; ``Runtime.end`` before the job object);
(c) the failure records and their diagnosis (``Job.failures``, with
    ``explain_failure`` inside), then the root-cause file, the echo and the next
    attempt's job (up to ``Job.start``; ``Runtime.start_all`` before);
(d) from there to the new processes started: the task and port checks
    (``Spawner.check``; ``_checked_task`` before the spawner), the look before launch
    (``Lookout.look``; ``_look_before_launch`` before: the precheck and the ``installed()``
    versions, which the supervisor's restarts skip) and the spawns (``Spawner.spawn``;
    ``Runtime.spawn`` before); the goal for (a) to (d) together is 0.3 s;
(e) from the launch to the first step, beside the same parts of the cold start:
    the interpreter up, TensorFlow imported, the gRPC server started, the cluster
    formed (the strategy created), the model and fit set up, the restore
    (``BackupAndRestore.on_train_begin``), the first step; and how often the cluster
    took more than 0.5 s to form after the last server started (gRPC's reconnect
    back-off: see ``--worker-env``).

The kernel side is timed by wrapping the runtime's methods and functions in this
script only (nothing in mwhelpers changes); the worker side by a probe: a
``sitecustomize`` module given to the workers through ``PYTHONPATH`` that prints a
stamped ``BENCH`` line at each point, and TensorFlow's own log records
(``TF_CPP_MIN_LOG_LEVEL=0`` for the workers, for the 'Started server' line).
``--no-probe`` runs the workers as before (no probe, TensorFlow's default log level
of this script), to check that the probe costs nothing; (e) then has its total only.

With warm starts (on by default, ``mwhelpers/warmstart.py``) the probe runs in the
warm-start server, which the workers are forked from: their interpreter start and their import
show as done ahead, and the server's stamps are in every worker's log.
``--worker-env MWHELPERS_WARM_START=0`` measures cold starts.

``--worker-env K=V`` gives the workers a variable, for experiments: with
``TF_GRPC_DEFAULT_OPTIONS=grpc.initial_reconnect_backoff_ms=50`` a task that dials task 0's
coordination service before it listens retries after 50 ms instead of gRPC's 1 s.

Then the calls the kernel made between the SIGKILL and the new launch (count and
milliseconds, medians per restart).  ``--profile`` also runs cProfile in the kernel
from the death being noticed to the new launch, over every round, and prints the
slowest calls (profiled rounds run slower; their timings are marked so).

``--standby`` runs each round twice, without and with ``supervise(standby=True)``: once the
first attempt's workers have imported TensorFlow, the second attempt's processes are
started ahead and wait; the restart releases them (their interpreter start, and their
import where it was over, show as done ahead).  It prints both, and the standby's
kill-to-resumed against the cold start without standbys, and what the standbys cost the
first attempt's cold start.

``--ssh`` runs the cluster on two test hosts (the workshop's test hosts: root and
openssh-server).
"""

import argparse
import contextlib
import cProfile
import functools
import importlib
import io
import os
import pstats
import re
import signal
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

TRAIN = ROOT / "tests" / "programs" / "mwms_train.py"
ARGS = ["--epochs", "2", "--steps", "10", "--save-freq", "4", "--log-steps", "--step-seconds", "0.05"]
KILL_AFTER = 6  # steps of the first attempt

# -- the workers' side: a probe that stamps points of a worker's start in its log -----------
PROBE = '''\
"""bench_restart.py's probe (a sitecustomize module on the workers' PYTHONPATH): prints
``BENCH <point> at=<time.time()>`` when the interpreter is up, TensorFlow imported, the
MultiWorkerMirroredStrategy begun and created, fit's callbacks made, the callbacks'
on_train_begin (BackupAndRestore's restore) begun and done, and the first batch begun."""
import sys
import time


def _say(point):
    sys.stdout.write(f"BENCH {point} at={time.time():.6f}\\n")
    sys.stdout.flush()


_say("up")


class _After:
    """Calls hooks[name](module) once the module ``name`` has been executed."""

    def __init__(self, hooks):
        self.hooks = hooks

    def find_spec(self, name, path, target=None):
        hook = self.hooks.pop(name, None)
        if hook is None:
            return None

        def around(run, module):
            run(module)
            try:
                hook(module)
            except Exception as e:  # the probe never stops the program
                _say(f"probe-failed-{name}:{type(e).__name__}")

        from mwhelpers.taskside.tfdata import wrapped_spec  # the start-up's own import-hook helper

        return wrapped_spec(self, name, path, target, around)


def _around(cls, name, before, after=None, once=True):
    original = getattr(cls, name)
    done = []

    def wrapper(self, *args, **kwargs):
        first = not done
        done.append(1)
        if first or not once:
            _say(before)
        try:
            return original(self, *args, **kwargs)
        finally:
            if after and (first or not once):
                _say(after)

    setattr(cls, name, wrapper)


def _tensorflow(module):
    _say("tf-imported")
    from tensorflow.python.distribute import collective_all_reduce_strategy as c

    _around(c.CollectiveAllReduceStrategy, "__init__", "strategy-begin", "strategy-created")


def _callbacks(module):
    cls = module.CallbackList
    _around(cls, "__init__", "fit-callbacks")
    _around(cls, "on_train_begin", "train-begin", "train-begun")
    _around(cls, "on_train_batch_begin", "first-batch")


sys.meta_path.insert(0, _After({"tensorflow": _tensorflow,
                                "keras.src.callbacks.callback_list": _callbacks}))
'''

BENCH_LINE = re.compile(r"^BENCH (\S+) at=([\d.]+)$")
STEP_LINE = re.compile(r"^STEP (\d+) at=([\d.]+)$")
# An absl record's time is seconds since the epoch: "I0000 00:00:1795546125.719945   11051 ..."
SERVER_LINE = re.compile(r"^I\d{4} \d\d:\d\d:(\d+\.\d+)\s+\d+ grpc_server_lib\.cc:\d+\] Started server")

# The points of a worker's start, in order, each with the name of the part that ends there.
WORKER_POINTS = [
    ("up", "launch -> interpreter up (exec, Python, site)"),
    ("tf-imported", "-> TensorFlow imported"),
    ("server", "-> gRPC server started (strategy begun)"),
    ("strategy-created", "-> cluster formed (coordination service, strategy made)"),
    ("fit-callbacks", "-> model, dataset, fit's first build (Keras: in the TF import)"),
    ("train-begin", "-> make_train_function, callbacks ready"),
    ("train-begun", "-> restore (BackupAndRestore.on_train_begin)"),
    ("first-step", "-> first step done (trace, first all-reduce, 50 ms sleep)"),
]


def worker_points(run):
    """{point: time.time()} that one run's log shows (the first of each)."""
    points = {}
    for line in run.lines():
        m = BENCH_LINE.match(line)
        if m:
            points.setdefault(m.group(1), float(m.group(2)))
            continue
        m = STEP_LINE.match(line)
        if m:
            points.setdefault("first-step", float(m.group(2)))
            continue
        m = SERVER_LINE.match(line)
        if m:
            points.setdefault("server", float(m.group(1)))
    return points


def attempt_points(runs):
    """The cluster's points: each the latest over the runs (the slowest worker holds the
    others up), from the attempt's last launch.  Points a run lacks are left out."""
    per_run = [worker_points(r) for r in runs]
    out = {"launch": max(r.launched_wall for r in runs)}
    for name, _ in WORKER_POINTS:
        if all(name in p for p in per_run):
            out[name] = max(p[name] for p in per_run)
    return out


def chain(points, order):
    """[(label, seconds)] between the successive points of ``order`` present in ``points``;
    a missing point's part is merged into the next one's (its label says so)."""
    out, last, skipped = [], None, []
    for key, label in order:
        if key not in points:
            skipped.append(label)
            continue
        if last is not None and points[key] < last:  # before the launch: ahead
            out.append((f"{label} (done ahead: warm-start server or standby)", 0.0))
            continue
        if last is not None:
            if skipped:
                label = f"{label} (and {len(skipped)} part(s) before it, not stamped)"
            out.append((label, points[key] - last))
        skipped = []
        last = points[key]
    return out


# -- the kernel's side: its calls, timed by wrapping them here ------------------------------
CALLS = []  # (label, thread name, time.time() at entry, time.time() at return)
SENDS = []  # (time.time(), signal, pids, thread name) of every proctree.send
PROFILE = None  # a cProfile.Profile with --profile
_PROFILING = {"armed": False, "on": False}


def _timed(label, fn, hook=None):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        t0 = time.time()
        try:
            return fn(*args, **kwargs)
        finally:
            t1 = time.time()
            CALLS.append((label, threading.current_thread().name, t0, t1))
            if hook is not None:
                hook(label)
    wrapper.__bench_wrapped__ = fn
    return wrapper


def _profile_hook(label):
    """cProfile in the kernel's thread from the death being noticed to the new launch."""
    if PROFILE is None or threading.current_thread() is not threading.main_thread():
        return
    if label == "Watcher.watch" and _PROFILING["armed"] and not _PROFILING["on"]:
        _PROFILING["on"] = True
        PROFILE.enable()
    elif label in STARTS and _PROFILING["on"]:
        PROFILE.disable()
        _PROFILING.update(on=False, armed=False)


# Functions timed wherever a module of the package holds them (a module that imported the
# name, or calls it through its own module), and methods timed on the class that defines them.
FUNCTIONS = {
    "mwhelpers.ending": ["end"],
    "mwhelpers.diagnosis": ["explain_failure"],
    "mwhelpers.precheck": ["check"],
    "mwhelpers.versions": ["installed"],
    "mwhelpers.ports": ["port_in_use"],
    "mwhelpers.proctree": ["tree", "group_members", "end_processes", "wait_gone"],
    "mwhelpers.failures": ["in_order"],
    "mwhelpers.logs": ["tail_lines"],
}
METHODS = {
    "Runtime": ["watch", "end", "failures", "kill", "start_all", "checked_tasks", "_checked_task",
                "_look_before_launch", "spawn", "_spawn", "_await_ready", "child_env"],
    "Job": ["start", "watch", "end", "signal", "failures"],
    "Spawner": ["check", "spawn", "environment"],
    "Lookout": ["look"],
    "Watcher": ["watch", "poll", "note_ready"],
    "LocalProcess": ["processes", "end"],
    "LocalLauncher": ["start"],
    "Failure": ["of", "write"],
}
# Where they live before and after the package's restructuring: whichever imports.
MODULES = ["mwhelpers.workers", "mwhelpers.supervisor", "mwhelpers.watcher", "mwhelpers.failures",
           "mwhelpers.diagnosis", "mwhelpers.precheck", "mwhelpers.versions", "mwhelpers.ports",
           "mwhelpers.proctree", "mwhelpers.logs", "mwhelpers.launchers", "mwhelpers.backends",
           "mwhelpers.backends.base", "mwhelpers.backends.local", "mwhelpers.job", "mwhelpers.jobs",
           "mwhelpers.spawner"]


def instrument():
    """Wrap the functions and methods above (in this process only); returns what was wrapped."""
    for name in MODULES:
        with contextlib.suppress(ImportError):
            importlib.import_module(name)
    mods = [m for n, m in list(sys.modules.items())
            if m is not None and (n == "mwhelpers" or n.startswith("mwhelpers."))]
    wrapped = []
    for modname, names in FUNCTIONS.items():
        home = sys.modules.get(modname)
        for name in names:
            original = getattr(home, name, None)
            if original is None or hasattr(original, "__bench_wrapped__"):
                continue
            timed = _timed(name, original)
            for m in mods:
                for attr, value in list(vars(m).items()):
                    if value is original:
                        setattr(m, attr, timed)
            wrapped.append(name)
    # proctree.send: the SIGKILL's moment (the first SIGKILL sent to the victim's tree).
    pt = sys.modules.get("mwhelpers.proctree")
    if pt is not None and hasattr(pt, "send"):
        original = pt.send

        def send(procs, sig, _send=original):
            procs = list(procs)
            SENDS.append((time.time(), sig, {p.pid for p in procs}, threading.current_thread().name))
            if sig == signal.SIGKILL and threading.current_thread().name == "chaos":
                _PROFILING["armed"] = True
            return _send(procs, sig)

        for m in mods:
            for attr, value in list(vars(m).items()):
                if value is original:
                    setattr(m, attr, send)
    seen = set()
    for m in mods:
        for cls in list(vars(m).values()):
            if not isinstance(cls, type) or cls.__name__ not in METHODS or id(cls) in seen:
                continue
            if cls.__module__ != m.__name__:
                continue
            seen.add(id(cls))
            for name in METHODS[cls.__name__]:
                raw = cls.__dict__.get(name)
                label = f"{cls.__name__}.{name}"
                hook = _profile_hook if label in ("Watcher.watch", *STARTS) else None
                if isinstance(raw, classmethod):
                    setattr(cls, name, classmethod(_timed(label, raw.__func__, hook)))
                elif callable(raw):
                    setattr(cls, name, _timed(label, raw, hook))
                else:
                    continue
                wrapped.append(label)
    return wrapped


# The calls that start an attempt's processes (the job's, or the runtime's before the job).
STARTS = ("Job.start", "Runtime.start_all")
SPAWNS = ("Spawner.spawn", "Runtime.spawn", "Runtime._spawn")


def first_call(labels, after, thread="MainThread", end=False):
    """The entry (or, ``end``, the return) time of the first call of one of ``labels`` in
    ``thread`` that began at or after ``after``; None when there is none."""
    for lab, th, t0, t1 in CALLS:
        if lab in labels and th == thread and t0 >= after:
            return t1 if end else t0
    return None


def first_return(labels, after, thread="MainThread"):
    """The first return at or after ``after`` of a call of one of ``labels`` in ``thread``."""
    return min((t1 for lab, th, _, t1 in CALLS if lab in labels and th == thread and t1 >= after),
               default=None)


def kernel_calls(start, stop):
    """{label: (count, seconds)} of the calls made in the window [start, stop], by thread:
    the kernel's own (MainThread) and the others (the fault injector's rt.kill, the ending
    threads)."""
    out = {}
    for lab, th, t0, t1 in CALLS:
        if t0 >= start and t1 <= stop:
            key = lab if th == "MainThread" else f"{lab} [{'chaos' if th == 'chaos' else 'other threads'}]"
            n, s = out.get(key, (0, 0.0))
            out[key] = (n + 1, s + (t1 - t0))
    return out


# The restart's in-kernel points, in order, each with the name of the part that ends there.
RESTART_POINTS = [
    ("sigkill", ""),
    ("exit", "(a) SIGKILL -> the victim's exit stamped (wait thread)"),
    ("noticed", "(a) exit stamp -> death noticed (Watcher.watch returned)"),
    ("peer-ended", "(b) ending the peer (Job.end)"),
    ("diagnosed", "(c) failure records + diagnosis (Job.failures)"),
    ("start-all", "(c) root-cause file, echo, decision, new job"),
    ("spawning", "(d) checks: Spawner.check (no look at a restart)"),
    ("launch", "(d) spawns: the new processes started"),
]


def restart_points(victim, second, started_at):
    """The restart's points: the SIGKILL (the first sent to the victim's tree), its exit
    stamp, then the kernel's calls after it, and the new attempt's last launch."""
    sent = [t for t, sig, pids, _ in SENDS if sig == signal.SIGKILL and victim.pid in pids
            and t >= started_at]
    marks = [t for t, kind, _ in victim.events if kind == "signal"]
    k = sent[0] if sent else (marks[0] if marks else None)
    points = {"sigkill": k, "exit": victim.ended_wall,
              "launch": max(r.launched_wall for r in second)}
    if k is not None:
        points["noticed"] = first_return(("Watcher.watch",), k)
        points["peer-ended"] = first_call(("Job.end", "Runtime.end"), k, end=True)
        points["diagnosed"] = first_call(("Job.failures", "Runtime.failures"), k, end=True)
        points["start-all"] = first_call(STARTS, k)
        points["spawning"] = first_call(SPAWNS, k)
    return {key: v for key, v in points.items() if v is not None}


BACKOFF_MS = 500  # "cluster formed" later than this after the last server: a reconnect back-off


def forming(runs):
    """(ms from the last server started to the cluster formed, the task whose server started
    first) of one attempt, or None without the probe.  A task that dials the coordination
    service (task 0's) before it listens waits for gRPC's reconnect back-off (about 1 s)."""
    pts = {str(r.task): worker_points(r) for r in runs}
    if not all("server" in p and "strategy-created" in p for p in pts.values()):
        return None
    first = min(pts, key=lambda t: pts[t]["server"])
    return (max(p["strategy-created"] for p in pts.values())
            - max(p["server"] for p in pts.values())) * 1000, first


def one_round(rt, workdir, probe, worker_env=(), standby=False, **where):
    from chaos import Chaos, steps_of

    rt.define_cluster(2, **where)
    monkey = Chaos(rt, 1, low=KILL_AFTER, high=KILL_AFTER)
    env = {}
    if probe is not None:
        env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(probe), os.environ.get("PYTHONPATH")])),
               "TF_CPP_MIN_LOG_LEVEL": "0"}
    env.update(dict(kv.split("=", 1) for kv in worker_env))
    started_at = time.time()
    monkey.start()
    attempts = rt.supervise(script=str(TRAIN), args=[*ARGS, "--backup", str(workdir / "bk")],
                            max_restarts=1, timeout=180, stream=False, env=env,
                            standby=standby)
    monkey.join(5)
    first, second = attempts[0].runs, attempts[1].runs
    launched = min(r.launched_wall for r in first)
    cold = max(steps_of(r)[0][1] for r in first) - launched
    victim = next(r for r in first if str(r.task) == monkey.kills[0][1])
    rp = restart_points(victim, second, started_at)
    killed_at = rp.get("sigkill", monkey.kills[0][2])
    resumed = max(steps_of(r)[0][1] for r in second) - killed_at
    resumed_step = min(steps_of(r)[0][0] for r in second)
    cold_pts, restart_pts = attempt_points(first), attempt_points(second)
    cold_pts["launch"] = launched  # as the cold start counts it: from the first launch
    return {"cold": cold, "resumed": resumed, "step": resumed_step,
            "restart": chain(rp, RESTART_POINTS),
            "kernel": rp["launch"] - killed_at,
            "calls": kernel_calls(killed_at, max(rp["launch"], first_return(
                STARTS, killed_at) or 0)),
            "first_calls": kernel_calls(started_at, max(launched, first_return(
                STARTS, started_at) or 0)),
            "forming": (forming(first), forming(second)),
            "e_restart": chain(restart_pts, [("launch", ""), *WORKER_POINTS]),
            "e_cold": chain(cold_pts, [("launch", ""), *WORKER_POINTS]),
            "e_restart_total": restart_pts.get("first-step", 0) - restart_pts["launch"],
            "e_cold_total": cold_pts.get("first-step", 0) - cold_pts["launch"]}


def _median_parts(rounds, key):
    """[(label, median ms)] of the parts under ``key``, in the order they came."""
    labels, values = [], {}
    for r in rounds:
        for label, s in r[key]:
            if label not in values:
                labels.append(label)
            values.setdefault(label, []).append(s * 1000)
    return [(label, statistics.median(values[label]), len(values[label])) for label in labels]


def report(rounds, profiled, no_probe=False):
    n = len(rounds)
    note = " (profiled: the kernel's part runs slower)" if profiled else ""
    print(f"\nParts of a restart, median of {n} restart(s), ms{note}:")
    for label, ms, k in _median_parts(rounds, "restart"):
        print(f"  {label:<62} {ms:8.1f}" + (f"   ({k} of {n} rounds)" if k != n else ""))
    kernel = statistics.median(r["kernel"] for r in rounds) * 1000
    worst = max(r["kernel"] for r in rounds) * 1000
    print(f"  {'SIGKILL -> new launch, in all (goal: 300 ms at most)':<62} {kernel:8.1f}"
          f"   (worst {worst:.1f})")
    cold_parts = {label: ms for label, ms, _ in _median_parts(rounds, "e_cold")}
    print(f"\n(e) launch -> first step, median ms{'':<27} {'restart':>8} {'cold':>8}")
    for label, ms, _ in _median_parts(rounds, "e_restart") if not no_probe else ():
        cold = cold_parts.get(label)
        print(f"  {label:<62} {ms:8.1f} {cold if cold is not None else float('nan'):8.1f}")
    er = statistics.median(r["e_restart_total"] for r in rounds) * 1000
    ec = statistics.median(r["e_cold_total"] for r in rounds) * 1000
    print(f"  {'launch -> first step, in all':<62} {er:8.1f} {ec:8.1f}")
    if any(r["forming"][0] or r["forming"][1] for r in rounds):
        cold_waits = sum(1 for r in rounds if r["forming"][0] and r["forming"][0][0] > BACKOFF_MS)
        restart_waits = sum(1 for r in rounds if r["forming"][1] and r["forming"][1][0] > BACKOFF_MS)
        print(f"  the cluster formed more than {BACKOFF_MS} ms after the last server started (a task "
              f"that dialled task 0's coordination service before it listened waits for gRPC's "
              f"reconnect back-off, about 1 s): restarts {restart_waits} of {n}, cold starts "
              f"{cold_waits} of {n}")
    cold = statistics.median(r["cold"] for r in rounds)
    resumed = statistics.median(r["resumed"] for r in rounds)
    print(f"\n  kill-to-resumed {resumed * 1000:.0f} ms = SIGKILL -> new launch {kernel:.0f} ms + "
          f"launch -> first step {er:.0f} ms; cold start {cold * 1000:.0f} ms; "
          f"ratio {resumed / cold:.2f}")

    for key, title in (("calls", "between the SIGKILL and the new launch"),
                       ("first_calls", "before the first launch (for comparison)")):
        labels = sorted({lab for r in rounds for lab in r[key]})
        if not labels:
            continue
        print(f"\nThe kernel's calls {title}: median per round, ms (calls nest: a call's time "
              "includes those it makes)")
        rows = []
        for lab in labels:
            counts = [r[key].get(lab, (0, 0.0))[0] for r in rounds]
            ms = [r[key].get(lab, (0, 0.0))[1] * 1000 for r in rounds]
            rows.append((statistics.median(ms), statistics.median(counts), lab))
        for ms, count, lab in sorted(rows, reverse=True):
            print(f"  {lab:<54} {count:4.0f} x {ms:8.1f}")


def main():
    global PROFILE
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--ssh", action="store_true", help="on two test hosts over SSH")
    p.add_argument("--no-probe", action="store_true",
                   help="run the workers without the probe (the worker-side parts are not split)")
    p.add_argument("--profile", action="store_true",
                   help="cProfile the kernel from the death noticed to the new launch")
    p.add_argument("--top", type=int, default=25, help="how many calls --profile lists")
    p.add_argument("--standby", action="store_true",
                   help="supervise(standby=True): the restart releases processes started "
                        "ahead, TensorFlow imported")
    p.add_argument("--worker-env", action="append", default=[], metavar="K=V",
                   help="a variable for the workers (an experiment: "
                        "TF_GRPC_DEFAULT_OPTIONS=grpc.initial_reconnect_backoff_ms=50, say)")
    a = p.parse_args()
    os.environ.pop("TF_USE_LEGACY_KERAS", None)  # Keras 3, mended in the workers
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from mwhelpers.workers import Runtime

    instrument()
    if a.profile:
        PROFILE = cProfile.Profile()

    hosts = None
    if a.ssh:
        try:
            from mwhelpers.workshop.testhosts import TestHosts, missing
        except ImportError:
            from mwhelpers.testhosts import TestHosts, missing

        why = missing()
        if why:
            sys.exit(f"cannot make test hosts: {why}")
        hosts = TestHosts(2).__enter__()
        os.environ.update(hosts.env())
    modes = [False, True] if a.standby else [False]  # with --standby, each round both ways
    rounds: dict[bool, list] = {m: [] for m in modes}
    try:
        with tempfile.TemporaryDirectory(prefix="bench-restart-probe-") as pd:
            probe = None
            if not a.no_probe:
                probe = Path(pd)
                (probe / "sitecustomize.py").write_text(PROBE)
            for i in range(1, a.rounds + 1):
                for standby in modes:
                    with tempfile.TemporaryDirectory(prefix="bench-restart-") as d:
                        os.chdir(d)
                        with Runtime(log_dir=Path(d) / "logs", echo=lambda line: None) as rt:
                            where = {"hosts": hosts.names} if hosts else {}
                            r = one_round(rt, Path(d), probe, a.worker_env, standby, **where)
                        os.chdir(ROOT)
                    rounds[standby].append(r)
                    print(f"round {i}{', standby' if standby else ''}: cold start to first step "
                          f"{r['cold']:.2f} s; SIGKILL to the first "
                          f"step of the restarted attempt {r['resumed']:.2f} s (it resumed at step "
                          f"{r['step']}); SIGKILL to the new launch {r['kernel'] * 1000:.0f} ms"
                          + "".join(f"; {what}: cluster formed {f[0]:.0f} ms after the last server "
                                    f"started ({f[1]}'s first)" for what, f in
                                    zip(("cold", "restart"), r["forming"], strict=True) if f),
                          flush=True)
    finally:
        if hosts is not None:
            hosts.__exit__(None, None, None)
    where = "two SSH test hosts" if hosts else "this machine"
    medians = {}
    for standby in modes:
        rs = rounds[standby]
        cold = statistics.median(r["cold"] for r in rs)
        resumed = statistics.median(r["resumed"] for r in rs)
        medians[standby] = cold, resumed
        how = "supervise(standby=True)" if standby else "restarts from scratch"
        slower = sum(1 for r in rs if r["resumed"] > r["cold"])
        print(f"\n{len(rs)} rounds on {where}, 2 workers, {how}: median cold start {cold:.2f} s, "
              f"median kill-to-resumed {resumed:.2f} s; ratio kill-to-resumed / cold = "
              f"{resumed / cold:.2f}; rounds whose restart took longer than their cold start: "
              f"{slower} of {len(rs)}")
        report(rs, a.profile, a.no_probe)
    if a.standby:
        (cold, resumed), (cold_sb, resumed_sb) = medians[False], medians[True]
        print(f"\nStandby against restarts from scratch, medians of the same run: kill-to-resumed "
              f"{resumed_sb:.2f} s against {resumed:.2f} s; against a cold start without standbys "
              f"({cold:.2f} s) {resumed_sb / cold:.2f}. What the standbys cost: the first attempt's "
              f"cold start {cold_sb:.2f} s with them against {cold:.2f} s without (their TensorFlow "
              "import runs while it forms the cluster and starts training)")
    warm = os.environ.get("MWHELPERS_WARM_START", "1") != "0" and not any(
        e.startswith("MWHELPERS_WARM_START=0") for e in a.worker_env)
    if warm and not hosts:
        print("\n('cold start' is the first attempt's start, forked from the warm-start server "
              "as every local start is by default; --worker-env MWHELPERS_WARM_START=0 for "
              "fresh interpreters)")
    if PROFILE is not None:
        out = io.StringIO()
        stats = pstats.Stats(PROFILE, stream=out)
        stats.sort_stats("cumulative").print_stats(a.top)
        stats.sort_stats("tottime").print_stats(a.top)
        print(f"\ncProfile of the kernel from the death noticed to the new launch, "
              f"{sum(len(rs) for rs in rounds.values())} round(s) together:")
        print(out.getvalue())


if __name__ == "__main__":
    main()
