"""What TensorFlow's messages of two collectives that did not match say, in plain words: a rule
of :mod:`mwhelpers.diagnosis` (its "collectives-differ" finding).

TensorFlow pairs the collectives of the tasks by their group and instance keys, and under
MultiWorkerMirroredStrategy each task numbers its instances in the order it runs them: tasks
that run different collectives, or the same ones in another order, meet with one of the
messages below.  Keys that never meet leave no such words: the tasks wait, until a timeout
("Collective has timed out during execution.") that a slow peer gives too, so that is not
read as one.
"""

from __future__ import annotations

import re
from collections.abc import Callable

# TensorFlow's words when the members of one collective did not agree on it (its collective
# parameter resolver; what each looks like in a task's log: tests/recorded/README.md).
_SHAPE_DIFFERS = re.compile(
    r"Shape mismatch in the collective instance (?P<instance>\d+)\. Op at device (?P<device>\S+) "
    r"expected shape (?P<mine>\[[^\]]*\]) but another member in the group expected shape "
    r"(?P<other>\[[^\]]*\])")
# e.g. "Collective instance 100 expected type 0 and data_type 1 but got type 2 and data_type 3":
# the kind of collective (CollectiveType in TensorFlow's collective.h) and its data type.
_TYPE_DIFFERS = re.compile(
    r"Collective instance (?P<instance>\d+) expected type (?P<kind>\d+) and data_type "
    r"(?P<dtype>\d+) but got type (?P<got_kind>\d+) and data_type (?P<got_dtype>\d+)")
# TensorFlow writes no space between "size" and the number.
_GROUP_SIZE_DIFFERS = re.compile(
    r"Device (?P<device>\S+) is joining a group with size ?(?P<mine>\d+), but that group has size "
    r"(?P<other>\d+) \(group_key=(?P<group>-?\d+)\)")
_GROUP_FULL = re.compile(
    r"Device (?P<device>\S+) is joining a group that is already full \(group_key=(?P<group>-?\d+)\)")
_NO_SENDER = re.compile(
    r"Instance (?P<instance>\d+) found no source for broadcast\.\s+This could mean that there were "
    r"group_size=(?P<size>\d+) BcastRecvs but no BcastSend")
_TWO_SENDERS = re.compile(
    r"Instance (?P<instance>\d+) already has source (?P<first>\d+), received second claim from "
    r"(?P<second>\d+)")
_DEVICE_TASK = re.compile(r"/job:(?P<job>[^/]+)/replica:\d+/task:(?P<index>\d+)")


_DIFFERENT_PATHS = "they ran different steps, epochs, models or code paths"
_SAME_PROGRAM = ("run the same program with the same model, epochs and steps_per_epoch on every "
                 "task, and let nothing that runs collectives depend on the task's index or its "
                 "own share of the data (a step count computed from a worker's shard, a branch on "
                 "the index)")
_HOW_MANY = ("they did not agree on how many devices take part in it (under "
             "MultiWorkerMirroredStrategy: the number of workers times each one's GPUs)")
_SAME_DEVICES = ("give every task the same number of GPUs (%cluster --gpus-per-task, or "
                 "CUDA_VISIBLE_DEVICES naming as many on each), and where the program runs "
                 "collectives of its own, the same group size for a group key on every task")
_ONE_SENDER = ("; and let exactly one task send each broadcast (under MultiWorkerMirroredStrategy "
               "the chief, worker:0 when there is no chief), chosen the same way on every task")
# TensorFlow's numbers of the kinds of collective (CollectiveType) and of the usual data types
# (DataType in types.proto).
_KINDS = {"0": "all-reduce", "1": "broadcast", "2": "all-gather", "3": "permute",
          "4": "all-to-all", "5": "reduce-scatter"}
_DTYPES = {"1": "float32", "2": "float64", "3": "int32", "9": "int64", "10": "bool",
           "19": "float16", "14": "bfloat16"}


def _task_of(device: str) -> str:
    """'worker:1' for '/job:worker/replica:0/task:1/device:CPU:0', else the device."""
    m = _DEVICE_TASK.match(device)
    return f"{m.group('job')}:{m.group('index')}" if m else device


def _shape_differs(m: re.Match[str]) -> tuple[str, str, str]:
    return (f"collective instance {m.group('instance')} had shape {m.group('mine')} on "
            f"{_task_of(m.group('device'))} and {m.group('other')} on another task",
            "they ran different steps, epochs, models, batch sizes or code paths",
            f"{_SAME_PROGRAM}; where the program reduces or gathers values per batch, give every "
            "task batches of the same size (batch with drop_remainder=True)")


def _type_differs(m: re.Match[str]) -> tuple[str, str, str]:
    instance = m.group("instance")
    kinds = [_KINDS.get(k, f"collective of type {k}") for k in (m.group("kind"), m.group("got_kind"))]
    dtypes = [_DTYPES.get(t, f"data type {t}") for t in (m.group("dtype"), m.group("got_dtype"))]
    if kinds[0] == kinds[1]:
        what = (f"collective instance {instance} had data type {dtypes[0]} on one task and "
                f"{dtypes[1]} on another")
    else:
        what = (f"collective instance {instance} was {_a(kinds[0])} of {dtypes[0]} on one task "
                f"and {_a(kinds[1])} of {dtypes[1]} on another")
    return what, _DIFFERENT_PATHS, _SAME_PROGRAM


def _a(noun: str) -> str:
    return ("an " if noun[0] in "aeiou" else "a ") + noun


def _group_size_differs(m: re.Match[str]) -> tuple[str, str, str]:
    return (f"{_task_of(m.group('device'))} joined collective group {m.group('group')} as a group "
            f"of {m.group('mine')} devices, which another task had made a group of "
            f"{m.group('other')}", _HOW_MANY, _SAME_DEVICES)


def _group_full(m: re.Match[str]) -> tuple[str, str, str]:
    return (f"{_task_of(m.group('device'))} asked to join collective group {m.group('group')}, "
            "which was already full: the tasks that joined first had made it a group of fewer "
            "devices", _HOW_MANY, _SAME_DEVICES)


def _no_sender(m: re.Match[str]) -> tuple[str, str, str]:
    return (f"collective instance {m.group('instance')} was a broadcast that its "
            f"{m.group('size')} devices all waited to receive and none sent", _DIFFERENT_PATHS,
            _SAME_PROGRAM + _ONE_SENDER)


def _two_senders(m: re.Match[str]) -> tuple[str, str, str]:
    return (f"collective instance {m.group('instance')} was a broadcast sent by two devices, "
            f"ranks {m.group('first')} and {m.group('second')}", _DIFFERENT_PATHS,
            _SAME_PROGRAM + _ONE_SENDER)


_Member = Callable[[re.Match[str]], tuple[str, str, str]]
_COLLECTIVE_MEMBERS: tuple[tuple[re.Pattern[str], _Member], ...] = (
    (_SHAPE_DIFFERS, _shape_differs), (_TYPE_DIFFERS, _type_differs),
    (_GROUP_SIZE_DIFFERS, _group_size_differs), (_GROUP_FULL, _group_full),
    (_NO_SENDER, _no_sender), (_TWO_SENDERS, _two_senders))


def mismatch(line: str) -> tuple[str, str, str] | None:
    """``(what, why, advice)`` when ``line`` is TensorFlow's message of two collectives that did
    not match; None otherwise."""
    for pattern, member in _COLLECTIVE_MEMBERS:
        m = pattern.search(line)
        if m is not None:
            return member(m)
    return None
