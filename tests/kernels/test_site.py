"""The static site (mwhelpers.workshop.site): executed notebooks, the guide, the cheat sheet and
the reference, built by Sphinx with myst-nb and furo, then read in a real browser (headless
Chromium, as in test_browser.py)."""

import base64
import re
import struct
import subprocess
import sys
import zlib

import nbformat
import pytest
from conftest import ROOT
from test_browser import REASON as NO_BROWSER
from test_browser import browser  # noqa: F401  (the fixture)

from mwhelpers.workshop import site


def png(width, height, rgb):
    """A small PNG of one colour, written by hand (no imaging library needed)."""
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    rows = b"".join(b"\0" + bytes(rgb) * width for _ in range(height))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))


def executed(folder, name, title, rgb):
    """An executed notebook as the suite leaves it: papermill's injected parameters, a printed
    line and a picture."""
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_markdown_cell(f"# {title}\n\nSome prose."),
        nbformat.v4.new_code_cell("workdir = None", metadata={"tags": ["parameters"]}),
        nbformat.v4.new_code_cell('workdir = "/tmp/the-run-that-executed-it"',
                                  metadata={"tags": ["injected-parameters"]}),
        nbformat.v4.new_code_cell("print('trained on 2 workers')", outputs=[
            nbformat.v4.new_output("stream", name="stdout", text="trained on 2 workers\n")]),
        nbformat.v4.new_code_cell("plt.show()", outputs=[nbformat.v4.new_output(
            "display_data", data={"image/png": base64.b64encode(png(40, 30, rgb)).decode(),
                                  "text/plain": "<Figure size 40x30 with 1 Axes>"})]),
    ]
    path = folder / name
    nbformat.write(nb, path)
    return path


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    folder = tmp_path_factory.mktemp("executed")
    executed(folder, "01_first.ipynb", "1. The first tutorial", (200, 60, 20))
    executed(folder, "02_second.ipynb", "2. The second tutorial", (20, 60, 200))
    out = folder / "site"
    return site.build(folder, out)


def test_the_site_has_the_notebooks_with_their_outputs_the_cheat_sheet_and_the_reference(built):
    out = built.parent
    index = built.read_text()
    for page, title in (("01_first.html", "1. The first tutorial"),
                        ("02_second.html", "2. The second tutorial"),
                        ("cheatsheet.html", "Multi-worker training on one page"),
                        ("reference.html", "Reference")):
        assert f'href="{page}"' in index and title in index, page  # in the navigation
    first = (out / "01_first.html").read_text()
    assert "trained on 2 workers" in first and "Some prose." in first
    assert "the-run-that-executed-it" not in first  # papermill's cell is left out
    # The footer names who holds the copyright, not "Copyright ©" alone.
    assert re.search(r"Copyright\s*(©|&#169;|&copy;)\s*2026, the mwhelpers authors", first)
    second = (out / "02_second.html").read_text()
    images = list((out / "_images").glob("*.png"))  # each notebook's picture, as a file
    assert len(images) == 2
    assert [sum(f"_images/{p.name}" in page for p in images) for page in (first, second)] == [1, 1]
    reference = (out / "reference.html").read_text()
    assert "%worker" in reference and "%%worker" in reference and "%cluster" in reference
    assert 'id="mwhelpers.Runtime.launch_all"' in reference  # the API, from its docstrings
    # The guide (docs/guide/), in its order, between the tutorials and the reference:
    guide = ["extension", "keras3", "more-machines", "diagnosis", "layout", "contributing"]
    places = [index.index(f'href="{page}"') for page in
              ["02_second.html", *(f"guide/{g}.html" for g in guide), "cheatsheet.html"]]
    assert places == sorted(places)
    extension = (out / "guide" / "extension.html").read_text()
    assert "The extension" in index and "The extension" in extension
    # one row of the generated settings table, and a link to another page of the guide
    assert "MWHELPERS_PORT_RANGE" in extension
    assert "20000 to just below the ephemeral range" in extension
    assert "reserved across notebooks with file locks" in extension
    assert 'href="more-machines.html"' in extension


def test_without_executed_notebooks_it_says_to_run_the_suite(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "mwhelpers.workshop.site", "--executed",
                           str(tmp_path), "--out", str(tmp_path / "site")], capture_output=True,
                          text=True, cwd=ROOT, timeout=120)
    assert proc.returncode != 0
    assert f"no executed notebooks in {tmp_path}: run the suite first" in proc.stderr


@pytest.mark.skipif(bool(NO_BROWSER), reason=NO_BROWSER or "")
def test_a_browser_reads_the_site_through_its_navigation(built, browser):  # noqa: F811
    from selenium.webdriver.common.by import By

    browser.get(built.as_uri())
    links = {a.text: a for a in browser.find_elements(By.CSS_SELECTOR, ".sidebar-tree a")}
    assert list(links)[:2] == ["1. The first tutorial", "2. The second tutorial"]
    assert "Reference" in links
    links["2. The second tutorial"].click()
    assert browser.title.startswith("2. The second tutorial")
    assert "trained on 2 workers" in browser.find_element(By.CSS_SELECTOR, "article").text
    (image,) = browser.find_elements(By.CSS_SELECTOR, "article img")
    assert browser.execute_script("return arguments[0].naturalWidth", image) == 40  # it loaded


def test_a_folder_that_holds_something_else_is_not_replaced(tmp_path):
    executed(tmp_path, "01_first.ipynb", "1. The first tutorial", (0, 0, 0))
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    with pytest.raises(SystemExit, match=r"mine is not empty and holds no site: give --out"):
        site.build(tmp_path, tmp_path / "mine")
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep me"
