"""A backend in one file, outside mwhelpers: tasks inside named network namespaces.

Each "host" is a namespace made with ``ip netns add`` (the test hosts are such
namespaces); a task runs there through ``ip netns exec NS python -c <agent>``,
the same agent that SSH and Slurm tasks run, so signals, stack dumps, ending
and the heartbeat work as they do there.  TF_CONFIG names the namespace's own
address.  It needs root, like ``ip netns exec``.

    import netns_backend                       # registers "netns"
    rt.define_cluster(2, backend="netns", hosts=["ns1", "ns2"])

Nothing in ``mwhelpers/`` names it: it is registered with
``mwhelpers.register_backend``, as a package of yours would be (or through an
entry point in the group ``mwhelpers.backends``).  Its options are the agent's
(``hosts``, ``python``, ``cwd``, ``heartbeat``), declared once in a frozen
dataclass: ``hosts`` again, for its own help.
"""

import os
import re
import subprocess
from dataclasses import dataclass

from mwhelpers import register_backend
from mwhelpers.backends import AgentLauncher, AgentOptions, option
from mwhelpers.backends.agent import hosts_option
from mwhelpers.errors import InfrastructureError, UsageError


def namespace_address(ns):
    """The first global IPv4 address inside namespace ``ns``."""
    out = subprocess.run(["ip", "-n", ns, "-4", "-o", "addr", "show", "scope", "global"],
                         capture_output=True, text=True, timeout=10)
    m = re.search(r"\binet (\d+\.\d+\.\d+\.\d+)/", out.stdout)
    if out.returncode != 0 or not m:
        why = out.stderr.strip() or "it has no IPv4 address outside loopback"
        raise InfrastructureError(f"network namespace {ns!r} cannot hold a task: {why}. "
                                  "'ip netns list' shows the namespaces there are")
    return m.group(1)


@dataclass(frozen=True)
class NetnsOptions(AgentOptions):
    """The agent's options, its hosts being namespaces."""

    hosts: tuple[str, ...] | None = option(hosts_option, "the namespaces, a list or NS1,NS2",
                                           metavar="H1,H2")


class NetnsLauncher(AgentLauncher):
    """Tasks in named network namespaces on this machine (ip netns exec)."""

    name = "netns"
    options = NetnsOptions

    def __init__(self, options: NetnsOptions):
        if os.geteuid() != 0:
            raise UsageError("the netns backend needs root (ip netns exec)")
        super().__init__(options)

    def transport(self, host, argv):
        return ["ip", "netns", "exec", host, *argv]

    def address_of(self, host, probe):
        return namespace_address(host)

    def describe_reach(self, host):
        return f"'ip netns exec {host} true'"

    def explain(self, host, code, err):
        last = err.strip().splitlines()[-1] if err.strip() else f"exit {code}"
        return InfrastructureError(f"cannot start a task in network namespace {host!r}: {last}")


register_backend("netns", NetnsLauncher)
