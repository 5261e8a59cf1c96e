"""Free localhost ports, reserved across processes.

A port is free when nothing listens on it (TensorFlow's gRPC server binds
every interface, so we test the wildcard address).  Choosing a free port is
not enough when two notebooks define clusters at the same time: both could
pick the same one before either worker binds it.  So each chosen port is also
*reserved* with an exclusive ``flock`` on a small file in a per-user folder of /tmp (the
same for every process of the machine, whatever its ``TMPDIR``).
Other mwhelpers processes skip locked ports; the lock is held for as long as
the cluster exists and is dropped by the kernel when the process ends, even
by SIGKILL, so a crashed kernel never leaves ports reserved.  A release removes
its file, so the folder holds only the reservations of now (and those of processes
that were killed); a process that opened the file just before it was removed
sees that its path names another file, or none, and skips the port.  (An older
mwhelpers sharing the folder lacks that check: in that moment it could take a port
that another process holds.)

Ports are drawn below the kernel's ephemeral range, so outgoing connections
of other programs do not take them between our check and the worker's bind.
``MWHELPERS_PORT_RANGE=LOW-HIGH`` picks another range (a firewall's, say).
"""

from __future__ import annotations

import errno
import fcntl
import os
import random
import socket
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from . import settings
from .errors import UsageError

DEFAULT_RANGE = (20000, 32767)


def lock_dir() -> Path:
    """The folder of the reservations: in /tmp, whatever ``TMPDIR`` says, since the ports are
    the machine's (a kernel started with another ``TMPDIR``, as Slurm gives each job its own,
    must still see them); the temporary folder only where /tmp cannot be written."""
    base = Path("/tmp")
    if not (base.is_dir() and os.access(base, os.W_OK | os.X_OK)):
        base = Path(tempfile.gettempdir())
    path = base / f"mwhelpers-ports-{os.getuid()}"
    path.mkdir(mode=0o700, exist_ok=True)
    return path


def port_range() -> tuple[int, int]:
    """The (low, high) range ports are drawn from, both ends included."""
    given = settings.PORT_RANGE.read()
    if given is not None:
        return given
    low, high = DEFAULT_RANGE
    try:
        eph_low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
        high = min(high, eph_low - 1)
    except (OSError, ValueError, IndexError):
        pass
    return low, high


def port_in_use(port: int) -> bool:
    """True when something already listens on ``port`` (any interface)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        # SO_REUSEADDR: a port whose last connection is in TIME_WAIT is free
        # for a new server too (gRPC sets the same option).
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("", port))
        except OSError as e:
            if e.errno in (errno.EADDRINUSE, errno.EACCES):
                return True
            raise
    return False


class PortHold(Protocol):
    """What keeps a port for a task until the cluster is closed: a :class:`PortReservation`,
    or a backend's own."""

    def release(self) -> None: ...


class PortReservation:
    """An exclusive claim on one port among mwhelpers processes."""

    def __init__(self, port: int, fd: int, path: Path | None = None) -> None:
        self.port = port
        self._fd: int | None = fd
        self._path = path  # its file, removed at release (by this process, not a fork's copy)
        self._owner = os.getpid()

    @classmethod
    def try_take(cls, port: int) -> PortReservation | None:
        path = lock_dir() / f"{port}.lock"
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            # Its holder may have released it (removed the file) between our open and our
            # lock: then ours is on a file no other process can find, and the port is not ours.
            held = os.fstat(fd)
            named = os.stat(path)
            if (held.st_dev, held.st_ino) != (named.st_dev, named.st_ino):
                raise FileNotFoundError(path)
        except OSError:
            os.close(fd)
            return None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        return cls(port, fd, path)

    def release(self, _close: Callable[[int], None] = os.close,
                _unlink: Callable[[Path], None] = os.unlink,
                _getpid: Callable[[], int] = os.getpid) -> None:
        # The functions are bound now: at interpreter exit the os module may be gone.
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            if self._path is not None and _getpid() == self._owner:
                _unlink(self._path)  # while locked: nobody else can hold this file
        except OSError:
            pass
        finally:
            _close(fd)  # closing drops the flock

    @property
    def held(self) -> bool:
        return self._fd is not None

    def __del__(self) -> None:
        self.release()


def remove_stale() -> int:
    """Remove the files of reservations that no process holds (those of processes killed while
    they held one); returns how many.  Each is taken, then released, as a reservation would be:
    a port that is held is left alone."""
    removed = 0
    for path in lock_dir().glob("*.lock"):
        try:
            reservation = PortReservation.try_take(int(path.stem))
        except (ValueError, OSError):  # not ours, or gone meanwhile
            continue
        if reservation is not None:
            reservation.release()
            removed += 1
    return removed


def reserve_ports(count: int, attempts: int = 2000) -> list[PortReservation]:
    """Reserve ``count`` distinct free ports; returns PortReservation objects."""
    low, high = port_range()
    candidates = list(range(low, high + 1))
    random.SystemRandom().shuffle(candidates)
    taken: list[PortReservation] = []
    for port in candidates[:attempts]:
        if len(taken) == count:
            break
        res = PortReservation.try_take(port)
        if res is None:
            continue
        if port_in_use(port):
            res.release()
            continue
        taken.append(res)
    if len(taken) < count:
        for res in taken:
            res.release()
        raise UsageError(
            f"could not find {count} free ports in {low}-{high}; "
            "free some or set MWHELPERS_PORT_RANGE=LOW-HIGH to another range"
        )
    return taken


def holder_of(port: int) -> str:
    """Describe the process listening on ``port``, if psutil can see it."""
    try:
        import psutil

        for conn in psutil.net_connections(kind="tcp"):
            if conn.laddr and conn.laddr.port == port and conn.status == psutil.CONN_LISTEN:
                if conn.pid:
                    try:
                        words = " ".join(psutil.Process(conn.pid).cmdline()).split()
                        command = " ".join(words)  # a -c program's lines on one line
                        if len(command) > 80:
                            command = command[:77] + "..."
                        return f"pid {conn.pid} ({command})"
                    except psutil.Error:
                        return f"pid {conn.pid}"
                return "another process"
    except Exception:
        pass
    return "another process"
