"""The package's shape: the core (runtime, backends, magics, diagnosis) imports nothing from the
workshop (mwhelpers.workshop: the notebook runner, test hosts, replay, MNIST), and no two
modules import each other, directly or around a loop."""

import ast
from pathlib import Path

import mwhelpers

PACKAGE = Path(mwhelpers.__file__).parent


def _module(path):
    parts = list(path.with_suffix("").relative_to(PACKAGE.parent).parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_checking(node):
    """Whether ``node`` is an ``if TYPE_CHECKING:`` block (``typing.TYPE_CHECKING`` too)."""
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and ("TYPE_CHECKING" in ast.unparse(test))


def imports(top_level_only, typing=False):
    """{module: the package's modules it imports}; ``top_level_only``: the imports run when
    it is imported (not those inside functions, made when they are called); ``typing``: with
    those a type checker follows (``if TYPE_CHECKING:``)."""
    graph = {}
    for path in PACKAGE.rglob("*.py"):
        name = _module(path)
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        tree = ast.parse(path.read_text())
        nodes = tree.body if top_level_only else list(ast.walk(tree))
        if typing:
            nodes = nodes + [n for block in tree.body if _type_checking(block) for n in block.body]
        found = set()
        for node in nodes:
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[:len(package.split(".")) - node.level + 1]
                    target = ".".join(base + ([node.module] if node.module else []))
                elif (node.module or "").startswith("mwhelpers"):
                    target = node.module
                else:
                    continue
                found.add(target)
                found |= {f"{target}.{a.name}" for a in node.names}
            elif isinstance(node, ast.Import):
                found |= {a.name for a in node.names if a.name.startswith("mwhelpers")}
        graph[name] = found
    return {m: {d for d in deps if d in graph and d != m} for m, deps in graph.items()}


def test_the_core_imports_nothing_from_the_workshop():
    graph = imports(top_level_only=False)
    core = {m for m in graph if not m.startswith("mwhelpers.workshop")}
    assert {"mwhelpers.workers", "mwhelpers.magics", "mwhelpers.backends.ssh"} <= core
    wrong = {m: sorted(d for d in graph[m] if d.startswith("mwhelpers.workshop")) for m in core}
    assert not any(wrong.values()), {m: d for m, d in wrong.items() if d}


def test_no_import_cycle():
    """Not even through the imports only a type checker follows (``if TYPE_CHECKING:``)."""
    # the package's __init__ imports nothing at import time (its names are lazy)
    assert imports(top_level_only=True)["mwhelpers"] == set()
    graph = imports(top_level_only=True, typing=True)
    graph = {m: {d for d in deps if d != "mwhelpers"} for m, deps in graph.items()}
    state = {}

    def visit(m, path):
        state[m] = "open"
        for d in sorted(graph[m]):
            if state.get(d) == "open":
                raise AssertionError("import cycle: " + " -> ".join(path[path.index(d):] + [d]))
            if d not in state:
                visit(d, path + [d])
        state[m] = "done"

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
    assert "mwhelpers.workers" not in imports(top_level_only=False)["mwhelpers.supervisor"]


def _classes(tree):
    return [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)]


def test_runtime_only_orchestrates():
    """The user's API and nothing else: what builds, starts, watches and ends tasks has
    objects of its own (spawner, job, supervisor), so the hall stays small."""
    tree = ast.parse((PACKAGE / "workers.py").read_text())
    runtime = next(c for c in _classes(tree) if c.name == "Runtime")
    methods = [f.name for f in runtime.body if isinstance(f, ast.FunctionDef)]
    # a function bound as a method counts too (supervise = supervisor.supervise)
    methods += [t.id for a in runtime.body if isinstance(a, ast.Assign)
                and isinstance(a.value, ast.Attribute) for t in a.targets
                if isinstance(t, ast.Name)]
    assert runtime.end_lineno - runtime.lineno + 1 <= 350
    assert len(methods) <= 25, methods
    big = {_module(p): n for p in PACKAGE.rglob("*.py")
           if (n := len(p.read_text().splitlines())) > 600}
    assert not big, big


def _private_names(tree):
    """The private names a module defines: its own attributes (``self._x = ...``), methods and
    class attributes, and module-level names."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
    return {n for n in names if n.startswith("_") and not n.startswith("__")}


def test_no_module_touches_another_modules_private_members():
    """``x._name`` outside ``self``/``cls`` only where ``_name`` is the module's own: no module
    reaches into another's privates (a third-party library's are not ours to judge here)."""
    trees = {_module(p): ast.parse(p.read_text()) for p in PACKAGE.rglob("*.py")}
    own = {m: _private_names(t) for m, t in trees.items()}
    ours = set().union(*own.values())
    wrong = []
    for m, tree in trees.items():
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Attribute) and node.attr.startswith("_")
                    and not node.attr.startswith("__")):
                continue
            if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                continue
            if node.attr in ours and node.attr not in own[m]:
                wrong.append(f"{m}:{node.lineno}: {ast.unparse(node)}")
    assert not wrong, wrong


# The ending primitive: proctree sends the signals (proctree.send, end_processes) that every
# backend's Process.end and job.end_runs go through.
def _signals(call):
    """Whether ``call`` signals a process itself: ``os.kill``, ``os.killpg``, ``x.send_signal``,
    ``x.terminate()`` or ``x.kill()`` (psutil's and subprocess's)."""
    func = call.func
    if not isinstance(func, ast.Attribute):
        return False
    if isinstance(func.value, ast.Name) and func.value.id == "os":
        return func.attr in ("kill", "killpg")
    return func.attr in ("send_signal", "terminate") or (func.attr == "kill" and not call.args)


def test_processes_are_signalled_only_by_the_ending_primitive():
    """On the kernel side, only proctree calls ``os.kill``, ``os.killpg``, ``send_signal``,
    ``kill()`` or ``terminate()``; the worker side (mwhelpers.taskside and the programs run
    inside tasks or on other hosts) and the workshop's test tooling are outside the rule."""
    wrong = []
    for path in PACKAGE.rglob("*.py"):
        name = _module(path)
        if name == "mwhelpers.proctree" or name.startswith(("mwhelpers.workshop",
                                                            "mwhelpers.taskside")):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and _signals(node):
                wrong.append(f"{name}:{node.lineno}: {ast.unparse(node)[:80]}")
    assert not wrong, wrong


# What escalates by itself: only mwhelpers.ending.end (and its end_local) may call these, and a
# backend's Process.end, which is the escalation of its kind of process.
_ESCALATE = ("end_processes", "end_local", "_together")


def _escalates(call):
    """Whether ``call`` escalates itself: one of :data:`_ESCALATE`, or ``x.end(...)`` given an
    escalation (a backend's ``Process.end``)."""
    func = call.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    if name in _ESCALATE:
        return True
    given = [ast.unparse(a) for a in [*call.args, *(k.value for k in call.keywords)]]
    return name == "end" and any("escalation" in g.lower() or "ESCALATIONS" in g for g in given)


def test_processes_end_only_through_the_one_ending_function():
    """Every process the kernel side starts ends through ``mwhelpers.ending.end`` with a
    policy: no module but ``ending`` (and ``proctree``, below it) escalates by itself, and only
    a backend's own ``Process.end`` calls the escalation of its kind of process."""
    wrong = []
    for path in PACKAGE.rglob("*.py"):
        name = _module(path)
        if name in ("mwhelpers.ending", "mwhelpers.proctree") or name.startswith(
                ("mwhelpers.workshop.testhosts", "mwhelpers.taskside")):
            continue
        tree = ast.parse(path.read_text())
        inside_end = {id(n) for f in ast.walk(tree) if isinstance(f, ast.FunctionDef)
                      and f.name == "end" and name.startswith("mwhelpers.backends")
                      for n in ast.walk(f)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and _escalates(node) and id(node) not in inside_end:
                wrong.append(f"{name}:{node.lineno}: {ast.unparse(node)[:80]}")
    assert not wrong, wrong


def test_the_ending_rule_sees_each_side_door():
    found = [ast.unparse(n) for n in ast.walk(ast.parse(
        "proctree.end_processes(procs, NOW)\nend_local(ps, esc)\n"
        "p.end(Policy.NOW.escalation, 'x')\np.end(proctree.ESCALATIONS['now'])\n"
        "job.end(runs, 'why')\nend([(p, 'x')])\n")) if isinstance(n, ast.Call) and _escalates(n)]
    assert found == ["proctree.end_processes(procs, NOW)", "end_local(ps, esc)",
                     "p.end(Policy.NOW.escalation, 'x')", "p.end(proctree.ESCALATIONS['now'])"]


def taskside_imports_of_the_package(path):
    """The imports in ``path`` (anywhere in it, inside functions too) that reach the mwhelpers
    package or a folder above the module's own: ``import mwhelpers...``, ``from mwhelpers...``,
    ``from .. import`` or ``from ..x import``, each as its line number and source text."""
    tree = ast.parse(path.read_text(), str(path))
    wrong = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [node.module or ""] if node.level == 0 else []
            if node.level > 1:
                wrong.append(f"line {node.lineno}: {ast.unparse(node)}")
                continue
        else:
            continue
        if any(n == "mwhelpers" or n.startswith("mwhelpers.") for n in names):
            wrong.append(f"line {node.lineno}: {ast.unparse(node)}")
    return wrong


def test_the_worker_side_imports_nothing_of_the_kernel_side():
    """mwhelpers/taskside/ runs in tasks (by path, forked, or sent as python -c to a host
    without mwhelpers): its modules import only the standard library and each other."""
    folder = PACKAGE / "taskside"
    modules = sorted(folder.rglob("*.py"))
    assert {p.name for p in modules} >= {"_bootstrap.py", "_agent.py", "_forkserver.py",
                                         "tfdata.py", "kerasfix.py", "lazyplot.py", "taskfacts.py"}
    wrong = {str(p.relative_to(PACKAGE.parent)): w for p in modules
             if (w := taskside_imports_of_the_package(p))}
    assert not wrong, f"the worker side imports the kernel side: {wrong}"


def test_the_worker_side_check_finds_each_kind_of_import(tmp_path):
    """The check above sees what it is for: absolute imports of the package, inside functions
    too, and relative ones that climb out of the folder; not the standard library's or a
    sibling's."""
    module = tmp_path / "m.py"
    module.write_text("import os\nfrom . import tfdata\nfrom .tfdata import after_import\n"
                      "import mwhelpers.workers\nfrom mwhelpers import settings\n"
                      "def f():\n    from .. import logs\n    from ..failures import Failure\n"
                      "import mwhelpersx\n")
    assert taskside_imports_of_the_package(module) == [
        "line 4: import mwhelpers.workers", "line 5: from mwhelpers import settings",
        "line 7: from .. import logs", "line 8: from ..failures import Failure"]


def test_no_module_imports_another_modules_private_names():
    """Nor does a module import another's private names (``from .x import _y``) or a private
    module (``from .taskside._bootstrap import ...``): what the worker side shares with the
    kernel side, it shares in public."""
    wrong = []
    for path in PACKAGE.rglob("*.py"):
        name = _module(path)
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom) or not (
                    node.level or (node.module or "").startswith("mwhelpers")):
                continue
            parts = (node.module or "").split(".")
            private = [p for p in parts if p.startswith("_") and not p.startswith("__")]
            private += [a.name for a in node.names
                        if a.name.startswith("_") and not a.name.startswith("__")]
            if private:
                wrong.append(f"{name}:{node.lineno}: {ast.unparse(node)}")
    assert not wrong, wrong


TESTS = Path(__file__).resolve().parents[1]


def test_the_tests_markers_follow_their_folders():
    """Every test module lives in a folder of what it needs (tests/conftest.py, FOLDER_MARKS),
    and none carries a folder's marker itself: moving a test is what changes its lane.  The
    one exception is the backends' parametrisation (``ON_HOSTS``: the ssh and slurm cases of
    a processes/ test need the hosts)."""
    from conftest import FOLDER_MARKS

    stray = [p.name for p in TESTS.glob("test_*.py")]
    assert not stray, f"test modules outside the folders: {stray}"
    marked = []
    for path in TESTS.glob("*/test_*.py"):
        assert path.parent.name in FOLDER_MARKS, path
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Attribute) and node.attr in ("tf", "notebook", "hosts")
                    and isinstance(node.value, ast.Attribute) and node.value.attr == "mark"):
                marked.append(f"{path.relative_to(TESTS)}:{node.lineno}")
    assert [m.partition(":")[0] for m in marked] == ["processes/test_backends.py"], marked
