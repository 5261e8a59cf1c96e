"""Background tasks are followed live in the notebook: the view updates itself, then settles.

Here: the tests of test_live that need Jupyter kernels; the module's text and its other tests
are in processes/test_live.py."""

import time

import nbformat
from conftest import ROOT
from test_live import PROGRESS


def test_in_a_kernel_the_view_updates_while_the_kernel_is_idle(tmp_path):
    from test_kernel import Kernel

    k = Kernel(tmp_path)
    try:
        status, out = k.run("%load_ext mwhelpers\n%cluster 1")
        assert status == "ok", out
        first = []
        reply = k.kc.execute_interactive("%%worker 0 --bg --ready start\n" + PROGRESS,
                                         output_hook=first.append, timeout=30)
        assert reply["content"]["status"] == "ok"
        shown = [m for m in first if m["msg_type"] == "display_data"]
        assert len(shown) == 1
        display_id = shown[0]["content"]["transient"]["display_id"]
        updates = []
        deadline, quiet_until = time.monotonic() + 15, None
        while time.monotonic() < (quiet_until or deadline):  # no cell runs: the kernel is idle
            try:
                m = k.kc.get_iopub_msg(timeout=0.5)
            except Exception:
                continue
            if m["msg_type"] == "update_display_data":
                assert m["content"]["transient"]["display_id"] == display_id
                updates.append((time.monotonic(), m["content"]["data"]["text/plain"]))
                html = m["content"]["data"].get("text/html", "")
                if "done" in updates[-1][1] and quiet_until is None:
                    quiet_until = time.monotonic() + 2.5  # long enough for 2 more updates
        texts = [t for _, t in updates]
        assert any("running" in t for t in texts), texts
        assert texts[-1].startswith("[worker:0] done (exit 0)"), texts
        assert "<table" in html and "done" in html  # JupyterLab renders the HTML
        done_at = next(t for t, text in updates if "done" in text)
        assert updates[-1][0] - done_at < 0.1  # settled: nothing after the final state
    finally:
        k.close()


def test_headless_runs_save_the_final_state(tmp_path, monkeypatch):
    from nbclient import NotebookClient

    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell("%load_ext mwhelpers\n%cluster 1"),
        nbformat.v4.new_code_cell("%%worker 0 --bg --ready start\n" + PROGRESS),
        nbformat.v4.new_code_cell("%waitworkers --timeout 60"),
    ])
    NotebookClient(nb, timeout=120, kernel_name="python3",
                   resources={"metadata": {"path": str(tmp_path)}}).execute()
    view = [o for o in nb.cells[1].outputs if o.output_type == "display_data"]
    assert len(view) == 1
    assert view[0].data["text/plain"].startswith("[worker:0] done (exit 0) after")
    assert "<table" in view[0].data["text/html"]
