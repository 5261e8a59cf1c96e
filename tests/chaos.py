"""Random SIGKILLs of a supervised job's tasks, and what the steps they logged show.

The training program (``programs/mwms_train.py --log-steps``) prints ``STEP N at=T``
after each step, N being the optimizer's step count (a restored backup carries it on).
:class:`Chaos` runs beside ``supervise`` and kills a random task of each attempt once
that attempt has done a random number of steps, until it has killed ``kills`` times;
:func:`steps_of` and :func:`redone` read the logs back.
"""

import itertools
import random
import re
import threading
import time

from mwhelpers.errors import UsageError

STEP = re.compile(r"^STEP (\d+) at=([\d.]+)$")


def steps_of(run):
    """[(step, time)] that ``run`` logged, in order."""
    return [(int(m.group(1)), float(m.group(2))) for m in map(STEP.match, run.lines()) if m]


class Chaos(threading.Thread):
    """Kills (SIGKILL, through the runtime, as ``%killworker`` does) a random task of
    attempt 1, 2, ... ``kills``, each once the attempt has done between ``low`` and
    ``high`` steps (chosen at random with ``seed``).  ``self.kills``: (attempt, task,
    kill time, steps that attempt had logged)."""

    def __init__(self, rt, kills, low, high, seed=0):
        super().__init__(daemon=True, name="chaos")
        self.rt, self.n, self.low, self.high = rt, kills, low, high
        self.rng = random.Random(seed)
        self.kills = []
        self.stop = threading.Event()

    def current(self):
        """The runs of the attempt due for a kill, once all of them run."""
        try:
            runs = list(dict(self.rt.runs).values())
        except RuntimeError:  # changed while copied
            return None
        attempt = len(self.kills) + 1
        if runs and all(r.attempt == attempt and r.running for r in runs):
            return runs
        return None

    def run(self):
        while len(self.kills) < self.n and not self.stop.is_set():
            runs = self.current()
            if runs is None:
                time.sleep(0.02)
                continue
            want, done = self.rng.randint(self.low, self.high), 0
            while not self.stop.is_set() and all(r.running for r in runs):
                done = max(len(steps_of(r)) for r in runs)
                if done >= want:
                    break
                time.sleep(0.02)
            victim = self.rng.choice(runs)
            try:
                self.rt.kill(victim.task, why=f"chaos: a random SIGKILL after {done} steps")
            except UsageError:  # the attempt ended meanwhile: try the next one
                continue
            self.kills.append((victim.attempt, str(victim.task), time.time(), done))


def redone(attempts):
    """For each restart, the steps done twice: the last step the killed attempt logged
    minus the step the next attempt resumed after (both taken over its tasks)."""
    out = []
    for before, after in itertools.pairwise(attempts):
        last = max((s for r in before.runs for s, _ in steps_of(r)), default=0)
        first = min(steps_of(r)[0][0] for r in after.runs)
        out.append(last - (first - 1))
    return out
