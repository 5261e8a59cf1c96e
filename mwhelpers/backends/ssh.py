"""The ``ssh`` backend: tasks on SSH hosts, each through the agent (:mod:`.agent`)."""

from __future__ import annotations

import shlex
from collections.abc import Iterable
from dataclasses import dataclass

from .. import settings
from ..errors import InfrastructureError
from .agent import PROBE_TRIES, SSH_DROPPED, AgentLauncher, AgentOptions, Probe, hosts_option
from .options import option


def ssh_command(value: object) -> tuple[str, ...]:
    """``"ssh -F cfg"`` or ``["ssh", "-F", "cfg"]``; not empty."""
    if not isinstance(value, (str, Iterable)):
        raise TypeError("a command: its words, or one string")
    words = shlex.split(value) if isinstance(value, str) else [str(w) for w in value]
    if not words:
        raise ValueError("an empty command")
    return tuple(words)


@dataclass(frozen=True)
class SSHOptions(AgentOptions):
    """The ssh backend's options: the agent's, and the ssh command."""

    hosts: tuple[str, ...] | None = option(
        hosts_option, "the SSH hosts, a list or H1,H2 (alias, user@host, address), tasks "
        "placed over them in turn", metavar="H1,H2")
    ssh: tuple[str, ...] | None = option(ssh_command, "the ssh command (default: "
                                         "$MWHELPERS_SSH or ssh)", metavar="COMMAND")


def _ssh_words(text: str) -> str:
    lowered = text.lower()
    if "could not resolve hostname" in lowered or "name or service not known" in lowered:
        return "its name does not resolve"
    if "connection refused" in lowered:
        return "nothing accepts SSH connections there (is sshd running?)"
    if "no route to host" in lowered or "network is unreachable" in lowered:
        return "there is no network route to it"
    if "timed out" in lowered:
        return "the connection timed out"
    if "permission denied" in lowered:
        return ("the login was refused; set up key-based login (ssh-copy-id HOST) or an "
                "ssh-agent: mwhelpers never asks for a password")
    if "kex_exchange_identification" in lowered:
        return (f"its sshd closed the connection before greeting, {PROBE_TRIES} times (either it "
                "refuses new connections while many are starting, sshd's MaxStartups, or it "
                "cannot start a session at all; sshd's log on that host says which)")
    if "host key verification failed" in lowered:
        return "its host key is not known yet; run 'ssh HOST true' once in a terminal to accept it"
    return ""


class SSHLauncher(AgentLauncher):
    """Tasks on SSH hosts.  A host is what ``ssh`` takes: an alias from
    ``~/.ssh/config``, ``user@host`` or an address.

    The ssh command is ``ssh`` or ``$MWHELPERS_SSH`` (``ssh -F my_config``,
    say), with batch mode on: a host that wants a password fails at once
    instead of waiting for a prompt nobody sees.
    """

    name = "ssh"
    options = SSHOptions
    OPTIONS = ("-o", "BatchMode=yes", "-o", "ConnectTimeout=10", "-o", "ServerAliveInterval=5",
               "-o", "ServerAliveCountMax=3", "-T")

    def __init__(self, options: SSHOptions) -> None:
        super().__init__(options)
        self.ssh: list[str] = settings.SSH.read() if options.ssh is None else list(options.ssh)

    def transport(self, host: str, argv: list[str]) -> list[str]:
        return [*self.ssh, *self.OPTIONS, host, shlex.join(argv)]

    def describe_reach(self, host: str) -> str:
        return f"'{shlex.join(self.ssh)} {host} true'"

    def address_of(self, host: str, probe: Probe) -> str:
        # The address the host was reached at (sshd's side of the connection):
        # reachable by the others, whatever alias the user wrote.
        return probe.get("address") or host.rsplit("@", 1)[-1]

    def transient(self, code: int, err: str) -> bool:
        # sshd dropped the connection before its greeting: it had too many handshakes in
        # progress (MaxStartups' random early drop) or could not start a session process.
        # OpenSSH leaves retrying to the client.
        return code == 255 and any(words in err for words in SSH_DROPPED)

    def explain(self, host: str, code: int, err: str) -> InfrastructureError:
        last = err.strip().splitlines()[-1] if err.strip() else ""
        if code == 255:
            why = _ssh_words(err) or "ssh failed"
            return InfrastructureError(f"cannot use host {host!r}: {why}.\n  ssh said: {last}\n"
                              f"  Check that {self.describe_reach(host)} works from this machine.")
        if code == 127 or "no such file" in err.lower():
            return InfrastructureError(
                f"no Python at {self.python} on {host} (ssh said: {last}). Install the same "
                "environment on every host, or name the interpreter for this cluster "
                "(%cluster ... --python PATH, or define_cluster(..., python=PATH))")
        return InfrastructureError(f"probing {host} with {self.python} failed (exit {code}): {last}")
