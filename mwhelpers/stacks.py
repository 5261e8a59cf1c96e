"""Reading the Python stacks a stuck task wrote to its log.

Before it ends a stuck task, mwhelpers has it write every thread's stack
(``faulthandler``: a thread of the worker start-up's writes them when asked on a pipe, or
the handler it registers on SIGUSR1 does).  The dump is plain text in the log::

    Current thread 0x00007f... (most recent call first):
      File "/home/me/main.py", line 10 in load_batch
      File "/home/me/main.py", line 12 in <module>
      File ".../mwhelpers/taskside/_bootstrap.py", line 89 in main

:func:`main_stack` finds the program's own thread in the last dump (the one
that runs the start-up's ``main``); :func:`where` says at which line of the
user's code it is, and whether it is inside TensorFlow at that moment.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

_HEADER = re.compile(r"^(Current thread|Thread) 0x[0-9a-f]+ \(most recent call first\):$")
_FRAME = re.compile(r'^\s+File "(?P<file>.*)", line (?P<line>\d+) in (?P<func>.*)$')
_LIBRARY = re.compile(r"/(site|dist)-packages/|/lib/python3\.\d+/|/lib64/python3\.\d+/")
_FRAMEWORKS = re.compile(r"/(site|dist)-packages/(tensorflow|tf_keras|keras|jax|jaxlib)/")
_JAX = re.compile(r"/(site|dist)-packages/(jax|jaxlib)/")
BOOTSTRAP = "_bootstrap.py"


@dataclass
class Frame:
    file: str
    line: int
    func: str

    @property
    def is_user(self) -> bool:
        """A frame of the user's program: not the standard library, not an installed
        package, not mwhelpers' start-up."""
        return not _LIBRARY.search(self.file) and not self.file.endswith(BOOTSTRAP)

    @property
    def in_framework(self) -> bool:
        return bool(_FRAMEWORKS.search(self.file))


def dumps(lines: Sequence[str]) -> list[list[Frame]]:
    """Every thread's stack in the last dump in ``lines``: a list of Frame lists, innermost
    frame first.  A dump is a block of thread headers, frame lines and blank lines."""
    last: list[list[Frame]] = []
    block: list[list[Frame]] | None = None
    frames: list[Frame] = []
    for line in lines:
        m = _FRAME.match(line)
        if _HEADER.match(line):
            if block is None:  # a new dump starts
                block = []
                last = block
            frames = []
            block.append(frames)
        elif block is not None and m:
            frames.append(Frame(m["file"], int(m["line"]), m["func"]))
        elif block is not None and not line.strip():
            continue
        else:
            block = None  # other output: the dump is over
    return last


def is_header(line: str) -> bool:
    """Whether ``line`` begins one thread's stack in a dump."""
    return bool(_HEADER.match(line))


def in_dump(line: str) -> bool:
    """Whether ``line`` can be part of a dump: a thread's header, a frame, or blank."""
    return not line.strip() or bool(_HEADER.match(line) or _FRAME.match(line))


def before_last_dump(lines: list[str]) -> list[str]:
    """``lines`` without the last stack dump and what follows it: what the program itself
    had written when it was stopped."""
    for i in range(len(lines) - 1, -1, -1):
        if _HEADER.match(lines[i]):
            start = i
            while start > 0 and (_HEADER.match(lines[start - 1]) or _FRAME.match(lines[start - 1])
                                 or not lines[start - 1].strip()):
                start -= 1
            return lines[:start]
    return lines


def main_stack(lines: Sequence[str]) -> list[Frame]:
    """The frames of the program's main thread in the last dump (innermost first), or []."""
    for frames in dumps(lines):
        if any(f.file.endswith(BOOTSTRAP) and f.func == "main" for f in frames):
            return frames
    return []


@dataclass
class Where:
    """Where a task's program was when its stacks were dumped."""

    frame: Frame  # the innermost frame of the user's code
    in_framework: bool  # the thread was inside TensorFlow, Keras or JAX, called from ``frame``
    source: str = ""  # the text of that line, when the file could be read
    framework: str = "TensorFlow"  # 'JAX' when its innermost frame is JAX's (Keras 3 on JAX)


def where(lines: Sequence[str],
          read_line: Callable[[str, int], str] | None = None) -> Where | None:
    """A :class:`Where` for the main thread of the last dump in ``lines``, or None.

    ``read_line(file, n)`` returns the text of a source line (or '')."""
    frames = main_stack(lines)
    for i, frame in enumerate(frames):
        if frame.is_user:
            inner = frames[:i]
            source = read_line(frame.file, frame.line) if read_line else ""
            jax = bool(inner) and _JAX.search(inner[0].file) is not None
            return Where(frame, any(f.in_framework for f in inner), source,
                         "JAX" if jax else "TensorFlow")
    return None


def source_line(path: str | os.PathLike[str], number: int) -> str:
    """Line ``number`` of the file ``path``, stripped ('' when it cannot be read)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            for i, line in enumerate(f, 1):
                if i == number:
                    return line.strip()
    except OSError:
        pass
    return ""

