"""The pods of an Indexed Job that ``write_kubernetes`` wrote, run on the test hosts the way a
kubelet runs them: what of a Kubernetes job can be checked on a machine without Kubernetes.

Pod ``i`` runs on test host ``i`` (its own network namespace and address, as a pod has), in a
UTS, mount and PID namespace of its own (the container's command is its PID 1, which gets only
the signals it handles), with what the kubelet gives a pod and nothing else:

* its host name ``JOB-i`` and the variable ``JOB_COMPLETION_INDEX=i``; ``HOSTNAME``, ``PATH``
  and ``HOME`` as an image sets them, and the container's ``env`` from the manifest;
* the container's volumes at their mount paths: each ConfigMap's items as files, a
  PersistentVolumeClaim as one folder that every pod shares, read-only where the manifest says
  so (a tmpfs over the path's top folder, ``/opt`` or ``/mnt``, holds the mount points);
* an ``/etc/hosts`` that plays the cluster's DNS: the pod's own names, as the kubelet writes
  them, and the name ``JOB-j.SERVICE`` of each pod ``j`` that :meth:`Pods.publish` says has
  an address (a running pod, through the headless Service), added while the pods run;
* the container's command, in its ``workingDir``.

What differs: the interpreter is this machine's (the image's ``python`` on ``PATH``), and the
termination message goes to a file of the pod's folder, as the kubelet's file at
``terminationMessagePath`` would (``/dev/termination-log`` cannot be made here): the one value
changed in the manifest's ``MWHELPERS_POD``.  A real cluster adds scheduling, its DNS
server, image pulls and the Job controller's retries; none of that runs here.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import yaml

from mwhelpers.taskside import wire


class Pod:
    """One pod: its process (the container's command), log, termination message and temporary
    folder (its ``TMPDIR``: a pod's ``/tmp`` is its own)."""

    def __init__(self, index: int, proc: subprocess.Popen[bytes], log: Path, message: Path,
                 tmp: Path) -> None:
        self.index, self.proc, self.log, self.message_file = index, proc, log, message
        self.tmp = tmp

    def wait(self, timeout: float) -> int:
        return self.proc.wait(timeout)

    def first_process(self, timeout: float = 10) -> int:
        """The pid here of the container's first process, PID 1 in the pod: ``unshare``'s
        child, once the command has replaced the shell that set the pod up."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for child in psutil.Process(self.proc.pid).children():
                try:
                    if child.name() != "sh":
                        return child.pid
                except psutil.Error:
                    pass
            time.sleep(0.05)
        raise TimeoutError(f"pod {self.index}'s command did not start: {self.output[-2000:]}")

    @property
    def output(self) -> str:
        return self.log.read_text(errors="replace")

    @property
    def message(self) -> str:
        return self.message_file.read_text() if self.message_file.exists() else ""

    def end(self) -> None:
        """SIGKILL to the pod's whole process group, as a deleted pod's grace period ends."""
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except OSError:
                pass
            self.proc.wait(10)


class Pods:
    """The pods of the Indexed Job in ``manifest``, on ``hosts`` (a started TestHosts), their
    files under ``folder``."""

    def __init__(self, hosts: object, manifest: Path, folder: Path) -> None:
        self.hosts, self.folder = hosts, folder
        docs = [d for d in yaml.safe_load_all(manifest.read_text()) if d]
        self.config_maps = {d["metadata"]["name"]: d["data"] for d in docs if d["kind"] == "ConfigMap"}
        self.service = next(d for d in docs if d["kind"] == "Service")
        self.job = next(d for d in docs if d["kind"] == "Job")
        self.name = self.job["metadata"]["name"]
        self.namespace = self.job["metadata"].get("namespace", "default")
        template = self.job["spec"]["template"]["spec"]
        self.subdomain = template["subdomain"]
        self.container = template["containers"][0]
        self.volumes = {v["name"]: v for v in template.get("volumes", [])}
        self.tasks = self.job["spec"]["completions"]
        names = self.hosts.names  # type: ignore[attr-defined]
        if self.tasks > len(names):
            raise ValueError(f"{self.tasks} pods need as many test hosts; there are {len(names)}")
        self.published: set[int] = set()
        self.pods: dict[int, Pod] = {}

    # -- the cluster's DNS -----------------------------------------------------------------
    def address(self, i: int) -> str:
        return self.hosts.addresses[self.hosts.names[i]]  # type: ignore[attr-defined,no-any-return]

    def _hosts_file(self, i: int) -> Path:
        return self.folder / f"pod-{i}" / "hosts"

    def publish(self, *indices: int) -> None:
        """Pods ``indices`` have an address: their names resolve in every pod from now on."""
        self.published.update(indices)
        for i in self.pods:
            self._write_hosts(i)

    def _write_hosts(self, i: int) -> None:
        domain = f"{self.subdomain}.{self.namespace}.svc.cluster.local"
        lines = ["127.0.0.1 localhost", f"{self.address(i)} {self.name}-{i}.{domain} {self.name}-{i}"]
        lines += [f"{self.address(j)} {self.name}-{j}.{domain} {self.name}-{j}.{self.subdomain}"
                  for j in sorted(self.published)]
        with open(self._hosts_file(i), "w") as f:  # the same file: the bind mount sees it
            f.write("\n".join(lines) + "\n")

    # -- a pod -------------------------------------------------------------------------------
    def _volume_source(self, i: int, volume: dict) -> Path:  # type: ignore[type-arg]
        if "configMap" in volume:
            where = self.folder / f"pod-{i}" / volume["name"]
            data = self.config_maps[volume["configMap"]["name"]]
            for item in volume["configMap"].get("items") or [{"key": k, "path": k} for k in data]:
                (where / item["path"]).parent.mkdir(parents=True, exist_ok=True)
                (where / item["path"]).write_text(data[item["key"]])
            return where
        if "persistentVolumeClaim" in volume:
            where = self.folder / "claims" / volume["persistentVolumeClaim"]["claimName"]
        else:
            where = self.folder / f"pod-{i}" / volume["name"]
        where.mkdir(parents=True, exist_ok=True)
        return where

    def start(self, i: int, publish: bool = True, env: dict[str, str] | None = None) -> Pod:
        """Start pod ``i`` (and, with ``publish``, make its name resolve at once, as a pod with
        an address gets its record)."""
        mine = self.folder / f"pod-{i}"
        mine.mkdir(parents=True, exist_ok=True)
        message = mine / "termination-log"
        tmp = mine / "tmp"
        tmp.mkdir(exist_ok=True)
        hostname = f"{self.name}-{i}"
        variables = {"PATH": f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin",
                     "HOME": "/root", "HOSTNAME": hostname, "JOB_COMPLETION_INDEX": str(i),
                     "TMPDIR": str(tmp)}
        for item in self.container.get("env", []):
            variables[item["name"]] = item["value"]
        pod_shape = json.loads(variables[wire.Env.POD])
        assert pod_shape["termination_log"] == self.container["terminationMessagePath"]
        variables[wire.Env.POD] = json.dumps({**pod_shape, "termination_log": str(message)})
        variables.update(env or {})
        if publish:
            self.published.add(i)
        self._write_hosts(i)
        steps = [f"hostname {hostname}", f"mount --bind {self._hosts_file(i)} /etc/hosts"]
        mounts = self.container.get("volumeMounts", [])
        for top in sorted({"/" + m["mountPath"].strip("/").split("/")[0] for m in mounts}):
            if top not in ("/opt", "/mnt", "/srv"):
                raise ValueError(f"a mount under {top}: the pods here mount under /opt, /mnt, /srv")
            steps.append(f"mount -t tmpfs tmpfs {top}")
        for m in mounts:
            source = self._volume_source(i, self.volumes[m["name"]])
            target = shlex.quote(m["mountPath"])
            steps += [f"mkdir -p {target}", f"mount --bind {shlex.quote(str(source))} {target}"]
            if m.get("readOnly"):
                steps.append(f"mount -o remount,bind,ro {target}")
        if "workingDir" in self.container:
            workdir = shlex.quote(self.container['workingDir'])  # (the runtime makes it)
            steps += [f"mkdir -p {workdir}", f"cd {workdir}"]
        steps.append("exec env -i " + " ".join(shlex.quote(f"{k}={v}") for k, v in variables.items())
                     + " " + shlex.join(self.container["command"] + self.container.get("args", [])))
        host = self.hosts.names[i]  # type: ignore[attr-defined]
        log = mine / "log"
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                ["nsenter", f"--net=/run/netns/{host}", "unshare", "--uts", "--mount", "--pid",
                 "--fork", "--mount-proc", "--propagation", "private", "sh", "-ec",
                 " && ".join(steps)],
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True)
        self.pods[i] = Pod(i, proc, log, message, tmp)
        self.publish()  # the others see its name now, where it was published
        return self.pods[i]

    def end(self) -> None:
        for pod in self.pods.values():
            pod.end()
