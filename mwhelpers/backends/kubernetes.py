"""Kubernetes: the manifests of a job whose pods form the cluster, written like the batch script.

:func:`write_kubernetes` writes one YAML file that ``kubectl apply --server-side -f`` takes,
four objects:

* a ConfigMap ``NAME-mwhelpers``: the worker start-up of this installation (the files of
  :mod:`mwhelpers.taskside`), mounted read-only at ``/opt/mwhelpers``;
* a ConfigMap ``NAME-program``: the program and the files it imports, mounted read-only at
  ``/opt/program``;
* a headless Service ``NAME`` (``clusterIP: None``), which gives each pod of the job a DNS
  name as soon as it has an address (``publishNotReadyAddresses``), selected by the pods' own
  labels;
* an Indexed Job ``NAME`` of ``tasks`` pods.  Each pod's host name is ``NAME-i`` (i: its
  completion index), and its ``subdomain`` is the Service, so task i is ``NAME-i.NAME``.

Each pod starts through ``_podstart.py``: it builds TF_CONFIG and the ``keras.distribution``
variables from ``JOB_COMPLETION_INDEX`` and those names, waits a bounded time for every
pod's name to resolve (and says which does not, and what to check), runs the program under the
worker start-up, and writes the program's exit record to the pod's termination message.

Every pod has its own address, so every task listens on the same ``port``.  The Job's
``backoffLimit`` (0 by default) says how many failed pods it replaces before it fails; a
failed Job ends the pods still running, as ``srun --kill-on-bad-exit`` does.  The files
are mwhelpers' own: the image needs Python, TensorFlow or JAX and Keras, not mwhelpers.
"""

from __future__ import annotations

import json
import os
import re
import shlex
from collections.abc import Iterable, Mapping
from pathlib import Path

from ..errors import UsageError
from ..taskside import wire
from ..taskside.kerasbase import KERAS_FIX_ENV
from ..taskside.tfdata import STALL_FIX_ENV
from .agent import AGENT_FILES
from .base import BOOTSTRAP

TASKSIDE = Path(BOOTSTRAP).parent
START_UP = "/opt/mwhelpers"  # where the pods see mwhelpers' start-up
PROGRAM = "/opt/program"  # and the program's files
TERMINATION_LOG = "/dev/termination-log"  # Kubernetes' default terminationMessagePath
# bytes of program files: the API server refuses an object over about 1 MB, and a client-side
# "kubectl apply" keeps a copy of each in an annotation of at most 256 KiB (--server-side does not)
CONFIGMAP_LIMIT = 200_000
_DNS_LABEL = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")  # (a Service's name starts with a letter)
_KEY = re.compile(r"[-._a-zA-Z0-9]+")  # a ConfigMap's key


def start_up_files() -> dict[str, str]:
    """{name: text} of what a pod's start-up runs: ``_podstart.py``, ``_bootstrap.py`` and the
    modules they load beside them (not the agent of the SSH and Slurm backends)."""
    return {p.name: p.read_text(encoding="utf-8") for p in sorted(TASKSIDE.glob("*.py"))
            if p.name not in AGENT_FILES}


def _name(job_name: str, tasks: int) -> str:
    longest = f"{job_name}-{tasks - 1}"
    if not (isinstance(job_name, str) and _DNS_LABEL.fullmatch(job_name)) or len(longest) > 63:
        raise UsageError(
            f"job_name={job_name!r} cannot name this job's pods: the last one would be "
            f"{longest!r}, and a pod's host name is a DNS label (lower-case letters, digits "
            "and '-', starting with a letter and ending with a letter or digit, at most 63 "
            "characters)")
    return job_name


def _program_files(script: Path, files: Iterable[str | os.PathLike[str]]) -> dict[str, str]:
    out: dict[str, str] = {}
    for path in [script, *(Path(f) for f in files)]:
        if not path.is_file():
            raise UsageError(f"{path} is not a file; write_kubernetes puts the program and the "
                             "files it imports (files=[...]) into the pods")
        if not _KEY.fullmatch(path.name) or path.name in out:
            why = "twice" if path.name in out else "with a name a ConfigMap cannot hold"
            raise UsageError(f"{path.name!r} is given {why}: the pods see every file by its name "
                             "alone, in one folder (letters, digits, '-', '_' and '.')")
        out[path.name] = path.read_text(encoding="utf-8")
    size = sum(len(text.encode()) for text in out.values())
    if size > CONFIGMAP_LIMIT:
        raise UsageError(f"the program's files hold {size:,} bytes, more than {CONFIGMAP_LIMIT:,} "
                         "(what kubectl apply can keep of a ConfigMap). Put data in the image "
                         "or a volume (claim=...)")
    return out


def _config_map(name: str, labels: dict[str, str], namespace: str | None,
                data: dict[str, str]) -> dict[str, object]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": _metadata(name, labels, namespace),
            "data": data}


def _metadata(name: str, labels: dict[str, str], namespace: str | None) -> dict[str, object]:
    meta: dict[str, object] = {"name": name}
    if namespace:
        meta["namespace"] = namespace
    meta["labels"] = dict(labels)
    return meta


def _mounted(volume: str, config_map: str, keys: Iterable[str]) -> dict[str, object]:
    return {"name": volume, "configMap": {"name": config_map, "items": [
        {"key": key, "path": key} for key in keys]}}


def write_kubernetes(path: str | os.PathLike[str], script: str | os.PathLike[str], *, image: str,
                     tasks: int = 2, args: Iterable[object] = (),
                     files: Iterable[str | os.PathLike[str]] = (), python: str = "python",
                     env: Mapping[str, object] | None = None, job_name: str = "tf-multiworker",
                     namespace: str | None = None, port: int = 2222,
                     cpus: str | int | float | None = None, memory: str | None = None,
                     gpus: int = 0, peer_timeout: float = 300, time_limit: int | None = None,
                     backoff_limit: int = 0, claim: str | None = None,
                     claim_path: str = "/mnt/shared", cwd: str | None = None,
                     stall_fix: bool = True, keras_fix: bool = True) -> Path:
    """Write the manifests that run ``script`` as ``tasks`` workers of one
    MultiWorkerMirroredStrategy (or ``keras.distribution`` on JAX) job on Kubernetes; return
    ``path``.  Apply with ``kubectl apply --server-side -f PATH``; follow with ``kubectl logs -f
    -l app.kubernetes.io/name=NAME --prefix``; end and remove with ``kubectl delete -f PATH``.

    ``image``: a container image with Python (``python``, the command's interpreter), TensorFlow
    (or JAX) and Keras.  ``files``: the modules ``script`` imports, put beside it.  ``env``:
    variables for every pod.  ``cpus``, ``memory`` (``"4Gi"``) and ``gpus`` (NVIDIA's device
    plugin, ``nvidia.com/gpu``): each pod's requests.  ``peer_timeout``: seconds a pod waits
    for the other pods' names to resolve.  ``time_limit``: seconds before the Job is ended
    (``activeDeadlineSeconds``).  ``backoff_limit``: failed pods the Job replaces before it
    fails.  ``claim``: a PersistentVolumeClaim that every pod mounts at ``claim_path`` (where
    BackupAndRestore and checkpoints must go to survive a pod); the pods start in ``cwd``,
    by default ``claim_path`` when there is a claim.  ``stall_fix`` and ``keras_fix``: as in
    :func:`~mwhelpers.backends.slurm.write_sbatch`.
    """
    if not isinstance(tasks, int) or isinstance(tasks, bool) or tasks < 1:
        raise UsageError(f"tasks must be a whole number >= 1, got {tasks!r}")
    if not isinstance(image, str) or not image.strip():
        raise UsageError("image= names the container image the pods run: one with Python, "
                         "TensorFlow (or JAX) and Keras, such as tensorflow/tensorflow:2.21.0")
    if not isinstance(port, int) or not 1024 <= port <= 65535:
        raise UsageError(f"port must be a whole number from 1024 to 65535, got {port!r}")
    if not isinstance(gpus, int) or gpus < 0:
        raise UsageError(f"gpus must be a whole number >= 0, got {gpus!r}")
    name = _name(job_name, tasks)
    program = _program_files(Path(script), files)
    labels = {"app.kubernetes.io/name": name, "app.kubernetes.io/managed-by": "mwhelpers"}
    pod = {"job": name, "service": name, "tasks": tasks, "port": port,
           "peer_timeout": float(peer_timeout), "termination_log": TERMINATION_LOG}
    variables = [{"name": wire.Env.POD, "value": json.dumps(pod)},
                 {"name": STALL_FIX_ENV, "value": str(int(bool(stall_fix)))},
                 {"name": KERAS_FIX_ENV, "value": str(int(bool(keras_fix)))}]
    variables += [{"name": str(k), "value": str(v)} for k, v in (env or {}).items()]
    container: dict[str, object] = {
        "name": "worker", "image": image.strip(),
        "command": [python, "-u", f"{START_UP}/_podstart.py", f"{PROGRAM}/{Path(script).name}",
                    *map(str, args)],
        "env": variables, "ports": [{"name": "grpc", "containerPort": port}]}
    workdir = cwd or (claim_path if claim else None)
    if workdir:
        container["workingDir"] = workdir
    requests: dict[str, object] = {}
    if cpus is not None:
        requests["cpu"] = str(cpus)
    if memory is not None:
        requests["memory"] = str(memory)
    if requests or gpus:
        resources: dict[str, object] = {"requests": requests} if requests else {}
        if gpus:
            resources["limits"] = {"nvidia.com/gpu": gpus}
        container["resources"] = resources
    mounts: list[dict[str, object]] = [
        {"name": "mwhelpers", "mountPath": START_UP, "readOnly": True},
        {"name": "program", "mountPath": PROGRAM, "readOnly": True}]
    volumes = [_mounted("mwhelpers", f"{name}-mwhelpers", start_up_files()),
               _mounted("program", f"{name}-program", program)]
    if claim:
        mounts.append({"name": "shared", "mountPath": claim_path})
        volumes.append({"name": "shared", "persistentVolumeClaim": {"claimName": claim}})
    container["volumeMounts"] = mounts
    container["terminationMessagePath"] = TERMINATION_LOG
    container["terminationMessagePolicy"] = "FallbackToLogsOnError"
    job_spec: dict[str, object] = {
        "completionMode": "Indexed", "completions": tasks, "parallelism": tasks,
        "backoffLimit": backoff_limit}
    if time_limit:
        job_spec["activeDeadlineSeconds"] = int(time_limit)
    job_spec["template"] = {
        "metadata": {"labels": dict(labels)},
        "spec": {"subdomain": name, "restartPolicy": "Never", "containers": [container],
                 "volumes": volumes}}
    objects = [
        _config_map(f"{name}-mwhelpers", labels, namespace, start_up_files()),
        _config_map(f"{name}-program", labels, namespace, program),
        {"apiVersion": "v1", "kind": "Service", "metadata": _metadata(name, labels, namespace),
         "spec": {"clusterIP": "None", "publishNotReadyAddresses": True,
                  "selector": dict(labels),  # the pods' own (not the Job controller's: 1.27+)
                  "ports": [{"name": "grpc", "port": port, "targetPort": port}]}},
        {"apiVersion": "batch/v1", "kind": "Job", "metadata": _metadata(name, labels, namespace),
         "spec": job_spec}]
    head = [f"# Written by mwhelpers.backends.kubernetes.write_kubernetes: {tasks} pods of the "
            f"Indexed Job {name} run {Path(script).name}.",
            f"# Pod i is {name}-i.{name}:{port} in TF_CONFIG (its host name, then the headless "
            "Service).",
            f"#   kubectl apply --server-side -f {shlex.quote(Path(path).name)}",
            f"#   kubectl logs -f -l app.kubernetes.io/name={name} --prefix",
            f"#   kubectl delete -f {shlex.quote(Path(path).name)}"]
    text = "\n".join(head) + "\n" + "".join(
        "---\n" + "\n".join(to_yaml(obj)) + "\n" for obj in objects)
    out = Path(path)
    out.write_text(text, encoding="utf-8")
    return out


# -- YAML, the little that manifests need ------------------------------------------------------
_PLAIN = re.compile(r"[A-Za-z_/][A-Za-z0-9_./-]*")
_UNPRINTED = re.compile(r"[\x7f-\x9f\u2028\u2029\ufeff]")
_NOT_PLAIN = {"true", "false", "yes", "no", "on", "off", "null", "y", "n", "~"}
# What a block literal may hold: YAML's printable characters, less those YAML 1.1 parsers read
# as line breaks (NEL, LS, PS)
_PRINTABLE = re.compile(r"[\t\n\x20-\x7e\xa0-\u2027\u202a-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]*")


def _scalar(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return json.dumps(value)
    if value is None:
        return "null"
    text = str(value)
    if _PLAIN.fullmatch(text) and text.lower() not in _NOT_PLAIN:
        return text
    # A JSON string is a double-quoted YAML one; what YAML does not print, escaped as \\u
    return _UNPRINTED.sub(lambda m: f"\\u{ord(m.group()):04x}", json.dumps(text, ensure_ascii=False))


def _literal(text: str, indent: int) -> list[str] | None:
    """``text`` as a block literal (``|``) at ``indent``, or None when one would change it or
    need an indentation indicator: a line of spaces alone, a first line that starts with a
    space, a carriage return, a character YAML does not print."""
    lines = text.split("\n")
    body = lines[:-1] if text.endswith("\n") else lines
    first = next((ln for ln in body if ln), "")
    if (not _PRINTABLE.fullmatch(text) or "\r" in text or "\ufeff" in text
            or any(ln and not ln.strip(" ") for ln in body) or first[:1] in (" ", "\t", "")):
        return None
    keep = "-" if not text.endswith("\n") else ("+" if text.endswith("\n\n") else "")
    if keep == "+":
        body = text[:-1].split("\n")
    pad = " " * indent
    return [f"|{keep}", *(pad + ln if ln else "" for ln in body)]


def to_yaml(value: object, indent: int = 0) -> list[str]:
    """The lines of ``value`` (dicts, lists, strings, numbers, booleans) as block YAML at
    ``indent``: strings that hold a newline as literal blocks, the others plain or JSON-quoted."""
    pad = " " * indent
    if isinstance(value, dict):
        if not value:
            return [pad + "{}"]
        out = []
        for key, item in value.items():
            head = f"{pad}{_scalar(key)}:"
            if isinstance(item, (dict, list)) and item:
                out.append(head)
                out += to_yaml(item, indent + 2)
            elif isinstance(item, str) and "\n" in item and (block := _literal(item, 2)):
                out.append(f"{head} {block[0]}")
                out += [pad + ln if ln else "" for ln in block[1:]]
            else:
                out.append(f"{head} {to_yaml(item)[0].strip()}")
        return out
    if isinstance(value, list):
        if not value:
            return [pad + "[]"]
        out = []
        for item in value:
            lines = to_yaml(item, indent + 2)
            out.append(f"{pad}- {lines[0].lstrip()}")
            out += lines[1:]
        return out
    if isinstance(value, str) and "\n" in value and (block := _literal(value, 2)):
        return [f"{pad}{block[0]}", *(pad + ln if ln else "" for ln in block[1:])]
    return [pad + _scalar(value)]
