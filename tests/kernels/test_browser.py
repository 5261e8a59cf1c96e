"""What JupyterLab shows, in a real browser: JupyterLab and headless Chromium (Debian's
chromium and chromium-driver packages, driven by selenium).

One notebook is opened and run ("Run All Above" its last cell, then that cell).  The
page must show a foreground task's output as it streams, the status table as a table, a background task's
live view changing while the kernel is idle, until it settles on its exit, and the
tasks' timeline as a picture (a screenshot of it is saved and checked).
"""

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import nbformat
import psutil
import pytest
from conftest import ROOT

CHROMIUM, CHROMEDRIVER = shutil.which("chromium"), shutil.which("chromedriver")
try:
    import selenium  # noqa: F401

    HAVE_SELENIUM = True
except ImportError:
    HAVE_SELENIUM = False
REASON = ("Debian's chromium and chromium-driver are not installed (apt-get install chromium "
          "chromium-driver)" if not (CHROMIUM and CHROMEDRIVER) else
          "selenium is not installed" if not HAVE_SELENIUM else "")
if REASON and os.environ.get("CI") == "true":
    raise RuntimeError(f"CI must run the browser test, but: {REASON}")
pytestmark = [pytest.mark.skipif(bool(REASON), reason=REASON)]

BACKGROUND = (  # about 9 s of Keras-like progress
    "import time\n"
    "for e in range(1, 4):\n"
    "    print(f'Epoch {e}/3', flush=True)\n"
    "    for s in range(1, 7):\n"
    "        print(f'{s}/6 - loss: 0.{s}', flush=True)\n"
    "        time.sleep(0.5)\n"
)
FOREGROUND = (
    "import time\n"
    "for i in range(1, 6):\n"
    "    print(f'line {i} of 5', flush=True)\n"
    "    time.sleep(0.7)\n"
)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def lab(tmp_path):
    """A JupyterLab server on loopback, with its own config, data and runtime folders."""
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell("%load_ext mwhelpers\n%cluster 2"),
        nbformat.v4.new_code_cell("%%worker 1 --bg --ready start\n" + BACKGROUND),
        nbformat.v4.new_code_cell("%%worker 0\n" + FOREGROUND),
        nbformat.v4.new_code_cell("%workers"),
        nbformat.v4.new_code_cell("%waitworkers\n%workers --timeline"),
    ], metadata={"kernelspec": {"name": "python3", "display_name": "Python 3",
                                "language": "python"}})
    root = tmp_path / "root"
    root.mkdir()
    nbformat.write(nb, root / "live.ipynb")
    port, token = free_port(), secrets.token_hex(16)
    env = dict(os.environ, PYTHONPATH=str(ROOT), JUPYTER_CONFIG_DIR=str(tmp_path / "config"),
               JUPYTER_DATA_DIR=str(tmp_path / "data"), JUPYTER_RUNTIME_DIR=str(tmp_path / "rt"))
    log = open(tmp_path / "lab.log", "wb")
    server = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--no-browser", "--allow-root", f"--port={port}",
         "--ServerApp.ip=127.0.0.1", f"--IdentityProvider.token={token}",
         f"--ServerApp.root_dir={root}", "--LabApp.expose_app_in_browser=True",
         "--LabApp.news_url=", "--ServerApp.open_browser=False"],
        env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
        start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            with urllib.request.urlopen(f"{url}/api/status?token={token}", timeout=2) as r:
                json.load(r)
            break
        except OSError:
            assert server.poll() is None and time.monotonic() < deadline, \
                (tmp_path / "lab.log").read_text()
            time.sleep(0.2)
    yield {"url": url, "token": token, "root": root}
    os.killpg(server.pid, signal.SIGTERM)  # the server ends its kernels on the way out
    try:
        server.wait(15)
    except subprocess.TimeoutExpired:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait(5)
    log.close()


@pytest.fixture
def browser(tmp_path):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--no-first-run", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--disable-quic", "--window-size=1400,1000",
                 f"--user-data-dir={tmp_path / 'chromium'}"):
        opts.add_argument(flag)
    service = Service(executable_path=CHROMEDRIVER, log_output=str(tmp_path / "chromedriver.log"))
    driver = webdriver.Chrome(service=service, options=opts)
    tree = psutil.Process(service.process.pid)
    try:
        yield driver
    finally:
        procs = [tree, *tree.children(recursive=True)]
        driver.quit()
        gone, alive = psutil.wait_procs(procs, timeout=10)
        for p in alive:  # what quit() left: ours, by the tree we started
            p.kill()


def js(driver, code):
    return driver.execute_script(code)


def outputs(driver):
    """The text of each cell's output area, in order."""
    return js(driver, """
        return Array.from(document.querySelectorAll('.jp-Notebook .jp-Cell')).map(
            c => { const o = c.querySelector('.jp-OutputArea'); return o ? o.innerText : ''; });""")


NOTEBOOK_JS = """
    const app = window.jupyterapp;
    const panel = app && Array.from(app.shell.widgets('main')).find(w => w.sessionContext);
"""


def kernel_status(driver):
    return js(driver, NOTEBOOK_JS + """
        const k = panel && panel.sessionContext.session && panel.sessionContext.session.kernel;
        return k ? k.status : null;""")


def run_all_above(driver, index):
    """Run every cell above cell ``index`` ("Run All Above Selected Cell")."""
    js(driver, NOTEBOOK_JS + f"""
        app.shell.activateById(panel.id);
        panel.content.activeCellIndex = {index};
        app.commands.execute('notebook:run-all-above');""")


def run_cell(driver, index):
    js(driver, NOTEBOOK_JS + f"""
        app.shell.activateById(panel.id);
        panel.content.activeCellIndex = {index};
        app.commands.execute('notebook:run-cell');""")


def wait_for(what, check, timeout, interval=0.1):
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(interval)


def test_jupyterlab_shows_streaming_output_the_status_table_and_a_live_view(lab, browser,
                                                                           tmp_path):
    browser.get(f"{lab['url']}/lab/tree/live.ipynb?reset&token={lab['token']}")
    wait_for("JupyterLab and the notebook's kernel", lambda: kernel_status(browser) == "idle", 90,
             interval=0.3)
    run_all_above(browser, 4)  # the timeline's cell waits for the tasks: run it last

    # Foreground output streams: the page shows the first lines before the last is printed.
    partial = wait_for("worker 0's first lines", lambda: (lambda t: t if "line 2 of 5" in t[2]
                       and "line 5 of 5" not in t[2] else None)(outputs(browser)), 60, 0.05)
    assert "[worker:0] line 1 of 5" in partial[2]
    assert kernel_status(browser) == "busy"

    # The status table renders as a table.
    wait_for("the status table", lambda: js(browser, """
        const cells = document.querySelectorAll('.jp-Notebook .jp-Cell');
        const t = cells[3] && cells[3].querySelector('.jp-OutputArea table');
        return t && t.innerText.includes('state') && t.innerText.includes('worker:1');"""), 60)

    # The live view of the background task follows it while the kernel is idle.
    wait_for("the kernel to be idle", lambda: kernel_status(browser) == "idle", 30)
    seen = []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        text = outputs(browser)[1]
        status = kernel_status(browser)
        if not seen or seen[-1][0] != text:
            seen.append((text, status))
        if "done" in text:
            break
        time.sleep(0.2)
    running = [(t, s) for t, s in seen if "running" in t]
    assert len(running) >= 2, seen  # it changed by itself, more than once
    assert all(s == "idle" for _, s in running), seen  # ... while no cell ran
    assert any("epoch" in t and "step" in t for t, _ in running), seen
    assert "done" in seen[-1][0] and "exit 0" in seen[-1][0], seen

    # The timeline: a picture in the last cell's output, drawn (not a broken image).
    run_cell(browser, 4)
    size = wait_for("the timeline picture", lambda: js(browser, """
        const cells = document.querySelectorAll('.jp-Notebook .jp-Cell');
        const img = cells[4] && cells[4].querySelector('.jp-OutputArea img');
        return img && img.complete && img.naturalWidth > 0 ? [img.naturalWidth, img.naturalHeight]
                                                           : null;"""), 60)
    assert size[0] > 600 and size[1] > 150, size
    assert "timeline saved to" in outputs(browser)[4]
    from selenium.webdriver.common.by import By

    img = browser.find_elements(By.CSS_SELECTOR, ".jp-Notebook .jp-Cell")[4].find_element(
        By.CSS_SELECTOR, ".jp-OutputArea img")
    browser.execute_script("arguments[0].scrollIntoView();", img)
    shot = tmp_path / "timeline-in-jupyterlab.png"
    img.screenshot(str(shot))
    assert shot.read_bytes()[:4] == b"\x89PNG" and shot.stat().st_size > 5_000
