"""Warm starts: the local backend forks a task from a process that has imported TensorFlow
already, instead of starting a fresh interpreter that imports it again.

Importing TensorFlow costs every task about 3 s of CPU (``python -c "import tensorflow"``
under ``/usr/bin/time``: 2.9 to 3.1 s here), more than a short job's training;
``benchmarks/bench_warmstart.py`` measures what forking saves.  A :class:`WarmStarter` (one
per runtime, shared by its local launchers: :class:`mwhelpers.services.Services`) keeps, for
each environment its tasks start from, a server process (``_forkserver.py``, run as
``_bootstrap.py --zygote``) that imported TensorFlow once; each task is then forked from it
and goes on as a cold start would after its own ``import tensorflow``.

A task is started cold (a fresh interpreter, as before) when:

* ``MWHELPERS_WARM_START=0`` is in its environment, or this is not Linux;
* its program does not import ``tensorflow``, ``keras`` or ``tf_keras`` itself (a top-level
  ``import`` or ``from`` line): nothing would be gained;
* its program writes to ``os.environ`` (or calls ``putenv``), other than ``TF_CONFIG``,
  ``XLA_FLAGS`` and, where TensorFlow was built without GPU support, ``CUDA_VISIBLE_DEVICES``
  (:data:`READ_AFTER_IMPORT`, :data:`GPU_BUILD_ONLY`): TensorFlow reads
  some variables while it is imported (``TF_USE_LEGACY_KERAS``, ``TF_CPP_MIN_LOG_LEVEL``...),
  and a program that sets them before its import must get its own import.  Writes below its
  first top-level ``import tensorflow`` do not count (:func:`before_tensorflow`): they run
  after the import in a cold start too.  Nor do literal settings above it, in a program that
  does nothing else there but import standard modules (:func:`literal_prelude`): its server
  imports TensorFlow with them (:func:`server_env`);
* the server could not import TensorFlow (the cold start then shows the program's own error).

Everything in a task's environment but what differs from task to task (``TF_CONFIG`` and
mwhelpers' own per-task variables, :data:`PER_TASK`) is part of the key, and the folder only
where it can change the import (:func:`folder_matters`). Tasks with another key get another
server, unless their environment differs from a server's only in what its own import set (a
kernel that imported TensorFlow since), in ``XLA_FLAGS``, or, where it did not load JAX, in
``JAX_*`` variables (:func:`same_import`).  The local launchers of one runtime share their
servers: a new cluster forks from the server the last one used.  They end with the runtime.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import io
import os
import re
import select
import socket
import subprocess
import sys
import threading
import time
import tokenize
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, NamedTuple

import psutil

from . import proctree, settings
from .ending import end
from .taskside import wire
from .taskside.wire import Env

ENV = "MWHELPERS_WARM_START"
# What differs from one task to the next and is read after TensorFlow's import, never during it.
PER_TASK = frozenset({"TF_CONFIG", *Env.PER_TASK,  # and keras.distribution's, read at initialize()
                      "KERAS_DISTRIBUTION_JOB_ADDRESSES", "KERAS_DISTRIBUTION_NUM_PROCESSES",
                      "KERAS_DISTRIBUTION_PROCESS_ID"})
MAX_SERVERS = 3  # per process; the oldest is retired (it ends once its tasks have)
READY_TIMEOUT = 120.0  # seconds a server may take to import TensorFlow
FORK_TIMEOUT = 60.0  # seconds a forked task may take to say its pid (milliseconds, usually)

_IMPORTS_TF = re.compile(r"^[ \t]*(?:import|from)[ \t][^\n#]*\b(?:tensorflow|keras|tf_keras)\b",
                         re.MULTILINE)
# Writes to the environment: every one, and those that name their variable (each write is
# found once by each expression).  An alias of os.environ or a .env loader counts as a write.
_AUG = r"(?:[-+*/%&|^@]|//|<<|>>|\*\*)?=(?!=)"
_ENV_WRITE = re.compile(
    r"\benviron\s*\[[^\]\n]*\]\s*" + _AUG
    + r"|\bdel\s+[\w.]*\benviron\s*\["
    + r"|\benviron\s*\|="
    + r"|\benviron\s*\.\s*(?:update|setdefault|pop|popitem|clear|__setitem__|__delitem__|__ior__)\b"
    + r"|\b(?:putenv|unsetenv|load_dotenv)\b"
    + r"|(?<![=!<>])=\s*(?:os\s*\.\s*)?environ\b(?!\s*[\[.(])")
_ENV_WRITE_NAMED = re.compile(
    r"\benviron\s*\[\s*(['\"])(\w+)\1\s*\]\s*" + _AUG
    + r"|\bdel\s+[\w.]*\benviron\s*\[\s*(['\"])(\w+)\3\s*\]"
    + r"|\benviron\s*\.\s*(?:setdefault|pop|__setitem__|__delitem__)\(\s*(['\"])(\w+)\5")
# Variables read after TensorFlow's import, never during it.  TF_CONFIG: on demand
# (_load_tf_config).  XLA_FLAGS: at XLA's first compile and JAX's first backend (TF 2.21,
# JAX 0.10: a dump folder and a device count set after the imports and an eager op are used).
READ_AFTER_IMPORT = frozenset({"TF_CONFIG", "XLA_FLAGS"})
# ... and those that only a TensorFlow built for GPUs reads: a program that hides the GPUs
# before its import is forked where the server's TensorFlow has no GPU support (tensorflow-cpu).
GPU_BUILD_ONLY = frozenset({"CUDA_VISIBLE_DEVICES"})


def cold_reason(source: str, env: Mapping[str, str], gpu_build: bool = True) -> str | None:
    """Why a task whose program is ``source`` starts cold in ``env`` (None: it can be forked
    from a server whose TensorFlow is ``gpu_build``, built for GPUs or not)."""
    if not settings.WARM_START.read(env):
        return f"{ENV}=0"
    if not sys.platform.startswith("linux"):
        return "warm starts need Linux"
    if not _IMPORTS_TF.search(source):
        return "its program does not import TensorFlow or Keras itself"
    harmless = READ_AFTER_IMPORT if gpu_build else READ_AFTER_IMPORT | GPU_BUILD_ONLY
    prelude = literal_prelude(source)
    if prelude is None:
        written = env_written(before_tensorflow(source))
    else:  # the server sets these itself before its import (server_env); what comes after?
        lines = source.splitlines(keepends=True)
        rest = "".join(lines[prelude.end_line:len(before_tensorflow(source).splitlines())])
        written = env_written(rest)
    if written is None or written - harmless:
        named = ", ".join(sorted(written - harmless)) if written else "some"
        return (f"its program sets environment variables ({named}), which TensorFlow may read "
                "as it loads")
    return None


_IMPORTED_FIRST = ("tensorflow", "keras", "tf_keras")


@functools.lru_cache(maxsize=8)
def _statements(source: str) -> tuple[ast.stmt, ...] | None:
    """``source``'s top-level statements (None: it does not parse); parsed once for the rules
    that one launch applies to it."""
    try:
        return tuple(ast.parse(source).body)
    except (SyntaxError, ValueError):
        return None


def _imported(node: ast.stmt) -> list[str] | None:
    """The modules an absolute ``import`` or ``from ... import`` statement names (None: it is
    another statement)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if isinstance(node, ast.ImportFrom) and not node.level:
        return [node.module or ""]
    return None


class Prelude(NamedTuple):
    """What a program does before its first top-level import of TensorFlow or Keras, when
    that is only to import standard modules and to set variables to literal strings:
    the settings ``(name, value, only_if_unset)`` in order, and the line that import ends."""

    settings: tuple[tuple[str, str, bool], ...]
    end_line: int


def literal_prelude(source: str) -> Prelude | None:
    """``source``'s :class:`Prelude`; None when anything else runs before that import (a
    call, a computed value, a module outside the standard library), or there is none.

    Such a program starts warm from a server whose environment has those settings when it
    imports (:func:`server_env`): the common ``os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"`` or
    ``os.environ["KERAS_BACKEND"] = "jax"`` above ``import tensorflow`` or ``import keras``."""
    settings: list[tuple[str, str, bool]] = []
    for node in _statements(source) or ():
        if (names := _imported(node)) is not None:
            tops = {name.split(".")[0] for name in names}
            if tops & set(_IMPORTED_FIRST):
                return Prelude(tuple(settings), node.end_lineno or node.lineno)
            if not tops <= sys.stdlib_module_names:
                return None
        elif isinstance(node, ast.ImportFrom):  # a relative import
            return None
        elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            continue  # a docstring
        elif (setting := _literal_setting(node)) is not None:
            settings.append(setting)
        else:
            return None
    return None


def _os_environ(node: ast.expr) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr == "environ"
            and isinstance(node.value, ast.Name) and node.value.id == "os")


def _text(node: ast.expr) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _literal_setting(node: ast.stmt) -> tuple[str, str, bool] | None:
    """``os.environ["NAME"] = "VALUE"`` or ``os.environ.setdefault("NAME", "VALUE")``."""
    if (isinstance(node, ast.Assign) and len(node.targets) == 1
            and isinstance(target := node.targets[0], ast.Subscript)
            and _os_environ(target.value)):
        name, value = _text(target.slice), _text(node.value)
        if name is not None and value is not None:
            return name, value, False
    if (isinstance(node, ast.Expr) and isinstance(call := node.value, ast.Call)
            and isinstance(call.func, ast.Attribute) and call.func.attr == "setdefault"
            and _os_environ(call.func.value) and len(call.args) == 2 and not call.keywords):
        name, value = _text(call.args[0]), _text(call.args[1])
        if name is not None and value is not None:
            return name, value, True
    return None


def server_env(source: str, env: Mapping[str, str]) -> dict[str, str]:
    """The environment of the server a task of ``source`` forks from: ``env`` with its
    :class:`Prelude`'s settings, as they are when a cold start reaches its import."""
    out = dict(env)
    prelude = literal_prelude(source)
    for name, value, only_if_unset in prelude.settings if prelude else ():
        if not (only_if_unset and name in out):
            out[name] = value
    return out


def imported_first(source: str, env: Mapping[str, str]) -> str:
    """What a server for ``source`` imports first, in ``env`` (then TensorFlow): ``keras``
    where the program imports Keras before TensorFlow on another backend (``KERAS_BACKEND``),
    which Keras then imports instead, as in the program; ``tensorflow`` otherwise (Keras on
    TensorFlow imports it, and TensorFlow imports Keras)."""
    if env.get("KERAS_BACKEND", "tensorflow") == "tensorflow":
        return "tensorflow"
    for node in _statements(source) or ():
        for name in _imported(node) or ():
            if name.split(".")[0] in _IMPORTED_FIRST:
                return "keras" if name.split(".")[0] == "keras" else "tensorflow"
    return "tensorflow"


def before_tensorflow(source: str) -> str:
    """The part of ``source`` that can run before TensorFlow is imported: all of it, but for
    the lines after its first top-level ``import tensorflow`` (or ``from tensorflow ...``).
    A module's top-level statements run in order, so what follows that import runs after it,
    in a fork as in a cold start; a function defined above it may be called later and counts."""
    for node in _statements(source) or ():
        if any(name.split(".")[0] == "tensorflow" for name in _imported(node) or ()):
            end = node.end_lineno or node.lineno
            return "".join(source.splitlines(keepends=True)[:end])
    return source


def env_written(source: str) -> set[str] | None:
    """The variables ``source`` writes to ``os.environ`` (None: some it does not name)."""
    code = _without_comments(source)
    named = [m.group(2) or m.group(4) or m.group(6) for m in _ENV_WRITE_NAMED.finditer(code)]
    if sum(1 for _ in _ENV_WRITE.finditer(code)) > len(named):
        return None
    return set(named)


def _without_comments(source: str) -> str:
    """``source`` with its comments blanked (as it is, when it does not tokenize)."""
    lines = source.splitlines(keepends=True)
    try:
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            if tok.type == tokenize.COMMENT:
                (row, col), (_, end) = tok.start, tok.end
                line = lines[row - 1]
                lines[row - 1] = line[:col] + " " * (end - col) + line[end:]
    except (tokenize.TokenError, SyntaxError, IndexError):
        return source
    return "".join(lines)


def key_of(env: Mapping[str, str], cwd: str) -> tuple[str, tuple[tuple[str, str], ...]]:
    """What tasks forked from one server share: the environment but for :data:`PER_TASK`,
    and the folder where it can change what the import finds (:func:`folder_matters`)."""
    return (cwd if folder_matters(env) else "",
            tuple(sorted((k, v) for k, v in env.items() if k not in PER_TASK)))


def folder_matters(env: Mapping[str, str]) -> bool:
    """Whether a server's import depends on its folder: only where ``PYTHONPATH`` has a
    relative entry (made absolute against the folder at start) or an empty one (the folder).
    A server runs a script, so the folder is not on its path otherwise; its tasks move to
    their own folders."""
    given = env.get("PYTHONPATH") or ""
    return any(not os.path.isabs(entry) for entry in given.split(os.pathsep)) if given else False


class ImportEffects(NamedTuple):
    """What a server's import did, as it says when ready: the variables it set (to these
    values) and removed, and whether it loaded JAX itself (not only the stand-in of
    ``taskside/lazyjax.py``)."""

    env_set: Mapping[str, str]
    env_unset: frozenset[str]
    jax: bool


def same_import(server_env: Mapping[str, str], effects: ImportEffects, env: Mapping[str, str],
                gpu_build: bool = True) -> bool:
    """Whether a task whose environment at import is ``env`` imports as a server started with
    ``server_env`` did, though the two differ (beyond :data:`PER_TASK`).  They may differ only

    * where the server's import set a variable and ``env`` has it already, with the value the
      import gave it (or lacks one the import removed): a kernel that imported TensorFlow has
      ``TF2_BEHAVIOR=1`` and more in its environment since, and a cold start's import would
      set the same; the fork gets the server's values (``_forkserver.py``);
    * in ``JAX_*`` variables, where the server did not load JAX: JAX reads them when it is
      imported, in the task, from the task's environment (``JAX_CPU_COLLECTIVES_IMPLEMENTATION``
      is set for the tasks of a cluster of workers only);
    * in :data:`GPU_BUILD_ONLY`, where the server's TensorFlow has no GPU support (``gpu_build``);
    * in :data:`READ_AFTER_IMPORT` (``--env XLA_FLAGS=...``)."""
    for name in (set(server_env) | set(env)) - PER_TASK - READ_AFTER_IMPORT:
        theirs, mine = env.get(name), server_env.get(name)
        if theirs == mine:
            continue
        if name in effects.env_set and theirs == effects.env_set[name]:
            continue
        if name in effects.env_unset and theirs is None:
            continue
        if (name.startswith("JAX_") and not effects.jax) or (
                name in GPU_BUILD_ONLY and not gpu_build):
            continue
        return False
    return True


def _installed() -> tuple[tuple[str, int, int], ...]:
    """The files a server's import ran, as installed now (path, size, mtime): after an upgrade
    of TensorFlow (``%pip install``) or an edit of the start-up's hooks, tasks get a new server."""
    here = Path(__file__).parent / "taskside"
    paths = sorted(p for p in here.glob("*.py") if p.name != "_agent.py")
    try:
        spec = importlib.util.find_spec("tensorflow")
    except (ImportError, ValueError):
        spec = None
    if spec is not None and spec.origin:
        paths.append(Path(spec.origin))
    stamps = []
    for path in paths:
        try:
            st = path.stat()
        except OSError:
            continue
        stamps.append((str(path), st.st_size, st.st_mtime_ns))
    return tuple(stamps)


# A server's key: key_of's (folder or "", environment), what it imports first, _installed()'s files.
Key = tuple[tuple[str, tuple[tuple[str, str], ...]], str, tuple[tuple[str, int, int], ...]]


class _Server:
    """One warm-start server process and the control socket the kernel keeps to it."""

    def __init__(self, python: str, bootstrap: str, env: dict[str, str], cwd: str,
                 first: str = "tensorflow") -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.ctl = ours
        self.lock = threading.Lock()
        self.error: str | None = None
        self.gpu_build = True  # its TensorFlow was built for GPUs (said once it is ready)
        self.effects = ImportEffects({}, frozenset(), True)  # (said once it is ready)
        try:
            self.popen = subprocess.Popen(
                # The blank argument leaves room to show each task's own command line.
                [python, "-u", bootstrap, "--zygote", str(theirs.fileno()), first, " " * 4096],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                env=dict(env), cwd=cwd, start_new_session=True,
                pass_fds=(theirs.fileno(),))
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        try:
            self.ready = self._await_ready()
        except BaseException:  # interrupted while it imports: it goes too
            self.close(kill=True)
            raise

    def _await_ready(self) -> bool:
        ready, _, _ = select.select([self.ctl], [], [], READY_TIMEOUT)
        kind: wire.Fork | None = None
        reply: dict[str, Any] = {}
        data = b""
        try:
            data = self.ctl.recv(1 << 16) if ready else b""
            if data:
                kind, reply = wire.read_fork_message(data)
        except (OSError, ValueError) as e:
            reply = {"error": f"it said what the kernel cannot read ({e})"}
        if kind is wire.Fork.READY:
            self.gpu_build = bool(reply.get("gpu_build", True))
            self.effects = ImportEffects(dict(reply.get("env_set") or {}),
                                         frozenset(reply.get("env_unset") or ()),
                                         bool(reply.get("jax", True)))
            return True
        if not ready:
            self.error = f"no word within {READY_TIMEOUT:.0f} s"
        elif not data and not reply:
            code = self.popen.poll()
            self.error = "it ended before it was ready" + (
                f" (exit code {code})" if code is not None else "")
        elif kind is not None and kind is not wire.Fork.FAILED:
            self.error = f"it answered {kind.value} where ready was expected"
        else:
            self.error = reply.get("error") or "it failed without saying why"
        self.close(kill=True)
        return False

    @property
    def alive(self) -> bool:
        return self.ready and self.popen.poll() is None

    def fork(self, argv: list[str], env: Mapping[str, str], cwd: str, log_fd: int,
             passed: Mapping[str, int]) -> tuple[int, Callable[[], int]]:
        """Fork a task; its pid and a function that waits for its exit code.  OSError: this
        task could not be forked (start it cold); :class:`ServerGone`: nor can any other."""
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            request = wire.fork_message(wire.Fork.TASK, argv=argv, env=dict(env), cwd=cwd,
                                        **{"pass": list(passed)})
            with self.lock:
                try:
                    socket.send_fds(self.ctl, [request],
                                    [theirs.fileno(), log_fd, *passed.values()])
                except OSError as e:
                    raise ServerGone(f"the warm-start server takes no tasks ({e})") from e
            theirs.close()
            mine.settimeout(FORK_TIMEOUT)
            try:
                data = mine.recv(1 << 16)
            except TimeoutError as e:
                raise ServerGone(f"the warm-start server's task said no pid within "
                                 f"{FORK_TIMEOUT:g} s") from e
            if not data:
                raise ServerGone("the warm-start server ended")
            try:
                kind, reply = wire.read_fork_message(data)
                if kind is wire.Fork.EXIT:
                    raise OSError(f"the forked task ended with exit code {int(reply['exit'])} "
                                  "before it started")
                if kind is not wire.Fork.PID:
                    raise OSError(reply.get("error") or f"no pid in its {kind.value} answer")
                pid = int(reply["pid"])
            except (ValueError, KeyError, TypeError) as e:
                raise ServerGone(f"the warm-start server's answer was not read ({e!r})") from e
            mine.settimeout(None)
        except BaseException:
            theirs.close()
            mine.close()
            raise
        return pid, lambda: _wait_exit(mine, pid)

    def close(self, kill: bool = False) -> None:
        """Stop its forking; it leaves once its tasks have ended (``kill``: within a second)."""
        with self.lock:  # not while a task's request is being sent
            self.ctl.close()
        if kill:
            try:
                self.popen.wait(1)
            except subprocess.TimeoutExpired:  # its group only: each task has a session of its own
                end(local=proctree.group_members(self.popen.pid))
                self.popen.wait()


class ServerGone(OSError):
    """The warm-start server no longer takes tasks."""


def _wait_exit(sock: socket.socket, pid: int) -> int:
    """The exit code its server sends once the task ``pid`` has ended.  Should the server
    itself end first, the task's end is awaited and its code is unknown: 255."""
    with sock:
        try:
            data = sock.recv(1 << 16)
        except OSError:
            data = b""
    try:
        kind, reply = wire.read_fork_message(data)
        if kind is wire.Fork.EXIT:
            return int(reply["exit"])
    except (ValueError, KeyError, TypeError):
        pass
    while _exists(pid):
        time.sleep(0.1)
    return 255


def _exists(pid: int) -> bool:
    try:
        return proctree.alive(psutil.Process(pid))
    except psutil.Error:
        return False


class WarmStarter:
    """The warm-start servers of one runtime, by key (its local launchers share it: see
    :mod:`mwhelpers.services`); thread-safe."""

    def __init__(self, python: str, bootstrap: str) -> None:
        self.python, self.bootstrap = python, bootstrap
        self._servers: dict[Key, _Server] = {}
        self._retired: list[_Server] = []  # replaced by newer ones; they end after their tasks
        self._failed: set[Key] = set()  # keys whose server could not import TensorFlow
        self._lock = threading.Lock()
        self.closed = False
        self.last_cold_reason: str | None = None

    def start(self, script: str, argv: list[str], env: Mapping[str, str], cwd: str, log_fd: int,
              passed: Mapping[str, int], source: str | None = None
              ) -> tuple[int, Callable[[], int]] | None:
        """Fork ``argv`` (the bootstrap's arguments) from the server for ``env`` and ``cwd``:
        its pid and exit-code waiter; None: start it cold (``last_cold_reason`` says why)."""
        if source is None:
            try:
                source = Path(script).read_text(errors="replace")
            except OSError as e:
                self.last_cold_reason = f"its program could not be read ({e})"
                return None
        self.last_cold_reason = cold_reason(source, env, gpu_build=False)
        if self.last_cold_reason is not None:
            return None
        at_import = server_env(source, env)
        first = imported_first(source, at_import)
        key = (key_of(at_import, cwd), first, _installed())
        server = self._server(key, at_import, cwd, first)
        if server is None:
            return None
        if server.gpu_build:  # (what only a GPU build reads may matter after all)
            self.last_cold_reason = cold_reason(source, env, gpu_build=True)
            if self.last_cold_reason is not None:
                return None
        try:
            return server.fork(argv, env, cwd, log_fd, passed)
        except ServerGone as e:  # the next task gets a new server; this one starts cold
            self.last_cold_reason = str(e)
            self._retire(server)
            return None
        except OSError as e:  # this task alone: the server goes on forking the others
            self.last_cold_reason = f"the warm-start server could not fork it ({e})"
            return None

    def _retire(self, server: _Server) -> None:
        """No more tasks for ``server``; it leaves when its tasks have (reaped at close)."""
        with self._lock:
            self._servers = {k: s for k, s in self._servers.items() if s is not server}
            self._retired.append(server)
        server.close()

    def _server(self, key: Key, env: Mapping[str, str], cwd: str,
                first: str) -> _Server | None:
        with self._lock:  # one server per key; the first task waits for its import
            if self.closed or key in self._failed:
                self.last_cold_reason = "its warm-start server could not import TensorFlow"
                return None
            server = self._servers.get(key) or self._alike(key, env)
            if server is not None and server.alive:
                return server
            if server is not None:  # key's own (_alike gives only live ones); it died
                del self._servers[key]
                server.close()
            base = {k: v for k, v in env.items() if k not in PER_TASK}
            try:
                server = _Server(self.python, self.bootstrap, base, cwd, first)
            except OSError as e:
                self._failed.add(key)
                self.last_cold_reason = f"its warm-start server could not start ({e})"
                return None
            if not server.ready:
                self._failed.add(key)
                self.last_cold_reason = (f"its warm-start server could not import TensorFlow "
                                         f"({server.error})")
                return None
            self._servers[key] = server
            while len(self._servers) > MAX_SERVERS:
                retired = self._servers.pop(next(iter(self._servers)))
                retired.close()
                self._retired.append(retired)
            self._retired = [s for s in self._retired if s.popen.poll() is None]
            return server

    def _alike(self, key: Key, env: Mapping[str, str]) -> _Server | None:
        """A server of another key whose import a task of ``key`` and ``env`` would repeat:
        the same folder (where it matters), first import and installed files, and
        :func:`same_import`."""
        for other, server in self._servers.items():  # (its key holds its environment)
            if (server.alive and other[0][0] == key[0][0] and other[1:] == key[1:]
                    and same_import(dict(other[0][1]), server.effects, env, server.gpu_build)):
                return server
        return None

    @property
    def pids(self) -> list[int]:
        """The servers' pids, while they run."""
        with self._lock:
            servers = [*self._servers.values(), *self._retired]
        return [s.popen.pid for s in servers if s.popen.poll() is None]

    def close(self) -> None:
        """End every server (their tasks are the launcher's to end)."""
        with self._lock:
            self.closed = True
            servers = [*self._servers.values(), *self._retired]
            self._servers, self._retired = {}, []
        for server in servers:
            server.close(kill=True)
