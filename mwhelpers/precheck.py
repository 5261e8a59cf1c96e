"""A look at a worker program before it starts: mistakes that can be seen in its source.

``%%worker``, ``%worker`` and :meth:`Runtime.launch` read the program once
(and the modules beside it that it calls into) and warn, never refuse, about:

* a TensorFlow operation that runs before MultiWorkerMirroredStrategy is
  created (the strategy would then fail with "Collective ops must be
  configured at program startup");
* ``fit`` under MultiWorkerMirroredStrategy when the task will get Keras 3
  (it fails: keras-team/keras#20585);
* a TF_CONFIG that the program sets itself, which replaces the one the
  cluster gives the task;
* top-level code that the file holds twice, or a function or class defined
  again: the mark of a ``%%writefile -a`` cell that ran again (its part is
  then in the file twice, and runs twice);
* Keras 3 on JAX across processes (``keras.distribution.initialize`` or
  ``jax.distributed.initialize``): addresses, a process count or a process id
  written into the program that differ from the cluster's (they replace the
  ``KERAS_DISTRIBUTION_*`` variables mwhelpers gives each chief and worker),
  and such a program launched as a task that is not one of the processes (ps,
  evaluator: no such variables, and JAX finds no coordinator).

The program is parsed, not run.  Its statements are followed in the order
they run: top-level code, the ``if __name__ == "__main__":`` block, and the
bodies of the functions it calls that are defined in the program or in a
module beside it.  Only calls known to run an operation count (checked on
TF 2.21: tensors, variables, datasets, models, ``list_logical_devices``);
``list_physical_devices``, seeds, layers and ``Input`` do not.
"""

from __future__ import annotations

import ast
import os
import re
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from .packages import installed
from .taskside.kerasbase import TESTED as KERAS_FIX_TESTED
from .taskside.kerasbase import major_minor
from .taskside.kerasfix import GRADIENTS_REDUCED_SINCE
from .taskside.taskfacts import LEGACY_ENV, legacy_selected

# Keras 3's fit with steps_per_execution > 1 fails under a multi-replica strategy from this
# release on; 3.5 and 3.6 train (measured with docs/keras-versions/run.py, 2026-11-27).
STEPS_PER_EXECUTION_FAILS_SINCE = (3, 7)

if TYPE_CHECKING:
    from .taskrun import LaunchRequest

_MWMS = re.compile(r"(^|\.)(MultiWorkerMirroredStrategy|CollectiveAllReduceStrategy)$")
# Calls that run a TensorFlow operation (and so set up TensorFlow's context), by qualified
# name with tensorflow written ``tf`` and every Keras written ``keras``.
_OPS = re.compile(
    r"^tf\.(constant|Variable|convert_to_tensor|zeros|ones|zeros_like|ones_like|fill|range|eye"
    r"|matmul|add|subtract|multiply|divide|cast|reshape|concat|stack|one_hot|reduce_\w+"
    r"|square|sqrt|exp|random\.(?!set_seed$)\w+|math\.\w+|linalg\.\w+"
    r"|data\.(Dataset\.\w+|TFRecordDataset|TextLineDataset|FixedLengthRecordDataset)"
    r"|config\.(experimental\.)?list_logical_devices)$"
    r"|^keras\.(Sequential|Model|models\.(Sequential|Model|load_model|clone_model)"
    r"|saving\.load_model)$")
_MAX_DEPTH = 4
# What starts Keras 3 on JAX across processes, with the names of its first three arguments.
_JAX_INITS = {
    "keras.distribution.initialize": ("job_addresses", "num_processes", "process_id"),
    "jax.distributed.initialize": ("coordinator_address", "num_processes", "process_id"),
}
_KERAS_DISTRIBUTION = {"KERAS_DISTRIBUTION_JOB_ADDRESSES": "job_addresses",
                       "KERAS_DISTRIBUTION_NUM_PROCESSES": "num_processes",
                       "KERAS_DISTRIBUTION_PROCESS_ID": "process_id"}


def _qualify(name: str) -> str:
    """``tensorflow.keras.X`` / ``tf_keras.X`` / ``keras.X`` -> ``keras.X``; ``tensorflow.X`` ->
    ``tf.X``."""
    for prefix in ("tensorflow.keras.", "tensorflow.python.keras.", "tf_keras.", "keras.src."):
        if name.startswith(prefix):
            return "keras." + name[len(prefix):]
    if name.startswith("tensorflow."):
        return "tf." + name[len("tensorflow."):]
    return name


class _Program:
    """One parsed file: its imports (local name -> qualified name) and its functions."""

    def __init__(self, path: str | os.PathLike[str], source: str, cell: bool = False) -> None:
        self.path = Path(path)
        self.cell = cell
        self.tree = ast.parse(source, filename=str(path))
        self.names: dict[str, str] = {}
        self.functions: dict[str, ast.FunctionDef | ast.AsyncFunctionDef] = {}
        self.modules: dict[str, str] = {}  # local name -> module name, for `import mnist_setup`
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    local = a.asname or a.name.split(".")[0]
                    self.names[local] = a.name if a.asname else a.name.split(".")[0]
                    self.modules[local] = a.name
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                for a in node.names:
                    self.names[a.asname or a.name] = f"{node.module}.{a.name}"
                    self.modules.setdefault(a.asname or a.name, f"{node.module}.{a.name}")
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                self.functions.setdefault(node.name, node)

    def qualified(self, func: ast.expr) -> str | None:
        """The qualified name of a call's function (``tf.constant``), or None."""
        parts = []
        while isinstance(func, ast.Attribute):
            parts.append(func.attr)
            func = func.value
        if not isinstance(func, ast.Name):
            return None
        head = self.names.get(func.id, func.id)
        return _qualify(".".join([head, *reversed(parts)]))

    def where(self, node: ast.stmt | ast.expr) -> str:
        return f"line {node.lineno} of the cell" if self.cell else \
            f"{self.path.name} line {node.lineno}"


def _calls_in_order(node: ast.AST) -> list[ast.Call]:
    calls = [n for n in ast.walk(node) if isinstance(n, ast.Call)]
    # Arguments run before the call that takes them: a deeper, later-ending node first.
    return sorted(calls, key=lambda c: (c.end_lineno, c.end_col_offset))


class _Walker:
    """Follows a program's statements in the order they run, noting TensorFlow operations
    and the creation of MultiWorkerMirroredStrategy."""

    def __init__(self, program: _Program, folders: Iterable[str | os.PathLike[str]]) -> None:
        self.program = program
        self.folders = folders
        self.first_op: tuple[str, str] | None = None  # (where, call text)
        self.mwms: str | None = None  # where
        self._seen: set[tuple[Path, str]] = set()
        self._loaded: dict[str, _Program | None] = {}

    def run(self) -> None:
        self._body(self.program, self.program.tree.body, 0, ())

    def _module(self, name: str) -> _Program | None:
        if name not in self._loaded:
            self._loaded[name] = None
            for folder in self.folders:
                path = Path(folder) / f"{name}.py"
                if path.is_file():
                    try:
                        self._loaded[name] = _Program(path, path.read_text())
                    except (SyntaxError, ValueError, OSError):
                        pass
                    break
        return self._loaded[name]

    def _body(self, program: _Program, stmts: Iterable[ast.stmt], depth: int,
              via: tuple[str, ...]) -> None:
        for stmt in stmts:
            if self.mwms:
                return
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef,
                                 ast.Import, ast.ImportFrom)):
                continue
            if isinstance(stmt, ast.If) and _is_main_guard(stmt.test):
                self._body(program, stmt.body, depth, via)
                continue
            for call in _calls_in_order(stmt):
                self._call(program, call, depth, via)
                if self.mwms:
                    return

    def _call(self, program: _Program, call: ast.Call, depth: int, via: tuple[str, ...]) -> None:
        name = program.qualified(call.func)
        if name is None:
            return
        if _MWMS.search(name):
            self.mwms = program.where(call)
            return
        here = program.where(call) + (f" (called from {via[0]})" if via else "")
        if _OPS.match(name):
            if self.first_op is None:
                self.first_op = (here, ast.unparse(call)[:60])
            return
        if depth >= _MAX_DEPTH:
            return
        target: tuple[_Program, ast.FunctionDef | ast.AsyncFunctionDef] | None = None
        if isinstance(call.func, ast.Name) and call.func.id in program.functions:
            target = (program, program.functions[call.func.id])
        elif isinstance(call.func, ast.Name) and name.count(".") == 1:  # from mod import f
            module, func = name.split(".")
            other = self._module(module)
            if other is not None and func in other.functions:
                target = (other, other.functions[func])
        elif isinstance(call.func, ast.Attribute) and isinstance(call.func.value, ast.Name):
            imported = program.modules.get(call.func.value.id)
            other = self._module(imported) if imported and "." not in imported else None
            if other is not None and call.func.attr in other.functions:
                target = (other, other.functions[call.func.attr])
        if target and (target[0].path, target[1].name) not in self._seen:
            self._seen.add((target[0].path, target[1].name))
            self._body(target[0], target[1].body, depth + 1, (program.where(call), *via))


def _is_main_guard(test: ast.expr) -> bool:
    return (isinstance(test, ast.Compare) and isinstance(test.left, ast.Name)
            and test.left.id == "__name__")


def _sets_tf_config(program: _Program) -> str | None:
    """Where the program assigns TF_CONFIG itself, outside an ``if`` about TF_CONFIG."""
    guarded: set[int] = set()
    for node in ast.walk(program.tree):
        if isinstance(node, ast.If) and "TF_CONFIG" in ast.unparse(node.test):
            guarded |= {id(n) for n in ast.walk(node)}
    for node in ast.walk(program.tree):
        if id(node) in guarded:
            continue
        text: ast.Assign | ast.Call | None = None
        if isinstance(node, ast.Assign):
            if any(_environ_key(t) == "TF_CONFIG" for t in node.targets):
                text = node
        elif isinstance(node, ast.Call):
            name = program.qualified(node.func) or ""
            if name in ("os.environ.update", "os.putenv", "os.environ.__setitem__"):
                if "TF_CONFIG" in ast.unparse(node):
                    text = node
        if text is not None:
            return program.where(text)
    return None


def _environ_key(target: ast.expr) -> object:
    if isinstance(target, ast.Subscript) and ast.unparse(target.value) in ("os.environ",
                                                                          "environ"):
        key = target.slice
        if isinstance(key, ast.Constant):
            return key.value
    return None


def _sets_legacy_itself(program: _Program) -> bool:
    """The program selects tf_keras itself: TF_USE_LEGACY_KERAS set to a true value in its
    source, or ``import tf_keras``."""
    for node in ast.walk(program.tree):
        if isinstance(node, ast.Assign) and any(_environ_key(t) == LEGACY_ENV for t in node.targets):
            if isinstance(node.value, ast.Constant) and legacy_selected(str(node.value.value)):
                return True
        if isinstance(node, ast.Call) and LEGACY_ENV in ast.unparse(node):
            return True  # os.environ.setdefault / update: taken as selecting it
    return any(v == "tf_keras" or v.startswith("tf_keras.") for v in program.names.values())


def _fit_calls(program: _Program) -> list[ast.Call]:
    return [n for n in ast.walk(program.tree) if isinstance(n, ast.Call)
            and isinstance(n.func, ast.Attribute) and n.func.attr == "fit"]


def _steps_per_execution(program: _Program) -> tuple[ast.Call, str] | None:
    """The first ``compile(..., steps_per_execution=N)`` with N other than 1, or None."""
    for node in ast.walk(program.tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr == "compile":
            for kw in node.keywords:
                if kw.arg == "steps_per_execution" and not (
                        isinstance(kw.value, ast.Constant) and kw.value.value in (1, None)):
                    return node, ast.unparse(kw.value)
    return None


def _jax_inits(program: _Program) -> list[tuple[ast.Call, str]]:
    """The calls that start Keras 3 on JAX across processes, with their qualified names."""
    return [(n, name) for n in ast.walk(program.tree) if isinstance(n, ast.Call)
            and (name := program.qualified(n.func) or "") in _JAX_INITS]


def initializes_jax(source: str) -> bool:
    """Whether the program ``source`` calls ``keras.distribution.initialize`` or
    ``jax.distributed.initialize`` (False when it does not parse): its processes other than
    process 0 open no port (only JAX's coordinator, on process 0's, does)."""
    try:
        return bool(_jax_inits(_Program("program.py", source)))
    except (SyntaxError, ValueError):
        return False


def _hard_coded(program: _Program) -> list[tuple[str, str, object]]:
    """``(where, what, value)`` for each constant that the program gives keras.distribution
    or JAX in place of mwhelpers' variables: an argument of an initialize call ('job_addresses',
    'coordinator_address', 'num_processes', 'process_id'), or a KERAS_DISTRIBUTION_* variable
    it sets (named by its argument)."""
    found: list[tuple[str, str, object]] = []
    for call, name in _jax_inits(program):
        names = _JAX_INITS[name]
        given = [(names[i], a) for i, a in enumerate(call.args[:3])]
        given += [(k.arg, k.value) for k in call.keywords if k.arg in names]
        for what, value in given:
            if isinstance(value, ast.Constant) and value.value is not None:
                found.append((program.where(call), what, value.value))
    for node in ast.walk(program.tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
            for target in node.targets:
                key = _environ_key(target)
                if isinstance(key, str) and key in _KERAS_DISTRIBUTION:
                    found.append((program.where(node), _KERAS_DISTRIBUTION[key], node.value.value))
    return found


def _differs(what: str, value: object, given: Mapping[str, str]) -> bool:
    """Whether ``value`` (given to ``what`` in the program) differs from what a process's
    KERAS_DISTRIBUTION_* variables ``given`` say."""
    addresses = given["KERAS_DISTRIBUTION_JOB_ADDRESSES"]
    text = str(value).strip()
    if what == "job_addresses" and "," in text:
        return text != addresses
    if what in ("job_addresses", "coordinator_address"):  # JAX needs only the coordinator's
        return text != addresses.split(",")[0]
    key = "KERAS_DISTRIBUTION_NUM_PROCESSES" if what == "num_processes" \
        else "KERAS_DISTRIBUTION_PROCESS_ID"
    return text != given[key]


def _jax_warnings(program: _Program, processes: Mapping[str, Mapping[str, str]]) -> list[str]:
    """Keras 3 on JAX across processes: what the program gives in place of the cluster's
    KERAS_DISTRIBUTION_* variables, and tasks that are not processes (``processes``: each
    task that runs the program, with the variables it gets, {} for ps and evaluator)."""
    inits = _jax_inits(program)
    if not inits or not processes:
        return []
    warnings = []
    trained = {t: v for t, v in processes.items() if v}
    for where, what, value in _hard_coded(program):
        wrong = [t for t, v in trained.items() if _differs(what, value, v)]
        if not wrong:
            continue
        first = trained[wrong[0]]
        theirs = {"num_processes": first["KERAS_DISTRIBUTION_NUM_PROCESSES"],
                  "process_id": first["KERAS_DISTRIBUTION_PROCESS_ID"]}.get(
            what, first["KERAS_DISTRIBUTION_JOB_ADDRESSES"])
        warnings.append(
            f"{where} gives keras.distribution/JAX {what}={value!r}, but the cluster gives "
            f"{_names_of(wrong)} {theirs} (KERAS_DISTRIBUTION_*, from %cluster): what the program "
            "writes replaces what mwhelpers gives, so its processes would not be the cluster you "
            "defined and JAX would wait for a coordinator or processes that are not there. Call "
            "keras.distribution.initialize() without arguments and leave the "
            "KERAS_DISTRIBUTION_* variables alone.")
    others = [t for t, v in processes.items() if not v]
    if others:
        warnings.append(
            f"{program.where(inits[0][0])} calls {inits[0][1]}, and {_names_of(others)} "
            f"{'is not a process' if len(others) == 1 else 'are not processes'} of Keras 3 on "
            "JAX (only the chief and the workers are): such a task gets no KERAS_DISTRIBUTION_* "
            "variables, and JAX there fails with 'coordinator_address should be defined'. Launch "
            "this program as the chief and worker tasks only.")
    return warnings


def _names_of(tasks: Sequence[str]) -> str:
    return tasks[0] if len(tasks) == 1 else ", ".join(tasks[:-1]) + " and " + tasks[-1]


def check(source: str, path: str | os.PathLike[str], env: Mapping[str, str],
          keras_version: str | None = None, tf_version: str | None = None,
          folders: Sequence[str | os.PathLike[str]] = (), cell: bool = False,
          keras_fix: bool = True,
          processes: Mapping[str, Mapping[str, str]] | None = None) -> list[str]:
    """Warnings (plain sentences) about ``source`` (the program at ``path``; ``cell``: a
    notebook cell's code) run with the environment ``env``.  ``keras_version`` and
    ``tf_version``: what the task's Python has installed (None: unknown, the Keras checks
    are skipped).  ``keras_fix``: whether the task's start-up mends Keras 3's multi-worker
    fit (:mod:`mwhelpers.taskside.kerasfix`).  ``folders``: where modules
    beside the program are looked for.  ``processes``: each task that will run the program,
    with the KERAS_DISTRIBUTION_* variables the cluster gives it ({} for a task that is not
    a process: ps, evaluator); None: not known, the JAX checks are skipped.  A program that
    does not parse gets no warnings (running it will say what is wrong)."""
    try:
        program = _Program(path, source, cell)
    except (SyntaxError, ValueError):
        return []
    warnings: list[str] = []
    walker = _Walker(program, folders)
    walker.run()
    if walker.mwms and walker.first_op:
        where, text = walker.first_op
        warnings.append(
            f"{where} runs a TensorFlow operation ({text}) before "
            f"MultiWorkerMirroredStrategy is created ({walker.mwms}): the strategy will fail "
            "with 'Collective ops must be configured at program startup'. Create the strategy "
            "first.")
    fits = _fit_calls(program)
    uses_mwms = walker.mwms or any(_MWMS.search(program.qualified(n.func) or "")
                                   for n in ast.walk(program.tree) if isinstance(n, ast.Call))
    keras3 = (uses_mwms and _keras3(keras_version, tf_version)
              and not legacy_selected(env.get(LEGACY_ENV)) and not _sets_legacy_itself(program))
    low, high = KERAS_FIX_TESTED
    if keras3 and fits and not keras_fix:
        warnings.append(
            f"{program.where(fits[0])} calls fit under MultiWorkerMirroredStrategy with Keras "
            f"{keras_version}, and mwhelpers' Keras fix is off for this task (--no-keras-fix or "
            "MWHELPERS_KERAS_FIX=0): that fails (keras-team/keras#20585). Leave the fix on, or "
            "set TF_USE_LEGACY_KERAS=1 before TensorFlow is imported (with tf_keras installed).")
    elif keras3 and fits and not low <= major_minor(keras_version) <= high:
        warnings.append(
            f"{program.where(fits[0])} calls fit under MultiWorkerMirroredStrategy with Keras "
            f"{keras_version}; mwhelpers' fix of keras-team/keras#20585 was tested with Keras "
            f"{'.'.join(map(str, low))} to {'.'.join(map(str, high))} and leaves this one "
            "unchanged, so fit may fail. The task's log says whether this Keras still has the "
            "bug.")
    elif keras3 and fits and major_minor(keras_version) < GRADIENTS_REDUCED_SINCE:
        warnings.append(
            f"{program.where(fits[0])} calls fit under MultiWorkerMirroredStrategy with Keras "
            f"{keras_version}, which never all-reduces the gradients across workers: each "
            "worker would train its own copy of the model (keras-team/keras#19969, fixed in "
            "Keras 3.5). Install keras>=3.5 (3.10 or later for exact losses).")
    spe = (_steps_per_execution(program) if keras3 and major_minor(keras_version)
           >= STEPS_PER_EXECUTION_FAILS_SINCE else None)
    if spe:
        warnings.append(
            f"{program.where(spe[0])} compiles with steps_per_execution={spe[1]}: under "
            f"MultiWorkerMirroredStrategy, Keras {keras_version}'s fit fails with more than one "
            "step per execution (\"You must feed a value for placeholder tensor ...cond/Placeholder\"), "
            "with or without mwhelpers' fix. Use steps_per_execution=1, the default.")
    sets_config = _sets_tf_config(program)
    if sets_config:
        warnings.append(
            f"{sets_config} sets TF_CONFIG itself: that replaces the TF_CONFIG mwhelpers gives each "
            "task from the cluster (%cluster), so the tasks would not be the cluster you "
            "defined. Delete that line, or set it only when TF_CONFIG is not already set.")
    warnings += _jax_warnings(program, processes or {})
    warnings += _twice(program, source)
    return warnings


def _twice(program: _Program, source: str) -> list[str]:
    """Warnings about top-level code that a file holds twice: the same statements again
    (spanning 3 lines or more besides imports), or a ``def`` or ``class`` given again."""
    if program.cell:
        return []
    body = program.tree.body
    texts = [ast.get_source_segment(source, node) for node in body]
    name = program.path.name
    fix = ("Run the program's cells again from its first one (%%writefile without -a writes "
           "the file anew).")
    warnings: list[str] = []
    repeated: set[int] = set()
    earlier: dict[str | None, list[int]] = {}
    for j in range(len(body)):
        for i in earlier.setdefault(texts[j], []):
            k = 0
            while i + k < j and j + k < len(body) and texts[i + k] == texts[j + k]:
                k += 1
            lines = sum((n.end_lineno or n.lineno) - n.lineno + 1 for n in body[j:j + k]
                        if not isinstance(n, (ast.Import, ast.ImportFrom)))
            if lines >= 3 and j not in repeated:
                repeated.update(range(j, j + k))
                warnings.append(
                    f"{name} has its lines {body[i].lineno}-{body[i + k - 1].end_lineno} again "
                    f"at lines {body[j].lineno}-{body[j + k - 1].end_lineno}: a %%writefile -a cell "
                    f"that ran again appends its part once more, and that part runs twice. {fix}")
        earlier[texts[j]].append(j)
    defined: dict[str, ast.stmt] = {}
    for j, node in enumerate(body):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            first = defined.setdefault(node.name, node)
            decorated = node.decorator_list or getattr(first, "decorator_list", None)
            if first is not node and j not in repeated and not decorated:  # (@overload...)
                warnings.append(
                    f"{name} defines {node.name} at line {first.lineno} and again, differently, "
                    f"at line {node.lineno}: the second replaces the first. A %%writefile -a "
                    f"cell run again after an edit does that. {fix}")
    return warnings


def _keras3(keras_version: str | None, tf_version: str | None) -> bool:
    return bool(keras_version and tf_version) and major_minor(keras_version) >= (3, 0) \
        and major_minor(tf_version) >= (2, 16)


class Lookout:
    """The look before launch: :func:`check` on each launch's program, its warnings said
    through ``echo`` once per program text (a runtime keeps one for its life)."""

    def __init__(self, echo: Callable[[str], None]) -> None:
        self.echo = echo
        self._said: set[tuple[int, str]] = set()  # (program text hash, warning)

    def look(self, request: LaunchRequest, python: str, keras_fix: bool,
             processes: Mapping[str, Mapping[str, str]] | None = None) -> list[str]:
        """Warn, never refuse, about the mistakes that can be seen in ``request``'s program,
        to be run by the Python ``python`` with the Keras fix on or off (``processes``: the
        tasks that run it, with their KERAS_DISTRIBUTION_* variables, as for :func:`check`);
        returns every warning (those said before too)."""
        if request.code is not None:
            source, path, folders = request.code, "cell.py", [os.getcwd()]
        else:
            assert request.script is not None  # a request holds code or a script
            try:
                source = request.script.read_text(encoding="utf-8", errors="replace")
            except OSError:
                return []
            path, folders = str(request.script), [str(request.script.parent)]
        same_python = python == sys.executable
        keras_version, tf_version = ((installed("keras"), installed("tensorflow"))
                                     if same_python else (None, None))
        try:
            warnings = check(source, path, {**os.environ, **request.env}, keras_version,
                             tf_version, folders, cell=request.code is not None,
                             keras_fix=keras_fix, processes=processes)
        except Exception as e:  # a look that fails must not stop the launch
            warnings = [f"the program could not be looked at before its launch "
                        f"({type(e).__name__}: {e}); it runs all the same"]
        for warning in warnings:
            key = (hash(source), warning)
            if key not in self._said:
                self._said.add(key)
                self.echo(f"[mwhelpers] warning: {warning}")
        return warnings
