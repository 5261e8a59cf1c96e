"""GPUs for tasks: each task on a host gets its own ``CUDA_VISIBLE_DEVICES``.

A host offers the GPUs :func:`visible_gpus` finds there: ``CUDA_VISIBLE_DEVICES`` when it is
set (a scheduler's allocation, such as Slurm's, or the user's own choice), otherwise what
``nvidia-smi -L`` lists.  :func:`assign` gives the tasks placed on each host consecutive,
disjoint slices of ``per_task`` GPUs, in task order, and refuses clearly when a host has too
few.  For other machines the probe runs :func:`visible_gpus` there (its source is sent with the
probe), so the lists are the hosts' own.
"""

import os
from collections.abc import Hashable, Mapping, Sequence
from typing import TypeVar

from .errors import UsageError

K = TypeVar("K", bound=Hashable)


def visible_gpus(environ: "Mapping[str, str] | None" = None) -> "list[str]":
    """The GPU ids this machine offers (strings, as CUDA_VISIBLE_DEVICES takes them).

    Self-contained (imports inside; annotations quoted, never evaluated): the probe sends
    this function's source to other hosts.
    """
    import os
    import re
    import subprocess

    environ = os.environ if environ is None else environ
    if "CUDA_VISIBLE_DEVICES" in environ:
        ids = []
        for word in environ["CUDA_VISIBLE_DEVICES"].split(","):
            word = word.strip()
            if not word or word.startswith("-"):  # CUDA stops at the first invalid id
                break
            ids.append(word)
        return ids
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20,
                             env=dict(environ))
    except (OSError, subprocess.SubprocessError):
        return []
    if out.returncode != 0:
        return []
    return [m.group(1) for m in re.finditer(r"^GPU (\d+):", out.stdout, re.M)]


def check_per_task(per_task: object) -> int | None:
    if per_task is None:
        return None
    if isinstance(per_task, bool) or not isinstance(per_task, int) or per_task < 1:
        raise UsageError(f"gpus_per_task must be a whole number >= 1, got {per_task!r}")
    return per_task


def assign(hosts_of: Mapping[K, str | None], gpus_of: Mapping[str | None, Sequence[str]],
           per_task: int) -> dict[K, str]:
    """``{task: "i,j"}``: ``per_task`` GPUs of its host for each task.

    ``hosts_of`` maps each task to its host (in task order), ``gpus_of`` each host to the GPU
    ids it offers.  UsageError, naming the host, its GPUs and its tasks, when a host has fewer
    GPUs than its tasks need.
    """
    check_per_task(per_task)
    on_host: dict[str | None, list[K]] = {}
    for task, host in hosts_of.items():
        on_host.setdefault(host, []).append(task)
    assigned: dict[K, str] = {}
    for host, tasks in on_host.items():
        ids = list(gpus_of.get(host) or [])
        need = per_task * len(tasks)
        if len(ids) < need:
            where = "this machine" if host is None else host
            found = f"GPUs {', '.join(ids)}" if ids else "no GPU"
            source = "from CUDA_VISIBLE_DEVICES, else nvidia-smi -L"
            if host is None and "CUDA_VISIBLE_DEVICES" in os.environ:  # set here: it decided
                source = f"this process's CUDA_VISIBLE_DEVICES is {os.environ['CUDA_VISIBLE_DEVICES']!r}"
            raise UsageError(
                f"{where} offers {found} ({source}) but its "
                f"{len(tasks)} task(s) ({', '.join(map(str, tasks))}) need {per_task} each, "
                f"{need} in all: ask for fewer GPUs per task, place fewer tasks on it, or leave "
                "out gpus_per_task (--gpus-per-task) to let every task see every GPU")
        for i, task in enumerate(tasks):
            assigned[task] = ",".join(ids[i * per_task:(i + 1) * per_task])
    return assigned
