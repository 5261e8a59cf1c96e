"""Build the tutorials into a static HTML site, to read without running them.

    python -m mwhelpers.workshop.site [--executed DIR] [--out DIR]

The pages are the executed notebooks that the suite writes (``output/`` by default: run
``python3 dev.py suite`` first, or ``python3 dev.py site``, which does both), with their
outputs and pictures; the guide, one page per topic (every ``docs/guide/*.md``, under
``guide/``); the cheat sheet (``docs/cheatsheet.md``); and the extension's reference:
every magic's help, as ``%magic?`` shows it, and the Python API from its docstrings.  Sphinx
builds them with myst-nb (the notebooks are not executed again) and the furo theme; the site
goes to ``site/`` (open ``site/index.html``).
"""

from __future__ import annotations

import argparse
import importlib.util
import inspect
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[2]
TITLE = "TensorFlow distributed training from a notebook"
# Who holds the copyright, as pyproject.toml's authors and LICENSE's Apache-2.0 notice say:
# the theme's footer prints "Copyright © <this>" on every page.
COPYRIGHT = "2026, the mwhelpers authors"
GUIDE = ROOT / "docs" / "guide"
# The guide's pages in the order a reader wants them; a page not named here comes after them.
GUIDE_ORDER = ("install", "extension", "keras3", "more-machines", "diagnosis", "performance", "layout",
               "contributing")

CONF = f'''project = {TITLE!r}
html_title = {TITLE!r}
author = "the mwhelpers authors"
copyright = {COPYRIGHT!r}
extensions = ["myst_nb", "sphinx.ext.autodoc"]
nb_execution_mode = "off"           # the suite executed them; their outputs are shown as they are
html_theme = "furo"
exclude_patterns = ["_build"]
autodoc_member_order = "bysource"
suppress_warnings = ["myst.header", "misc.highlighting_failure"]
'''

# The Python API, in the order a reader meets it.
API = """
```{eval-rst}
.. autofunction:: mwhelpers.runtime

.. autoclass:: mwhelpers.Runtime
   :members:

.. autoclass:: mwhelpers.Cluster
   :members:

.. autofunction:: mwhelpers.fix_keras_multi_worker

.. autofunction:: mwhelpers.avoid_teardown_stall

.. autofunction:: mwhelpers.read_results

.. autoexception:: mwhelpers.WorkerFailed
   :members:

.. autoexception:: mwhelpers.WorkerTimeout

.. autoexception:: mwhelpers.CellFailed

.. autoexception:: mwhelpers.UsageError

.. autoexception:: mwhelpers.InfrastructureError
```
"""


def magics_help() -> str:
    """Every magic's help, as ``%name?`` shows it, one section each."""
    from ..magics import WorkerMagics

    parts = []
    for kind, prefix in (("line", "%"), ("cell", "%%")):
        for name, method_name in sorted(WorkerMagics.magics[kind].items()):
            doc = inspect.getdoc(getattr(WorkerMagics, method_name)) or ""
            parts.append(f"### `{prefix}{name}`\n\n```text\n{doc}\n```\n")
    return "\n".join(parts)


def reference() -> str:
    return (f"# Reference\n\n`%load_ext mwhelpers` adds these magics to IPython; the same features "
            f"are in the Python API below.\n\n## Magics\n\n{magics_help()}\n## Python API\n{API}")


def readable(src: Path, dst: Path) -> None:
    """The executed notebook ``src``, without the cell papermill added (its parameters name the
    folders of the run that executed it), written to ``dst``."""
    nb = nbformat.read(src, as_version=4)
    nb.cells = [c for c in nb.cells if "injected-parameters" not in c.metadata.get("tags", [])]
    nbformat.write(nb, dst)


def guide_pages(folder: Path = GUIDE) -> list[Path]:
    """Every page of the guide in ``folder``, in :data:`GUIDE_ORDER`, then any other by name."""
    rank = {name: i for i, name in enumerate(GUIDE_ORDER)}
    return sorted(folder.glob("*.md"), key=lambda p: (rank.get(p.stem, len(rank)), p.stem))


def index(notebooks: Sequence[str], guide: Sequence[str] = GUIDE_ORDER) -> str:
    tutorials = "\n".join(Path(n).stem for n in notebooks)
    pages = "\n".join(f"guide/{Path(g).stem}" for g in guide)
    return f"""# {TITLE}

Executable Jupyter notebooks that teach `tf.distribute` with real worker processes, and
`mwhelpers`, the IPython extension that starts them. Every tutorial here is a notebook as the
suite ran it headless, with its outputs and pictures; run them yourself with
`python3 dev.py suite`, or open them in JupyterLab. The guide takes the extension topic by
topic.

```{{toctree}}
:maxdepth: 1
:caption: Tutorials

{tutorials}
```

```{{toctree}}
:maxdepth: 1
:caption: Guide

{pages}
```

```{{toctree}}
:maxdepth: 1
:caption: Reference

cheatsheet
reference
```
"""


def build(executed: Path, out: Path) -> Path:
    """Build the site from the executed notebooks in ``executed`` into ``out``; return the
    path of its start page."""
    missing = [m for m in ("sphinx", "myst_nb", "furo") if importlib.util.find_spec(m) is None]
    if missing:
        raise SystemExit(f"the site needs {', '.join(missing)} in this Python ({sys.executable}): "
                         "pip install sphinx myst-nb furo (python3 dev.py site has them, in the "
                         "lock requirements/test.txt)")
    found = sorted(executed.glob("*.ipynb"))
    if not found:
        raise SystemExit(f"no executed notebooks in {executed}: run the suite first "
                         "(python3 dev.py suite), or python3 dev.py site, which runs it")
    if out.exists() and any(out.iterdir()) and not (out / "index.html").exists():
        raise SystemExit(f"{out} is not empty and holds no site: give --out an empty or new "
                         "folder, or the one of an earlier site (it is replaced)")
    with tempfile.TemporaryDirectory(prefix="mwhelpers-site-") as tmp:
        src = Path(tmp)
        for nb in found:
            readable(nb, src / nb.name)
        (src / "_build").mkdir()
        # The guide's pages link only to each other (the files outside the guide that they
        # name are code text, not links), so they are copied as they are, side by side.
        guide = guide_pages()
        (src / "guide").mkdir()
        for page in guide:
            shutil.copy(page, src / "guide" / page.name)
        shutil.copy(ROOT / "docs" / "cheatsheet.md", src / "cheatsheet.md")
        (src / "reference.md").write_text(reference(), encoding="utf-8")
        (src / "index.md").write_text(index([nb.name for nb in found], [p.stem for p in guide]),
                                      encoding="utf-8")
        (src / "conf.py").write_text(CONF, encoding="utf-8")
        # Built beside the sources: myst-nb writes a folder next to Sphinx's output folder.
        html = src / "_build" / "html"
        done = subprocess.run([sys.executable, "-m", "sphinx", "-b", "html", "-q", "-E",
                               str(src), str(html)], capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"sphinx-build failed (exit {done.returncode}):\n"
                             f"{(done.stdout + done.stderr)[-4000:]}")
        shutil.rmtree(out, ignore_errors=True)  # an earlier site, or nothing (checked above)
        shutil.copytree(html, out)
    return out / "index.html"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mwhelpers.workshop.site",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--executed", type=Path, default=ROOT / "output",
                        help="the suite's output folder (default: output/)")
    parser.add_argument("--out", type=Path, default=ROOT / "site",
                        help="where the site goes (default: site/)")
    args = parser.parse_args(argv)
    start = build(args.executed, args.out)
    print(f"site built: {start}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
