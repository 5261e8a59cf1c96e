"""Entry point of every worker process: ``python -u _bootstrap.py [--cell] SCRIPT [ARGS...]``.

It runs in the worker's own interpreter before the user's program, costs no
extra process, and imports nothing heavy.  It:

* arms the parent-death guard: the launching kernel holds the write end of a
  pipe whose read end is ``MWHELPERS_GUARD_FD`` here.  When the kernel dies
  for any reason (exit, restart, SIGKILL) the pipe reaches end-of-file and a
  daemon thread kills this worker's whole process group with SIGKILL;
* has a thread write the Python stacks of every thread to the log for each byte that
  arrives on the pipe ``MWHELPERS_DUMP_FD`` (how the local backend, and the agent over SSH
  and Slurm, ask before they end a stuck task).  The thread holds the interpreter's lock
  while it writes, so no thread can end under it.  It also registers ``faulthandler`` on
  SIGUSR1, which writes them from a signal handler, without that lock: that works where a
  thread holds the lock for good, and can crash the process (SIGSEGV) when a thread ends
  meanwhile, so it is the fallback;
* unless ``MWHELPERS_STALL_FIX=0``, arranges for MultiWorkerMirroredStrategy's
  input pipelines to run without tf.data autotuning, so that ``fit`` ends when
  training ends (``tfdata.py`` beside this file; nothing is imported until
  the program imports TensorFlow itself);
* unless ``MWHELPERS_KERAS_FIX=0``, mends Keras 3 ``fit`` and its checkpointing
  callbacks for multi-worker MultiWorkerMirroredStrategy once the program loads
  Keras (``kerasfix.py``, keras-team/keras#20585);
* unless ``MWHELPERS_LAZY_PYPLOT=0``, lets Keras's own ``import matplotlib.pyplot``
  wait until a plot needs it (``lazyplot.py``: 0.4 s of CPU at every start);
* unless ``MWHELPERS_LAZY_JAX=0``, lets TensorFlow Lite's ``import jax`` wait until JAX is
  used (``lazyjax.py``: about 3 s of CPU at every start where JAX is installed);
* once the program imports JAX, has JAX's gloo CPU collectives listen on the address TF_CONFIG
  names for this task rather than on what the machine's name resolves to, often loopback
  (``jaxgloo.py``; ``MWHELPERS_JAX_GLOO_HOST=0`` leaves JAX's choice);
* unless ``MWHELPERS_LAYOUT_CHECK=0``, reads a ``ModelParallel`` LayoutMap against the model
  before its first step, Keras on JAX, and says which rule matches no variable and which large
  variable no rule shards (``keraslayout.py``);
* once the program has imported TensorFlow, writes one line saying which
  TensorFlow and Keras it got (``taskfacts.py``), for the failure diagnosis;
* with ``--standby`` (``supervise(standby=True)``: the next attempt's process started
  ahead, while the current attempt runs), imports TensorFlow, then waits until the kernel
  releases it (a byte on the pipe ``MWHELPERS_STANDBY_FD``) and says so in one line; end of
  file (no restart came) ends it quietly;
* with ``--zygote`` (the local backend's warm start, :mod:`mwhelpers.warmstart`), becomes the
  server ``_forkserver.py`` beside this file: it arms the import hooks, imports TensorFlow
  (Keras first, where the programs do that on another backend) and forks every task from
  there; what follows happens in each forked task;
* runs SCRIPT as ``__main__`` with ``sys.argv`` and ``sys.path[0]`` set the way
  ``python SCRIPT ARGS`` would set them.  With ``--cell``, SCRIPT holds the
  code of a ``%%worker`` cell and ``sys.path[0]`` is the working directory,
  as for ``python -c CODE``: modules written beside the notebook import;
* when the program ends by an exception that makes the exit code other than 0 (an
  uncaught exception, ``sys.exit(3)``, ``sys.exit("message")``, a KeyboardInterrupt),
  writes how it ended to the JSON file that ``MWHELPERS_EXIT_RECORD`` names (taken out of
  the environment before the program runs): ``type`` (qualified as the traceback's last
  line names it), ``message``, ``traceback`` (the program's frames, formatted as Python
  prints them), ``time`` (``time.time()``), ``pid`` and ``exit_code`` (as ``subprocess``
  reports it: negative for a signal).  It is written beside and renamed into place; what
  the program prints and its exit code stay as they were.

This file is run by path, never imported as part of the package, so the
worker needs no installed mwhelpers.
"""

import builtins
import faulthandler
import importlib.util
import os
import signal
import sys
import threading
import time
import types

# No ``from __future__ import annotations`` here: main's compile() would pass it on to the
# user's program.  The annotations below are ones every Python 3 evaluates.

# The names of the variables read here, and the exit record's form: wire.py beside this file,
# which the kernel reads too (_load("wire").Env).
_exit_record = ""  # where this task's record goes ('': nowhere), read by main()


def _arm_guard() -> None:
    fd_text = os.environ.pop(_load("wire").Env.GUARD_FD, "")
    if not fd_text:
        return
    fd = int(fd_text)
    os.set_inheritable(fd, False)  # children of the worker need not hold it

    def watch() -> None:
        try:
            while os.read(fd, 1):
                pass
        except OSError:
            pass
        # The kernel that launched us is gone: end our whole process group.
        try:
            os.killpg(os.getpgrp(), signal.SIGKILL)
        finally:
            os._exit(137)

    threading.Thread(target=watch, name="mwhelpers-parent-guard", daemon=True).start()


def _arm_dumper() -> None:
    """Each byte on ``MWHELPERS_DUMP_FD``: every thread's stack to standard error."""
    fd_text = os.environ.pop(_load("wire").Env.DUMP_FD, "")
    if not fd_text:
        return
    fd = int(fd_text)
    os.set_inheritable(fd, False)
    try:
        out = sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):
        out = 2

    def dump() -> None:
        try:
            while os.read(fd, 1):
                faulthandler.dump_traceback(file=out, all_threads=True)
        except OSError:
            pass
        finally:
            os.close(fd)

    threading.Thread(target=dump, name="mwhelpers-stack-dumper", daemon=True).start()


PACKAGE = "_mwhelpers_taskside"  # this folder, imported by path under a name of its own


def _load(name: str) -> types.ModuleType:
    """The module ``name`` of this folder, imported as part of it (its modules import each
    other relatively) without the mwhelpers package."""
    if PACKAGE not in sys.modules:
        here = os.path.dirname(os.path.abspath(__file__))
        spec = importlib.util.spec_from_file_location(
            PACKAGE, os.path.join(here, "__init__.py"), submodule_search_locations=[here])
        assert spec is not None and spec.loader is not None  # a .py file always has both
        package = importlib.util.module_from_spec(spec)
        sys.modules[PACKAGE] = package
        spec.loader.exec_module(package)
    return importlib.import_module(f"{PACKAGE}.{name}")


def _arm_import_hooks() -> None:
    tfdata = _load("tfdata")
    if tfdata.stall_fix_wanted(os.environ):
        tfdata.install_import_hook()
    kerasfix = _load("kerasfix")
    if kerasfix.fix_wanted(os.environ):
        kerasfix.install(tfdata.after_import)
    tfdata.after_import("tensorflow", _load("taskfacts").say)
    _load("jaxgloo").install(tfdata.after_import)
    lazyplot = _load("lazyplot")
    if tfdata.switched_on(os.environ, lazyplot.ENV):
        lazyplot.install(tfdata.wrapped_spec)
    lazyjax = _load("lazyjax")
    if tfdata.switched_on(os.environ, lazyjax.ENV):
        lazyjax.install(tfdata.wrapped_spec)
    keraslayout = _load("keraslayout")
    if tfdata.switched_on(os.environ, keraslayout.ENV):
        keraslayout.install(tfdata.after_import)
    kerasorbax = _load("kerasorbax")
    if tfdata.switched_on(os.environ, kerasorbax.ENV):
        kerasorbax.install(tfdata.after_import)


def _wait_as_standby() -> None:
    """Import TensorFlow now, then wait for the kernel's word: a byte on
    ``MWHELPERS_STANDBY_FD`` (b"x": the agent found the task's port taken and said so in the
    log) or end of file (not needed: leave quietly)."""
    fd = int(os.environ.pop(_load("wire").Env.STANDBY_FD))
    os.set_inheritable(fd, False)
    try:
        import tensorflow  # noqa: F401  (what a restart would otherwise wait for)
    except Exception:  # the program's own import says what is wrong, as in a cold start
        pass
    try:
        word = os.read(fd, 1)
    except OSError:
        word = b""
    if not word:
        os._exit(0)
    if word == b"x":
        os._exit(1)
    os.close(fd)
    sys.stderr.write("[mwhelpers] this process was started ahead as a standby and TensorFlow "
                     "was imported before the program ran (supervise(standby=True))\n")
    sys.stderr.flush()


def _serve_as_zygote() -> None:
    """Import TensorFlow with the hooks armed, then fork tasks; returns only in a forked task,
    with that task's ``sys.argv``, environment, folder and log (``_forkserver.py``)."""
    # _bootstrap.py --zygote FD FIRST ROOM (FIRST: the module to import before TensorFlow, as
    # the tasks' programs do; ROOM: for the tasks' titles)
    ctl_fd, first = int(sys.argv[2]), sys.argv[3]

    def import_first() -> None:
        _arm_import_hooks()
        __import__(first)
        import tensorflow  # noqa: F401  (once, for every task forked from here)

    _load("_forkserver").run(ctl_fd, os.path.abspath(__file__), import_first)


def exit_code_of(exc: BaseException) -> int:
    """The exit code that ``exc``, uncaught, gives this process, as ``subprocess`` says it."""
    if isinstance(exc, SystemExit):
        code = exc.code
        if code is None:
            return 0
        return code & 0xFF if isinstance(code, int) else 1  # Python prints any other value
    if isinstance(exc, KeyboardInterrupt):  # Python ends itself with SIGINT then
        return -signal.SIGINT
    return 1


def _qualified(cls: type) -> str:
    """The exception's name as a traceback's last line gives it."""
    module = getattr(cls, "__module__", None)
    name = getattr(cls, "__qualname__", cls.__name__)
    return name if module in (None, "builtins", "__main__") else f"{module}.{name}"


def _record_exit(exc: BaseException) -> None:
    """Write how the program ended to :data:`_exit_record`, when set and the exit is not 0;
    never raises, prints nothing."""
    path = _exit_record
    code = exit_code_of(exc)
    if not path or code == 0:
        return
    try:
        import traceback  # (here: a program that succeeds does not pay for it)

        tb = exc.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
            tb = tb.tb_next  # this file's frames: the program's own start here
        try:
            message = str(exc)
        except Exception:
            message = f"<the {type(exc).__name__}'s str() failed>"
        formatted = "".join(traceback.format_exception(type(exc), exc, tb or exc.__traceback__))
        record = _load("wire").ExitRecord(
            type=_qualified(type(exc)), message=message, traceback=formatted, time=time.time(),
            pid=os.getpid(), exit_code=code)
        partial = f"{path}.{os.getpid()}.part"
        with open(partial, "w", encoding="utf-8") as f:
            f.write(record.dumps())
        os.replace(partial, path)
    except Exception:  # nowhere to write it: the log still has what the program printed
        pass


def main() -> int:
    global _exit_record
    zygote = sys.argv[1:2] == ["--zygote"]
    if zygote:
        _serve_as_zygote()
    # (here, a forked task has its own environment)
    _exit_record = os.environ.pop(_load("wire").Env.EXIT_RECORD, "")
    flags = set()
    while len(sys.argv) > 1 and sys.argv[1] in ("--cell", "--standby"):
        flags.add(sys.argv.pop(1))
    cell = "--cell" in flags
    if len(sys.argv) < 2:
        sys.stderr.write("usage: _bootstrap.py [--standby] [--cell] SCRIPT [ARGS...]\n")
        return 2
    _arm_guard()
    _arm_dumper()
    faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)
    if not zygote:  # a forked task has them from its server
        _arm_import_hooks()
    if "--standby" in flags:
        _wait_as_standby()
    script = sys.argv[1]
    sys.argv = sys.argv[1:]
    # python SCRIPT puts the script's folder first on sys.path; python -c puts ''.
    sys.path[0] = "" if cell else os.path.dirname(os.path.abspath(script))
    with open(script, "rb") as f:
        source = f.read()
    code = compile(source, script, "exec")
    # A fresh __main__ module, as ``python SCRIPT`` would give: the user's
    # program does not see this file's names.
    module = types.ModuleType("__main__")
    module.__file__ = script
    module.__builtins__ = builtins  # type: ignore[attr-defined]  # as __main__ has them
    sys.modules["__main__"] = module
    exec(code, module.__dict__)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BaseException as e:
        _record_exit(e)
        raise
