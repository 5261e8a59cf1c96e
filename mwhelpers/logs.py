"""Task log files: reading their last lines, and following them as they grow.

A task's stdout and stderr go, merged, to one log file.  Progress bars
rewrite their line with ``\\r``; every reader here keeps what such a line
shows last, the way a terminal would.
"""

import os

TAIL = 15  # log lines quoted in errors and failure records
_TAIL_WINDOW = 256 * 1024  # bytes read from the end for a short tail


def _split(text):
    lines = [ln.rsplit("\r", 1)[-1] for ln in text.replace("\r\n", "\n").split("\n")]
    if lines and lines[-1] == "":
        lines.pop()
    return lines


def tail_lines(path, n=TAIL):
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


class LogFollower:
    """Yields the complete new lines of a growing log file, one poll at a time."""

    def __init__(self, path, offset=0):
        self.path = path
        self.offset = offset
        self._partial = b""

    def poll(self, final=False):
        """New complete lines since the last poll; ``final``: the unfinished one too."""
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except OSError:
            data = b""
        self.offset += len(data)
        parts = (self._partial + data).split(b"\n")
        self._partial = parts.pop()
        if final and self._partial:
            parts.append(self._partial)
            self._partial = b""
        return [p.decode("utf-8", "replace").rstrip("\r").rsplit("\r", 1)[-1] for p in parts]
