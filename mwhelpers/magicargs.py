"""The magics' argument parsing: ``%cluster``'s flags (its backend's options among them, from
their one declaration), the ``%%worker`` line, and the ``magic_arguments`` parsers, all
raising mwhelpers' UsageError (what was wrong, and the usage) instead of exiting.

Imported when the extension loads: it imports nothing of the package but the errors and
the launch options."""

from __future__ import annotations

import argparse
import shlex
from typing import TYPE_CHECKING, Any, NoReturn

from IPython.core.error import UsageError as IPythonUsageError

from .errors import UsageError
from .launchoptions import LAUNCH_OPTIONS, launch_usage

if TYPE_CHECKING:
    from .backends.options import OptionSpec


class Parser(argparse.ArgumentParser):
    """argparse, raising our UsageError (what was wrong, and the usage) instead of exiting."""

    backend_options: tuple[OptionSpec, ...] = ()

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog}: {message}\n{self.format_usage().strip()}")


def cluster_parser(line: str) -> tuple[Parser, str]:
    """The parser of ``%cluster`` for the backend ``line`` names, and that name: the
    general flags, then the backend's own options as flags (``--hosts``, ``--job``...)."""
    from .backends import available_backends, options_of

    words = line.split()
    backend = None
    for i, w in enumerate(words):
        if w == "--backend" and i + 1 < len(words):
            backend = words[i + 1]
        elif w.startswith("--backend="):
            backend = w.partition("=")[2]
    slurm = "--slurm" in words
    hosts = any(w == "--hosts" or w.startswith("--hosts=") for w in words)
    if slurm and hosts:
        raise UsageError("give either --hosts (SSH) or --slurm, not both")
    if slurm and backend not in (None, "slurm"):
        raise UsageError(f"--slurm means the slurm backend, not {backend!r}")
    name = backend or ("slurm" if slurm else "ssh" if hosts else "local")
    p = Parser(prog="%cluster", add_help=False,
                description=f"Define a cluster. Backends: {', '.join(available_backends())}.")
    p.add_argument("workers", nargs="?", type=int, default=None, help="number of workers (default 2)")
    p.add_argument("--chief", action="store_true", help="add a chief task")
    p.add_argument("--ps", type=int, default=0, metavar="K", help="add K parameter servers")
    p.add_argument("--evaluator", action="store_true", help="add an evaluator task")
    p.add_argument("--gpus-per-task", type=int, default=None, metavar="K",
                   help="give each task K GPUs of its host of its own (CUDA_VISIBLE_DEVICES)")
    p.add_argument("--backend", default=None, metavar="NAME",
                   help="how the tasks are started (default local; --hosts alone means ssh, "
                        "--slurm means slurm)")
    p.add_argument("--slurm", action="store_true", help="short for --backend slurm")
    p.add_argument("--option", action="append", default=[], metavar="NAME=VALUE",
                   help="an option of the backend, repeatable (the same as its flag)")
    p.add_argument("--interactive", action="store_true",
                   help="every task runs a live Python (an ipyparallel engine with its "
                        "TF_CONFIG): %%%%px runs a cell on all of them")
    p.add_argument("-h", "--help", action="store_true", help="show this help and the backend's "
                   "options (with --backend NAME: that backend's)")
    own = p.add_argument_group(f"options of the {name} backend")
    p.backend_options = tuple(options_of(name).values())
    for option in p.backend_options:
        own.add_argument(option.flag, dest=option.name, default=None, metavar=option.metavar,
                         help=option.help)
    return p, name


def parse(magic: object, line: str) -> argparse.Namespace:
    """Parse ``line`` with the magic's ``magic_arguments`` parser (the ``parser`` attribute
    those decorators give the method), raising our UsageError (what was wrong, and the usage).

    The words are split as a shell would (``shlex``): IPython's own
    ``parse_argstring`` keeps the quotes, so ``--when "^Epoch 2/"`` would
    look for the quote characters too.
    """
    parser = getattr(magic, "parser", None)  # (IPython's decorators are not annotated)
    if not isinstance(parser, argparse.ArgumentParser):
        raise TypeError(f"{magic!r} has no magic_arguments parser")
    try:
        return parser.parse_args(shlex.split(line))
    except ValueError as e:
        raise UsageError(f"{parser.prog}: cannot parse {line!r}: {e}") from None
    except IPythonUsageError as e:
        raise UsageError(f"{parser.prog}: {e}\n{parser.format_usage().strip()}") from None


def parse_worker_line(line: str) -> dict[str, Any]:
    """Split ``[TASK] [options] [SCRIPT [ARGS...]]``.

    Options are read until the first word that is neither an option nor a
    task name; that word is SCRIPT and everything after it belongs to the
    script, options included (as with ``python [opts] script [args]``).
    argparse cannot say this (a task name and a script are both bare words),
    so this small parser does.
    """
    from .cluster import looks_like_task

    try:
        words = shlex.split(line)
    except ValueError as e:
        raise UsageError(f"cannot parse {line!r}: {e}") from None
    flags = {o.flag: o for o in LAUNCH_OPTIONS}
    # task, script and args, then the launch options given, by name (LaunchRequest.parse's)
    opts: dict[str, Any] = {"task": None, "script": None, "args": []}
    i = 0
    while i < len(words):
        w = words[i]
        flag, eq, inline = w.partition("=")
        option = flags.get(flag) if w.startswith("--") else None
        if option is not None and option.metavar is None:
            if eq:
                raise UsageError(f"{flag} takes no value")
            opts[option.name] = option.value
        elif option is not None and eq:
            if option.repeat:
                opts.setdefault(option.name, []).append(inline)
            else:
                opts[option.name] = inline
        elif option is not None:
            start = i + 1
            # a repeated option takes every KEY=VALUE word that follows it
            while i + 1 < len(words) and not words[i + 1].startswith("--") and (
                    i + 1 == start or (option.repeat and "=" in words[i + 1])):
                i += 1
                if option.repeat:
                    opts.setdefault(option.name, []).append(words[i])
                else:
                    opts[option.name] = words[i]
            if i + 1 == start:
                raise UsageError(f"{flag} needs a value ({option.metavar})")
        elif w.startswith("-"):
            raise UsageError(f"unknown option {w!r} for %%worker; options: {launch_usage()}")
        elif opts["task"] is None and opts["script"] is None and all(
                looks_like_task(part) for part in w.split(",")):
            opts["task"] = w
        else:
            opts["script"] = w
            opts["args"] = words[i + 1:]
            break
        i += 1
    return opts
