"""Following a task's log: read once as it grows, handed on as lines and events.

A task's log is the one record of its output.  What the kernel learns from it
while the task runs comes from one :class:`LogFeed` per run (``run.feed``).  A
feed reads the bytes written since its last read, whoever asks for them (its runtime's
:class:`Follower` thread, every :data:`BACKGROUND` seconds while the run runs,
every :data:`INTERVAL` while a cell streams it, every :data:`URGENT` while a fault waits
for one of its lines, and once more after it ended; a
watch that wants the last lines at once), splits
them into lines as a terminal shows them (:func:`mwhelpers.logs.shown`) and
hands them on, in order, to its subscribers, with the events it parsed from
them (:class:`Event`):

    kind        from                                            text
    epoch       Keras' "Epoch 2/3"                              "2/3"
    batch       Keras' progress within an epoch, "5/10 ..."     "5/10"
    step        a line that starts with the word step           "4" ('' without a number)
                (a custom loop's "step 4 loss=...")
    facts       the task's TensorFlow and Keras (taskfacts)     the line
    stacks      a stack dump begins (its first thread header)   the line
    stacks-end  the dump is over (another line, or the end)     ''

Progress is parsed here and nowhere else: :func:`progress_of` (one line) and
:func:`progress` (the ``'epoch 2/3, step 5/10'`` of some lines).

Subscribers (:meth:`LogFeed.subscribe`) are called while the feed holds its
lock, in the thread that read: they must be quick (note, queue, stamp) and must
not block.  The echo of a watch queues lines and shows them in the watch's own
thread (:class:`mwhelpers.watcher.Watcher`); a run stamps its epochs and steps
(:class:`mwhelpers.taskrun.TaskRun`); a live view reads the feed's state
(:meth:`LogFeed.progress`, :meth:`LogFeed.recent`).
"""

from __future__ import annotations

import re
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from . import stacks
from .logs import LogFollower, head_lines
from .taskside import taskfacts

INTERVAL = 0.05  # seconds between reads of a running task's log that a cell streams
URGENT = 0.005  # ... that a fault waits on (supervise's inject, %killworker --when): a kill
# lands within a step or two of its line even where a step takes a few milliseconds
BACKGROUND = 0.1  # seconds between reads of the others (the timeline's marks, live views)
RECENT = 200  # lines a feed keeps of its log's end (a live view's last line)

EventKind = Literal["epoch", "batch", "step", "facts", "stacks", "stacks-end"]

# Progress, at the start of a line: Keras' "Epoch 2/3" at the start of each epoch, Keras'
# "5/10 ..." within one (its progress bar's state, or a verbose=2 line), and a custom loop's
# lines that start with the word "step" ("step 4 loss=...", "STEP epoch=1 batch=2 ...").
_PROGRESS = re.compile(r"^(?:Epoch (?P<epoch>\d+/\d+)|\s*(?P<batch>\d+/\d+)\b"
                       r"|\s*(?i:step)\b\W*(?P<step>\d*))")


@dataclass(frozen=True)
class Event:
    """Something a feed read in its log: ``kind`` (see the module's table), ``text``,
    and ``at``, the ``time.time()`` it was read."""

    kind: EventKind
    text: str
    at: float


def progress_of(line: str) -> tuple[Literal["epoch", "batch", "step"], str] | None:
    """``(kind, text)`` when ``line`` says how far a program got (``("epoch", "2/3")``,
    ``("batch", "5/10")``, ``("step", "4")``), else None."""
    m = _PROGRESS.match(line)
    if m is None:
        return None
    epoch, batch, step = m.group("epoch", "batch", "step")
    if epoch is not None:
        return "epoch", epoch
    if batch is not None:
        return "batch", batch
    return "step", step


def _said(epoch: str | None, batch: str | None) -> str:
    parts = ([f"epoch {epoch}"] if epoch else []) + ([f"step {batch}"] if batch else [])
    return ", ".join(parts)


def progress(lines: Iterable[str]) -> str:
    """``'epoch 2/3, step 5/10'`` from Keras' output in ``lines`` ('' if none)."""
    epoch = batch = None
    for line in lines:
        found = progress_of(line)
        if found is None:
            continue
        if found[0] == "epoch":
            epoch, batch = found[1], None
        elif found[0] == "batch":
            batch = found[1]
    return _said(epoch, batch)


LinesListener = Callable[[list[str]], object]
EventListener = Callable[[Event], object]


class LogFeed:
    """One run's log, read once as it grows; its lines and events go to its subscribers.

    Public: :meth:`read` (read what is new now), :meth:`subscribe`, and what it gathered:
    :meth:`progress`, :meth:`recent`, ``facts`` (the task's TensorFlow and Keras, a dict
    from :func:`mwhelpers.taskside.taskfacts.parse`, or None), ``stack_dumps`` (dumps begun).
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._reader = LogFollower(self.path)
        self._lock = threading.RLock()
        self._subscribers: list[tuple[LinesListener | None, EventListener | None]] = []
        self._recent: deque[str] = deque(maxlen=RECENT)
        self._epoch: str | None = None
        self._batch: str | None = None
        self._in_dump = False
        self.facts: dict[str, str] | None = None
        self.stack_dumps = 0
        self.hurried = 0  # subscribers that want lines every INTERVAL, not every BACKGROUND
        self.urgent = 0  # ... every URGENT

    def read(self, final: bool = False) -> int:
        """Read what was written since the last read and hand it on; ``final``: the
        unfinished last line too (the run has ended).  Returns how many lines it read."""
        with self._lock:
            lines = self._reader.poll(final=final)
            events = self._parse(lines) if lines else []
            if final and self._in_dump:
                self._in_dump = False
                events.append(Event("stacks-end", "", time.time()))
            if lines:
                self._recent.extend(lines)
            for on_lines, on_event in self._subscribers:
                if lines and on_lines is not None:
                    on_lines(lines)
                if on_event is not None:
                    for event in events:
                        on_event(event)
            return len(lines)

    def subscribe(self, on_lines: LinesListener | None = None,
                  on_event: EventListener | None = None,
                  replay: bool = False, hurry: bool = False, urgent: bool = False
                  ) -> Callable[[], None]:
        """Have ``on_lines(lines)`` called with every batch of new lines and ``on_event(event)``
        with every event from now on; ``replay``: ``on_lines`` first gets the lines read
        before (read again from the file, once); ``hurry``: the follower reads the log every
        :data:`INTERVAL` while this subscription lasts (a cell streams it); ``urgent``: every
        :data:`URGENT` (a fault waits for a line).  Returns the function that unsubscribes."""
        entry = (on_lines, on_event)
        with self._lock:
            if replay and on_lines is not None and self._reader.complete:
                earlier = head_lines(self.path, self._reader.complete)
                if earlier:
                    on_lines(earlier)
            self._subscribers.append(entry)
            self.hurried += hurry or urgent
            self.urgent += urgent

        def unsubscribe() -> None:
            with self._lock:
                if entry in self._subscribers:
                    self._subscribers.remove(entry)
                    self.hurried -= hurry or urgent
                    self.urgent -= urgent
        return unsubscribe

    def progress(self) -> str:
        """``'epoch 2/3, step 5/10'``: the Keras progress read so far, a progress bar's
        unfinished line included ('' if none)."""
        with self._lock:
            epoch, batch, pending = self._epoch, self._batch, self._reader.pending()
        found = progress_of(pending) if pending else None
        if found is not None and found[0] == "epoch":
            epoch, batch = found[1], None
        elif found is not None and found[0] == "batch":
            batch = found[1]
        return _said(epoch, batch)

    def recent(self, n: int = RECENT) -> list[str]:
        """The last ``n`` (at most :data:`RECENT`) lines read, an unfinished one included."""
        with self._lock:
            lines = list(self._recent)
            pending = self._reader.pending()
        if pending:
            lines.append(pending)
        return lines[-n:] if n else []

    def _parse(self, lines: list[str]) -> list[Event]:
        events: list[Event] = []
        now = time.time()
        for line in lines:
            if self._in_dump:
                if stacks.in_dump(line):
                    continue
                self._in_dump = False
                events.append(Event("stacks-end", "", now))
            found = progress_of(line)
            if found is not None:
                kind, text = found
                if kind == "epoch":
                    self._epoch, self._batch = text, None
                elif kind == "batch":
                    self._batch = text
                events.append(Event(kind, text, now))
            elif line.startswith(taskfacts.PREFIX):
                facts = taskfacts.parse([line])
                if facts is not None:
                    self.facts = facts
                    events.append(Event("facts", line, now))
            elif line.startswith(("Current thread ", "Thread ")) and stacks.is_header(line):
                self._in_dump = True
                self.stack_dumps += 1
                events.append(Event("stacks", line, now))
        return events


class Follower:
    """One daemon thread that reads every followed feed while its run runs, every ``urgent``
    seconds while a subscriber is urgent, every ``interval`` seconds if one hurries it, else
    every ``background`` seconds, and once more (to its end) after the run ended; it stops by
    itself when nothing is left to follow, and :meth:`follow` starts it again.  Each runtime owns one
    (:class:`mwhelpers.services.Services`), which :meth:`close` ends with it."""

    def __init__(self, interval: float = INTERVAL, background: float = BACKGROUND,
                 urgent: float = URGENT) -> None:
        self.interval = interval
        self.background = background
        self.urgent = urgent
        self._feeds: dict[LogFeed, tuple[Callable[[], bool], list[float]]] = {}  # [next read]
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def follow(self, feed: LogFeed, running: Callable[[], bool]) -> None:
        """Read ``feed`` while ``running()`` is true, and once more after."""
        with self._lock:
            self._feeds[feed] = (running, [0.0])
            if self._thread is None or not self._thread.is_alive():  # (a forked process has none)
                self._thread = threading.Thread(target=self._loop, name="mwhelpers-follow",
                                                daemon=True)
                self._thread.start()

    def close(self) -> None:
        """Follow nothing any more: each feed is read once more, to its end, here."""
        with self._lock:
            feeds, self._feeds = list(self._feeds), {}
        for feed in feeds:
            try:
                feed.read(final=True)
            except Exception:  # a subscriber's mistake must not keep the others from their end
                pass

    @property
    def following(self) -> int:
        """How many feeds it follows now."""
        with self._lock:
            return len(self._feeds)

    def _loop(self) -> None:
        while True:
            with self._lock:
                feeds = list(self._feeds.items())
            now = time.monotonic()
            hurried = urgent = False
            for feed, (running, next_read) in feeds:
                ended = not running()  # decided before the read: the last read follows the exit
                hurried = hurried or (feed.hurried > 0 and not ended)
                urgent = urgent or (feed.urgent > 0 and not ended)
                if not (ended or feed.hurried or now >= next_read[0]):
                    continue
                next_read[0] = now + self.background - self.interval / 2
                try:
                    feed.read(final=ended)
                except Exception:  # a subscriber's mistake must not stop every other feed
                    ended = True
                if ended:
                    with self._lock:
                        self._feeds.pop(feed, None)
            with self._lock:
                if not self._feeds:
                    self._thread = None  # decided under the lock: a new follow() starts one
                    return
            time.sleep(self.urgent if urgent else self.interval if hurried else self.background)

