"""How often the runtime's follower reads a log: every BACKGROUND seconds, every INTERVAL while
a cell streams it, every URGENT while a fault waits for one of its lines (supervise's inject,
%killworker --when).  A real feed on a real file and the real follower thread; only the
follower's sleeps are recorded (each still sleeps, a millisecond)."""

import threading
import time

import pytest

from mwhelpers import follow


@pytest.fixture
def sleeps(monkeypatch):
    """The intervals the follower thread asked to sleep, newest last."""
    asked: list[float] = []
    real = time.sleep

    def record(seconds):
        if threading.current_thread().name == "mwhelpers-follow":
            asked.append(seconds)
            real(0.001)
        else:
            real(seconds)

    monkeypatch.setattr(follow.time, "sleep", record)
    return asked


def settle(asked, n=5):
    """The next ``n`` intervals the follower asks for."""
    start = len(asked)
    deadline = time.monotonic() + 10
    while len(asked) < start + n:
        assert time.monotonic() < deadline, asked
        time.sleep(0.01)
    return set(asked[start:start + n])


def test_the_follower_reads_urgently_only_while_a_subscriber_is_urgent(tmp_path, sleeps):
    log = tmp_path / "worker-0.log"
    log.write_text("STEP 1\n")
    feed, follower, running = follow.LogFeed(log), follow.Follower(), [True]
    heard: list[str] = []
    follower.follow(feed, lambda: running[0])
    try:
        quiet = feed.subscribe(heard.extend)
        assert settle(sleeps) == {follow.BACKGROUND}
        streamed = feed.subscribe(heard.extend, hurry=True)
        assert settle(sleeps) == {follow.INTERVAL}
        fault = feed.subscribe(heard.extend, urgent=True)
        assert settle(sleeps) == {follow.URGENT}
        assert (feed.hurried, feed.urgent) == (2, 1)
        with log.open("a") as f:
            f.write("STEP 2\n")
        settle(sleeps)
        assert heard.count("STEP 2") == 3  # each subscriber got it
        fault()
        assert settle(sleeps) == {follow.INTERVAL} and (feed.hurried, feed.urgent) == (1, 0)
        streamed()
        quiet()
        assert settle(sleeps) == {follow.BACKGROUND}
    finally:
        running[0] = False
        follower.close()


def test_a_watch_that_injects_a_fault_is_urgent_and_an_ordinary_one_is_not(tmp_path):
    from types import SimpleNamespace

    from mwhelpers.watcher import Watcher

    log = tmp_path / "worker-0.log"
    log.write_text("")
    feed = follow.LogFeed(log)
    run = SimpleNamespace(feed=feed, process=SimpleNamespace(on_exit=lambda fn: None))
    ordinary = Watcher([run])
    assert (feed.hurried, feed.urgent) == (1, 0)
    injecting = Watcher([run], urgent=True)
    assert (feed.hurried, feed.urgent) == (2, 1)
    injecting.close()
    ordinary.close()
    assert (feed.hurried, feed.urgent) == (0, 0)
