"""Each task's life on one time axis: the events runs keep, the text, the PNG, the magic."""

import pytest

from mwhelpers.errors import UsageError
from mwhelpers.failures import WorkerFailed

# Three "epochs" of five steps, the lines Keras and custom loops print.
EPOCHS = ("import time\n"
          "for e in range(1, 4):\n"
          "    print(f'Epoch {e}/3', flush=True)\n"
          "    for s in range(5):\n"
          "        print('step', s, flush=True)\n"
          "        time.sleep(0.1)\n")


def kinds(timeline, run):
    return [kind for _, kind, _ in timeline.events(run)]


def test_a_supervised_restart_on_the_timeline(ip, rt, tmp_path):
    rt.define_cluster(2)
    attempts = rt.supervise(code=EPOCHS, inject=[("worker:1", "^Epoch 2/3")], stream=False)
    assert len(attempts) == 2
    tl = rt.timeline()
    assert [(str(r.task), r.attempt) for r in tl.runs] == [
        ("worker:0", 1), ("worker:1", 1), ("worker:0", 2), ("worker:1", 2)]
    killed = tl.runs[1]
    k = kinds(tl, killed)
    assert k[:3] == ["launched", "ready", "epoch"] and k[-1] == "exit"
    assert "signal" in k and k.index("signal") < k.index("exit")
    signal_at = next(t for t, kind, _ in tl.events(killed) if kind == "signal")
    epoch2_at = next(t for t, kind, text in tl.events(killed) if kind == "epoch" and text == "2/3")
    assert epoch2_at <= signal_at + 0.2  # stamped when read, within the reading interval
    for run in tl.runs[2:]:  # the second attempt: three epochs, fifteen steps, exit 0
        evs = tl.events(run)
        assert [text for _, kind, text in evs if kind == "epoch"] == ["1/3", "2/3", "3/3"]
        assert sum(kind == "step" for _, kind, _ in evs) == 15
        assert evs[-1][1:] == ("exit", "exit code 0")
        assert evs[0][0] >= tl.events(killed)[-1][0] - 0.5  # after the first attempt ended
    text = str(tl)
    assert "worker:1 run 1:" in text and "SIGKILL sent" in text
    assert "worker:0 run 2 (attempt 2):" in text and "exit code 0" in text and "(15 step lines)" in text

    # The magic: a picture returned, a PNG saved where the log folder is (or --save says).
    ip.run_line_magic("workers", "--timeline")
    png = (rt.log_dir / "timeline.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    shown = ip.run_line_magic("workers", f"--timeline --save {tmp_path / 'pics' / 'one.png'}")
    assert (tmp_path / "pics" / "one.png").read_bytes()[:4] == b"\x89PNG"
    assert shown._repr_png_()[:4] == b"\x89PNG"


def test_a_new_cluster_starts_a_new_timeline(ip, rt):
    ip.run_line_magic("cluster", "2")
    with pytest.raises(WorkerFailed):
        ip.run_cell_magic("worker", "0", "import sys\nsys.exit(3)\n")
    # It exited before its port opened: never ready.
    assert kinds(rt.timeline(), rt.get_run(0)) == ["launched", "exit"]
    ip.run_line_magic("cluster", "1")
    assert rt.timeline().runs == []
    assert str(rt.timeline()) == "No task has been launched on this cluster yet."
    assert ip.run_line_magic("workers", "--timeline") is None  # says so, draws nothing
    with pytest.raises(UsageError, match="--save goes with --timeline"):
        ip.run_line_magic("workers", "--save x.png")
