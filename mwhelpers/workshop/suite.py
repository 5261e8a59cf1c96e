"""Run notebooks headless: ``python -m mwhelpers.workshop.suite [--full] [-j N] [NOTEBOOK | FOLDER ...]``.

NOTEBOOK or FOLDER (its ``*.ipynb``); without any, the ``notebooks/`` folder of the
current directory, or of this checkout when mwhelpers runs from one.

Each notebook runs through papermill in a fresh kernel with its own empty
working directory (``output/work/<name>/``, passed as the ``workdir``
parameter when the notebook declares it), with its small default
parameters unless ``--full`` (``full_size=True``) or ``-p NAME VALUE`` say
otherwise.  Executed notebooks and an HTML rendering of each go to
``output/``, with each kernel's stderr (TensorFlow's C++ log lines) in
``output/<name>.stderr.log``.  Notebooks run side by side, one per CPU by default (``--jobs N``),
each in a process of its own, the ones that took longest in the last run
first (in a first run, those whose metadata says they usually take longest).
A summary table follows (wall and CPU seconds per notebook); the exit
status is non-zero when any notebook failed.  Every process a notebook's kernel started is ended when
the notebook is done, even when it failed half-way, and so is its temporary
folder (its ``TMPDIR``).

Notebooks that take ``ssh_hosts`` (the multi-host one) run against test hosts
that the suite makes for the run (``mwhelpers/workshop/testhosts.py``: network namespaces
with sshd and a one-box Slurm; root and Debian's openssh-server, slurm-wlm and
munge needed), unless ``-p ssh_hosts H1,H2`` names real ones.  Where test
hosts cannot be made, the suite says why and those notebooks run their local
part only.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import os
import re
import secrets
import shutil
import sys
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import logging

ROOT = Path(__file__).resolve().parents[2]
# This checkout, when mwhelpers runs from one (not from an installed wheel).
CHECKOUT = ROOT if (ROOT / "pyproject.toml").is_file() and (ROOT / "notebooks").is_dir() else None
SUITE_ENV = "MWHELPERS_SUITE_RUN"
# run_timed's arguments: the notebook, the output folder, its parameters, its run's mark, and
# the parameters it gets only if it declares them. A parameter's value is a Python literal (or
# the text given) that papermill writes into the notebook: only passed through here.
Job = tuple[Path, Path, dict[str, object], str, dict[str, object]]
# run_timed's result: the notebook, its error or None, its seconds and CPU seconds.
Done = tuple[Path, str | None, float, float]


class SuiteError(Exception):
    """A notebook cannot be run as asked (no parameters cell, unknown parameter)."""


def declared_parameters(path: Path) -> list[str]:
    """The names the notebook's ``parameters`` cell declares; SuiteError if it has none."""
    import nbformat

    nb = nbformat.read(path, as_version=4)
    cells = [c for c in nb.cells if "parameters" in c.get("metadata", {}).get("tags", [])]
    if not cells:
        raise SuiteError(f"{path.name} has no cell tagged 'parameters'; papermill needs one "
                         "to pass sizes and the working directory")
    if len(cells) > 1:
        raise SuiteError(f"{path.name} has {len(cells)} cells tagged 'parameters'; keep one")
    names = []
    for node in ast.parse(cells[0].source).body:
        targets = node.targets if isinstance(node, ast.Assign) else \
            [node.target] if isinstance(node, ast.AnnAssign) else []
        names += [t.id for t in targets if isinstance(t, ast.Name)]
    return names


def parse_value(text: str) -> object:
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def with_root_on_path(pythonpath: str) -> str:
    """``pythonpath`` with this checkout first (kernels must import this mwhelpers); as it
    was when mwhelpers is installed."""
    if CHECKOUT is None:
        return pythonpath
    parts = [p for p in pythonpath.split(os.pathsep) if p and Path(p).resolve() != CHECKOUT]
    return os.pathsep.join([str(CHECKOUT), *parts])


def find_notebooks(names: Sequence[str | os.PathLike[str]]) -> list[Path]:
    """The notebooks named (files, or folders whose ``*.ipynb`` count); SuiteError with what
    to do when a name is neither or nothing is found."""
    if not names:
        here = Path.cwd() / "notebooks"
        folder = here if here.is_dir() else (CHECKOUT / "notebooks" if CHECKOUT else None)
        if folder is None:
            raise SuiteError("no notebook folder here: name the notebooks or their folder, "
                             "e.g. python -m mwhelpers.workshop.suite path/to/notebooks")
        names = [folder]
    paths = []
    for name in names:
        path = Path(name).resolve()
        if path.is_dir():
            found = sorted(path.glob("*.ipynb"))
            if not found:
                raise SuiteError(f"{path} has no notebooks (*.ipynb) to run")
            paths += found
        elif path.is_file() and path.suffix == ".ipynb":
            paths.append(path)
        elif path.is_file():
            raise SuiteError(f"{path} is not a notebook (.ipynb)")
        else:
            raise SuiteError(f"no notebook or folder {path}")
    return paths


# A notebook's kernel has exited when papermill returns; its tasks end on their own within
# moments (each task's guard sees the kernel's pipe close). Only what is still there after
# this grace is a leak.
LEFTOVER_GRACE = 3.0


def end_leftovers(run_id: str) -> list[str]:
    """End processes that carry this suite run's mark (a notebook's leaked workers), after
    :data:`LEFTOVER_GRACE` for those on their way out; return what each one was."""
    import psutil

    from ..ending import end
    from ..proctree import Policy, carrying, wait_gone

    left = wait_gone(carrying(SUITE_ENV, run_id, exclude={os.getpid()}), LEFTOVER_GRACE)
    named = []
    for p in left:
        try:
            named.append(f"pid {p.pid} {' '.join(p.cmdline())[:160]}")
        except psutil.Error:
            named.append(f"pid {p.pid}")
    end(local=left, policy=Policy.GENTLE)
    return named


@contextlib.contextmanager
def stderr_to(path: Path) -> Iterator[None]:
    """Point file descriptor 2 at ``path`` while papermill runs.

    The kernel (and TensorFlow's C++ logging in it) inherits this process's
    stderr; without this, every kernel's log lines would flood the console.
    """
    sys.stderr.flush()
    saved = os.dup(2)
    with open(path, "wb") as log:
        os.dup2(log.fileno(), 2)
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)


@contextlib.contextmanager
def test_hosts(paths: Sequence[Path], params: Mapping[str, object]) -> Iterator[dict[str, object]]:
    """Parameters for the notebooks that take ``ssh_hosts``: test hosts made for this
    run (ended afterwards), or nothing when the user named hosts or none can be made."""
    takers = [p for p in paths if _takes_hosts(p)]
    if not takers or "ssh_hosts" in params:
        yield {}
        return
    names = ", ".join(p.name for p in takers)
    from . import testhosts as hosts_mod

    why = hosts_mod.missing(slurm=True)
    if why:
        print(f"note: no test hosts ({why}); {names} run(s) the local part only")
        yield {}
        return
    saved = dict(os.environ)
    with hosts_mod.TestHosts(2, slurm=True) as h:
        print(f"test hosts for {names}: " + ", ".join(f"{n} ({h.addresses[n]})" for n in h.names),
              flush=True)
        os.environ.update(h.env())  # the kernels find the hosts' ssh config and slurm.conf
        try:
            yield {"ssh_hosts": ",".join(h.names), "use_slurm": True}
        finally:
            os.environ.clear()
            os.environ.update(saved)


def _takes_hosts(path: Path) -> bool:
    try:
        return "ssh_hosts" in declared_parameters(path)
    except SuiteError:
        return False


def run_notebook(path: Path, out_dir: Path, params: Mapping[str, object], run_id: str,
                 optional: Mapping[str, object] | None = None) -> str | None:
    import papermill
    from papermill.exceptions import PapermillExecutionError

    out_nb = out_dir / path.name
    for stale in (out_nb, out_nb.with_suffix(".html")):  # the last run's, if this one fails early
        stale.unlink(missing_ok=True)
    declared = declared_parameters(path)
    unknown = sorted(set(params) - set(declared))
    params = dict(params, **{k: v for k, v in (optional or {}).items() if k in declared})
    if unknown:
        raise SuiteError(f"{path.name} does not declare the parameter(s) {', '.join(unknown)}; "
                         f"it declares: {', '.join(declared) or 'none'}")
    workdir = out_dir / "work" / path.stem
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    params = dict(params)
    if "workdir" in declared:
        params["workdir"] = str(workdir)
    kernel_log = out_dir / f"{path.stem}.stderr.log"
    error = None
    try:
        with stderr_to(kernel_log):
            papermill.execute_notebook(
                str(path), str(out_nb), parameters=params, cwd=str(workdir),
                kernel_name="python3", language="python", progress_bar=False, log_output=False,
                request_save_on_cell_execute=True,
            )
    except PapermillExecutionError as e:
        error = (f"cell {e.exec_count}: {e.ename}: {e.evalue.splitlines()[0] if e.evalue else ''}"
                 f" (kernel stderr: {kernel_log})")
    finally:
        leaked = end_leftovers(run_id)
    if leaked and not error:
        error = (f"left {len(leaked)} process(es) running after it finished (ended now): "
                 + "; ".join(leaked))
    return error


def run_timed(path: Path, out_dir: Path, params: Mapping[str, object], run_id: str,
              optional: Mapping[str, object] | None) -> Done:
    """Run one notebook with this run's mark; (path, error or None, seconds, CPU seconds).

    ``run_id`` is the notebook's own mark, so its leftovers are told apart
    from those of a notebook running beside it.  The CPU seconds are this
    process's and those of every process it waited for meanwhile: the kernel,
    which waits for the workers it started, and so on down.
    """
    _no_dead_kernel_reports()
    os.environ[SUITE_ENV] = run_id  # inherited by the kernel and every worker it starts
    # The kernel runs in the output folder; as under Jupyter Server, this names the notebook
    # it runs (ipykernel shows it as __session__), so the notebook can find files beside it.
    os.environ["JPY_SESSION_NAME"] = str(path)
    t0, cpu0 = time.monotonic(), cpu_seconds()
    try:
        with own_temporary_folder():
            error = run_notebook(path, out_dir, params, run_id, optional=optional)
    except SuiteError as e:
        error = str(e)
    except Exception as e:  # papermill or the kernel broke: report it, run the rest
        error = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    return path, error, time.monotonic() - t0, cpu_seconds() - cpu0


@contextlib.contextmanager
def own_temporary_folder() -> Iterator[None]:
    """``TMPDIR`` for the kernel and all it starts: a new folder, removed afterwards.

    A worker that is killed (the notebooks kill some on purpose) leaves the temporary files
    it had not removed yet: TensorFlow's autograph writes one module per traced function
    (``tensorflow/python/autograph/pyct/loader.py``) and removes it only at the process's
    exit.  The folder's path stays short, as Unix socket paths under it must.
    """
    import tempfile

    saved = os.environ.get("TMPDIR")
    folder = tempfile.mkdtemp(prefix="mws-")  # in this process's own temporary folder
    os.environ["TMPDIR"] = folder
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = saved
        shutil.rmtree(folder, ignore_errors=True)


def _not_a_dead_kernel(record: logging.LogRecord) -> bool:
    exc = record.exc_info[1] if record.exc_info else None
    return type(exc).__name__ != "DeadKernelError"


def _no_dead_kernel_reports() -> None:
    """After a Ctrl-C, the kernel ends under nbclient's feet and a task of nbclient's that
    nobody awaits any more fails with DeadKernelError; asyncio would print it as "Task
    exception was never retrieved" with a traceback, under the suite's own one-line
    summary.  Leave those out (other asyncio reports stay)."""
    import logging

    asyncio_log = logging.getLogger("asyncio")
    if _not_a_dead_kernel not in asyncio_log.filters:
        asyncio_log.addFilter(_not_a_dead_kernel)


def cpu_seconds() -> float:
    """User + system CPU seconds of this process and of its waited-for descendants."""
    import resource

    return sum(u.ru_utime + u.ru_stime for u in (resource.getrusage(resource.RUSAGE_SELF),
                                                  resource.getrusage(resource.RUSAGE_CHILDREN)))


def run_all(jobs: Sequence[Job], parallel: int) -> Iterator[Done]:
    """Run ``jobs`` (run_timed's arguments), ``parallel`` at a time; yield results as they end.

    With more than one at a time, each notebook runs in a process of its own
    (kernel stderr goes to its file through this process's descriptor 2, and
    that cannot be shared); this process renders each one's HTML (:func:`with_html`) while
    the next notebook starts in that process.
    """
    parallel = min(parallel, len(jobs))
    if parallel <= 1:
        for job in jobs:
            print(f"{job[0].name} ...", flush=True)
            yield with_html(run_timed(*job), job[1])
        return
    import concurrent.futures
    import multiprocessing

    pool = concurrent.futures.ProcessPoolExecutor(
        max_workers=parallel, mp_context=multiprocessing.get_context("spawn"))
    with pool:
        pending = {pool.submit(run_timed, *job): job for job in jobs}
        print(f"running {len(jobs)} notebooks, {parallel} at a time ...", flush=True)
        try:
            for done in concurrent.futures.as_completed(pending):
                path, out_dir, _, run_id, _ = pending[done]
                try:
                    result = done.result()
                except Exception as e:  # its process died: report it, end what it left
                    end_leftovers(run_id)
                    yield path, f"the process running it failed: {type(e).__name__}: {e}", 0.0, 0.0
                    continue
                yield with_html(result, out_dir)
        finally:  # interrupted: the notebooks not done may have left processes
            unfinished = [job for future, job in pending.items() if not future.done()]
            for future in pending:
                future.cancel()
            for *_, run_id, _ in unfinished:
                end_leftovers(run_id)


def with_html(done: Done, out_dir: Path) -> Done:
    """``done`` once the executed notebook's HTML is written beside it; a rendering that
    fails is that notebook's error (when it has none), not the end of the run."""
    path, error, seconds, cpu = done
    executed = out_dir / path.name
    if executed.exists():
        try:
            write_html(executed)
        except Exception as e:  # nbconvert broke
            error = error or f"its HTML could not be written: {type(e).__name__}: {e}"
    return path, error, seconds, cpu


def write_html(nb_path: Path) -> None:
    import nbformat
    from nbconvert import HTMLExporter

    body, _ = HTMLExporter().from_notebook_node(nbformat.read(nb_path, as_version=4))
    nb_path.with_suffix(".html").write_text(body, encoding="utf-8")


def longest_first(paths: Iterable[Path], out_dir: Path) -> list[Path]:
    """``paths`` ordered by how long each took in the last run recorded in ``out_dir``,
    longest first, so that with several at a time a long notebook does not start last
    and run alone.  A notebook with no run there goes by the seconds it says it usually
    takes (:data:`USUAL_SECONDS` in its metadata), so a fresh checkout's first run is in that
    order too.  Unknown ones come first of all: those that take ``ssh_hosts``
    first (they spend much of their time waiting on other machines, which the
    notebooks beside them fill), then in name order."""
    import json

    def seconds(path: Path) -> float:
        try:
            meta = json.loads((out_dir / path.name).read_text(encoding="utf-8"))["metadata"]
            return float(meta["papermill"]["duration"])
        except OSError:  # never run into out_dir
            return usual_seconds(path)
        except (ValueError, KeyError, TypeError):  # it failed half-way: first, to see it soon
            return float("inf")

    return sorted(paths, key=lambda p: (-seconds(p), not _takes_hosts(p), p.name))


# metadata.mwhelpers.usual_seconds: what a notebook took alone in a whole suite run at its default
# sizes (bench_suite.py --record-usual, one notebook at a time); the order of a first run and
# the notebook's "Before you start" box depend on it.
USUAL_SECONDS = ("mwhelpers", "usual_seconds")


def usual_seconds(path: Path) -> float:
    """The seconds ``path`` says it usually takes (inf where it does not say)."""
    import json

    try:
        meta = json.loads(path.read_text(encoding="utf-8"))["metadata"]
        return float(meta[USUAL_SECONDS[0]][USUAL_SECONDS[1]])
    except (OSError, ValueError, KeyError, TypeError):
        return float("inf")


# A notebook's "Before you start" box: the markdown cell tagged SETUP_TAG after its title, a
# table of what it needs and how long it takes; bench_suite.py --record-usual rewrites the
# second with usual_seconds (tests/inprocess/test_tutorial_shape.py checks that they agree).
SETUP_TAG = "setup"
TAKES_ROW = re.compile(r"^\| It takes \| about (\d+) s on (\d+) CPU cores? at the default sizes, "
                       r"where `import tensorflow` takes ([\d.]+) CPU-s \(measured "
                       r"(\d{4}-\d\d-\d\d)\) \|$", re.M)


def takes_row(seconds: float, cores: int, import_cpu: float, measured: str) -> str:
    """The box's row for a notebook that took ``seconds`` on ``cores`` CPU cores in the suite
    run of the day ``measured`` (YYYY-MM-DD), rounded to 5 s, on a machine where one
    ``import tensorflow`` took ``import_cpu`` CPU seconds (machines differ by 2x and more:
    with it, a learner can scale the time to theirs)."""
    return (f"| It takes | about {max(5, 5 * round(seconds / 5))} s on {cores} CPU "
            f"core{'s' if cores != 1 else ''} at the default sizes, where `import tensorflow` "
            f"takes {import_cpu:.1f} CPU-s (measured {measured}) |")


def default_jobs() -> int:
    """One notebook at a time per CPU, up to four.

    A notebook alone leaves the CPUs idle much of the time (its kernel waits for
    a worker to start, for peers, for timeouts); a second one fills that time.
    Beyond one per CPU nothing is gained: every worker is a TensorFlow process
    that spends seconds of CPU importing TensorFlow. Measured on 2 cores: one at
    a time kept them 60% busy, two at a time 88%, three 97% for the same time; in
    a later run, longest first, three at a time took 10% longer than two.
    """
    return max(1, min(4, os.cpu_count() or 1))


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python3 dev.py suite", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("notebooks", nargs="*", metavar="NOTEBOOK_OR_FOLDER",
                   help="notebooks, or folders of notebooks, to run (default: ./notebooks, or this "
                        "checkout's notebooks/)")
    p.add_argument("--full", action="store_true", help="full-size runs (full_size=True)")
    p.add_argument("-p", nargs=2, action="append", default=[], metavar=("NAME", "VALUE"),
                   help="set a parameter in every notebook")
    p.add_argument("--output", default=str((CHECKOUT or Path.cwd()) / "output"),
                   help="where results go (default: output/ of this checkout, or of the current "
                        "directory)")
    p.add_argument("-j", "--jobs", type=int, default=default_jobs(),
                   help="notebooks run at the same time (default: %(default)s, from the CPU count)")
    a = p.parse_args(argv)
    if a.jobs < 1:
        p.error(f"--jobs must be 1 or more, not {a.jobs}")

    try:
        paths = find_notebooks(a.notebooks)
    except SuiteError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    params = {name: parse_value(value) for name, value in a.p}
    if a.full:
        params["full_size"] = True
    out_dir = Path(a.output).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    run_id = secrets.token_hex(6)
    os.environ["PYTHONPATH"] = with_root_on_path(os.environ.get("PYTHONPATH", ""))

    rows = []
    total = time.monotonic()
    with test_hosts(paths, params) as host_params:
        order = longest_first(paths, out_dir) if a.jobs > 1 else paths
        jobs = [(path, out_dir, params, f"{run_id}.{i}", host_params)
                for i, path in enumerate(order, 1)]
        try:
            for i, (path, error, dt, cpu) in enumerate(run_all(jobs, a.jobs), 1):
                status = "ok" if error is None else "FAILED"
                print(f"[{i}/{len(paths)}] {path.name}: {status} in {dt:.1f} s"
                      + (f"\n    {error}" if error else ""), flush=True)
                rows.append((path.name, status, f"{dt:.1f}", f"{cpu:.1f}", error or ""))
        except KeyboardInterrupt:
            print(f"\ninterrupted after {len(rows)} of {len(paths)} notebook(s); every process "
                  "the running ones had started was ended", flush=True)
            return 130
    rows.sort()

    width = max(len(r[0]) for r in rows)
    print(f"\n{'notebook'.ljust(width)}  status  seconds  CPU s  error")
    for name, status, secs, cpu_text, err in rows:
        print(f"{name.ljust(width)}  {status:<6}  {secs:>7}  {cpu_text:>5}  {err}")
    failed = sum(r[1] != "ok" for r in rows)
    cpu = sum(float(r[3]) for r in rows)
    print(f"\n{len(rows) - failed} passed, {failed} failed in {time.monotonic() - total:.1f} s "
          f"({cpu:.0f} CPU s); "
          f"executed notebooks and HTML in {out_dir}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
