"""What a failed or stuck job means, in plain words, and what to do about it.

The failure reports name the first task to die, its exit and its log tail.
This module adds, after that root cause, a :class:`Finding`: one line on
what it means and one on what to do.  Each rule recognises one mistake that
people make with multi-worker TensorFlow from evidence that leaves no doubt:
the exception a task wrote down as it ended (its exit record,
:mod:`mwhelpers.exitrecord`; the log's last traceback only where it wrote none), a message
in a task's log, an exit status, who exited first, the stacks a
stuck task wrote, the TensorFlow and Keras each task says it ran
(:mod:`mwhelpers.taskside.taskfacts`).  A failure no rule recognises gets no finding:
its report stays as it was, never a guess.

:func:`explain_failure` reads failed jobs, :func:`explain_stuck` jobs that
did not finish or become ready in time.
"""

from __future__ import annotations

import os
import re
import signal
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from . import collectivediagnosis as collectives
from . import jaxdiagnosis, stacks
from .failures import PEER_LOST, explained, last_exception
from .follow import progress_of
from .proctree import signal_of
from .taskside import kerasbase, keraslayout, kerasmixed, taskfacts

if TYPE_CHECKING:
    from .cluster import Task
    from .failures import Failure
    from .taskrun import TaskRun

KERAS_ISSUE = "keras-team/keras#20585"
_KERAS3_FIT = "Attempt to convert a value (PerReplica"
_OP_FIRST = "Collective ops must be configured at program startup"
# Keras 3 with steps_per_execution > 1 under a multi-replica strategy: its multi-step loop
# checks for a next batch with a tf.cond that TensorFlow cannot run under the strategy.
_MULTI_STEP = re.compile(r"You must feed a value for placeholder tensor '[^']*cond/Placeholder")
_MULTI_STEP_WHERE = "multi_step_on_iterator"
# What mwhelpers' fix of keras-team/keras#20585 writes in a task's log (kerasfix.py).
_FIX_OFF = "MWHELPERS_KERAS_FIX=0"
_FIX_SKIPPED = "[mwhelpers] the Keras 3 multi-worker fix"
# What a program that trains with Keras 3's LossScaleOptimizer shows in its source, and the line
# mwhelpers' mend of it (taskside/kerasmixed.py) writes when it runs.
_LOSS_SCALE_USE = ("mixed_float16", "LossScaleOptimizer")
_NO_MODULE = re.compile(r"^ModuleNotFoundError: No module named '([\w.]+)'")
_SAME_STEPS = ("every worker must run exactly the same steps: the same epochs and "
               "steps_per_epoch, and the same number of batches in every worker's shard")


@dataclass
class Finding:
    """One recognised mistake: what it means and what to do."""

    key: str  # a short name of the rule: 'keras3-fit', 'op-before-strategy', ...
    cause: str
    advice: str

    def lines(self) -> list[str]:
        return explained([self.to_dict()])

    def to_dict(self) -> dict[str, str]:
        return asdict(self)


class _Job:
    """The runs of one job with their logs read once."""

    def __init__(self, runs: Iterable[TaskRun]) -> None:
        self.runs = list(runs)
        self._lines: dict[int, list[str]] = {}  # id(run) -> its log's lines

    def lines(self, run: TaskRun) -> list[str]:
        if id(run) not in self._lines:
            self._lines[id(run)] = run.lines()
        return self._lines[id(run)]

    def facts(self, run: TaskRun) -> dict[str, str] | None:
        return taskfacts.parse(self.lines(run))

    def failed_logs(self, failures: Iterable[Failure]
                    ) -> Iterator[tuple[Failure, TaskRun | None, list[str]]]:
        """(failure, its run or None, its log lines: the run's, else the failure's tail)."""
        for f in failures:
            run = self.run_of(f)
            yield f, run, self.lines(run) if run else f.tail

    @staticmethod
    def raised(failure: Failure, lines: Sequence[str]) -> str:
        """The exception that ended the failed task, 'Type: message': its exit record's,
        else (no record, or ``sys.exit``) the last traceback's in ``lines``."""
        record = failure.exit_record
        if record is not None and not record.exited:
            return f"{record.type}: {record.message}"
        return last_exception(lines)

    @staticmethod
    def traceback(failure: Failure, lines: list[str]) -> list[str]:
        """Where to look for what the program raised: its exit record's traceback (chained
        exceptions included), else (no record, or ``sys.exit``) its log's ``lines``."""
        record = failure.exit_record
        return record.traceback.splitlines() if record is not None and not record.exited \
            else lines

    def run_of(self, failure: Failure) -> TaskRun | None:
        return next((r for r in self.runs if str(r.task) == failure.task and r.pid == failure.pid),
                    None)


def _names(tasks: Iterable[object]) -> str:
    names = [str(t) for t in tasks]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


# -- failed jobs ---------------------------------------------------------------------------
def explain_failure(failures: Sequence[Failure], runs: Iterable[TaskRun] = ()) -> list[Finding]:
    """Findings for a failed job: ``failures`` (root cause first) among ``runs`` (every run
    of the job, those that finished too).  At most two; [] when nothing is recognised."""
    if not failures:
        return []
    job = _Job(list(runs) or [])
    found: list[Finding] = []
    for rule in (_settings_differ, _keras3_fit, _steps_per_execution, _op_before_strategy,
                 _collectives_differ, _jax_port_taken, _jax_gave_up, _jax_saving,
                 _module_missing,
                 _peer_finished_first, _replicated_by_layout, _foreign_sigkill):
        finding = rule(job, failures)
        if finding is not None:
            found.append(finding)
        if len(found) == 2:
            break
    return found


def _settings_differ(job: _Job, failures: Sequence[Failure]) -> Finding | None:
    facts = {str(r.task): f for r in job.runs if (f := job.facts(r))}
    if len(facts) < 2:
        return None
    for key, what in (("tensorflow", "TensorFlow"), ("keras", "Keras")):
        values = {f[key] for f in facts.values()}
        if len(values) < 2:
            continue
        per_task = "; ".join(f"{t}: TensorFlow {f['tensorflow']} with {f['keras']} "
                             f"(TF_USE_LEGACY_KERAS={f['legacy']})" for t, f in facts.items())
        if key == "keras":
            advice = ("give every task the same Keras: set TF_USE_LEGACY_KERAS in the kernel "
                      "before launching (each task inherits it), not with --env for some tasks "
                      "only, or set it first thing in the program, before importing TensorFlow")
        else:
            advice = ("install the same TensorFlow for every task's Python (%cluster --python "
                      "names it on other hosts) and run them all with it")
        return Finding(f"{key}-differs",
                       f"the tasks did not run the same {what} ({per_task}); their collectives "
                       "and saved state do not match", advice)
    return None


def _keras3_fit(job: _Job, failures: Sequence[Failure]) -> Finding | None:
    for f, run, lines in job.failed_logs(failures):
        if not any(_KERAS3_FIT in ln for ln in job.traceback(f, lines)):
            continue
        facts = taskfacts.parse(lines)
        if facts and not facts["keras"].startswith("Keras 3"):
            continue  # the message, but not Keras 3: not this mistake
        used = f" ({facts['keras']})" if facts else ""
        skipped = next((ln[len("[mwhelpers] "):] for ln in lines if ln.startswith(_FIX_SKIPPED)),
                       None)
        if skipped:
            why = f"mwhelpers' fix was not applied in it: {skipped}"
        elif run is not None and not getattr(run, "keras_fix", True):
            why = f"mwhelpers' fix was turned off for it ({_FIX_OFF} or --no-keras-fix)"
        else:
            why = ("the program was not started by mwhelpers or did not get its fix; call "
                   "mwhelpers.fix_keras_multi_worker() before fit")
        return Finding(
            "keras3-fit",
            f"{f.task} ran model.fit under MultiWorkerMirroredStrategy with Keras 3{used} "
            f"unmended, which fails this way ({KERAS_ISSUE}); {why}",
            "leave mwhelpers' Keras fix on (the default: no --no-keras-fix, no "
            f"{_FIX_OFF}) so that fit and evaluate work, or use tf_keras (pip install tf_keras, "
            "TF_USE_LEGACY_KERAS=1 in the kernel before launching), or train with a custom "
            "loop (strategy.run in a tf.function)")
    return None


def _steps_per_execution(job: _Job, failures: Sequence[Failure]) -> Finding | None:
    for f, _, lines in job.failed_logs(failures):
        raised = job.traceback(f, lines)
        if not any(_MULTI_STEP.search(ln) for ln in raised) or \
                not any(_MULTI_STEP_WHERE in ln for ln in raised):
            continue
        return Finding(
            "steps-per-execution",
            f"{f.task} ran Keras fit with steps_per_execution > 1 under a multi-replica "
            "strategy; Keras 3's loop of several steps per call cannot run there (its check "
            "for a next batch fails on a placeholder), with or without mwhelpers' fix",
            "compile with steps_per_execution=1 (the default) for a distributed fit")
    return None


def _collectives_differ(job: _Job, failures: Sequence[Failure]) -> Finding | None:
    for _, _, lines in job.failed_logs(failures):
        for line in lines:
            said = collectives.mismatch(line)
            if said is not None:
                what, why, advice = said
                return Finding(
                    "collectives-differ",
                    f"the tasks did not run the same collective at the same point ({what}): "
                    f"{why}", advice)
    return None


def _op_before_strategy(job: _Job, failures: Sequence[Failure]) -> Finding | None:
    for f, _, lines in job.failed_logs(failures):
        if _OP_FIRST in job.raised(f, lines):
            return Finding(
                "op-before-strategy",
                f"{f.task} ran a TensorFlow operation (a tensor, a variable, a dataset, a model, "
                "listing logical devices) before creating MultiWorkerMirroredStrategy; the "
                "strategy must set up collectives before the first operation",
                "create the strategy right after importing TensorFlow, before anything else "
                "uses TensorFlow (mwhelpers' warning before the launch names the line)")
    return None


def _jax_port_taken(job: _Job, failures: Sequence[Failure]) -> Finding | None:
    for f, run, lines in job.failed_logs(failures):
        found = jaxdiagnosis.port_taken(f.task, job.raised(f, lines), job.traceback(f, lines),
                                        lines, run.port if run else 0)
        if found:
            return Finding(*found)
    return None


def _jax_saving(job: _Job, failures: Sequence[Failure]) -> Finding | None:
    f, _, lines = next(job.failed_logs(failures[:1]))
    raised = job.raised(f, lines)
    found = (jaxdiagnosis.fetched_split(f.task, raised)
             or jaxdiagnosis.orbax_relative(f.task, raised, lines))
    return Finding(*found) if found else None


def _jax_gave_up(job: _Job, failures: Sequence[Failure]) -> Finding | None:
    found = jaxdiagnosis.gave_up(job.runs, job.lines)
    return Finding(*found) if found else None


def _module_missing(job: _Job, failures: Sequence[Failure]) -> Finding | None:
    root = failures[0]
    run = job.run_of(root)
    if run is None:
        return None
    m = _NO_MODULE.match(job.raised(root, job.lines(run)))
    if not m:
        return None
    name = m.group(1).split(".")[0]
    kernel_dir = os.getcwd()
    # A cell runs in its run's folder; a run here without one (its launcher did not fill it
    # in) started in the kernel's.
    task_dir = (run.cwd or kernel_dir) if run.cell else str(Path(run.script).parent)
    here = [d for d in dict.fromkeys([kernel_dir, run.cwd or kernel_dir, str(Path(run.script).parent)])
            if d and _module_in(d, name)]
    if run.host is not None:
        if not here:
            return None
        return Finding(
            "module-missing",
            f"{root.task} runs on {run.host} in {run.cwd or 'its login folder'}, and {name} is "
            f"not there: {name}.py was written in {here[0]} on this machine only",
            f"put {name}.py in that folder on {run.host} too (a shared file system, or scp), or "
            f"install it as a package for that host's Python")
    if task_dir in here:
        return None  # it is where the task looks: something else is wrong
    if here:
        how = ("runs a notebook cell, and Python looks for modules in its working directory "
               f"{task_dir}") if run.cell else (
            f"runs {run.script}, and Python looks for modules in the script's folder "
            f"{task_dir} (and the installed packages), not in the working directory")
        return Finding(
            "module-missing",
            f"{name}.py is in {here[0]}, where the notebook wrote it, but {root.task} {how}",
            f"write {name}.py beside the program (%%writefile {Path(task_dir) / (name + '.py')}), "
            f"or launch with --env PYTHONPATH={here[0]}")
    return Finding(
        "module-missing",
        f"{root.task} cannot import {name}: there is no {name}.py in its folder {task_dir}, and "
        f"its Python has no package {name} installed",
        f"install it into the Python the tasks run (python -m pip install ...), or, when it "
        f"is a module of your own, write {name}.py into {task_dir} (%%writefile)")


def _module_in(folder: str, name: str) -> bool:
    base = Path(folder)
    return (base / f"{name}.py").is_file() or (base / name).is_dir()


def _peer_finished_first(job: _Job, failures: Sequence[Failure]) -> Finding | None:
    root = failures[0]
    root_run = job.run_of(root)
    lines = job.lines(root_run) if root_run else root.tail
    if not PEER_LOST.search(job.raised(root, lines) or "\n".join(lines[-5:])):
        return None
    done = [(ended, r) for r in job.runs if r.returncode == 0
            and (ended := r.ended_wall) is not None and ended <= root.ended_at]
    if not done:
        return None
    first_ended, first = min(done, key=lambda d: d[0])
    gap = root.ended_at - first_ended
    last = _last_progress(job.lines(first))
    got = f" (its last progress line: {last!r})" if last else ""
    return Finding(
        "unequal-steps",
        f"{first.task} finished (exit code 0) {gap:.1f} s before {root.task} failed{got}, while "
        f"{root.task} still waited for it in a collective: the workers did not run the same "
        "number of steps",
        f"{_SAME_STEPS} (repeat the dataset and set steps_per_epoch, or make the shards "
        "equal)")


def _last_progress(lines: Sequence[str]) -> str:
    # Keras progress and the "step N" lines of a custom loop (mwhelpers.follow): where a task
    # had got to.
    shown = [ln for ln in lines if progress_of(ln) is not None]
    return shown[-1].strip()[:80] if shown else ""


_OUT_OF_MEMORY = ("RESOURCE_EXHAUSTED", "Out of memory", "MemoryError", "out of memory")


def _replicated_by_layout(job: _Job, failures: Sequence[Failure]) -> Finding | None:
    """A task that ran out of memory (killed by a SIGKILL mwhelpers did not send, or an
    out-of-memory error) after its LayoutMap check said the model stays replicated."""
    root = failures[0]
    f, _, lines = next(job.failed_logs([root]))
    said = [ln[len(keraslayout.PREFIX):] for ln in lines if ln.startswith(keraslayout.PREFIX)
            and keraslayout.REPLICATED in ln]
    killed = signal_of(root.returncode) == signal.SIGKILL and not root.note
    if not said or not killed and not any(w in job.raised(f, lines) for w in _OUT_OF_MEMORY):
        return None
    return Finding(
        "layout-replicated",
        f"{root.task} ran out of memory, most likely, after its LayoutMap left large "
        f"variables whole on every device: {said[0]}",
        "make a LayoutMap rule match each large variable's path (Keras 3.14 and later match "
        "a rule against the whole path, re.fullmatch; 3.13 and older, re.search; print "
        "[v.path for v in model.variables] to see the paths), then start the job again; "
        "its log says, before the first step, what the rules left whole")


def _foreign_sigkill(job: _Job, failures: Sequence[Failure]) -> Finding | None:
    root = failures[0]
    if signal_of(root.returncode) != signal.SIGKILL or root.note:
        return None  # mwhelpers notes every signal it sends
    run = job.run_of(root)
    host = getattr(run, "host", None) or "this machine"
    return Finding(
        "foreign-sigkill",
        f"{root.task} (pid {root.pid}) was killed by a SIGKILL that mwhelpers did not send. "
        "The kernel's out-of-memory killer ends processes this way when memory runs out; a "
        "scheduler's time or memory limit, or someone's kill -9, does too",
        f"look on {host} for 'Out of memory: Killed process {root.pid}' (dmesg, or journalctl "
        "-k); if it is there, make the tasks use less memory (smaller batches or datasets, "
        "fewer tasks per machine)")


# -- stuck jobs ----------------------------------------------------------------------------
def explain_stuck(stuck: Sequence[TaskRun], runs: Sequence[TaskRun] = (),
                  not_ready: Sequence[tuple[Task, str]] = ()) -> tuple[list[str], list[Finding]]:
    """``(where_lines, findings)`` for tasks that did not finish or become ready in time.

    ``stuck`` are the runs that were still running (their stacks were dumped into their
    logs before they were ended), ``runs`` every run of the job, ``not_ready``
    ``(task, why)`` for the training tasks that never became ready.  ``where_lines`` say
    where each stuck task's program was; the findings name the task that is behind.
    """
    job = _Job(runs or stuck)
    places: dict[TaskRun, stacks.Where] = {}
    for r in stuck:
        place = stacks.where(job.lines(r), partial(_source_line, r))
        if place is not None:
            places[r] = place
    lines: list[str] = []
    for r, place in places.items():
        inside = f"inside {place.framework}, called from" if place.in_framework else "at"
        lines.append(f"  {r.task} was {inside} {_at(r, place)}")
    found: list[Finding] = []
    jax = jaxdiagnosis.stuck(stuck, job.runs, not_ready, job.lines)
    if jax:  # Keras 3 on JAX: what follows is about TensorFlow's servers
        return lines, [Finding(*jax)]
    absent = [(t, why) for t, why in not_ready if why == "never launched"]
    if absent:
        found.append(Finding(
            "peer-missing",
            f"{_names(t for t, _ in absent)} never started: each worker waits for every task "
            "that TF_CONFIG names before it takes a step",
            "launch every task of the cluster (one %%worker --bg per task), or define the "
            "cluster with the tasks you run (%cluster N)"))
    silent = [(t, why) for t, why in not_ready if why != "never launched" and "running" in why]
    for t, _ in silent:
        run = next((r for r in stuck if r.task == t), None)
        place = places.get(run) if run is not None else None
        at = f": it was at {_at(run, place)}" if run is not None and place else ""
        found.append(Finding(
            "peer-not-ready",
            f"{t} is running but its TensorFlow server never started{at}; the server starts "
            "when the program creates its strategy",
            "create the strategy first thing in the program, before loading data or "
            "building models, and look at what keeps it from getting there"))
    behind = [r for r, p in places.items() if not p.in_framework]
    waiting = [r for r, p in places.items() if p.in_framework]
    done = [r for r in job.runs if r.returncode == 0 and r.task.type in ("chief", "worker")]
    if waiting and done and not behind:
        found.append(Finding(
            "unequal-steps",
            f"{_names(r.task for r in done)} finished (exit code 0) while "
            f"{_names(r.task for r in waiting)} still waited inside TensorFlow for "
            f"{'it' if len(done) == 1 else 'them'}: the workers did not run the same number "
            "of steps",
            _SAME_STEPS))
    elif waiting and not behind and not done and \
            (finding := _keras3_loss_scale(job, waiting, places)) is not None:
        found.append(finding)
    elif waiting and behind:
        found.append(Finding(
            "task-behind",
            f"{_names(r.task for r in behind)} {'is' if len(behind) == 1 else 'are'} behind, "
            f"in the program's own code ({'; '.join(_at(r, places[r], False) for r in behind)}), "
            f"while {_names(r.task for r in waiting)} "
            f"{'waits' if len(waiting) == 1 else 'wait'} inside TensorFlow: a collective step "
            "completes only when every worker joins it",
            f"find out why {_names(r.task for r in behind)} "
            f"{'does' if len(behind) == 1 else 'do'} not get past that line (slow or blocked "
            "input, a wait on a file or a lock); every worker must reach every step"))
    return lines, found[:2]


def _keras3_loss_scale(job: _Job, waiting: Sequence[TaskRun],
                       places: dict[TaskRun, stacks.Where]) -> Finding | None:
    """Every stuck task waits inside TensorFlow, training with Keras 3's LossScaleOptimizer
    (its program sets mixed_float16 or names the optimizer) that mwhelpers did not mend: the
    hang of a step that one worker skipped alone (docs/keras-lossscale.md)."""
    if len(waiting) < 2:
        return None
    kerases = set()
    for r in waiting:
        lines = job.lines(r)
        facts = job.facts(r)
        if facts is None or not facts["keras"].startswith("Keras 3") or \
                any(kerasmixed.MENDED in ln for ln in lines):
            return None
        text = _source_text(r, places[r].frame.file)
        if not any(word in text for word in _LOSS_SCALE_USE):
            return None
        kerases.add(facts["keras"])
    # What the mend said where it stepped aside (an untested release, source it cannot judge);
    # a Keras that carries the fix hangs for another reason.
    aside = [ln[len("[mwhelpers] "):] for r in waiting for ln in job.lines(r)
             if ln.startswith("[mwhelpers] ") and kerasmixed.ISSUE in ln]
    if any(kerasbase.CARRIES in ln for ln in aside):
        return None
    skipped = aside[0] if aside else None
    if skipped:
        why = f"mwhelpers' mend of it was not applied: {skipped}"
    elif any(not getattr(r, "keras_fix", True) for r in waiting):
        why = f"mwhelpers' Keras mends were turned off ({_FIX_OFF} or --no-keras-fix)"
    else:
        why = "the program did not get mwhelpers' mend of it"
    return Finding(
        "keras3-loss-scale",
        f"{_names(r.task for r in waiting)} waited inside TensorFlow, training with "
        f"mixed_float16 (LossScaleOptimizer) and {_names(sorted(kerases))} unmended: Keras 3 "
        "decides whether to "
        "skip a step from each worker's own gradients, before they are all-reduced, so when "
        "one worker's gradients overflow float16 it skips the step alone and the others wait "
        f"in that step's all-reduce for ever ({kerasmixed.ISSUE}); {why}",
        f"leave mwhelpers' Keras fix on (no --no-keras-fix, no {_FIX_OFF}): the workers then "
        "decide together and skip the step on all of them; a program mwhelpers did not start "
        "calls mwhelpers.fix_keras_multi_worker() before fit; or train in float32, or with "
        "tf_keras (TF_USE_LEGACY_KERAS=1), which all-reduces the gradients before it checks them")


def _source_text(run: TaskRun, file: str) -> str:
    """The text of ``file`` from a task's stack ('' when it cannot be read)."""
    for path in (file, run.script if _in_cell(run, file) else None):
        if path and os.path.isfile(path):
            try:
                return Path(path).read_text(encoding="utf-8", errors="replace")
            except OSError:
                pass
    return ""


def _in_cell(run: TaskRun, file: str) -> bool:
    """Whether ``file`` (from a task's stack) is the task's notebook cell."""
    return run.cell and (file == str(run.script) or os.path.basename(file) == "cell.py")


def _at(run: TaskRun, place: stacks.Where, source: bool = True) -> str:
    """'main.py line 10, in load: time.sleep(600)', or 'line 10 of the cell, ...'."""
    frame = place.frame
    text = f"line {frame.line} of the cell" if _in_cell(run, frame.file) else \
        f"{os.path.basename(frame.file)} line {frame.line}"
    if frame.func != "<module>":
        text += f", in {frame.func}"
    return text + (f": {place.source}" if source and place.source else "")


def _source_line(run: TaskRun, file: str, number: int) -> str:
    if os.path.isfile(file):
        return stacks.source_line(file, number)
    if _in_cell(run, file):  # a remote task's copy of the cell is cell.py there
        return stacks.source_line(run.script, number)
    return ""
