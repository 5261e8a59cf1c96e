"""This kernel's session mark, and the processes of the session that escaped.

Every process a kernel starts carries the session mark (``MWHELPERS_SESSION``) in its
environment; :func:`escaped_orphans` finds those, marked as a task or a background cell, that
lost their parent.
"""

from __future__ import annotations

import os
import secrets

import psutil

from . import proctree
from .taskside.wire import Env

SESSION_ENV = Env.SESSION
# Set (to the session mark) in what a %%script --bg cell starts: its escaped descendants are
# ended by %killbgscripts, other background commands of the kernel are not.
BG_ENV = "MWHELPERS_BG"
TASK_ENV = Env.TASK


def claim_session() -> str:
    """This process's session mark, set in its environment.

    Every process started from here from now on (also through %%bash --bg
    and !cmd) inherits it, so escaped orphans can be found.  A mark
    inherited from a parent process (a kernel started by another process
    that uses mwhelpers) is replaced: orphans of ours are only ours.
    """
    mark = os.environ.get(SESSION_ENV, "")
    if not mark.startswith(f"{os.getpid()}-"):
        mark = f"{os.getpid()}-{secrets.token_hex(4)}"
        os.environ[SESSION_ENV] = mark
    return mark


def escaped_orphans(session: str) -> list[psutil.Process]:
    """Processes that a task or a ``%%script --bg`` cell of ``session`` started and that
    lost their parent.

    Every process started from here carries the session mark in its environment; one whose
    parent is gone has been re-parented away from us (the ``python main.py`` that IPython's
    own %killbgscripts leaves behind when it kills ``bash``).  Only those that also carry a
    task's mark (``MWHELPERS_TASK``) or a background cell's (``MWHELPERS_BG``) count: a
    ``!nohup tensorboard ... &`` of the user's is not ours to end.
    """
    me = os.getpid()
    mine = {p.pid for p in proctree.tree(me)}
    try:
        mine |= {p.pid for p in psutil.Process(me).parents()}
    except psutil.Error:
        pass
    return proctree.carrying(
        SESSION_ENV, session, exclude=mine,
        where=lambda env: TASK_ENV in env or env.get(BG_ENV) == session)
