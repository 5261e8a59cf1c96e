"""Test hosts on this machine: network namespaces with their own address and sshd,
and optionally a one-box Slurm cluster whose nodes are those namespaces.

    python -m mwhelpers.workshop.testhosts up [--hosts 2] [--slurm] [--dir DIR]   # prints what to export
    python -m mwhelpers.workshop.testhosts down --dir DIR

To try the SSH and Slurm backends (and notebook 10) with no other machine; the
suite (``python -m mwhelpers.workshop.suite``) and the tests use :class:`TestHosts` as a
context manager.  It needs root, iproute2,
OpenSSH's server and, for Slurm, munge and slurm-wlm (``.ci/run`` installs them);
it installs nothing.  Everything it starts it ends by PID, and it removes the
namespaces, the bridge and the files it made.  Traffic stays between this machine
and the namespaces: no route leads anywhere else.

Layout (N hosts, a /24 chosen free among 10.251.0.0/16):

* bridge ``<prefix>br`` in the root namespace at ``10.251.S.1``;
* namespace ``<prefix>hI`` (I = 1..N) with ``eth0`` at ``10.251.S.(10+I)`` and
  sshd on port 22 there, root login with a key made for this run only;
* an ssh client config (``ssh_config``) naming each host ``<prefix>hI``;
* with Slurm: munged, slurmctld (on the bridge address) and one slurmd per
  namespace, node name = host name, and ``slurm.conf`` for the clients.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import itertools
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

NEEDED = {"ssh": ["ip", "ssh", "ssh-keygen", "/usr/sbin/sshd"],
          "slurm": ["munged", "slurmctld", "slurmd", "srun", "sbatch", "scontrol", "nsenter",
                    "unshare"]}


def missing(slurm: bool = False) -> str:
    """Why test hosts cannot be made here ('' when they can)."""
    if os.geteuid() != 0:
        return "test hosts need root (network namespaces, sshd)"
    wanted = NEEDED["ssh"] + (NEEDED["slurm"] if slurm else [])
    absent = [c for c in wanted if not (shutil.which(c) or Path(c).exists())]
    pkgs = "openssh-server" + (" slurm-wlm munge" if slurm else "")
    if absent:
        return f"{', '.join(absent)} not installed (apt-get install {pkgs})"
    return ""


def _run(*cmd: str, check: bool = True, **kw: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(cmd), check=check, capture_output=True, text=True, **kw)


def _daemon_env(**extra: str) -> dict[str, str]:
    """The daemons' environment: ours without mwhelpers' marks, which would make a
    runtime (or the suite) count them as its own leftovers."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MWHELPERS_")}
    env.update(extra)
    return env


def _wait_port(addr: str, port: int, timeout: float, what: str,
               proc: subprocess.Popen[bytes] | None = None,
               log: str | os.PathLike[str] | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((addr, port), timeout=0.5):
                return
        except OSError:
            pass
        if proc is not None and proc.poll() is not None:
            break
        time.sleep(0.05)
    detail = Path(log).read_text(errors="replace")[-2000:] if log and Path(log).exists() else ""
    raise RuntimeError(f"{what} did not come up on {addr}:{port}\n{detail}")


PRIVSEP = Path("/run/sshd")  # sshd's privilege-separation folder: fixed when sshd is built
USERS = Path("/run/mwh-testhosts")  # one file per live set of test hosts, while any is up


@contextlib.contextmanager
def _machine_lock() -> Iterator[None]:
    """One set of test hosts at a time changes what they share on this machine: the
    10.251.S.0/24 subnets and sshd's ``/run/sshd``.  Several sets can be up at once (the
    suite beside the tests, two test processes), and a set that removed ``/run/sshd``
    while another's sshd runs would make that sshd drop every new connection
    ("Missing privilege separation directory"; the client sees a reset before the
    greeting).  The lock is taken on ``/run`` itself, so nothing is left behind."""
    fd = os.open("/run", os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _live_users() -> list[str]:
    """Prefixes of the test-host sets that are up (their first namespace exists)."""
    if not USERS.is_dir():
        return []
    return [f.name for f in USERS.iterdir()
            if f.name != "made-run-sshd" and Path(f"/run/netns/{f.name}h1").exists()]


def _free_subnet() -> int:
    used = _run("ip", "-o", "-4", "addr").stdout
    for s in range(10, 250):
        if f" 10.251.{s}." not in used:
            return s
    raise RuntimeError("no free 10.251.S.0/24 subnet for test hosts")


_SETS = itertools.count()


class TestHosts:
    """Network-namespace hosts with sshd (and Slurm with ``slurm=True``)."""

    __test__ = False  # not a pytest test class

    def __init__(self, n: int = 2, slurm: bool = False,
                 workdir: str | os.PathLike[str] | None = None) -> None:
        self.n = n
        self.slurm = slurm
        self.dir = Path(workdir or tempfile.mkdtemp(prefix="mwh-hosts-"))
        # unique among the sets this process makes (a letter each) and, through the pid,
        # among processes: it names the namespaces, links and Slurm cluster
        self.prefix = f"mw{os.getpid() % 10000}{chr(ord('a') + next(_SETS) % 26)}"
        self.bridge = f"{self.prefix}br"
        self.subnet: int | None = None  # S of 10.251.S.0/24, chosen by up()
        self.names = [f"{self.prefix}h{i}" for i in range(1, n + 1)]
        self.addresses: dict[str, str] = {}
        self.procs: dict[str, subprocess.Popen[bytes]] = {}  # name -> each daemon we started
        self._uses_privsep = False
        self._made_netns: list[str] = []
        self.ssh_config = self.dir / "ssh_config"
        self.munge_dir: Path | None = None
        self.slurm_conf = self.dir / "slurm" / "slurm.conf"

    # -- what users of the hosts need ------------------------------------------------
    @property
    def gateway(self) -> str:
        return f"10.251.{self.subnet}.1"

    def env(self) -> dict[str, str]:
        """Environment for the clients: ssh through our config, Slurm through our conf."""
        out = {"MWHELPERS_SSH": f"ssh -F {self.ssh_config}"}
        if self.slurm:
            out["SLURM_CONF"] = str(self.slurm_conf)
        return out

    def ssh(self, host: str, *cmd: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        return _run("ssh", "-F", str(self.ssh_config), host, *cmd, check=False, timeout=timeout)

    def log_tails(self, lines: int = 25) -> str:
        """The last ``lines`` of each daemon's log, for a failing test's report: once the
        hosts are down their folder (and the logs) are gone."""
        logs = sorted((self.dir / "ssh").glob("sshd_*.log")) + sorted((self.dir / "slurm").glob("*.log"))
        out = []
        for log in logs:
            try:
                text = log.read_text(errors="replace").splitlines()[-lines:]
            except OSError as e:
                text = [f"(unreadable: {e})"]
            out.append(f"--- {log.name} ---\n" + ("\n".join(text) or "(empty)"))
        return "\n".join(out)

    def netns_pids(self, name: str) -> list[int]:
        """PIDs of the processes in namespace ``name`` (``ip netns pids``)."""
        out = _run("ip", "netns", "pids", name, check=False).stdout.split()
        return [int(p) for p in out]

    # -- bring up ------------------------------------------------------------------------
    def __enter__(self) -> TestHosts:
        try:
            self.up()
        except BaseException:
            self.down()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.down()

    def up(self) -> None:
        why = missing(self.slurm)
        if why:
            raise RuntimeError(why)
        self.dir.mkdir(parents=True, exist_ok=True)
        with _machine_lock():
            self.subnet = _free_subnet()
            self._network()
            self._use_privsep()
        self._sshd()
        if self.slurm:
            self._slurm()
        (self.dir / "hosts.json").write_text(json.dumps(self.describe(), indent=1))

    def describe(self) -> dict[str, Any]:
        return {"prefix": self.prefix, "subnet": self.subnet, "hosts": self.names,
                "addresses": self.addresses, "env": self.env(),
                "pids": {k: p.pid for k, p in self.procs.items()},
                "munge_dir": str(self.munge_dir) if self.munge_dir else None,
                "uses_privsep": self._uses_privsep}

    def _network(self) -> None:
        _run("ip", "link", "add", self.bridge, "type", "bridge")
        _run("ip", "addr", "add", f"{self.gateway}/24", "dev", self.bridge)
        _run("ip", "link", "set", self.bridge, "up")
        for i, name in enumerate(self.names, start=1):
            addr = f"10.251.{self.subnet}.{10 + i}"
            outside = f"{self.prefix}v{i}"
            _run("ip", "netns", "add", name)
            self._made_netns.append(name)
            _run("ip", "link", "add", outside, "type", "veth", "peer", "name", f"{outside}p")
            _run("ip", "link", "set", f"{outside}p", "netns", name)
            _run("ip", "link", "set", outside, "master", self.bridge, "up")
            inside = ["ip", "netns", "exec", name, "ip"]
            _run(*inside, "link", "set", f"{outside}p", "name", "eth0")
            _run(*inside, "addr", "add", f"{addr}/24", "dev", "eth0")
            _run(*inside, "link", "set", "eth0", "up")
            _run(*inside, "link", "set", "lo", "up")
            self.addresses[name] = addr

    def _use_privsep(self) -> None:
        """Register this set as a user of ``/run/sshd``, made if missing (under the lock)."""
        USERS.mkdir(mode=0o755, exist_ok=True)
        if not PRIVSEP.exists():
            PRIVSEP.mkdir(mode=0o755)
            (USERS / "made-run-sshd").touch()
        (USERS / self.prefix).write_text(str(self.dir))
        self._uses_privsep = True

    def _leave_privsep(self) -> None:
        """Unregister; the last set to leave removes ``/run/sshd`` if a set made it."""
        with _machine_lock():
            (USERS / self.prefix).unlink(missing_ok=True)
            if _live_users():
                return
            if (USERS / "made-run-sshd").exists():
                shutil.rmtree(PRIVSEP, ignore_errors=True)
            shutil.rmtree(USERS, ignore_errors=True)

    def _sshd(self) -> None:
        d = self.dir / "ssh"
        d.mkdir(exist_ok=True)
        for key in ("host_key", "client_key"):
            if not (d / key).exists():
                _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / key))
        shutil.copy(d / "client_key.pub", d / "authorized_keys")
        lines = []
        for name in self.names:
            addr = self.addresses[name]
            # Each host's own temporary folder, as another machine has: the hosts share this
            # one's /tmp, and a killed task leaves its files there (TensorFlow's autograph
            # modules); this folder goes with the hosts.
            tmp = self.dir / "tmp" / name
            tmp.mkdir(parents=True, exist_ok=True)
            cfg = d / f"sshd_{name}.conf"
            cfg.write_text("\n".join([
                f"ListenAddress {addr}", f"HostKey {d / 'host_key'}", f"SetEnv TMPDIR={tmp}",
                f"PidFile {d / f'sshd_{name}.pid'}", f"AuthorizedKeysFile {d / 'authorized_keys'}",
                "PermitRootLogin prohibit-password", "PasswordAuthentication no",
                "KbdInteractiveAuthentication no", "UsePAM no", "StrictModes no",
                # no random early drop of handshakes: tests run beside others (xdist) and
                # open several connections at once
                "MaxStartups 200",
                "PrintMotd no", "Subsystem sftp internal-sftp", "",
            ]))
            log = d / f"sshd_{name}.log"
            self.procs[f"sshd-{name}"] = subprocess.Popen(
                ["ip", "netns", "exec", name, "/usr/sbin/sshd", "-D", "-f", str(cfg), "-E", str(log)],
                env=_daemon_env(), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=subprocess.STDOUT, start_new_session=True)
            lines += [f"Host {name}", f"  HostName {addr}", "  User root",
                      f"  IdentityFile {d / 'client_key'}", "  IdentitiesOnly yes",
                      "  StrictHostKeyChecking no", "  UserKnownHostsFile /dev/null",
                      "  LogLevel ERROR", "  BatchMode yes", "  ConnectTimeout 10", ""]
        self.ssh_config.write_text("\n".join(lines))
        for name in self.names:
            _wait_port(self.addresses[name], 22, 15, f"sshd of {name}", self.procs[f"sshd-{name}"],
                       d / f"sshd_{name}.log")

    def _slurm(self) -> None:
        d = self.dir / "slurm"
        for sub in (d, d / "state"):
            sub.mkdir(parents=True, exist_ok=True)
        # munged insists that every folder above its socket is reachable by all, which a
        # private working folder (pytest's is 0700) is not: its own folder in /tmp.
        m = self.munge_dir = Path(tempfile.mkdtemp(prefix="mwh-munge-"))
        m.chmod(0o755)
        key = m / "munge.key"
        if not key.exists():
            key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        sock = m / "munge.sock"
        self.procs["munged"] = subprocess.Popen(
            ["munged", "--foreground", f"--socket={sock}", f"--key-file={key}",
             f"--pid-file={m / 'munged.pid'}", f"--log-file={m / 'munged.log'}",
             f"--seed-file={m / 'munged.seed'}"],
            env=_daemon_env(), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
            start_new_session=True)
        deadline = time.monotonic() + 10
        while not sock.exists() and time.monotonic() < deadline:
            if self.procs["munged"].poll() is not None:
                break
            time.sleep(0.05)
        if not sock.exists():
            log = m / "munged.log"
            raise RuntimeError("munged did not start:\n"
                               + (log.read_text(errors="replace")[-2000:] if log.exists() else ""))
        me = socket.gethostname()
        subnet = self.subnet
        assert subnet is not None  # chosen by up() before this runs
        base = 16800 + (subnet % 100) * 10
        nodes = [f"NodeName={n} NodeAddr={self.addresses[n]} NodeHostname={n} CPUs=2 "
                 f"Port={base + 2} State=UNKNOWN" for n in self.names]
        self.slurm_conf.write_text("\n".join([
            f"ClusterName={self.prefix}", f"SlurmctldHost={me}({self.gateway})",
            f"SlurmctldPort={base}", "SlurmUser=root", "SlurmdUser=root",
            "AuthType=auth/munge", "CredType=cred/munge", f"AuthInfo=socket={sock}",
            f"StateSaveLocation={d / 'state'}", f"SlurmdSpoolDir={d}/spool-%n",
            f"SlurmctldPidFile={d / 'slurmctld.pid'}", f"SlurmdPidFile={d}/slurmd-%n.pid",
            f"SlurmctldLogFile={d / 'slurmctld.log'}", f"SlurmdLogFile={d}/slurmd-%n.log",
            "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none",
            "SelectType=select/cons_tres", "SelectTypeParameters=CR_CPU",
            "AccountingStorageType=accounting_storage/none", "JobAcctGatherType=jobacct_gather/none",
            "JobCompType=jobcomp/none", "MpiDefault=none", "ReturnToService=2", "KillWait=5",
            "SchedulerType=sched/builtin", "MailProg=/bin/true", "SlurmdTimeout=30",
            "InactiveLimit=0", "MinJobAge=30",
            *nodes,
            f"PartitionName=test Nodes={','.join(self.names)} Default=YES MaxTime=INFINITE State=UP",
            "",
        ]))
        env = _daemon_env(SLURM_CONF=str(self.slurm_conf))
        self.procs["slurmctld"] = subprocess.Popen(
            ["slurmctld", "-D", "-i", "-f", str(self.slurm_conf)], env=env,
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
            start_new_session=True)
        _wait_port(self.gateway, base, 20, "slurmctld", self.procs["slurmctld"], d / "slurmctld.log")
        for n in self.names:
            hosts = d / f"hosts-{n}"
            hosts.write_text(f"127.0.0.1 localhost\n{self.addresses[n]} {n}\n"
                             f"{self.gateway} {me}\n"
                             + "".join(f"{self.addresses[o]} {o}\n" for o in self.names if o != n))
            inner = (f"hostname {n} && mount --bind {hosts} /etc/hosts && "
                     f"exec slurmd -D -N {n} -f {self.slurm_conf}")
            self.procs[f"slurmd-{n}"] = subprocess.Popen(
                ["nsenter", f"--net=/run/netns/{n}", "unshare", "--uts", "--mount",
                 "--propagation", "private", "sh", "-c", inner], env=env,
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
                start_new_session=True)
        for n in self.names:
            _wait_port(self.addresses[n], base + 2, 20, f"slurmd of {n}", self.procs[f"slurmd-{n}"],
                       d / f"slurmd-{n}.log")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            out = _run("sinfo", "-h", "-o", "%t", env=env, check=False).stdout.split()
            if out and all(s == "idle" for s in out):
                return
            time.sleep(0.2)
        raise RuntimeError(f"Slurm nodes did not become idle: {out}\n"
                           + (d / "slurmctld.log").read_text(errors="replace")[-2000:])

    # -- tear down ---------------------------------------------------------------------
    def down(self) -> None:
        """End every daemon we started (by PID), then remove namespaces, bridge and files."""
        if self.slurm and self.slurm_conf.exists() and "slurmctld" in self.procs:
            try:  # jobs first, while slurmd can still end their steps
                _run("scancel", "--user=root", env=_daemon_env(SLURM_CONF=str(self.slurm_conf)),
                     check=False, timeout=10)
            except subprocess.TimeoutExpired:
                pass
        for key in sorted(self.procs, key=lambda k: k.startswith("munged")):  # munge last
            _stop(self.procs[key])
        self.procs = {}
        for name in self._made_netns:
            for pid in self.netns_pids(name):  # stragglers of the tests: ours by construction
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            _run("ip", "netns", "del", name, check=False)
        self._made_netns = []
        _run("ip", "link", "del", self.bridge, check=False)
        if self._uses_privsep:
            self._leave_privsep()
            self._uses_privsep = False
        shutil.rmtree(self.dir, ignore_errors=True)
        if self.munge_dir is not None:
            shutil.rmtree(self.munge_dir, ignore_errors=True)
            self.munge_dir = None


def _stop(proc: subprocess.Popen[bytes], timeout: float = 5) -> None:
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(5)
    except ProcessLookupError:
        proc.wait(5)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("action", choices=("up", "down"))
    ap.add_argument("--hosts", type=int, default=2)
    ap.add_argument("--slurm", action="store_true")
    ap.add_argument("--dir", help="working folder (default: a new temporary one)")
    a = ap.parse_args(argv)
    if a.action == "up":
        h = TestHosts(a.hosts, a.slurm, a.dir)
        try:
            h.up()
        except BaseException:
            h.down()
            raise
        # Leave the daemons running; 'down' ends them by the PIDs recorded in hosts.json.
        print(f"test hosts up: {', '.join(f'{n}={h.addresses[n]}' for n in h.names)}")
        for k, v in h.env().items():
            print(f"export {k}={v!r}")
        print(f"end them with: {sys.executable} -m mwhelpers.workshop.testhosts down --dir {h.dir}")
        return 0
    state = json.loads((Path(a.dir) / "hosts.json").read_text())
    h = TestHosts(len(state["hosts"]), "SLURM_CONF" in state["env"], a.dir)
    h.prefix, h.subnet = state["prefix"], state["subnet"]
    h.bridge, h.names = f"{h.prefix}br", state["hosts"]
    h._made_netns, h._uses_privsep = list(state["hosts"]), state.get("uses_privsep", False)
    h.munge_dir = Path(state["munge_dir"]) if state.get("munge_dir") else None
    for pid in state["pids"].values():
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(pid, sig)
            except OSError:
                break
            time.sleep(1)
    h.down()
    return 0


if __name__ == "__main__":
    sys.exit(main())
