"""How the tutorials are built, read from the committed notebooks (no kernel runs here):
the reading order and its previous/next lines, lessons apart from their checks, no drawing
code in a cell, short cells, and the prose goals that benchmarks/prose.py measures."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest
from conftest import ROOT

NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
OPTIONAL = {"03b", "03c"}  # may be skipped; listed as optional wherever the order is given
MAX_CODE_LINES = 50  # issue 41 found two cells over 50 lines (06: 65, 09: 60)


def cells(path: Path) -> list[dict]:
    return json.loads(path.read_text(encoding="utf-8"))["cells"]


def source(cell: dict) -> str:
    return "".join(cell["source"])


def tags(cell: dict) -> list[str]:
    return cell.get("metadata", {}).get("tags", [])


def number(path: Path) -> str:
    return path.name.split("_", 1)[0]


def test_the_file_names_give_the_reading_order_with_the_reference_last():
    numbers = [number(p) for p in NOTEBOOKS]
    assert numbers[0] == "01" and numbers == sorted(numbers)
    assert NOTEBOOKS[-1].name == "13_mwhelpers_tour.ipynb"
    for path in NOTEBOOKS:
        title = next(source(c) for c in cells(path) if c["cell_type"] == "markdown"
                     and source(c).lstrip().startswith("# "))
        assert ("optional" in title.splitlines()[0].lower()) == (number(path) in OPTIONAL), title


def links(markdown: str) -> list[str]:
    return re.findall(r"\]\(([^)]+\.ipynb)\)", markdown)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_a_previous_and_next_line_at_the_top_and_the_bottom(path):
    names = [p.name for p in NOTEBOOKS]
    i = names.index(path.name)
    all_cells = cells(path)
    top, bottom = all_cells[0], all_cells[-1]
    for cell in (top, bottom):
        assert cell["cell_type"] == "markdown" and "nav" in tags(cell), source(cell)
        text = source(cell)
        assert source(top) == text  # the same line at both ends
        targets = links(text)
        if i > 0:
            assert text.startswith("Previous: ") and targets[0] == names[i - 1], text
        else:
            assert "Previous" not in text
        if i + 1 < len(names):
            assert "Next: " in text and names[i + 1] in targets, text
            if number(NOTEBOOKS[i + 1]) in OPTIONAL:  # an optional next: say so, and where
                after = next(n for n in names[i + 1:] if n.split("_")[0] not in OPTIONAL)
                assert "(optional)" in text and after in targets, text
        else:
            assert "last" in text.lower()


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_a_box_after_the_title_says_what_it_needs_and_how_long_it_took(path):
    """As tutorial sites do: what a learner must have, and the time the notebook took in the
    suite (its usual_seconds, which bench_suite.py --record-usual writes into both)."""
    from mwhelpers.workshop.suite import SETUP_TAG, TAKES_ROW, takes_row, usual_seconds

    box = cells(path)[2]
    assert box["cell_type"] == "markdown" and SETUP_TAG in tags(box), source(box)
    text = source(box)
    assert text.startswith("| Before you start | |\n|---|---|\n| You need | "), text
    assert "%pip install" in text and "restart the kernel" in text, text
    lock = (ROOT / "requirements" / "tutorials.txt").read_text()
    tf, keras = (re.search(rf"^{name}==(\d+\.\d+)\.", lock, re.M).group(1)
                 for name in ("tensorflow_cpu", "keras"))
    need = next(line for line in text.splitlines() if line.startswith("| You need | "))
    assert f" The cells run with TensorFlow {tf} and Keras {keras}, the lock's. " in need, (
        f"the box should name the versions the suite runs the cells with, the lock's: {need}")
    row = TAKES_ROW.search(text)
    assert row, f"no 'It takes' row in: {text}"
    seconds, cores, day = float(row.group(1)), int(row.group(2)), row.group(4)
    assert row.group(0) == takes_row(usual_seconds(path), cores, float(row.group(3)), day), (
        f"the box says {seconds:g} s, but its usual_seconds is {usual_seconds(path):g}")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_lessons_hold_no_assert_and_each_check_cell_says_what_it_checks(path):
    checks = 0
    for cell in cells(path):
        if cell["cell_type"] != "code":
            continue
        text = source(cell)
        has_assert = re.search(r"^\s*assert\b", text, re.M) is not None
        if "check" in tags(cell):
            checks += 1
            assert text.startswith("# Check: ") and has_assert, text[:300]
        else:
            assert not has_assert, f"an assert in a lesson cell:\n{text[:600]}"
        if "reset" in tags(cell):
            assert text.startswith("# Reset: "), text[:300]
    assert checks >= 1


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_no_drawing_code_and_no_long_cell(path):
    drawing = re.compile(r"\b(plt|ax|axes|fig)\.(subplots|plot|bar|barh|imshow|add_patch|text|"
                         r"annotate|set_\w+|legend|axis)\(|import matplotlib|from matplotlib")
    for cell in cells(path):
        if cell["cell_type"] != "code":
            continue
        text = source(cell)
        assert not drawing.search(text), f"drawing code in a cell (mwhelpers.workshop.pictures " \
                                         f"draws):\n{text[:600]}"
        assert len(text.splitlines()) <= MAX_CODE_LINES, text[:300]


def _prose():
    spec = importlib.util.spec_from_file_location("prose", ROOT / "benchmarks" / "prose.py")
    prose = importlib.util.module_from_spec(spec)
    sys.modules["prose"] = prose  # its dataclass looks its module up there
    spec.loader.exec_module(prose)
    return prose


def test_the_prose_goals_hold():
    prose = _prose()
    results = [prose.measure(p) for p in NOTEBOOKS]
    words = sum(r.words for r in results)
    assert words <= prose.MAX_WORDS, words
    assert [(r.name, round(r.mean, 1)) for r in results if r.mean > prose.MAX_MEAN] == []
    assert [(r.name, s) for r in results for s in r.long] == []


def test_the_guide_the_cheat_sheet_and_the_readme_read_as_the_notebooks_do():
    """The same sentence goals for what a reader reads beside the notebooks (no word cap)."""
    prose = _prose()
    results = [prose.measure(p) for p in prose.docs(ROOT)]
    assert {r.name for r in results} >= {"extension.md", "more-machines.md", "README.md"}
    assert [(r.name, round(r.mean, 1)) for r in results if r.mean > prose.MAX_MEAN] == []
    assert [(r.name, s) for r in results for s in r.long] == []
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 120, "the README is for a newcomer's two-minute read"
