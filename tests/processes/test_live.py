"""Background tasks are followed live in the notebook: the view updates itself, then settles.

The tests described here that need more than this folder gives are in kernels/test_live_kernels.py."""

import threading
import time

from mwhelpers.follow import progress
from mwhelpers.live import LiveViews, TaskView

# Keras-like progress, about 2.5 s in all.
PROGRESS = (
    "import time\n"
    "for e in range(1, 4):\n"
    "    print(f'Epoch {e}/3', flush=True)\n"
    "    for s in range(1, 6):\n"
    "        print(f'{s}/5 - loss: 0.{s}', flush=True)\n"
    "        time.sleep(0.15)\n"
)


def test_progress_reads_keras_epochs_and_steps():
    assert progress(["Epoch 1/3", "3/10 [==>....] - loss: 1.0"]) == "epoch 1/3, step 3/10"
    assert progress(["Epoch 1/3", "10/10 - 0s - loss: 1.0", "Epoch 2/3"]) == "epoch 2/3"
    assert progress(["hello"]) == ""


class Handle:
    """Records what a display handle was updated with (the kernel's part is tested below)."""

    def __init__(self, first):
        self.shown = [repr(first)]

    def update(self, obj):
        self.shown.append(repr(obj))


def test_views_update_until_the_task_ends_then_the_thread_stops(rt):
    handles = []

    def display(obj):
        handles.append(Handle(obj))
        return handles[-1]

    views = LiveViews(display=display, interval=0.2)
    rt.define_cluster(1)
    run = rt.launch("worker:0", code=PROGRESS, background=True, ready="start")
    views.show(run)
    run.wait(10)
    deadline = time.monotonic() + 5
    while views.following and time.monotonic() < deadline:
        time.sleep(0.05)
    assert views.following == 0 and views._thread is None
    shown = handles[0].shown
    assert any("running" in s and "epoch" in s for s in shown[1:-1]), shown
    assert shown[-1].startswith("[worker:0] done (exit 0) after") and "epoch 3/3, step 5/5" in shown[-1]
    assert not any(t.name == "mwhelpers-live" for t in threading.enumerate())


def test_the_html_view_names_state_exit_and_progress(rt):
    rt.define_cluster(1)
    run = rt.launch("worker:0", code="print('Epoch 1/1')\nprint('1/1 - loss: 0.1')\nraise SystemExit(3)",
                    background=True, ready="start")
    run.wait(10)
    page = TaskView(run)._repr_html_()
    assert "worker:0" in page and "failed" in page and "exit 3" in page
    assert "epoch 1/1, step 1/1" in page


def test_a_view_drawn_as_its_task_ends_is_drawn_once_more(rt, monkeypatch):
    """A task that ends between the state read and the view drawn must not settle showing
    "running" (a race seen in JupyterLab under load); a fake task, in-process."""
    from fakes import code

    from mwhelpers import live

    rt.define_cluster(1, backend="fake")
    run = rt.launch("worker:0", code=code("hangs"), background=True)
    shown = []

    class Handle:
        def update(self, view):
            shown.append(view.running)

    views = live.LiveViews(display=lambda view: Handle(), interval=3600)
    views.show(run)
    drawn = live.TaskView

    def drawn_then_ended(r):
        view = drawn(r)  # drawn while it runs...
        rt.end_all(policy="now")  # ... and it ends right after
        return view

    monkeypatch.setattr(live, "TaskView", drawn_then_ended)
    assert views.refresh() is True and shown == [True]  # still followed
    monkeypatch.setattr(live, "TaskView", drawn)
    assert views.refresh() is False and shown == [True, False]  # drawn ended, then settled
