"""Task log files: reading their last lines, and following them as they grow.

A task's stdout and stderr go, merged, to one log file.  Progress bars
rewrite their line with ``\\r``; every reader here keeps what such a line
shows last, the way a terminal would, without the colour codes and
backspaces that Keras 3's progress bar writes even into a file (it takes
any POSIX system for a terminal: ``keras/src/utils/progbar.py``).
"""

from __future__ import annotations

import os
import re

from .results import TAG as _RESULT_TAG

TAIL = 15  # log lines quoted in errors and failure records
_TAIL_WINDOW = 256 * 1024  # bytes read from the end for a short tail


# Terminal control sequences (colours, cursor moves) and backspaces.
_CONTROL = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x08")


def shown(line: str) -> str:
    """What a terminal shows of one line: the text after its last carriage return, without
    control sequences."""
    line = line.rstrip("\r").rsplit("\r", 1)[-1]
    return _CONTROL.sub("", line) if ("\x1b" in line or "\x08" in line) else line


def _split(text: str) -> list[str]:
    lines = [shown(ln) for ln in text.replace("\r\n", "\n").split("\n")]
    if lines and lines[-1] == "":
        lines.pop()
    return lines


def tail_lines(path: str | os.PathLike[str], n: int = TAIL) -> list[str]:
    """The last ``n`` lines of a text file; ``n=0``: every line of it.

    A file that does not exist (yet) has no lines.
    """
    try:
        with open(path, "rb") as f:
            if n:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - _TAIL_WINDOW))
            data = f.read()
    except OSError:
        return []
    lines = _split(data.decode("utf-8", "replace"))
    return lines[-n:] if n else lines


def split_lines(data: bytes) -> list[str]:
    """The lines of ``data`` (bytes of a log) as a terminal shows them; a last line without
    its newline counts."""
    parts = data.split(b"\n")
    if parts and parts[-1] == b"":
        parts.pop()
    return [shown(p.decode("utf-8", "replace")) for p in parts]


def head_lines(path: str | os.PathLike[str], size: int) -> list[str]:
    """The lines of the first ``size`` bytes of a file (none when it cannot be read)."""
    try:
        with open(path, "rb") as f:
            return split_lines(f.read(size))
    except OSError:
        return []


class LogFollower:
    """Yields the complete new lines of a growing log file, one poll at a time."""

    def __init__(self, path: str | os.PathLike[str], offset: int = 0) -> None:
        self.path = path
        self.offset = offset
        self._partial = b""

    def poll(self, final: bool = False) -> list[str]:
        """New complete lines since the last poll; ``final``: the unfinished one too."""
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except OSError:
            data = b""
        self.offset += len(data)
        if not data and not (final and self._partial):
            return []
        parts = (self._partial + data).split(b"\n")
        self._partial = parts.pop()
        if final and self._partial:
            parts.append(self._partial)
            self._partial = b""
        return [shown(p.decode("utf-8", "replace")) for p in parts]

    @property
    def complete(self) -> int:
        """The bytes of the file that the lines returned so far hold."""
        return self.offset - len(self._partial)

    def pending(self) -> str:
        """The unfinished last line read so far, as a terminal shows it ('' if none): a
        progress bar that rewrites its line with carriage returns."""
        return shown(self._partial.decode("utf-8", "replace")) if self._partial else ""


# TensorFlow's C++ log records (absl format): "I0000 00:00:1795362809.141083   26731 file.cc:467] ...".
_TF_RECORD = re.compile(r"^([IWEF])\d{4} \d\d:\d\d:\d+\.\d+\s+\d+ [\w./-]+:\d+\] ")
# Warnings and errors that every CPU-only start prints; noise, not news.
_START_UP_NOISE = re.compile(
    r"cuInit|Could not find cuda drivers|Unable to register cu(DNN|FFT|BLAS) factory|"
    r"TF-TRT Warning|computation placer already registered|oneDNN custom operations")
_ABSL_PREAMBLE = "WARNING: All log messages before absl::InitializeLog() is called"
# The task's TensorFlow and Keras, written by mwhelpers' start-up for the diagnosis (taskfacts.py).
_FACTS = "[mwhelpers] this task: "
# mwhelpers' start-up deferring Keras's pyplot import (lazyplot.py): a log line, not news.
_LAZY = ("[mwhelpers] matplotlib is imported when a plot needs it",
         "[mwhelpers] JAX is imported when it is used")
# mwhelpers' start-up putting JAX's gloo on the task's address (jaxgloo.py), and gloo's own
# line once its peers are connected: log lines, not news.
_GLOO = ("[mwhelpers] JAX's gloo collectives listen on ", "[Gloo] Rank ")
# A program's machine-readable result line (mwhelpers.results): read by rt.results(), kept in the log.
_RESULT = f"{_RESULT_TAG} {{"
# Lines that continue a hidden record on the next line.
_CONTINUATION = re.compile(r"^(To enable the following instructions|/job:\w+/replica:\d+/task:\d+$)")


class QuietFilter:
    """Decides, line by line, what a cell shows of a task's output.

    Hidden: TensorFlow's informational C++ records (``I...`` lines, with the
    lines that continue them), absl's start-up preamble, mwhelpers' lines
    naming the task's TensorFlow and Keras, deferring Keras's pyplot import and placing JAX's
    gloo (with gloo's own "connected" line), the CUDA and
    oneDNN start-up messages of CPU-only machines, and the program's
    ``RESULT {...}`` lines (JSON for the kernel, see :mod:`mwhelpers.results`).  Shown: everything else,
    the program's own output and TensorFlow's other warnings and errors.
    The log file always keeps every line; this only filters what streams.
    """

    def __init__(self) -> None:
        self.hidden = 0
        self._after_hidden = False

    def keep(self, line: str) -> bool:
        show = self._decide(line)
        self.hidden += not show
        return show

    def _decide(self, line: str) -> bool:
        m = _TF_RECORD.match(line)
        if m:
            self._after_hidden = m.group(1) == "I" or bool(_START_UP_NOISE.search(line))
            return not self._after_hidden
        if line.startswith((_ABSL_PREAMBLE, _FACTS, *_LAZY, *_GLOO, _RESULT)):
            return False
        if self._after_hidden and _CONTINUATION.match(line):
            return False
        self._after_hidden = False
        return True

