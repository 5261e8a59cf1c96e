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


def imports(top_level_only):
    """{module: the package's modules it imports}; ``top_level_only``: the imports run when
    it is imported (not those inside functions, made when they are called)."""
    graph = {}
    for path in PACKAGE.rglob("*.py"):
        name = _module(path)
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        tree = ast.parse(path.read_text())
        nodes = tree.body if top_level_only else list(ast.walk(tree))
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
    graph = imports(top_level_only=True)
    # the package's __init__ imports nothing at import time (its names are lazy)
    assert graph["mwhelpers"] == set()
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
